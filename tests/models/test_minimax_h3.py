"""MiniMax-H3 text→audio+video adapter on a tiny random MiniMax-H3 directory of the real diffusers classes (CPU).

The directory (Qwen3-VL with 51 layers, the video and audio VAEs, the transformer, two schedulers) is written by
`MiniMaxH3ModularPipeline.save_pretrained` in `tests/video_models.py` and loaded back through
`MiniMaxH3Adapter.load`. References are diffusers' own modular pipeline: `get_qwen3vl_prompt_embeds`, the packed
layout and row timesteps of its blocks, and its whole `t2va` denoising loop and decode, run from the text
embeddings on (its Qwen3-VL processor needs torchvision, which this machine lacks; for a text-only prompt it only
marks no vision tokens). The pipeline is given its video grid for the audio too: the adapter's joint latent has one σ.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers import MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel  # noqa: E402
from diffusers.modular_pipelines import MiniMaxH3Blocks, MiniMaxH3ModularPipeline  # noqa: E402
from diffusers.modular_pipelines.minimax_h3.before_denoise import (  # noqa: E402
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds  # noqa: E402
from tests.video_models import MAX_SEQUENCE_LENGTH, save_tiny  # noqa: E402
from transformers import Qwen3VLProcessor  # noqa: E402

from omnirl.algorithms import gaussian_log_prob, ode_step, sde_mean_std, sde_step  # noqa: E402
from omnirl.models.diffusers.minimax_h3 import MiniMaxH3Adapter  # noqa: E402
from omnirl.models.diffusers.video import VideoGeometry  # noqa: E402

PROMPT = 'a robot sings "la"'
VIDEO = VideoGeometry(frames=124, height=32, width=32, fps=24.0)  # 5.17 s: video [4, 37, 2, 2], audio [2, 4, 207]


@pytest.fixture(scope="module")
def h3(tmp_path_factory):
    torch.set_num_threads(1)
    path = save_tiny("minimax-h3", tmp_path_factory.mktemp("h3"))
    return path, MiniMaxH3Adapter.load(path, "cpu", torch.float32, video=VIDEO, max_sequence_length=MAX_SEQUENCE_LENGTH)


def _noise(adapter, batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, adapter.numel, generator=torch.Generator().manual_seed(seed))


def _text_only_processor(text_encoder) -> Qwen3VLProcessor:
    """The processor's token typing without its image/video processors (which need torchvision): the method the
    pipeline calls, on an object carrying the vision token ids of the text encoder's config."""
    processor = Qwen3VLProcessor.__new__(Qwen3VLProcessor)
    processor.image_token_ids = [text_encoder.config.image_token_id]
    processor.video_token_ids = [text_encoder.config.video_token_id]
    processor.audio_token_ids = []
    return processor


def test_slots_grid_and_media_shapes(h3):
    _, adapter = h3
    assert adapter.time_convention == "data_progress" and not adapter.cfg_enabled
    # 124 = 17·7 + 5 frames → 7·5 + 2 latent frames; audio round(124/24·40) = 207 latents per stereo channel
    assert adapter.slots() == [("video", (4, 37, 2, 2)), ("audio", (2, 4, 207))]
    assert adapter.latent_shape([]) == (4 * 37 * 4 + 2 * 4 * 207,)
    for steps in (1, 3, 10):
        scheduler = MiniMaxH3Scheduler(shift=12.0)
        scheduler.set_timesteps(steps + 1)  # H3 counts grid points, the terminal 0 included
        assert torch.equal(adapter.sigma_grid(steps, (adapter.numel,)), scheduler.sigmas)
    audio = MiniMaxH3Scheduler(shift=3.0)
    audio.set_timesteps(11)
    grid = adapter.sigma_grid(10, (adapter.numel,))
    torch.testing.assert_close(adapter.modality_sigmas(grid)["audio"], audio.sigmas, atol=1e-6, rtol=0)
    media = adapter.decode_media(_noise(adapter, 2))
    assert media["video"].shape == (2, 124, 32, 32, 3) and media["video"].dtype == torch.uint8
    assert media["audio"].shape == (2, 207 * 4) and media["audio_sample_rate"].tolist() == [160, 160]


def test_encode_is_the_pipelines_qwen3vl_hidden_state_50(h3):
    _, adapter = h3
    ids = adapter.tokenize(PROMPT)
    cond = adapter.encode([ids, adapter.tokenize("b")])
    with torch.no_grad():
        theirs = get_qwen3vl_prompt_embeds(adapter.text_encoder, _text_only_processor(adapter.text_encoder), ids, {},
                                           text_encoder_layer=50, device="cpu", dtype=torch.float32)
    n = len(ids)
    assert cond["text_length"].tolist() == [n, 1] and theirs.shape == (1, n, 16)
    torch.testing.assert_close(cond["prompt_embeds"][:1, :n], theirs, atol=1e-6, rtol=0)
    assert cond["prompt_embeds"][1, 1:].abs().max() == 0  # padded past each prompt


def test_velocity_is_the_negated_packed_forward_at_one_minus_sigma(h3):
    """`[text | audio | video]` rows from the pipeline's own layout builder, t = 1 − σ for every row, and the output
    negated (the transformer's velocity points to the data); samples of different σ and text length in one call."""
    _, adapter = h3
    x, sigma = _noise(adapter, 2, seed=3), torch.tensor([0.9, 0.4])
    prompts = [PROMPT, "ab"]
    cond = adapter.encode([adapter.tokenize(p) for p in prompts])
    v = adapter.velocity(x, sigma, cond)
    parts = adapter.split(x)
    for i, prompt in enumerate(prompts):
        n = len(adapter.tokenize(prompt))
        layout = MiniMaxH3PrepareLayoutStep.build_packed_sequence(torch.ones(n, dtype=torch.long), 37, 2, 2, 207,
                                                                 (1, 2, 2), 2, 2, 0)
        position_ids, token_tags, video_idx, audio_idx, text_idx, _, _ = layout
        t = 1.0 - float(sigma[i])
        timestep, index = MiniMaxH3SetTimestepsStep.build_row_timesteps(video_idx, audio_idx, 0, 0, n, t, t, t, 1.0)
        with torch.no_grad():
            out_v, out_a = adapter.module(
                hidden_states=patchify_video_latents(parts["video"][i:i + 1], (1, 2, 2))[None],
                audio_hidden_states=parts["audio"][i].permute(0, 2, 1).reshape(-1, 4)[None],
                encoder_hidden_states=cond["prompt_embeds"][i:i + 1, :n], timestep=timestep, timestep_indices=index,
                token_tags=token_tags, position_ids=position_ids, video_indices=video_idx, audio_indices=audio_idx,
                text_indices=text_idx, return_dict=False)
        ours = adapter.split(v[i:i + 1])
        video = out_v.reshape(1, 37, 1, 1, 4, 1, 2, 2).permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(1, 4, 37, 2, 2)
        torch.testing.assert_close(ours["video"], -video, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours["audio"], -out_a.reshape(1, 2, 207, 4).permute(0, 1, 3, 2), atol=1e-5,
                                   rtol=1e-5)


def test_denoising_loop_and_decode_match_the_modular_pipeline(h3):
    """Our Euler ODE loop over the joint latent + `decode_media` reproduce the `t2va` blocks of
    `MiniMaxH3ModularPipeline` from the text embeddings on (its audio scheduler set to the video's grid): frames
    exactly, the stereo waveform averaged to mono."""
    path, adapter = h3
    blocks = MiniMaxH3Blocks()
    blocks.sub_blocks.pop("text_encoder")
    pipe = blocks.init_pipeline(str(path))
    pipe.load_components(torch_dtype=torch.float32)
    pipe.update_components(audio_scheduler=MiniMaxH3Scheduler(shift=12.0))
    cond = adapter.encode([adapter.tokenize(PROMPT)])
    n, steps = int(cond["text_length"][0]), 3
    x = _noise(adapter, 1, seed=7)
    parts = adapter.split(x)
    with torch.no_grad():
        state = pipe(prompt_embeds=cond["prompt_embeds"][:, :n], text_token_tags=torch.ones(n, dtype=torch.long),
                     height=32, width=32, num_frames=124, num_inference_steps=steps + 1,
                     latents=parts["video"].clone(), audio_latents=parts["audio"][0].clone(), output_type="pt")
        grid = adapter.sigma_grid(steps, (adapter.numel,))
        for k in range(steps):
            x = ode_step(x, adapter.velocity(x, grid[k:k + 1], cond), grid[k:k + 1], grid[k + 1:k + 2])
        media = adapter.decode_media(x)
    frames = (state.get("videos")[0].permute(0, 2, 3, 1) * 255).round().to(torch.int16)
    assert media["video"][0].shape == frames.shape == (124, 32, 32, 3)
    assert (media["video"][0].to(torch.int16) - frames).abs().max() <= 1
    torch.testing.assert_close(media["audio"][0], state.get("audio")[0].mean(dim=0).clamp(-1, 1), atol=1e-5, rtol=0)


def test_fp32_modules_kept_lora_ratio_one_and_loads_in_the_modular_pipeline(h3, tmp_path):
    """bfloat16 loading keeps `_keep_in_fp32_modules` float32; LoRA lands on the attention projections of the blocks
    and the token refiner; ratio 1 with gradients into both heads; `MiniMaxH3ModularPipeline.load_lora_weights`
    loads what `save_lora_weights` wrote and gives the same velocity."""
    from omnirl.api.spec import LoRASpec
    from omnirl.models.diffusers.lora_io import diffusers_lora_state, save_lora_state
    from omnirl.models.lora import inject_lora

    path, adapter = h3
    half = MiniMaxH3Transformer3DModel.from_pretrained(path / "transformer", torch_dtype=torch.bfloat16)
    dtypes = {n.split(".")[0]: p.dtype for n, p in half.named_parameters()}
    assert dtypes["proj_in"] == dtypes["audio_proj_out"] == dtypes["time_embedder"] == torch.float32
    assert dtypes["transformer_blocks"] == dtypes["context_embedder"] == torch.bfloat16

    original, adapter.module = adapter.module, copy.deepcopy(adapter.module)
    try:
        inject_lora(adapter.module, LoRASpec(enabled=True, rank=2, alpha=4.0), adapter.lora_target_modules)
        names = [n for n, _ in adapter.module.named_parameters() if "lora_A" in n]
        assert len(names) == 3 * 4 and any(n.startswith("token_refiner.") for n in names)
        with torch.no_grad():
            for n, p in adapter.module.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        ids = [adapter.tokenize(PROMPT), adapter.tokenize("x")]
        x, sigma, sigma_next = _noise(adapter, 2, seed=5), torch.tensor([1.0, 0.6]), torch.tensor([0.8, 0.4])
        with torch.no_grad():
            step = sde_step(x, adapter.velocity(x, sigma, adapter.encode(ids)), sigma, sigma_next, 0.7,
                            generator=torch.Generator().manual_seed(1))
        v = adapter.velocity(x, sigma, adapter.encode(ids))
        mean, std = sde_mean_std(x, v, sigma, sigma_next, 0.7)
        ratio = torch.exp(gaussian_log_prob(step.x_next, mean, std) - step.log_prob)
        assert torch.allclose(ratio, torch.ones(2), atol=1e-6, rtol=0)
        ratio.sum().backward()
        assert all(p.grad is not None and bool(p.grad.abs().sum() > 0)
                   for n, p in adapter.module.named_parameters() if "lora_B" in n and "transformer_blocks" in n)

        save_lora_state(MiniMaxH3Adapter.pipeline, diffusers_lora_state(adapter.module.named_parameters()), 2, 4.0,
                        tmp_path / "lora")
        pipe = MiniMaxH3ModularPipeline.from_pretrained(str(path))
        pipe.load_components(names=["transformer"], torch_dtype=torch.float32)
        pipe.load_lora_weights(str(tmp_path / "lora"))
        cond = adapter.encode([adapter.tokenize(PROMPT)])
        with torch.no_grad():
            ours = adapter.velocity(x[:1], sigma[:1], cond)
            trained, adapter.module = adapter.module, pipe.transformer
            theirs = adapter.velocity(x[:1], sigma[:1], cond)
            adapter.module = trained
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    finally:
        adapter.module = original


def test_geometry_fps_duration_and_guidance_are_checked(h3):
    _, a = h3

    def build(video, **kwargs):
        return MiniMaxH3Adapter(a.module, a.vae, a.audio_vae, a.scheduler_config, a.text_encoder, a.tokenizers[0],
                                video=video, **kwargs)

    cases = [(VideoGeometry(121, 32, 32, 24.0), r"frames: 121 .*17k\+5.*nearest valid: 107 or 124"),
             (VideoGeometry(124, 48, 32, 24.0), "height: 48 is not a multiple of 32.*nearest valid: 32 or 64"),
             (VideoGeometry(124, 32, 32, 25.0), "24 fps only"),
             (VideoGeometry(107, 32, 32, 24.0), r"4.46 s; MiniMax-H3 generates 5–15 s at 24 fps: use 124 to 345")]
    for video, message in cases:
        with pytest.raises(ValueError, match=message):
            build(video)
    with pytest.raises(ValueError, match="guidance-distilled"):
        build(VIDEO, modalities={"audio": {"guidance_scale": 2.0}})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_cuda_keeps_the_fp32_boundary_and_ratio_one(h3):
    """bfloat16 weights on a GPU: latents and velocities stay float32 at the adapter's boundary, an SDE step's
    log-prob recomputed gives ratio 1, and the media decode."""
    path, _ = h3
    adapter = MiniMaxH3Adapter.load(path, "cuda", torch.bfloat16, video=VIDEO, max_sequence_length=MAX_SEQUENCE_LENGTH)
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
