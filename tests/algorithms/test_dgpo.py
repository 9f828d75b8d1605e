"""DGPO: the group preference statistic and loss against hand-computed values, and one actor step."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tests.helpers import PROMPTS, requests, tiny_adapter

from omnirl.actor.batch import TrainSample
from omnirl.actor.trainer import Trainer
from omnirl.algorithms import dgpo_loss, group_preference
from omnirl.api.spec import RLJobSpec
from omnirl.rollout.engine import RolloutEngine

# two groups of two samples, K = 1 draw: group 7 = samples 0, 1; group 3 = samples 2, 3
ERR = torch.tensor([[0.5], [0.2], [0.4], [0.9]])
REF = torch.tensor([[0.3], [0.3], [0.4], [0.6]])
ADV = torch.tensor([1.0, -1.0, 2.0, -2.0])
GROUPS = torch.tensor([7, 7, 3, 3])


def test_group_statistic_is_the_closed_form():
    s = group_preference(ERR, REF, ADV, GROUPS, beta=10.0)
    # group 7: 10/2·(1·0.2 + (−1)·(−0.1)) = 1.5; group 3: 10/2·(2·0 + (−2)·0.3) = −3
    assert s[:, 0].tolist() == pytest.approx([1.5, 1.5, -3.0, -3.0], abs=1e-6)


def test_the_group_statistic_never_reads_the_device():
    """The statistic is built without a value read (no unique()/bincount() sized from the data, which
    on a GPU is a host sync per loss): on the meta device, which has no values, any read raises."""
    meta = {"device": "meta"}
    s = group_preference(torch.empty(6, 2, **meta), torch.empty(6, 2, **meta), torch.empty(6, **meta),
                         torch.empty(6, dtype=torch.int64, **meta), beta=1.0)
    assert s.shape == (6, 2) and s.device.type == "meta"


def test_loss_value_and_its_gradient_is_the_group_likelihood_gradient_over_beta():
    beta = 10.0
    err = ERR.clone().requires_grad_(True)
    out = dgpo_loss(err, REF, ADV, GROUPS, beta)
    w7, w3 = 1 / (1 + math.exp(-1.5)), 1 / (1 + math.exp(3.0))
    expected = (w7 * (0.5 - 0.2) + w3 * (2 * 0.4 - 2 * 0.9)) / 4
    assert float(out.loss.detach()) == pytest.approx(expected, rel=1e-6)
    assert float(out.group_nll) == pytest.approx((2 * math.log1p(math.exp(1.5)) + 2 * math.log1p(math.exp(-3))) / 4,
                                                  rel=1e-6)
    out.loss.backward()
    # the true objective: mean over groups of −log σ(−s_g), s_g = β/G·Σ A·(ℓ − ℓ_ref)
    err2 = ERR.clone().requires_grad_(True)
    s = torch.stack([beta / 2 * (ADV[:2] * (err2[:2, 0] - REF[:2, 0])).sum(),
                     beta / 2 * (ADV[2:] * (err2[2:, 0] - REF[2:, 0])).sum()])
    (-torch.nn.functional.logsigmoid(-s)).mean().backward()
    assert torch.allclose(err.grad, err2.grad / beta, atol=1e-7)


def test_positive_members_are_pulled_down_and_equal_errors_give_half_weights():
    out = dgpo_loss(REF.clone(), REF, ADV, GROUPS, beta=100.0)  # θ = reference: s = 0
    assert out.group_weight.flatten().tolist() == [0.5] * 4
    err = ERR.clone().requires_grad_(True)
    dgpo_loss(err, REF, ADV, GROUPS, beta=1.0).loss.backward()
    assert (torch.sign(err.grad.flatten()) == torch.sign(ADV)).all()  # descent lowers ℓ where A > 0


def test_kl_term_and_bad_inputs():
    kl = torch.full((4, 1), 0.25)
    out = dgpo_loss(ERR, REF, ADV, GROUPS, 1.0, kl=kl, kl_coef=0.1)
    assert float(out.loss - out.policy_loss) == pytest.approx(0.025, rel=1e-6) and float(out.kl) == 0.25
    with pytest.raises(ValueError, match="beta must be > 0"):
        group_preference(ERR, REF, ADV, GROUPS, 0.0)
    with pytest.raises(ValueError, match="must be \\[B\\]"):
        group_preference(ERR, REF, ADV[:3], GROUPS[:3], 1.0)
    with pytest.raises(ValueError, match="must be \\[B, K\\]"):
        group_preference(ERR[:, 0], REF[:, 0], ADV, GROUPS, 1.0)


@pytest.mark.parametrize("reference", ["base", "ema"])
def test_one_actor_step_moves_matching_error_with_the_advantage(reference):
    torch.set_num_threads(1)
    adapter = tiny_adapter(seed=4)
    engine = RolloutEngine(adapter, max_batch_size=16)
    for r in requests(adapter, 4, num_steps=6, window=(), prompts=PROMPTS[:2]):
        engine.submit(r)
    results = sorted(engine.run_until_idle(), key=lambda r: r.request.sample_id)
    adv = [1.5, 0.5, -0.5, -1.5]
    samples = [TrainSample(r.request.sample_id, r.request.sample_id.rsplit(":", 1)[0], list(r.request.prompt_ids),
                           adv[int(r.request.sample_id.rsplit(":", 1)[1])], r.x0, r.latents, r.log_probs, r.sigmas,
                           0.0, "sde") for r in results]
    spec = RLJobSpec.model_validate({
        "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
        "algorithm": {"name": "dgpo", "sampling": {"numSteps": 6}, "optimizer": {"learningRate": 1e-3,
                      "microBatchSize": 4}, "dgpo": {"timestepsPerSample": 2, "groupSharedNoise": True,
                                                     "reference": reference}}})
    trainer = Trainer(copy.deepcopy(adapter), spec)
    assert trainer.policies.has_ref and trainer.policies.has_old == (reference == "ema")
    metrics = trainer.train_step(samples, step=0)
    assert metrics["optimizer_steps"] == 1 and math.isfinite(metrics["loss"])
    assert metrics["group_weight"] == pytest.approx(0.5, abs=1e-6)  # θ = reference at the first step
    after = trainer.train_step(samples, step=0)  # the same draws again, one update later
    # good samples' errors fell relative to bad ones: the group likelihood rose (−log σ(−s) fell below log 2)
    assert metrics["group_nll"] == pytest.approx(math.log(2), abs=1e-6)
    assert after["group_nll"] < metrics["group_nll"]
