"""LTX-2 text→audio+video adapter on a tiny random LTX-2 pipeline of the real diffusers classes (CPU).

The pipeline (Gemma 3 with a tiny SigLIP tower, connectors, video VAE, audio VAE, vocoder, and a transformer with
both streams and their cross-attention both ways) is built and saved by `tests/video_models.py` and loaded back
through `LTX2Adapter.load`. References are diffusers' own `LTX2Pipeline`: `encode_prompt` + `connectors`, its
transformer call, its σ grid, its joint denoising loop and decode (plain CFG: STG, modality guidance and rescale
off), and `load_lora_weights`.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline  # noqa: E402
from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, retrieve_timesteps  # noqa: E402
from tests.video_models import MAX_SEQUENCE_LENGTH, save_tiny  # noqa: E402

from omnirl.algorithms import gaussian_log_prob, ode_step, sde_mean_std, sde_step  # noqa: E402
from omnirl.models.diffusers.ltx2 import LTX2Adapter  # noqa: E402
from omnirl.models.diffusers.video import VideoGeometry  # noqa: E402

PROMPT = 'a drum that says "hi"'
VIDEO = VideoGeometry(frames=9, height=32, width=32, fps=25.0)  # video [4, 5, 16, 16], audio [2, 9, 2]
GUIDANCE = {"video": {"guidance_scale": 4.0}, "audio": {"guidance_scale": 2.0}}
PLAIN_CFG = dict(stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0,
                 guidance_rescale=0.0, audio_guidance_rescale=0.0, spatio_temporal_guidance_blocks=None)


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    """(pipeline dir, LTX2Pipeline loaded from it, LTX2Adapter with CFG video 4, audio 2)."""
    torch.set_num_threads(1)
    path = save_tiny("ltx2", tmp_path_factory.mktemp("ltx2"))
    pipe = LTX2Pipeline.from_pretrained(path, local_files_only=True)
    adapter = LTX2Adapter.load(path, "cpu", torch.float32, video=VIDEO, modalities=GUIDANCE,
                               max_sequence_length=MAX_SEQUENCE_LENGTH)
    return path, pipe, adapter


def _noise(adapter: LTX2Adapter, batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, adapter.numel, generator=torch.Generator().manual_seed(seed))


def _lora(module, targets, rank: int = 2, alpha: float = 4.0) -> None:
    from omnirl.api.spec import LoRASpec
    from omnirl.models.lora import inject_lora

    inject_lora(module, LoRASpec(enabled=True, rank=rank, alpha=alpha), list(targets))


def _text(pipe: LTX2Pipeline, prompts: list[str]):
    """The pipeline's own conditioning: `encode_prompt`, then its connectors (negative rows first, as it batches)."""
    with torch.no_grad():
        pe, mask, ne, nmask = pipe.encode_prompt(prompts, negative_prompt="", max_sequence_length=MAX_SEQUENCE_LENGTH,
                                                 device="cpu")
        return pipe.connectors(torch.cat([ne, pe]), torch.cat([nmask, mask]), padding_side="left")


def test_slots_audio_length_and_media_shapes(ltx2):
    _, pipe, adapter = ltx2
    assert adapter.slots() == [("video", (4, 5, 16, 16)), ("audio", (2, 9, 2))]
    # audio latent frames: round(9 frames / 25 fps · 16000 Hz / hop 160 / 4), as LTX2Pipeline.__call__
    assert adapter.audio_latent_frames == round(9 / 25 * 16000 / 160 / 4) == 9
    assert adapter.latent_shape([]) == (4 * 5 * 16 * 16 + 2 * 9 * 2,)
    assert (adapter.guidance("video"), adapter.guidance("audio")) == (4.0, 2.0)
    media = adapter.decode_media(_noise(adapter, 2))
    assert media["video"].shape == (2, 9, 32, 32, 3) and media["video"].dtype == torch.uint8
    assert media["audio"].dtype == torch.float32 and media["audio"].shape[0] == 2 and media["audio"].abs().max() <= 1
    assert media["audio_sample_rate"].tolist() == [pipe.vocoder.config.output_sampling_rate] * 2


def test_encode_is_the_pipelines_gemma_and_connectors(ltx2):
    _, pipe, adapter = ltx2
    video, audio, mask = _text(pipe, [PROMPT])
    cond = adapter.encode([adapter.tokenize(PROMPT)])
    for ours, theirs in [(cond["negative_video_embeds"], video[:1]), (cond["video_embeds"], video[1:]),
                         (cond["negative_audio_embeds"], audio[:1]), (cond["audio_embeds"], audio[1:]),
                         (cond["attention_mask"], mask[1:]), (cond["negative_attention_mask"], mask[:1])]:
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours.float(), theirs.float(), atol=1e-5, rtol=0)


def test_velocity_is_the_pipelines_joint_call_with_cfg_per_modality(ltx2):
    """Packed video and audio tokens, σ·1000 as timestep and sigma, the clip's RoPE coordinates, one forward of
    [uncond; cond] rows, each stream guided with its own weight: `LTX2Pipeline.__call__`'s arithmetic."""
    _, pipe, adapter = ltx2
    x, sigma = _noise(adapter, 2, seed=3), torch.tensor([0.8, 0.35])
    v = adapter.velocity(x, sigma, adapter.encode([adapter.tokenize(PROMPT)] * 2))
    video, audio, mask = _text(pipe, [PROMPT] * 2)
    parts = adapter.split(x)
    lat = pipe._pack_latents(parts["video"], 1, 1)
    alat = pipe._pack_audio_latents(parts["audio"])
    t = torch.cat([sigma, sigma]) * 1000
    with torch.no_grad():
        coords = pipe.transformer.rope.prepare_video_coords(4, 5, 16, 16, "cpu", fps=25.0)
        acoords = pipe.transformer.audio_rope.prepare_audio_coords(4, 9, "cpu")
        ov, oa = pipe.transformer(hidden_states=torch.cat([lat, lat]), audio_hidden_states=torch.cat([alat, alat]),
                                  encoder_hidden_states=video, audio_encoder_hidden_states=audio, timestep=t, sigma=t,
                                  encoder_attention_mask=mask, audio_encoder_attention_mask=mask, num_frames=5,
                                  height=16, width=16, fps=25.0, audio_num_frames=9, video_coords=coords,
                                  audio_coords=acoords, use_cross_timestep=True, return_dict=False)
    (vu, vc), (au, ac) = ov.chunk(2), oa.chunk(2)
    expected = adapter.join({"video": pipe._unpack_latents(vu + 4.0 * (vc - vu), 5, 16, 16, 1, 1),
                             "audio": pipe._unpack_audio_latents(au + 2.0 * (ac - au), 9, num_mel_bins=2)})
    torch.testing.assert_close(v, expected, atol=1e-5, rtol=1e-5)


def test_sigma_grid_is_the_pipelines(ltx2):
    _, pipe, adapter = ltx2
    for steps in (1, 3, 24):
        scheduler = copy.deepcopy(pipe.scheduler)
        mu = calculate_shift(1280, scheduler.config.get("base_image_seq_len", 1024),
                             scheduler.config.get("max_image_seq_len", 4096), scheduler.config.get("base_shift", 0.95),
                             scheduler.config.get("max_shift", 2.05))
        retrieve_timesteps(scheduler, steps, "cpu", None, sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        assert torch.equal(adapter.sigma_grid(steps, (adapter.numel,)), scheduler.sigmas.float())
    # LTX-2's own config shifts dynamically with the video token count
    dynamic = {**pipe.scheduler.config, "use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05,
               "base_image_seq_len": 1024, "max_image_seq_len": 4096}
    adapter_grid = LTX2Adapter.sigmas.__get__(type("A", (), {"scheduler_config": dynamic})())(24, 3072)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(dynamic)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 24, 24), mu=calculate_shift(3072, 1024, 4096, 0.95, 2.05))
    assert torch.equal(adapter_grid, scheduler.sigmas.float()) and adapter_grid[1] > 1 - 1 / 24


def test_joint_denoising_loop_and_decode_match_the_pipeline(ltx2):
    """Our Euler ODE loop over the flat joint latent + `decode_media` reproduce `LTX2Pipeline.__call__` (CFG video 4,
    audio 2, plain guidance): the video frames and the waveform (channels averaged)."""
    _, pipe, adapter = ltx2
    noise, steps = _noise(adapter, 1, seed=7), 3
    parts = adapter.split(noise)
    kwargs = dict(prompt=PROMPT, negative_prompt="", height=32, width=32, num_frames=9, frame_rate=25.0,
                  num_inference_steps=steps, guidance_scale=4.0, audio_guidance_scale=2.0,
                  max_sequence_length=MAX_SEQUENCE_LENGTH, latents=pipe._pack_latents(parts["video"], 1, 1),
                  audio_latents=parts["audio"].clone(), **PLAIN_CFG)
    with torch.no_grad():
        out = pipe(**kwargs, output_type="pt")
        cond = adapter.encode([adapter.tokenize(PROMPT)])
        grid, x = adapter.sigma_grid(steps, (adapter.numel,)), noise
        for k in range(steps):
            x = ode_step(x, adapter.velocity(x, grid[k:k + 1], cond), grid[k:k + 1], grid[k + 1:k + 2])
        media = adapter.decode_media(x)
    frames = (out.frames[0].permute(0, 2, 3, 1) * 255).round().to(torch.int16)  # [F, H, W, 3]
    assert media["video"][0].shape == frames.shape == (9, 32, 32, 3)
    assert (media["video"][0].to(torch.int16) - frames).abs().max() <= 1
    torch.testing.assert_close(media["audio"][0], out.audio[0].float().mean(dim=0).clamp(-1, 1), atol=1e-5, rtol=1e-5)


def test_lora_joint_forward_backward_ratio_one_and_loads_in_ltx2_pipeline(ltx2, tmp_path):
    """LoRA on q/k/v/out of all six attentions of every block; an SDE step over the joint latent recomputed with
    gradients gives ratio 1 and trains both streams; the adapters load with `LTX2Pipeline.load_lora_weights`."""
    from omnirl.models.diffusers.lora_io import diffusers_lora_state, save_lora_state

    path, _, adapter = ltx2
    original, adapter.module = adapter.module, copy.deepcopy(adapter.module)
    try:
        _lora(adapter.module, adapter.lora_target_modules)
        names = [n for n, _ in adapter.module.named_parameters() if "lora_A" in n]
        attentions = {"attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn"}
        assert len(names) == 2 * 6 * 4 and {n.split(".")[2] for n in names} == attentions
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
        trained = {n.split(".")[2] for n, p in adapter.module.named_parameters()
                   if "lora_B" in n and p.grad is not None and bool(p.grad.abs().sum() > 0)}
        assert trained == attentions  # the joint backward reaches every attention of both streams

        save_lora_state(LTX2Adapter.pipeline, diffusers_lora_state(adapter.module.named_parameters()), 2, 4.0,
                        tmp_path / "lora")
        fresh = LTX2Pipeline.from_pretrained(path, local_files_only=True)
        fresh.load_lora_weights(str(tmp_path / "lora"))
        cond = adapter.encode([adapter.tokenize(PROMPT)])
        with torch.no_grad():
            ours = adapter.velocity(x[:1], sigma[:1], cond)
            trained_module, adapter.module = adapter.module, fresh.transformer
            theirs = adapter.velocity(x[:1], sigma[:1], cond)
            adapter.module = original
            base = adapter.velocity(x[:1], sigma[:1], cond)
            adapter.module = trained_module
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
        assert (ours - base).abs().max() > 1e-4
    finally:
        adapter.module = original


def test_unguided_audio_is_the_conditional_stream_and_bad_settings_are_refused(ltx2):
    _, _, a = ltx2

    def build(video=VIDEO, **kwargs):
        return LTX2Adapter(a.module, a.vae, a.audio_vae, a.vocoder, a.scheduler_config, a.text_encoder, a.tokenizers[0],
                           a.connectors, video=video, max_sequence_length=MAX_SEQUENCE_LENGTH, **kwargs)

    adapter = a
    plain = build(modalities={"video": {"guidance_scale": 4.0}, "audio": {"guidance_scale": 1.0}})
    unguided = build()
    assert not unguided.cfg_enabled and plain.cfg_enabled
    x, sigma = _noise(adapter, 1, seed=9), torch.tensor([0.5])
    ids = [adapter.tokenize(PROMPT)]
    with torch.no_grad():
        v_plain, v_cond = plain.velocity(x, sigma, plain.encode(ids)), unguided.velocity(x, sigma, unguided.encode(ids))
    # the guided run's forward holds 2 rows: equal up to the rounding of a batch of 2
    torch.testing.assert_close(plain.split(v_plain)["audio"], unguided.split(v_cond)["audio"], atol=1e-6, rtol=0)
    assert (plain.split(v_plain)["video"] - unguided.split(v_cond)["video"]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="makes video, audio; spec.model.modalities names image"):
        build(modalities={"image": {}})
    with pytest.raises(ValueError, match=r"spec.model.video.frames: 8 .*nearest valid: 7 or 9"):
        build(VideoGeometry(8, 32, 32, 25.0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_cuda_keeps_the_fp32_boundary_and_ratio_one(ltx2):
    """bfloat16 weights on a GPU: latents and velocities stay float32 at the adapter's boundary, an SDE step's
    log-prob recomputed gives ratio 1, and the media decode."""
    path, _, _ = ltx2
    adapter = LTX2Adapter.load(path, "cuda", torch.bfloat16, video=VIDEO, modalities=GUIDANCE, max_sequence_length=MAX_SEQUENCE_LENGTH)
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
