"""The rollout engine and the FlowGRPO log-probs on a CUDA GPU (skipped where there is none)."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _requests(adapter, n, side=None, steps=6):
    from omnirl.rollout.types import SampleRequest

    text = f"gpu @{side}" if side else '"4821"'
    ids = tuple(adapter.tokenize(text))
    return [SampleRequest(f"s{i}", text, ids, seed=100 + i, num_steps=steps, window=(1, 2, 3), noise_level=0.8,
                          sde_type="cps", shift=3.0) for i in range(n)]


def _run(adapter, reqs, max_batch):
    from omnirl.rollout.engine import RolloutEngine

    engine = RolloutEngine(adapter, max_batch_size=max_batch, device="cuda")
    for r in reqs:
        engine.submit(r)
    return {r.request.sample_id: r for r in engine.run_until_idle()}


def test_a_sample_does_not_depend_on_its_batch_on_cuda():
    from omnirl.models.registry import load_adapter

    adapter = load_adapter("ocr-digits", "builtin", device="cuda")
    reqs = _requests(adapter, 6)
    alone, together = _run(adapter, reqs, 1), _run(adapter, reqs, 6)
    for sid, a in alone.items():
        b = together[sid]
        # same per-sample CUDA generator stream; only matmul rounding may differ between batch sizes
        torch.testing.assert_close(b.latents, a.latents, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.x0, a.x0, atol=1e-4, rtol=1e-4)
        assert a.latents.device.type == "cpu" and a.log_probs.dtype == torch.float32


def test_bf16_log_probs_are_finite_and_the_actor_recomputes_them():
    pytest.importorskip("diffusers")
    from benchmarks.gpu.actor import train_samples
    from benchmarks.gpu.model import TINY, BenchSD3Adapter, build_transformer

    from omnirl.actor.flow_grpo_update import window_log_probs

    adapter = BenchSD3Adapter(build_transformer(TINY, "cuda", torch.bfloat16), resolution=(128, 128))
    results = list(_run(adapter, _requests(adapter, 4, side=128), 4).values())
    lp = torch.stack([r.log_probs for r in results])
    assert lp.shape == (4, 3) and bool(torch.isfinite(lp).all())
    samples = train_samples(results, [0.0, 1.0, 2.0, 3.0])
    with torch.no_grad():
        again = window_log_probs(adapter, samples, torch.device("cuda")).cpu()
    # same bf16 weights, same fp32 SDE math: the on-policy ratio is 1 up to bf16 matmul rounding
    assert float((again - lp).abs().max()) < 1e-3


@pytest.mark.parametrize("family", ["ocr-digits", "sd3"])
def test_no_engine_step_waits_for_the_gpu_until_it_hands_finished_samples_over(family):
    """Between a batch's admission and its handover every step only queues work: no host sync,
    the finishing step included (its copies go to pinned memory); the step after it returns them.

    A sync drains the GPU's queue and leaves it idle until the host launches the next kernels;
    the σ checks' reads of failing indices were several per step (~5% of engine throughput), and
    a finishing step's `.cpu()` left the GPU idle while the host built and published results."""
    from omnirl.rollout.engine import RolloutEngine

    if family == "sd3":
        pytest.importorskip("diffusers")
        from benchmarks.gpu.model import TINY, BenchSD3Adapter, build_transformer

        adapter = BenchSD3Adapter(build_transformer(TINY, "cuda", torch.bfloat16), resolution=(128, 128))
        reqs = _requests(adapter, 4, side=128)
    else:
        from omnirl.models.registry import load_adapter

        adapter = load_adapter("ocr-digits", "builtin", device="cuda")
        reqs = _requests(adapter, 4)
    engine = RolloutEngine(adapter, max_batch_size=4, device="cuda")
    for r in reqs:
        engine.submit(r)
    assert engine.step() == []  # admission (prompt encoding, σ grids) and step 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):  # steps 1–5: the SDE window (1, 2, 3) included; step 5 finishes the batch
            assert engine.step() == []
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not engine.in_flight and engine.has_work()
    results = engine.step()  # the handover: waits for the finishing step's copies only
    assert sorted(r.request.sample_id for r in results) == sorted(r.sample_id for r in reqs)
    assert all(r.latents.device.type == "cpu" and r.latents.shape[0] == 4 for r in results)
    assert not engine.has_work()
