"""FLUX.1 adapter on tiny random configurations of the real diffusers classes (CPU).

Both variants run: "dev" (guidance-distilled, `guidance_embeds=True`) and "schnell" (no guidance
input). Every component — transformer, 16-channel VAE, CLIP-L, T5 and their tokenizers (vocabularies
written here, nothing downloaded) — is built in the test, saved with `FluxPipeline.save_pretrained`
and loaded back through `FluxAdapter.load`. The references are diffusers' own `FluxPipeline`
methods: `encode_prompt`, `_pack_latents`, `_prepare_latent_image_ids`, `calculate_shift`, its
scheduler grid and its full denoising loop + decode.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel  # noqa: E402
from diffusers.pipelines.flux.pipeline_flux import calculate_shift  # noqa: E402
from tokenizers.pre_tokenizers import ByteLevel  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast  # noqa: E402

from omnirl.algorithms import gaussian_log_prob, ode_step, sde_mean_std, sde_step, sigma_schedule  # noqa: E402
from omnirl.models.diffusers import save_lora  # noqa: E402
from omnirl.models.diffusers.flux import FluxAdapter, latent_image_ids  # noqa: E402
from omnirl.models.protocol import ModelAdapter  # noqa: E402

RES = (32, 32)  # tiny VAE factor 2 → latents [16, 16, 16] → 64 packed tokens
PROMPT = 'a sign that says "hi 42"'
MSL = 16  # T5 max_sequence_length of the tiny model


def _clip_tokenizer() -> CLIPTokenizer:
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in sorted(ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>", model_max_length=16)


def _flux_pipeline(guidance_embeds: bool) -> FluxPipeline:
    torch.manual_seed(0)
    tokenizer = _clip_tokenizer()
    clip_config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1,
                                 pad_token_id=1)
    t5_vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    t5_vocab += [(ch, -3.0) for ch in "abcdefghijklmnopqrstuvwxyz0123456789\"'"]
    t5_config = T5Config(vocab_size=len(t5_vocab), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                         relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                        pooled_projection_dim=16, guidance_embeds=guidance_embeds,
                                        axes_dims_rope=(4, 6, 6))
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                        latent_channels=16, norm_num_groups=4, sample_size=32, shift_factor=0.1159,
                        scaling_factor=0.3611, use_quant_conv=False, use_post_quant_conv=False)
    scheduler = FlowMatchEulerDiscreteScheduler(  # FLUX.1's scheduler_config.json
        base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15, num_train_timesteps=1000,
        shift=3.0, use_dynamic_shifting=True)
    return FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=CLIPTextModel(clip_config).eval(),
                        tokenizer=tokenizer, text_encoder_2=T5EncoderModel(t5_config).eval(),
                        tokenizer_2=T5TokenizerFast(vocab=t5_vocab, extra_ids=0), transformer=transformer)


@pytest.fixture(scope="module", params=["dev", "schnell"])
def flux(request, tmp_path_factory):
    """(variant, pipeline dir, pipeline, adapter loaded by `FluxAdapter.load` with default guidance)."""
    torch.set_num_threads(1)
    pipe = _flux_pipeline(guidance_embeds=request.param == "dev")
    path = tmp_path_factory.mktemp(f"flux_{request.param}")
    pipe.save_pretrained(path)
    adapter = FluxAdapter.load(path, "cpu", torch.float32, resolution=RES, max_sequence_length=MSL)
    return request.param, path, pipe, adapter


def _noise(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 16, 16, 16, generator=torch.Generator().manual_seed(seed))


def test_protocol_shapes_and_declarations(flux):
    variant, _, _, adapter = flux
    assert isinstance(adapter, ModelAdapter) and adapter.time_convention == "sigma"
    assert adapter.guidance_scale == (3.5 if variant == "dev" else 1.0) and not adapter.cfg_enabled
    assert adapter.latent_shape(adapter.tokenize(PROMPT)) == (16, 16, 16)
    assert adapter.latent_shape([], resolution=(64, 32)) == (16, 32, 16)
    assert adapter.image_seq_len((16, 16, 16)) == 64
    cond = adapter.encode([adapter.tokenize(PROMPT), adapter.tokenize("b")])
    assert sorted(cond) == ["pooled_prompt_embeds", "prompt_embeds"]  # never negative rows: no CFG
    assert cond["prompt_embeds"].shape == (2, MSL, 32) and cond["pooled_prompt_embeds"].shape == (2, 16)
    v = adapter.velocity(_noise(2), torch.tensor([0.9, 0.3]), cond)
    assert v.shape == (2, 16, 16, 16) and v.dtype == torch.float32 and torch.isfinite(v).all()
    images = adapter.decode(_noise(2))
    assert images.shape == (2, 32, 32, 3) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match="not a multiple of 4"):
        adapter.latent_shape([], resolution=(34, 32))
    classes = {type(m).__name__ for m in adapter.module.modules()}
    assert set(adapter.compile_block_types) <= classes
    names = [n for n, _ in adapter.module.named_modules()]
    for target in adapter.lora_target_modules:  # every target binds, in both block kinds for q/k/v
        assert any(n.endswith("." + target) for n in names), target
    assert any(n.startswith("single_transformer_blocks.") and n.endswith(".to_q") for n in names)


def test_encode_matches_pipeline_encode_prompt(flux):
    _, _, pipe, adapter = flux
    ids = adapter.tokenize(PROMPT)
    assert ids[:2] == [16, 16]  # both truncated to 16 (CLIP 26, T5 26 untruncated)
    assert ids[2 + 15] == pipe.tokenizer.eos_token_id and ids[-1] == pipe.tokenizer_2.eos_token_id
    cond = adapter.encode([ids])
    short = adapter.encode([adapter.tokenize("hi")])  # padded by encode, as the pipeline pads
    with torch.no_grad():
        pe, pooled, text_ids = pipe.encode_prompt(PROMPT, device="cpu", max_sequence_length=MSL)
        pe_short, pooled_short, _ = pipe.encode_prompt("hi", device="cpu", max_sequence_length=MSL)
    assert torch.equal(text_ids, torch.zeros(MSL, 3))
    for ours, theirs in [(cond["prompt_embeds"], pe), (cond["pooled_prompt_embeds"], pooled),
                         (short["prompt_embeds"], pe_short), (short["pooled_prompt_embeds"], pooled_short)]:
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_encode_cache_and_id_validation(flux):
    _, _, _, adapter = flux
    adapter.cache.clear()
    ids = adapter.tokenize("cache me")
    first = adapter.encode([ids, ids])
    assert len(adapter.cache) == 1  # one prompt row, no negative row
    assert torch.equal(adapter.encode([ids])["prompt_embeds"][0], first["prompt_embeds"][1])
    with pytest.raises(ValueError, match="header"):
        adapter.encode([[3, 1, 5, 6]])
    with pytest.raises(ValueError, match="longer"):
        adapter.encode([[17, 1, *range(18)]])


def test_packing_and_image_ids_match_pipeline():
    x = torch.randn(2, 16, 6, 10)
    from omnirl.models.diffusers.qwen_image import pack_latents, unpack_latents

    packed = FluxPipeline._pack_latents(x, 2, 16, 6, 10)
    assert torch.equal(pack_latents(x), packed) and packed.shape == (2, 15, 64)
    assert torch.equal(unpack_latents(packed, 6, 10), FluxPipeline._unpack_latents(packed, 12, 20, 2))
    ids = latent_image_ids(3, 5, "cpu")
    assert torch.equal(ids, FluxPipeline._prepare_latent_image_ids(2, 3, 5, "cpu", torch.float32))
    assert ids[7].tolist() == [0.0, 1.0, 2.0]  # token 7 = row 1, column 2


def test_velocity_is_the_pipelines_transformer_call(flux):
    """Same packed inputs as `FluxPipeline.__call__` (timestep/1000 = σ, guidance, ids) → same output."""
    variant, _, pipe, adapter = flux
    cond = adapter.encode([adapter.tokenize(PROMPT)] * 2)
    x = _noise(2, seed=3)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 4, 4), mu=calculate_shift(64))
    t = scheduler.timesteps[1:3]  # two different σ in one batch
    seen = {}
    hook = adapter.module.register_forward_hook(lambda m, a, kw, out: seen.update(kw), with_kwargs=True)
    v = adapter.velocity(x, scheduler.sigmas[1:3], cond)
    hook.remove()
    with torch.no_grad():
        pe, pooled, text_ids = pipe.encode_prompt([PROMPT] * 2, device="cpu", max_sequence_length=MSL)
        guidance = torch.full([2], 3.5) if variant == "dev" else None
        out = pipe.transformer(hidden_states=pipe._pack_latents(x, 2, 16, 16, 16), timestep=t / 1000,
                               guidance=guidance, pooled_projections=pooled, encoder_hidden_states=pe,
                               txt_ids=text_ids, img_ids=pipe._prepare_latent_image_ids(2, 8, 8, "cpu", torch.float32),
                               return_dict=False)[0]
    torch.testing.assert_close(v, pipe._unpack_latents(out, 32, 32, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen["timestep"], t / 1000, atol=1e-6, rtol=0)  # σ, not σ·1000
    if variant == "dev":
        assert torch.equal(seen["guidance"], torch.tensor([3.5, 3.5]))
        assert adapter.module.time_text_embed.time_proj.scale == 1  # ×1000 happens in forward
    else:
        assert seen["guidance"] is None


def test_dev_guidance_is_an_input_and_schnell_rejects_it(flux):
    variant, path, _, adapter = flux
    cond = adapter.encode([adapter.tokenize(PROMPT)])
    x, sigma = _noise(1, seed=4), torch.tensor([0.6])
    if variant == "schnell":
        with pytest.raises(ValueError, match="no effect on FLUX-schnell"):
            FluxAdapter.load(path, "cpu", torch.float32, resolution=RES, max_sequence_length=MSL, guidance_scale=3.5)
        return
    v_default = adapter.velocity(x, sigma, cond)
    adapter.guidance_scale = 5.0
    try:
        v_strong = adapter.velocity(x, sigma, cond)
    finally:
        adapter.guidance_scale = 3.5
    assert (v_strong - v_default).abs().max() > 1e-4
    with pytest.raises(ValueError, match="must be > 0"):
        FluxAdapter.load(path, "cpu", torch.float32, resolution=RES, max_sequence_length=MSL, guidance_scale=0.0)


@pytest.mark.parametrize("resolution", [(32, 32), (256, 256), (768, 1360)])  # 256² here = 1024² with FLUX's VAE
def test_sigma_grid_equals_pipeline_scheduler(flux, resolution):
    _, _, pipe, adapter = flux
    seq = adapter.image_seq_len(adapter.latent_shape([], resolution=resolution))
    assert seq == resolution[0] * resolution[1] // 16  # tiny VAE factor 2 · packing 2
    mu = calculate_shift(seq, 256, 4096, 0.5, 1.15)
    if seq == 4096:
        assert mu == pytest.approx(1.15)  # FLUX.1 at 1024², shift e^1.15 ≈ 3.16
    assert adapter.sigma_shift(10, seq) == pytest.approx(math.exp(mu), rel=1e-12)
    for n in (1, 4, 10, 28):
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n), mu=mu)  # what FluxPipeline feeds it
        grid = adapter.sigmas(n, seq)
        assert grid.shape == (n + 1,) and grid[0] == 1 and grid[-1] == 0
        assert torch.equal(grid, scheduler.sigmas), n
        torch.testing.assert_close(grid, sigma_schedule(n, adapter.sigma_shift(n, seq)), atol=1e-6, rtol=0)


def test_denoising_loop_and_decode_match_the_pipeline(flux):
    """Our ODE loop on `adapter.sigmas` + `decode` reproduces `FluxPipeline.__call__` end to end."""
    _, _, pipe, adapter = flux
    noise, steps = _noise(1, seed=7), 3
    kwargs = dict(prompt=PROMPT, height=32, width=32, num_inference_steps=steps, max_sequence_length=MSL,
                  latents=pipe._pack_latents(noise, 1, 16, 16, 16), guidance_scale=3.5)
    with torch.no_grad():
        theirs = pipe(**kwargs, output_type="latent").images
        image = pipe(**kwargs, output_type="np").images
        cond = adapter.encode([adapter.tokenize(PROMPT)])
        grid, x = adapter.sigmas(steps, 64), noise
        for k in range(steps):
            x = ode_step(x, adapter.velocity(x, grid[k:k + 1], cond), grid[k:k + 1], grid[k + 1:k + 2])
    torch.testing.assert_close(x, pipe._unpack_latents(theirs, 32, 32, 2), atol=1e-5, rtol=1e-5)
    ours = adapter.decode(x)[0].to(torch.int16)
    expected = torch.from_numpy((image[0] * 255).round().astype(np.int16))
    assert (ours - expected).abs().max() <= 1


def _inject_lora(module, rank: int, alpha: float, targets: list[str], name: str = "default") -> None:
    from omnirl.api.spec import LoRASpec
    from omnirl.models.lora import inject_lora

    inject_lora(module, LoRASpec(enabled=True, rank=rank, alpha=alpha), targets, name)


def test_on_policy_ratio_is_one_with_lora(flux):
    """Rollout SDE step log-prob recomputed by the 'actor' with the same weights: ratio 1 to 1e-6."""
    _, _, _, adapter = flux
    module, adapter.module = adapter.module, copy.deepcopy(adapter.module)
    _inject_lora(adapter.module, 2, 4.0, adapter.lora_target_modules, "dry")
    try:
        ids = [adapter.tokenize(PROMPT), adapter.tokenize("x")]
        x = _noise(2, seed=5)
        sigma, sigma_next = torch.tensor([1.0, 0.6]), torch.tensor([0.8, 0.4])
        with torch.no_grad():
            step = sde_step(x, adapter.velocity(x, sigma, adapter.encode(ids)), sigma, sigma_next, 0.7,
                            generator=torch.Generator().manual_seed(1))
        v = adapter.velocity(x, sigma, adapter.encode(ids), detach_uncond=True)
        mean, std = sde_mean_std(x, v, sigma, sigma_next, 0.7)
        ratio = torch.exp(gaussian_log_prob(step.x_next, mean, std) - step.log_prob)
        assert torch.allclose(ratio, torch.ones(2), atol=1e-6, rtol=0)
        ratio.sum().backward()
        grads = [p.grad for n, p in adapter.module.named_parameters() if ".dry." in n and "lora_B" in n]
        assert len(grads) == 8 + 3  # one lora_B per layer: 8 targets in the double block, q/k/v in the single block
        # the single block discards the text stream, and the last double block's text output
        # feeds only the single block's attention: most, not all, lora_B get a gradient
        assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) >= len(grads) // 2
    finally:
        adapter.module = module


def test_lora_save_loads_in_flux_pipeline(flux, tmp_path):
    _, path, _, adapter = flux
    original, module = adapter.module, copy.deepcopy(adapter.module)
    adapter.module = module
    base = {k: v.clone() for k, v in original.state_dict().items()}
    _inject_lora(module, 4, 8.0, adapter.lora_target_modules)
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "lora_B.default" in n:
                p.normal_(0, 0.1)
    n_layers = sum(1 for n, _ in module.named_parameters() if "lora_A.default" in n)
    assert n_layers == 8 + 3
    file = save_lora(adapter, tmp_path / "lora")
    fresh = FluxPipeline.from_pretrained(path, local_files_only=True)
    fresh.load_lora_weights(str(file.parent))
    loaded = {n: p for n, p in fresh.transformer.named_parameters() if "lora_" in n}
    ours = {n.replace(".default.", "."): p for n, p in module.named_parameters() if "lora_" in n}
    assert len(loaded) == len(ours) == 2 * n_layers
    for n, p in loaded.items():
        assert torch.equal(p, ours[n.replace(".default_0.", ".")]), n
    cond = adapter.encode([adapter.tokenize(PROMPT)])
    x, sigma = _noise(1), torch.tensor([0.5])
    v_ours = adapter.velocity(x, sigma, cond)
    adapter.module = fresh.transformer  # same base weights + loaded LoRA (scaling alpha/r restored)
    try:
        v_loaded = adapter.velocity(x, sigma, cond)
    finally:
        adapter.module = original
    torch.testing.assert_close(v_loaded, v_ours, atol=1e-6, rtol=1e-6)
    assert (v_ours - adapter.velocity(x, sigma, cond)).abs().max() > 1e-4  # the LoRA does change v
    assert all(torch.equal(base[k], v) for k, v in fresh.transformer.state_dict().items() if k in base)


def test_bad_path_names_path_and_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*'flux'.*transformer/.*tokenizer_2/"):
        FluxAdapter.load(tmp_path / "nowhere")
    for name in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer"):
        (tmp_path / name).mkdir()
    with pytest.raises(FileNotFoundError, match=r"lacks subfolder\(s\) \['text_encoder_2', 'tokenizer_2'\]"):
        FluxAdapter.load(tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_cuda_keeps_fp32_boundary_and_ratio_one(flux):
    _, path, _, _ = flux
    adapter = FluxAdapter.load(path, "cuda", torch.bfloat16, resolution=RES, max_sequence_length=MSL)
    ids = [adapter.tokenize(PROMPT)] * 2
    x = _noise(2).cuda()
    sigma, sigma_next = torch.tensor([0.9, 0.5], device="cuda"), torch.tensor([0.7, 0.3], device="cuda")
    with torch.no_grad():
        v = adapter.velocity(x, sigma, adapter.encode(ids, "cuda"))
        step = sde_step(x, v, sigma, sigma_next, 0.7)
        v2 = adapter.velocity(x, sigma, adapter.encode(ids, "cuda"))
    assert v.dtype == torch.float32 and adapter.compute_dtype() == torch.bfloat16
    mean, std = sde_mean_std(x, v2, sigma, sigma_next, 0.7)
    ratio = torch.exp(gaussian_log_prob(step.x_next, mean, std) - step.log_prob)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0)
    assert adapter.decode(step.x_next).shape == (2, 32, 32, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.xfail(strict=False, reason="cuDNN attention's input gradients for FLUX were ~1e30 on the H200 (torch 2.11), "
                   "both variants; on an H100 (same torch) dev matched and schnell did not: flux is not in "
                   "CUDNN_FAMILIES. Not strict because the outcome depends on the card")
def test_cudnn_attention_on_cuda_matches_torchs_choice(flux):
    from tests.models.test_attention import check_cudnn_matches_torchs_choice

    _, path, _, _ = flux
    adapter = FluxAdapter.load(path, "cuda", torch.bfloat16, resolution=RES, max_sequence_length=MSL)
    cond = adapter.encode([adapter.tokenize(PROMPT)] * 2, "cuda")
    check_cudnn_matches_torchs_choice(adapter, _noise(2).cuda(), torch.tensor([0.9, 0.5], device="cuda"), cond)


def test_rljob_guidance_reaches_flux_through_the_registry(flux):
    """guidanceScale 1 keeps FLUX-dev's embedded default (3.5); another value is passed through."""
    from omnirl.api.spec import RLJobSpec
    from omnirl.models.registry import adapter_options, load_adapter

    variant, path, _, _ = flux
    base = {"model": {"family": "flux", "path": str(path), "resolution": list(RES)},
            "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]}
    assert adapter_options(RLJobSpec.model_validate(base)) == {"resolution": tuple(RES)}
    adapter = load_adapter("flux", str(path), max_sequence_length=MSL, **adapter_options(RLJobSpec.model_validate(base)))
    assert isinstance(adapter, FluxAdapter)
    if variant == "dev":
        assert adapter.guidance_scale == 3.5
        job = RLJobSpec.model_validate({**base, "algorithm": {"sampling": {"guidanceScale": 5.0}}})
        assert load_adapter("flux", str(path), max_sequence_length=MSL, **adapter_options(job)).guidance_scale == 5.0
