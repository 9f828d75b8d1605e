"""Wan text→video adapter on a tiny random Wan 2.1 pipeline of the real diffusers classes (CPU).

The pipeline (UMT5, a 16-channel `AutoencoderKLWan` with factors 4 and 8, `WanTransformer3DModel`, UniPC flow
scheduler) is built and saved by `tests/video_models.py` and loaded back through `WanAdapter.load`. References are
diffusers' own `WanPipeline`: `encode_prompt`, its transformer call, its scheduler's σ, its denoising loop and
decode, and `load_lora_weights`.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline  # noqa: E402
from tests.video_models import MAX_SEQUENCE_LENGTH, save_tiny, wan_pipeline  # noqa: E402

from omnirl.algorithms import gaussian_log_prob, ode_step, sde_mean_std, sde_step  # noqa: E402
from omnirl.models.diffusers.video import VideoGeometry  # noqa: E402
from omnirl.models.diffusers.wan import WanAdapter  # noqa: E402

PROMPT = 'a sign that says "hi 42"'
VIDEO = VideoGeometry(frames=9, height=16, width=16, fps=8.0)  # latents [16, 3, 2, 2]: 3 latent frames, 4 tokens each


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """(pipeline dir, WanPipeline loaded from it, WanAdapter with CFG 4)."""
    torch.set_num_threads(1)
    path = save_tiny("wan", tmp_path_factory.mktemp("wan"))
    pipe = WanPipeline.from_pretrained(path, local_files_only=True)
    adapter = WanAdapter.load(path, "cpu", torch.float32, video=VIDEO, guidance_scale=4.0,
                              max_sequence_length=MAX_SEQUENCE_LENGTH)
    return path, pipe, adapter


def _noise(adapter: WanAdapter, batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, adapter.numel, generator=torch.Generator().manual_seed(seed))


def _lora(module, rank: int = 2, alpha: float = 4.0, targets=None, name: str = "default") -> None:
    from omnirl.api.spec import LoRASpec
    from omnirl.models.lora import inject_lora

    inject_lora(module, LoRASpec(enabled=True, rank=rank, alpha=alpha), list(targets), name)


def test_flat_latent_slots_and_media_shapes(wan):
    _, _, adapter = wan
    assert adapter.time_convention == "sigma" and adapter.cfg_enabled
    assert adapter.slots() == [("video", (16, 3, 2, 2))]
    assert adapter.latent_shape(adapter.tokenize(PROMPT)) == (192,) == (adapter.numel,)
    assert adapter.video_seq_len() == 3 * 1 * 1
    x = _noise(adapter, 2)
    assert torch.equal(adapter.join(adapter.split(x)), x)
    v = adapter.velocity(x, torch.tensor([0.9, 0.3]), adapter.encode([adapter.tokenize(PROMPT)] * 2))
    assert v.shape == (2, 192) and v.dtype == torch.float32 and torch.isfinite(v).all()
    media = adapter.decode_media(x)
    assert media["video"].shape == (2, 9, 16, 16, 3) and media["video"].dtype == torch.uint8
    assert media["fps"].tolist() == [8.0, 8.0]
    assert torch.equal(adapter.decode(x), media["video"][:, 4])  # the poster frame is the middle one
    with pytest.raises(ValueError, match="no model.resolutions for video"):
        adapter.latent_shape([], resolution=(32, 32))


def test_encode_is_the_pipelines_encode_prompt(wan):
    _, pipe, adapter = wan
    cond = adapter.encode([adapter.tokenize(PROMPT)])
    with torch.no_grad():
        pe, ne = pipe.encode_prompt(PROMPT, do_classifier_free_guidance=True, max_sequence_length=MAX_SEQUENCE_LENGTH,
                                    device="cpu")
    assert cond["prompt_embeds"].shape == pe.shape == (1, MAX_SEQUENCE_LENGTH, 32)
    torch.testing.assert_close(cond["prompt_embeds"], pe, atol=1e-6, rtol=0)
    torch.testing.assert_close(cond["negative_prompt_embeds"], ne, atol=1e-6, rtol=0)
    short = adapter.encode([adapter.tokenize("hi")])["prompt_embeds"][0]
    n = len(adapter.tokenize("hi"))
    assert n < MAX_SEQUENCE_LENGTH and short[n:].abs().max() == 0 < short[:n].abs().max()  # zero past the prompt


def test_velocity_is_the_pipelines_transformer_call_with_cfg(wan):
    """σ·1000 as timestep, [uncond; cond] rows, v_u + w·(v_c − v_u): `WanPipeline.__call__`'s arithmetic."""
    _, pipe, adapter = wan
    x, sigma = _noise(adapter, 2, seed=3), torch.tensor([0.8, 0.35])  # two σ in one batch
    seen = {}
    hook = adapter.module.register_forward_hook(lambda m, a, kw, out: seen.update(kw), with_kwargs=True)
    v = adapter.velocity(x, sigma, adapter.encode([adapter.tokenize(PROMPT)] * 2))
    hook.remove()
    with torch.no_grad():
        pe, ne = pipe.encode_prompt([PROMPT] * 2, max_sequence_length=MAX_SEQUENCE_LENGTH, device="cpu")
        latents = x.reshape(2, 16, 3, 2, 2)
        cond = pipe.transformer(hidden_states=latents, timestep=sigma * 1000, encoder_hidden_states=pe,
                                return_dict=False)[0]
        uncond = pipe.transformer(hidden_states=latents, timestep=sigma * 1000, encoder_hidden_states=ne,
                                  return_dict=False)[0]
    expected = (uncond + 4.0 * (cond - uncond)).reshape(2, -1)
    torch.testing.assert_close(v, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen["timestep"], torch.cat([sigma, sigma]) * 1000, atol=1e-4, rtol=0)


@pytest.mark.parametrize("steps", [1, 4, 20])
def test_sigma_grid_is_the_pipelines_scheduler(wan, steps):
    _, pipe, adapter = wan
    scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config)
    scheduler.set_timesteps(steps)
    grid = adapter.sigma_grid(steps, (adapter.numel,))
    assert torch.equal(grid, scheduler.sigmas.float()) and grid.shape == (steps + 1,) and grid[-1] == 0
    assert adapter.sigma_grid(steps, (adapter.numel,), shift=3.0)[0] == 1.0  # the manifest's override


def test_denoising_loop_and_decode_match_the_pipeline(wan, tmp_path):
    """Our Euler ODE loop on the adapter's grid + `decode_media` reproduce `WanPipeline.__call__` with a flow-match
    Euler scheduler (CFG 4), latents and frames."""
    path, _, _ = wan
    pipe = WanPipeline.from_pretrained(path, local_files_only=True)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    adapter = WanAdapter.load(path, "cpu", torch.float32, video=VIDEO, guidance_scale=4.0,
                              max_sequence_length=MAX_SEQUENCE_LENGTH)
    adapter.scheduler_config = dict(pipe.scheduler.config)
    noise, steps = _noise(adapter, 1, seed=7), 3
    kwargs = dict(prompt=PROMPT, height=16, width=16, num_frames=9, num_inference_steps=steps, guidance_scale=4.0,
                  max_sequence_length=MAX_SEQUENCE_LENGTH, latents=noise.reshape(1, 16, 3, 2, 2))
    with torch.no_grad():
        theirs = pipe(**kwargs, output_type="latent").frames
        frames = pipe(**kwargs, output_type="np").frames
        cond = adapter.encode([adapter.tokenize(PROMPT)])
        grid, x = adapter.sigma_grid(steps, (adapter.numel,)), noise
        for k in range(steps):
            x = ode_step(x, adapter.velocity(x, grid[k:k + 1], cond), grid[k:k + 1], grid[k + 1:k + 2])
    torch.testing.assert_close(x, theirs.reshape(1, -1), atol=1e-5, rtol=1e-5)
    ours = adapter.decode_media(x)["video"][0].to(torch.int16)
    expected = torch.from_numpy((frames[0] * 255).round().astype(np.int16))
    assert ours.shape == expected.shape == (9, 16, 16, 3)
    assert (ours - expected).abs().max() <= 1


def test_lora_on_the_default_targets_ratio_one_and_loads_in_wan_pipeline(wan, tmp_path):
    """LoRA lands on q/k/v/out of both attentions of every block; a rollout SDE step's log-prob recomputed with
    gradients gives ratio 1; the adapters saved in diffusers' format load with `WanPipeline.load_lora_weights` and
    give the same velocity."""
    from omnirl.models.diffusers.lora_io import diffusers_lora_state, save_lora_state

    path, _, adapter = wan
    original, adapter.module = adapter.module, copy.deepcopy(adapter.module)
    try:
        _lora(adapter.module, 2, 4.0, adapter.lora_target_modules)
        names = [n for n, _ in adapter.module.named_parameters() if "lora_A.default" in n]
        assert len(names) == 2 * 2 * 4  # 2 blocks x (attn1, attn2) x (to_q, to_k, to_v, to_out.0)
        assert {n.split(".")[2] for n in names} == {"attn1", "attn2"}
        with torch.no_grad():
            for n, p in adapter.module.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        ids = [adapter.tokenize(PROMPT), adapter.tokenize("x")]
        x, sigma, sigma_next = _noise(adapter, 2, seed=5), torch.tensor([1.0, 0.6]), torch.tensor([0.8, 0.4])
        with torch.no_grad():
            step = sde_step(x, adapter.velocity(x, sigma, adapter.encode(ids)), sigma, sigma_next, 0.7,
                            generator=torch.Generator().manual_seed(1))
        v = adapter.velocity(x, sigma, adapter.encode(ids), detach_uncond=True)
        mean, std = sde_mean_std(x, v, sigma, sigma_next, 0.7)
        ratio = torch.exp(gaussian_log_prob(step.x_next, mean, std) - step.log_prob)
        assert torch.allclose(ratio, torch.ones(2), atol=1e-6, rtol=0)
        ratio.sum().backward()
        grads = [p.grad for n, p in adapter.module.named_parameters() if "lora_B" in n]
        assert all(g is not None and bool(g.abs().sum() > 0) for g in grads)

        state = diffusers_lora_state(adapter.module.named_parameters())
        save_lora_state(WanAdapter.pipeline, state, 2, 4.0, tmp_path / "lora")
        fresh = WanPipeline.from_pretrained(path, local_files_only=True)
        fresh.load_lora_weights(str(tmp_path / "lora"))
        cond = adapter.encode([adapter.tokenize(PROMPT)])
        with torch.no_grad():
            ours = adapter.velocity(x[:1], sigma[:1], cond)
            trained, adapter.module = adapter.module, fresh.transformer
            theirs = adapter.velocity(x[:1], sigma[:1], cond)
            adapter.module = trained
        torch.testing.assert_close(theirs, ours, atol=1e-6, rtol=1e-6)
        assert (ours - adapter_velocity(original, adapter, x[:1], sigma[:1], cond)).abs().max() > 1e-4
    finally:
        adapter.module = original


def adapter_velocity(module, adapter, x, sigma, cond):
    """The adapter's velocity with `module` swapped in (restored after)."""
    kept, adapter.module = adapter.module, module
    try:
        with torch.no_grad():
            return adapter.velocity(x, sigma, cond)
    finally:
        adapter.module = kept


def test_per_token_timesteps_of_wan22_give_the_same_velocity(tmp_path):
    """Wan 2.2-TI2V's `expand_timesteps` (one timestep per token, `model_index.json`) reaches the transformer as
    `[B, tokens]`; with every token at σ it is the per-sample call."""
    torch.set_num_threads(1)
    wan_pipeline(expand_timesteps=True).save_pretrained(tmp_path / "wan22")
    adapter = WanAdapter.load(tmp_path / "wan22", "cpu", torch.float32, video=VIDEO,
                              max_sequence_length=MAX_SEQUENCE_LENGTH)
    assert adapter.expand_timesteps
    x, sigma = _noise(adapter, 2, seed=2), torch.tensor([0.7, 0.2])
    cond = adapter.encode([adapter.tokenize(PROMPT)] * 2)
    seen = {}
    hook = adapter.module.register_forward_hook(lambda m, a, kw, out: seen.update(kw), with_kwargs=True)
    with torch.no_grad():
        per_token = adapter.velocity(x, sigma, cond)
    hook.remove()
    assert seen["timestep"].shape == (2, 3)
    adapter.expand_timesteps = False
    with torch.no_grad():
        torch.testing.assert_close(adapter.velocity(x, sigma, cond), per_token, atol=1e-5, rtol=1e-5)


def test_two_expert_wan22_and_bad_geometry_are_refused(wan, tmp_path):
    path, _, _ = wan
    copy_dir = tmp_path / "a14b"
    shutil.copytree(path, copy_dir)
    index = json.loads((copy_dir / "model_index.json").read_text())
    (copy_dir / "model_index.json").write_text(json.dumps({**index, "boundary_ratio": 0.875}))
    with pytest.raises(ValueError, match="two-expert Wan 2.2.*Wan2.2-TI2V-5B"):
        WanAdapter.load(copy_dir, "cpu", torch.float32, video=VIDEO)
    with pytest.raises(ValueError, match=r"spec.model.video.frames: 10 .*4k\+1.*nearest valid: 9 or 13"):
        WanAdapter.load(path, "cpu", torch.float32, video=VideoGeometry(10, 16, 16, 8.0))
    with pytest.raises(ValueError, match="spec.model.video.width: 24 is not a multiple of 16.*nearest valid: 16 or 32"):
        WanAdapter.load(path, "cpu", torch.float32, video=VideoGeometry(9, 16, 24, 8.0))


def test_bf16_checkpoint_runs_in_bf16_despite_its_fp32_kept_first_parameter(wan):
    """Wan keeps `scale_shift_table` (its first parameter) in float32: the compute dtype is the patch
    embedding's, so a bfloat16 checkpoint's forward gets bfloat16 latents (a float32 input fails in conv3d)."""
    path, _, _ = wan
    adapter = WanAdapter.load(path, "cpu", torch.bfloat16, video=VIDEO, max_sequence_length=MAX_SEQUENCE_LENGTH)
    assert next(adapter.module.parameters()).dtype == torch.float32
    assert adapter.compute_dtype() == torch.bfloat16
    with torch.no_grad():
        v = adapter.velocity(_noise(adapter, 1), torch.tensor([0.5]), adapter.encode([adapter.tokenize(PROMPT)], "cpu"))
    assert v.dtype == torch.float32 and v.shape == (1, adapter.numel) and torch.isfinite(v).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_cuda_keeps_the_fp32_boundary_and_ratio_one(wan):
    """bfloat16 weights on a GPU: latents and velocities stay float32 at the adapter's boundary, an SDE step's
    log-prob recomputed gives ratio 1, and the media decode."""
    path, _, _ = wan
    adapter = WanAdapter.load(path, "cuda", torch.bfloat16, video=VIDEO, guidance_scale=4.0, max_sequence_length=MAX_SEQUENCE_LENGTH)
    ids = [adapter.tokenize(PROMPT)] * 2
    x = torch.randn(2, adapter.numel, generator=torch.Generator().manual_seed(0)).cuda()
    sigma, sigma_next = torch.tensor([0.9, 0.5], device="cuda"), torch.tensor([0.7, 0.3], device="cuda")
    with torch.no_grad():
        v = adapter.velocity(x, sigma, adapter.encode(ids, "cuda"))
        step = sde_step(x, v, sigma, sigma_next, 0.7)
        v2 = adapter.velocity(x, sigma, adapter.encode(ids, "cuda"))
    assert v.dtype == torch.float32 and adapter.compute_dtype() == torch.bfloat16
    mean, std = sde_mean_std(x, v2, sigma, sigma_next, 0.7)
    ratio = torch.exp(gaussian_log_prob(step.x_next, mean, std) - step.log_prob)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0)
    media = adapter.decode_media(step.x_next)
    assert media["video"].shape[:2] == (2, VIDEO.frames) and media["video"].dtype == torch.uint8
