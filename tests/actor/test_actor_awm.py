"""The AWM actor step on the real (tiny) digits model: on-policy ratio, direction, EMA anchor, rollout policy."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from tests.helpers import requests, tiny_adapter

from omnirl.actor.awm_update import _forward, _log_prob, draw_noise, draw_sigmas
from omnirl.actor.batch import TrainSample
from omnirl.actor.trainer import Trainer
from omnirl.algorithms import sigma_schedule
from omnirl.api.spec import RLJobSpec
from omnirl.rollout.engine import RolloutEngine

ADVANTAGES = [1.5, -1.0, -0.5]  # per member of every group (mean 0)


@pytest.fixture(scope="module")
def batch():
    torch.set_num_threads(1)
    adapter = tiny_adapter(seed=3)
    with torch.no_grad():  # undo adaLN-Zero's zero init so every layer gets gradients
        for layer in [b.modulation for b in adapter.module.blocks] + [adapter.module.modulation_out,
                                                                     adapter.module.out_proj]:
            layer.weight.normal_(std=0.05)
    engine = RolloutEngine(adapter, max_batch_size=16)
    for r in requests(adapter, 3, num_steps=6, window=()):  # ODE rollouts: AWM needs x0 only
        engine.submit(r)
    results = sorted(engine.run_until_idle(), key=lambda r: r.request.sample_id)
    samples = [TrainSample(r.request.sample_id, r.request.sample_id.rsplit(":", 1)[0], list(r.request.prompt_ids),
                           ADVANTAGES[int(r.request.sample_id.rsplit(":", 1)[1])], r.x0, r.latents, r.log_probs,
                           r.sigmas, 0.0, "sde") for r in results]
    assert all(s.log_probs.numel() == 0 for s in samples)
    return adapter, samples


def _spec(**awm) -> RLJobSpec:
    return RLJobSpec.model_validate({
        "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
        "algorithm": {"name": "awm", "sampling": {"numSteps": 6},
                      "optimizer": {"microBatchSize": 4, "learningRate": 1e-4},
                      "awm": {"timestepsPerSample": 2, "groupSharedNoise": True, **awm}}})


def _log_probs(trainer: Trainer, samples: list[TrainSample]) -> torch.Tensor:
    """−w(ℓ, σ) `[B, K]` of each sample's step-0 draws under θ (no grad)."""
    spec = trainer.spec.algorithm.awm
    seed = trainer.spec.seed  # the job seed (draws derive from it and the ids)
    sigmas = {s.group_id: draw_sigmas(s.group_id, spec, sigma_schedule(6), seed) for s in samples}
    out = []
    with torch.no_grad():
        for s in samples:  # one at a time: the latent shapes differ
            x_t, x0, eps, sigma, cond = _forward(trainer.policies.adapter, [s], spec, sigmas, seed, torch.device("cpu"))
            out.append(_log_prob(trainer.policies.adapter.velocity(x_t, sigma, cond), x0, eps, sigma, spec, 1)[0])
    return torch.cat(out)


def test_one_update_is_on_policy_and_moves_log_p_with_the_advantage(batch):
    adapter, samples = batch
    trainer = Trainer(copy.deepcopy(adapter), _spec(klCoef=0.0, emaKlCoef=0.0))
    before = _log_probs(trainer, samples)
    metrics = trainer.train_step(samples, step=0)
    after = _log_probs(trainer, samples)
    assert metrics["ratio_max_abs_dev"] == 0.0 and metrics["clip_fraction"] == 0.0 and metrics["optimizer_steps"] == 1
    assert not trainer.policies.has_old and not trainer.policies.has_ref
    adv = torch.tensor([s.advantage for s in samples])
    # a descent step on −mean(A·log p) raises Σ A·log p (first order): good samples gain likelihood
    assert float((adv[:, None] * (after - before)).sum()) > 0


def test_group_shared_draws(batch):
    _, samples = batch
    spec = _spec().algorithm.awm
    a, b = samples[0], samples[1]
    assert a.group_id == b.group_id and a.sample_id != b.sample_id
    assert torch.equal(draw_noise(a, spec, 7), draw_noise(b, spec, 7))
    private = spec.model_copy(update={"groupSharedNoise": False})
    assert not torch.equal(draw_noise(a, private, 7), draw_noise(b, private, 7))
    grid = sigma_schedule(6)
    sig = draw_sigmas(a.group_id, spec, grid, 7)
    assert sig.shape == (2,) and all(float(s) in grid.tolist() for s in sig)  # grid values, never σ = 1
    assert float(sig.max()) < 1.0


def test_ema_anchor_follows_theta_and_rollout_gets_theta(batch):
    adapter, samples = batch
    trainer = Trainer(copy.deepcopy(adapter), _spec(), device="cpu")
    assert trainer.policies.has_old and trainer.policies.has_ref and not trainer.policies.rollout_old
    old0 = {k: v.clone() for k, v in trainer.policies.named_tensors("old").items()}
    metrics = trainer.train_step(samples, step=0)
    decay = metrics["old_policy_decay"]
    assert decay == pytest.approx(0.001)  # min(0.3, 0.3·1/300): the paper's min(0.3, 0.001·steps)
    theta = trainer.policies.trained_tensors()
    for k, v in trainer.policies.named_tensors("old").items():
        torch.testing.assert_close(v, decay * old0[k] + (1 - decay) * theta[k], rtol=1e-6, atol=1e-7)
    rollout = trainer.rollout_tensors()
    assert all(torch.equal(rollout[k], theta[k]) for k in theta)  # AWM rolls out θ, not the anchor


@pytest.mark.parametrize("kl_coef, ema_kl_coef, key", [(1.0, 0.0, "kl"), (0.0, 1.0, "ema_kl")])
def test_anchors_pull_theta_back(batch, kl_coef, ema_kl_coef, key):
    """With every advantage 0 the policy term has no gradient: only the velocity KL to the base model
    (klCoef) or to the EMA anchor (emaKlCoef) moves θ, back towards the anchor (both were once computed
    under the anchor's no-grad context and never acted)."""
    adapter, samples = batch
    trainer = Trainer(copy.deepcopy(adapter), _spec(klCoef=kl_coef, emaKlCoef=ema_kl_coef))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # θ drifts away from both anchors (the frozen copies keep the start)
        for p in trainer.policies.trainable_parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    neutral = [dataclasses.replace(s, advantage=0.0) for s in samples]
    first = trainer.train_step(neutral, step=0)
    assert first["policy_loss"] == 0.0 and first[key] > 0.0
    assert first["grad_norm"] > 0.0
    if key == "kl":  # the base model stays put: the gap shrinks step by step
        second = trainer.train_step(neutral, step=1)
        assert second["kl"] < first["kl"]


def test_each_group_draws_on_the_grid_of_its_own_size(batch, monkeypatch):
    """`timeSampling: grid` with groups of several latent sizes (the digits model's width follows the
    text; `model.resolutions` for the diffusers families, whose grid shifts with the size): each group's
    σ draws come from its own size's rollout grid, not the first sample's."""
    import omnirl.actor.awm_update as awm

    adapter, samples = batch
    shapes = {s.group_id: tuple(s.x0.shape) for s in samples}
    assert len(set(shapes.values())) > 1  # the batch has several sizes
    trainer = Trainer(copy.deepcopy(adapter), _spec(klCoef=0.0, emaKlCoef=0.0, timeSampling="grid"))

    def sized_grid(num_steps, shape, shift=None):  # a grid that depends on the size, as FLUX's does
        return sigma_schedule(num_steps, 1.0 + shape[-1] / 8)

    monkeypatch.setattr(trainer.policies.adapter, "sigma_grid", sized_grid)
    used: dict[str, torch.Tensor] = {}
    real = awm.draw_sigmas

    def spy(group_id, spec, grid, seed):
        used[group_id] = grid
        return real(group_id, spec, grid, seed)

    monkeypatch.setattr(awm, "draw_sigmas", spy)
    trainer.train_step(samples, step=0)
    assert set(used) == set(shapes)
    for g, shape in shapes.items():
        torch.testing.assert_close(used[g], sized_grid(6, shape))
