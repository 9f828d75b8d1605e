"""A training step whose gradient norm is not finite is not applied (`actor.ranks.clip_grad_norm`).

Reproduced with `omnirl run` of the AWM demo at `learningRate: 2` (2e-4 meant): step 0 made the weights huge,
step 1's gradient norm was NaN and its optimizer step was applied all the same, so every weight turned NaN,
the rollouts drew NaN images (train reward 0.000), the NaN weights were checkpointed and exported, and only the
next step failed (`ValueError: error must be >= 0 (a mean of squares); got [nan, …]`), on every restart from
that checkpoint until `maxRestarts` (exit 1).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tests.actor.test_actor import rollouts, spec  # noqa: F401 - the fixture is used by name

from omnirl.actor.ranks import check_loss, clip_grad_norm
from omnirl.actor.trainer import Trainer
from omnirl.api.errors import ConfigError


def test_a_non_finite_gradient_norm_is_a_configuration_error_naming_the_learning_rate():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, float("nan"), 2.0])
    with pytest.raises(ConfigError, match=r"^spec.algorithm.optimizer: the gradient norm is nan \(the training "
                                          r"diverged\), so this update was not applied: .* lower "
                                          r"spec.algorithm.optimizer.learningRate \(or gradClip, now 1\)"):
        clip_grad_norm([p], 1.0)
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    assert clip_grad_norm([p], 1.0) == pytest.approx(5.0)  # a finite norm: clipped and returned as before
    assert torch.allclose(p.grad, torch.tensor([0.6, 0.8, 0.0]), atol=1e-5)


def test_a_step_whose_gradients_are_not_finite_leaves_the_weights_as_they_were(rollouts):  # noqa: F811
    adapter, samples = rollouts
    trainer = Trainer(copy.deepcopy(adapter), spec(name="awm", optimizer={"learningRate": 1e-3}))
    before = {k: v.clone() for k, v in trainer.policies.trained_tensors().items()}
    # a gradient that overflows in the backward pass, as a diverged run's did (loss 6.6e11, gradient norm NaN)
    _, weight = next((n, p) for n, p in trainer.policies.adapter.module.named_parameters()
                     if p.requires_grad and p.dim() == 2)
    weight.register_hook(lambda grad: grad * float("inf"))
    with pytest.raises(ConfigError, match="the training diverged"):
        trainer.train_step(samples, step=0)
    after = trainer.policies.trained_tensors()
    assert all(torch.equal(after[k], before[k]) for k in before)  # no NaN written into any weight
    assert trainer.optimizer_steps == 0


def test_a_non_finite_loss_is_a_configuration_error_naming_the_learning_rate():
    with pytest.raises(ConfigError, match=r"^spec.algorithm.optimizer: the NFT loss is nan \(samples \['a', 'b'\]; "
                                          r"the training diverged\); lower spec.algorithm.optimizer.learningRate"):
        check_loss(torch.tensor(float("nan")), "NFT", ["a", "b"])
    check_loss(torch.tensor(0.5), "NFT", ["a"])  # a finite loss passes


def test_a_step_after_an_absurd_learning_rate_stops_with_a_configuration_error(rollouts):  # noqa: F811
    # `omnirl run` of the NFT demo at learningRate 1e30: step 0's gradient norm was finite, AdamW moved every weight
    # by ~1e30, and step 1's loss was NaN: a ValueError, restarted from scratch maxRestarts times (exit 1)
    adapter, samples = rollouts
    trainer = Trainer(copy.deepcopy(adapter), spec(name="diffusion-nft", optimizer={"learningRate": 1e30}))
    trainer.train_step(samples, step=0)
    assert trainer.optimizer_steps >= 1
    with pytest.raises(ConfigError, match=r"the NFT loss is (nan|inf|-inf) .*lower spec.algorithm.optimizer"):
        trainer.train_step(samples, step=1)
