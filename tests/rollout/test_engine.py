"""The rollout engine: step-wise continuous batching vs static batching, on the real digits model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.helpers import requests, tiny_adapter

from omnirl.algorithms import gaussian_log_prob, sde_mean_std, sigma_schedule
from omnirl.rollout.engine import RolloutEngine


@pytest.fixture(scope="module")
def adapter():
    torch.set_num_threads(1)
    return tiny_adapter()


def run(adapter, reqs, **kw):
    engine = RolloutEngine(adapter, **kw)
    for r in reqs:
        engine.submit(r)
    return engine, engine.run_until_idle()


def test_every_request_finishes_once_with_trajectory_shapes(adapter):
    reqs = requests(adapter, 3, num_steps=6, window=(1, 2))
    engine, results = run(adapter, reqs, max_batch_size=4)
    assert sorted(r.request.sample_id for r in results) == sorted(r.sample_id for r in reqs)
    for r in results:
        c, h, w = adapter.latent_shape(list(r.request.prompt_ids))
        assert r.latents.shape == (3, c, h, w) and r.latents.dtype == torch.float32
        assert r.log_probs.shape == (2,) and torch.isfinite(r.log_probs).all()
        assert torch.allclose(r.sigmas, sigma_schedule(6)[1:4])
        assert r.image.shape == (h, w, 3) and r.image.dtype == torch.uint8
    assert engine.stats.sample_steps == len(reqs) * 6


def test_samples_are_identical_whatever_the_batching(adapter):
    reqs = requests(adapter, 3)
    _, stepwise = run(adapter, reqs, max_batch_size=4, batching="stepwise")
    _, static = run(adapter, reqs, max_batch_size=2, batching="static")
    by_id = {r.request.sample_id: r for r in static}
    for r in stepwise:
        other = by_id[r.request.sample_id]
        torch.testing.assert_close(r.x0, other.x0, atol=1e-5, rtol=0)
        torch.testing.assert_close(r.log_probs, other.log_probs, atol=1e-4, rtol=0)


def test_recorded_log_prob_is_the_transition_density(adapter):
    (req,) = requests(adapter, 1, prompts=['"55"'])
    _, (res,) = run(adapter, [req])
    cond = adapter.encode([list(req.prompt_ids)])
    with torch.no_grad():
        v = adapter.velocity(res.latents[:1], res.sigmas[:1], cond)
    mean, std = sde_mean_std(res.latents[:1], v, res.sigmas[:1], res.sigmas[1:2], 0.7)
    expected = gaussian_log_prob(res.latents[1:2], mean, std)
    torch.testing.assert_close(res.log_probs[:1], expected, atol=1e-5, rtol=0)


def test_stepwise_batches_fuller_than_static_on_mixed_step_counts(adapter):
    # static batching keeps a slot empty once its short request is done; step-wise refills it
    short = requests(adapter, 8, num_steps=4, window=(), prompts=['"12"'])
    long = [dataclasses.replace(r, sample_id="L" + r.sample_id) for r in
            requests(adapter, 8, num_steps=8, window=(), prompts=['"34"'])]
    mixed = [r for pair in zip(short, long, strict=True) for r in pair]
    s_engine, s_res = run(adapter, mixed, max_batch_size=8, batching="stepwise")
    t_engine, t_res = run(adapter, mixed, max_batch_size=8, batching="static")
    assert len(s_res) == len(t_res) == 16
    assert s_engine.stats.sample_steps == t_engine.stats.sample_steps == 8 * 4 + 8 * 8
    assert t_engine.stats.forwards == 16  # two static batches of 8 steps each
    assert s_engine.stats.forwards == 12  # 96 sample-steps in full batches of 8


def test_finished_samples_leave_at_once(adapter):
    fast = requests(adapter, 1, num_steps=3, window=(), prompts=['"7"'])
    slow = requests(adapter, 1, num_steps=9, window=(), prompts=['"8"'])
    engine = RolloutEngine(adapter, max_batch_size=4)
    engine.submit(slow[0])
    engine.step()
    engine.submit(fast[0])  # joins at the next step boundary
    finished_at = {}
    step = 1
    while engine.has_work():
        for r in engine.step():
            finished_at[r.request.prompt] = step
        step += 1
    assert finished_at['"7"'] == 3 and finished_at['"8"'] == 8


def test_a_deferred_handover_returns_every_sample_once_one_step_later_stamped_at_its_finish(adapter):
    """What an accelerator's engine does (the CPU's copies are no-ops, the schedule is the same):
    a finishing step returns nothing, the next step returns its samples, identical to the
    immediate handover's; a weight version set in between does not restamp them."""
    reqs = requests(adapter, 3, num_steps=4, window=(1,), prompts=['"7"'])
    _, now = run(adapter, reqs, max_batch_size=4)
    engine = RolloutEngine(adapter, max_batch_size=4, policy_version=3)
    engine._defer = True
    for r in reqs:
        engine.submit(r)
    assert [engine.step() for _ in range(4)] == [[], [], [], []] and engine.has_work()
    engine.set_policy_version(4)  # nothing in flight: the finished samples are v3's
    later = engine.step()
    assert not engine.has_work() and engine.step() == []
    assert sorted(r.request.sample_id for r in later) == sorted(r.request.sample_id for r in now)
    by_id = {r.request.sample_id: r for r in now}
    for r in later:
        assert r.policy_version == 3
        for name in ("x0", "image", "latents", "log_probs", "sigmas"):
            assert torch.equal(getattr(r, name), getattr(by_id[r.request.sample_id], name)), name


def test_fairness_serves_a_rare_shape(adapter):
    many = requests(adapter, 8, num_steps=20, window=(), prompts=['"11"'])
    rare = requests(adapter, 1, num_steps=2, window=(), prompts=['"123456"'])
    engine = RolloutEngine(adapter, max_batch_size=8, max_wait_steps=3)
    for r in many + rare:
        engine.submit(r)
    done_at = None
    for step in range(1, 40):
        if any(r.request.prompt == '"123456"' for r in engine.step()):
            done_at = step
            break
    assert done_at is not None and done_at <= 2 * (3 + 1)


def test_bad_windows_are_rejected(adapter):
    (req,) = requests(adapter, 1, prompts=['"1"'])
    engine = RolloutEngine(adapter)
    with pytest.raises(ValueError, match="contiguous"):
        engine.submit(dataclasses.replace(req, window=(1, 3)))
    with pytest.raises(ValueError, match="last denoising step"):
        engine.submit(dataclasses.replace(req, window=(5,)))
    with pytest.raises(ValueError, match="batching"):
        RolloutEngine(adapter, batching="dynamic")
