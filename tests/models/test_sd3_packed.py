"""Packed SD3 forward: samples of different resolutions in ONE transformer forward (CPU, tiny random
configs of the real diffusers classes; a GPU-marked bf16 variant)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from benchmarks.gpu.model import TINY, BenchSD3Adapter, build_transformer  # noqa: E402
from tests.models.test_diffusers import PROMPT, _inject_lora, _sd3_pipeline  # noqa: E402

from omnirl.models.diffusers.sd3 import SD3Adapter  # noqa: E402
from omnirl.models.diffusers.sd3_packed import sd3_packed_forward  # noqa: E402
from omnirl.rollout.engine import RolloutEngine  # noqa: E402
from omnirl.rollout.types import SampleRequest  # noqa: E402

RESOLUTIONS = [(32, 32), (24, 40), (32, 32), (16, 16), (40, 24)]  # pixels; latents /2 (tiny VAE), tokens /2 more


def _adapter(dtype: torch.dtype, device: str) -> SD3Adapter:
    pipe = _sd3_pipeline()
    pipe.to(device=device, dtype=dtype)
    adapter = SD3Adapter(pipe.transformer, pipe.vae, dict(pipe.scheduler.config),
                         [pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3],
                         [pipe.tokenizer, pipe.tokenizer_2, pipe.tokenizer_3], resolution=(32, 32),
                         guidance_scale=4.0, max_sequence_length=16)
    _inject_lora(adapter.module, 4, 8.0, adapter.lora_target_modules)
    with torch.no_grad():  # LoRA B starts at zero: make the adapters change the output
        for name, p in adapter.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return adapter


@pytest.fixture(scope="module")
def sd3():
    torch.set_num_threads(1)
    return _adapter(torch.float32, "cpu")


def _inputs(adapter, device="cpu"):
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(adapter.latent_shape([], res), generator=g).to(device) for res in RESOLUTIONS]
    sigma = torch.tensor([0.9, 0.5, 0.2, 0.7, 0.35], device=device)
    cond = adapter.encode([adapter.tokenize(f"{PROMPT} {i}") for i in range(len(xs))], device=device)
    return xs, sigma, cond


def _check_packed_equals_unpacked(adapter, cfg: bool, atol: float, rtol: float | None, device="cpu"):
    xs, sigma, cond = _inputs(adapter, device)
    if not cfg:
        cond = {k: v for k, v in cond.items() if not k.startswith("negative_")}
    assert adapter.has_negative(cond) == cfg
    with torch.no_grad():
        packed = adapter.velocity_packed(xs, sigma, cond)
        for i, x in enumerate(xs):
            row = {k: v[i:i + 1] for k, v in cond.items()}
            alone = adapter.velocity(x[None], sigma[i:i + 1], row)[0]
            assert packed[i].shape == x.shape and packed[i].dtype == torch.float32
            if rtol is None:  # bf16: GEMMs of other shapes round differently; bound the relative error norm
                assert (packed[i] - alone).norm() / alone.norm() < atol
            else:
                torch.testing.assert_close(packed[i], alone, atol=atol, rtol=rtol)


@pytest.mark.parametrize("cfg", [False, True])
def test_packed_velocity_equals_unpacked_fp32(sd3, cfg):
    """4 resolutions (one twice), LoRA active: each sample's packed velocity is its own forward's."""
    _check_packed_equals_unpacked(sd3, cfg, atol=1e-5, rtol=1e-5)


def test_packed_samples_do_not_see_each_other(sd3):
    """Changing one sample's latents (same shape as another's) changes only its own output."""
    xs, sigma, cond = _inputs(sd3)
    with torch.no_grad():
        before = sd3.velocity_packed(xs, sigma, cond)
        xs[2] = xs[2] + 1.0  # shares the 32x32 shape (and its attention call) with sample 0
        after = sd3.velocity_packed(xs, sigma, cond)
    for i in range(len(xs)):
        assert torch.equal(before[i], after[i]) == (i != 2)


def test_packed_forward_rejects_bad_input(sd3):
    module = sd3.module
    e, p, t = torch.zeros(1, 4, 32), torch.zeros(1, 32), torch.zeros(1)
    with pytest.raises(ValueError, match="latents is empty"):
        sd3_packed_forward(module, [], e, p, t)
    with pytest.raises(ValueError, match="multiples of patch_size 2"):
        sd3_packed_forward(module, [torch.zeros(4, 5, 4)], e, p, t)
    with pytest.raises(ValueError, match="timestep has batch 1 but 2"):
        sd3_packed_forward(module, [torch.zeros(4, 4, 4)] * 2, torch.zeros(2, 4, 32), torch.zeros(2, 32), t)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [False, True])
def test_packed_velocity_equals_unpacked_bf16_cuda(cfg):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    adapter = _adapter(torch.bfloat16, "cuda")
    _check_packed_equals_unpacked(adapter, cfg, atol=2e-2, rtol=None, device="cuda")  # ‖Δ‖/‖v‖ < 2%


@pytest.mark.gpu
def test_compiled_velocities_equal_eager_bf16_cuda():
    """As a compiled rollout runs it (`compile_adapter_module`: the blocks and the packed stages with
    Inductor's coordinate-descent tuning on real Triton kernels): unpacked and packed velocities
    equal the eager ones within bf16 rounding, and a second call is exactly the first."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from omnirl.models.compile import compile_adapter_module

    torch._dynamo.reset()
    adapter = _adapter(torch.bfloat16, "cuda")
    xs, sigma, cond = _inputs(adapter, "cuda")
    batch = torch.stack([xs[0], xs[2]])  # the two 32x32 samples
    rows = {k: v[[0, 2]] for k, v in cond.items()}
    with torch.no_grad():
        eager, eager_packed = adapter.velocity(batch, sigma[[0, 2]], rows), adapter.velocity_packed(xs, sigma, cond)
        assert compile_adapter_module(adapter) > 0
        compiled, packed = adapter.velocity(batch, sigma[[0, 2]], rows), adapter.velocity_packed(xs, sigma, cond)
        again = adapter.velocity(batch, sigma[[0, 2]], rows)
    assert ((compiled - eager).norm() / eager.norm()).item() < 2e-2
    for a, b in zip(eager_packed, packed, strict=True):
        assert ((b - a).norm() / a.norm()).item() < 2e-2
    assert torch.equal(again, compiled)


def _requests(adapter, sides, guidance=1.0):
    out = []
    for g, side in enumerate(sides):
        ids = tuple(adapter.tokenize(f"p{g} @{side}"))
        out += [SampleRequest(f"{g}:{i}", f"p{g}", ids, seed=10 * g + i, num_steps=4 + g % 2, window=(0, 1),
                              noise_level=0.8, sde_type="cps", shift=3.0, guidance_scale=guidance)
                for i in range(2)]
    return out


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_engine_packed_gives_the_samples_of_stepwise(guidance):
    """A fragmented workload (4 resolutions x 2 requests, two step counts): packing runs fewer,
    fuller forwards and returns the same samples, trajectories and log-probs."""
    torch.set_num_threads(1)
    adapter = BenchSD3Adapter(build_transformer(TINY, "cpu", torch.float32), text_tokens=6)
    adapter.guidance_scale = guidance
    reqs = _requests(adapter, [64, 96, 48, 80], guidance)
    runs = {}
    for batching in ("stepwise", "packed"):
        engine = RolloutEngine(adapter, max_batch_size=8, batching=batching)
        for r in reqs:
            engine.submit(r)
        runs[batching] = (engine.stats, {r.request.sample_id: r for r in engine.run_until_idle()})
    (s_stats, step), (p_stats, packed) = runs["stepwise"], runs["packed"]
    assert sorted(packed) == sorted(step) == sorted(r.sample_id for r in reqs)
    assert p_stats.sample_steps == s_stats.sample_steps == sum(r.num_steps for r in reqs)
    assert p_stats.forwards == 5 < s_stats.forwards  # all 8 samples per forward, 5 = the longest request
    for sid, a in step.items():
        b = packed[sid]
        assert b.x0.shape == a.x0.shape and b.image.shape == a.image.shape
        torch.testing.assert_close(b.x0, a.x0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.latents, a.latents, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.log_probs, a.log_probs, atol=1e-4, rtol=1e-4)


def test_engine_packed_needs_an_adapter_that_packs():
    class NoPacking:
        pass

    with pytest.raises(ValueError, match="velocity_packed"):
        RolloutEngine(NoPacking(), batching="packed")


@pytest.mark.slow
def test_compiled_stages_trace_whole_and_match(sd3):
    """The per-token stages compile as whole graphs (no graph break, LoRA included) over varying
    token counts; dynamo's eager backend keeps the test cheap, inductor is what `compile_packed` uses."""
    from omnirl.models.diffusers.sd3_packed import PackedBlock

    xs, sigma, cond = _inputs(sd3)
    with torch.no_grad():
        eager = sd3.velocity_packed(xs, sigma, cond)
        sd3._packed_block = PackedBlock({"backend": "eager", "dynamic": True, "fullgraph": True})
        try:
            traced = sd3.velocity_packed(xs, sigma, cond)
            fewer = sd3.velocity_packed(xs[1:], sigma[1:], {k: v[1:] for k, v in cond.items()})
        finally:
            del sd3._packed_block  # back to the class default (eager)
    for a, b in zip(eager + eager[1:], traced + fewer, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_requests_carry_their_own_resolution_through_the_engine(sd3):
    """`SampleRequest.resolution` (`model.resolutions`) sets each sample's latent and image size; a
    request without one gets the adapter's default (32²). Packed, the three sizes share every
    forward; step-wise, each size is its own bucket — and both give the same samples."""
    sizes = [(32, 48), (48, 32), None]
    ids = sd3.tokenize(PROMPT)
    reqs = [SampleRequest(f"{g}:{i}", PROMPT, tuple(ids), seed=5 * g + i, num_steps=3, window=(0,), noise_level=0.7,
                          resolution=size) for g, size in enumerate(sizes) for i in range(2)]
    runs = {}
    for batching in ("stepwise", "packed"):
        engine = RolloutEngine(sd3, max_batch_size=8, batching=batching)
        for r in reqs:
            engine.submit(r)
        results = {r.request.sample_id: r for r in engine.run_until_idle()}
        runs[batching] = (engine.stats.forwards, results)
    (s_forwards, step), (p_forwards, packed) = runs["stepwise"], runs["packed"]
    assert (p_forwards, s_forwards) == (3, 9)  # 3 steps; step-wise: 3 shape buckets x 3 steps
    for g, (h, w) in enumerate([(32, 48), (48, 32), (32, 32)]):
        for i in range(2):
            a, b = step[f"{g}:{i}"], packed[f"{g}:{i}"]
            assert tuple(a.x0.shape) == (4, h // 2, w // 2) and tuple(a.image.shape) == (h, w, 3)
            torch.testing.assert_close(b.x0, a.x0, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(b.log_probs, a.log_probs, atol=1e-3, rtol=1e-3)
