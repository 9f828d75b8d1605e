"""SD3 and Qwen-Image adapters on tiny random configurations of the real diffusers classes (CPU).

Every component — transformer, VAE, text encoders and tokenizers (byte-level BPE / unigram vocabularies
written here, so nothing is downloaded) — is built in the test, saved with the pipeline's
`save_pretrained` and loaded back through the adapters' `load`, so the `from_pretrained` path runs.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from diffusers import (  # noqa: E402
    AutoencoderKL,
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from tokenizers.pre_tokenizers import ByteLevel  # noqa: E402
from transformers import (  # noqa: E402
    CLIPTextConfig,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,
    T5Config,
    T5EncoderModel,
    T5TokenizerFast,
)

from omnirl.algorithms import gaussian_log_prob, sde_mean_std, sde_step, sigma_schedule  # noqa: E402
from omnirl.models.diffusers import pack_latents, save_lora, unpack_latents  # noqa: E402
from omnirl.models.diffusers.qwen_image import DROP_IDX, PROMPT_TEMPLATE  # noqa: E402
from omnirl.models.protocol import ModelAdapter  # noqa: E402
from omnirl.models.registry import load_adapter  # noqa: E402

RES = (32, 32)
PROMPT = 'a sign that says "hi 42"'
BYTES = sorted(ByteLevel.alphabet())


def _clip_tokenizer(pad: str) -> CLIPTokenizer:
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in BYTES:
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], pad_token=pad, model_max_length=16)


def _sd3_pipeline() -> StableDiffusion3Pipeline:
    torch.manual_seed(0)
    tok_l, tok_g = _clip_tokenizer("<|endoftext|>"), _clip_tokenizer("!")  # SD3's CLIP-G pads with "!"
    clip_config = CLIPTextConfig(vocab_size=len(tok_l), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, projection_dim=16, max_position_embeddings=16,
                                 bos_token_id=0, eos_token_id=1, pad_token_id=1)
    t5_vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    t5_vocab += [(ch, -3.0) for ch in "abcdefghijklmnopqrstuvwxyz0123456789\"'"]
    t5_config = T5Config(vocab_size=len(t5_vocab), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                         relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    transformer = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                        caption_projection_dim=16, pooled_projection_dim=32, out_channels=4,
                                        qk_norm="rms_norm", dual_attention_layers=(0,))
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, sample_size=32, shift_factor=0.0609,
                        scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=CLIPTextModelWithProjection(clip_config).eval(), tokenizer=tok_l,
        text_encoder_2=CLIPTextModelWithProjection(clip_config).eval(), tokenizer_2=tok_g,
        text_encoder_3=T5EncoderModel(t5_config).eval(), tokenizer_3=T5TokenizerFast(vocab=t5_vocab, extra_ids=0))


def _qwen_pipeline() -> QwenImagePipeline:
    torch.manual_seed(0)
    vocab = {ch: i for i, ch in enumerate(BYTES)}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 300, "rope_theta": 1000000.0,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=300, vision_start_token_id=290, vision_end_token_id=291, vision_token_id=292,
        image_token_id=293, video_token_id=294)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                              attention_head_dim=16, num_attention_heads=3, joint_attention_dim=16,
                                              axes_dims_rope=(8, 4, 4))
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                 latents_std=[1.5, 0.5, 1.0, 2.0])
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
        max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")
    return QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=Qwen2_5_VLForConditionalGeneration(config).eval(),
                             tokenizer=tokenizer, transformer=transformer)


@pytest.fixture(scope="module", params=["sd3", "qwen-image"])
def family(request, tmp_path_factory):
    """(family, pipeline dir, pipeline, adapter loaded through the registry with CFG w = 4)."""
    torch.set_num_threads(1)
    name = request.param
    pipe = _sd3_pipeline() if name == "sd3" else _qwen_pipeline()
    path = tmp_path_factory.mktemp(name.replace("-", "_"))
    pipe.save_pretrained(path)
    # the byte-level tiny Qwen tokenizer spells the chat template out (~190 tokens after DROP_IDX)
    adapter = load_adapter(name, str(path), "cpu", "float32", resolution=RES, guidance_scale=4.0,
                           max_sequence_length=16 if name == "sd3" else 256)
    return name, path, pipe, adapter


def _inject_lora(module, rank: int, alpha: float, targets: list[str], name: str = "default") -> None:
    """The actor's and rollout's LoRA injection (imported here: it pulls in pydantic via the spec)."""
    from omnirl.api.spec import LoRASpec
    from omnirl.models.lora import inject_lora

    inject_lora(module, LoRASpec(enabled=True, rank=rank, alpha=alpha), targets, name)


def _noisy(adapter, batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *adapter.latent_shape([]), generator=g)


def test_load_gives_protocol_adapter_with_expected_shapes(family):
    name, _, _, adapter = family
    assert isinstance(adapter, ModelAdapter) and adapter.time_convention == "sigma"
    expected = (4, 16, 16) if name == "sd3" else (4, 8, 8)  # VAE factor 2 (SD3 tiny) / 4 (Qwen tiny)
    assert adapter.latent_shape(adapter.tokenize(PROMPT)) == expected
    assert adapter.latent_shape([], resolution=(64, 32)) == (4, expected[1] * 2, expected[2])
    cond = adapter.encode([adapter.tokenize(PROMPT), adapter.tokenize("b")])
    assert all(v.shape[0] == 2 for v in cond.values()) and any(k.startswith("negative_") for k in cond)
    v = adapter.velocity(_noisy(adapter, 2), torch.tensor([0.9, 0.3]), cond)
    assert v.shape == (2, *expected) and v.dtype == torch.float32 and torch.isfinite(v).all()
    images = adapter.decode(_noisy(adapter, 2))
    assert images.shape == (2, 32, 32, 3) and images.dtype == torch.uint8
    m = adapter.vae_scale_factor * adapter.patch_size  # 2·2 (SD3 tiny), 4·2 (Qwen tiny); 8·2 for real models
    with pytest.raises(ValueError, match=f"not a multiple of {m}"):
        adapter.latent_shape([], resolution=(m + m // 2, m))


def test_bad_path_names_path_and_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*transformer/"):
        load_adapter("sd3", str(tmp_path / "nowhere"))
    (tmp_path / "transformer").mkdir()
    with pytest.raises(FileNotFoundError, match="lacks subfolder.*vae"):
        load_adapter("qwen-image", str(tmp_path))
    with pytest.raises(ValueError, match="unknown model.family 'hunyuan-video'"):
        load_adapter("hunyuan-video", str(tmp_path))


def test_registry_dispatches_digits():
    adapter = load_adapter("ocr-digits", "builtin")
    assert isinstance(adapter, ModelAdapter) and type(adapter).__name__ == "DigitsAdapter"


def test_encode_matches_pipeline_encode_prompt(family):
    name, _, pipe, adapter = family
    ids = adapter.tokenize(PROMPT)
    cond = adapter.encode([ids])
    with torch.no_grad():
        if name == "sd3":
            assert ids[:3] == [16, 16, 16]  # all three truncated to 16 here (21, 21 and 26 untruncated)
            assert ids[3 + 15] == ids[3 + 31] == pipe.tokenizer.eos_token_id and ids[-1] == pipe.tokenizer_3.eos_token_id
            pe, npe, pooled, npooled = pipe.encode_prompt(PROMPT, None, None, device="cpu", negative_prompt="",
                                                          do_classifier_free_guidance=True, max_sequence_length=16)
            pairs = [(cond["prompt_embeds"], pe), (cond["negative_prompt_embeds"], npe),
                     (cond["pooled_prompt_embeds"], pooled), (cond["negative_pooled_prompt_embeds"], npooled)]
        else:
            assert pipe.prompt_template_encode == PROMPT_TEMPLATE and pipe.prompt_template_encode_start_idx == DROP_IDX
            pe, mask = pipe.encode_prompt(PROMPT, device="cpu", max_sequence_length=256)
            n = pe.shape[1]
            assert mask is None and int(cond["prompt_embeds_mask"].sum()) == n
            assert cond["prompt_embeds"][:, n:].abs().max() == 0
            pairs = [(cond["prompt_embeds"][:, :n], pe)]
    for ours, theirs in pairs:
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_encode_cache_and_id_validation(family):
    name, _, _, adapter = family
    adapter.cache.clear()
    ids = adapter.tokenize("cache me")
    first = adapter.encode([ids, ids])
    assert len(adapter.cache) == 2  # the prompt row and the negative prompt's row
    second = adapter.encode([ids])
    assert len(adapter.cache) == 2 and torch.equal(second["prompt_embeds"][0], first["prompt_embeds"][1])
    with pytest.raises(ValueError, match="empty"):
        adapter.encode([])
    bad = [3, 1, 1, 5] if name == "sd3" else ids[:DROP_IDX]
    with pytest.raises(ValueError, match="header|template"):
        adapter.encode([bad])


def test_sigma_convention_timestep_and_unpacking(family):
    """The transformer gets σ·1000 (SD3) or σ (Qwen: ×1000 inside); the adapter returns its output unpacked."""
    name, _, _, adapter = family
    adapter.guidance_scale = 1.0  # no CFG: velocity must be the raw transformer output
    try:
        cond = adapter.encode([adapter.tokenize(PROMPT)])
        x, sigma = _noisy(adapter, 1), torch.tensor([0.625])
        seen = {}
        hook = adapter.module.register_forward_hook(
            lambda m, args, kwargs, out: seen.update(kwargs=kwargs, out=out[0]), with_kwargs=True)
        v = adapter.velocity(x, sigma, cond)
        hook.remove()
    finally:
        adapter.guidance_scale = 4.0
    timestep = seen["kwargs"]["timestep"]
    if name == "sd3":
        assert torch.equal(timestep, torch.tensor([625.0]))
        assert torch.equal(v, seen["out"])
        assert adapter.module.time_text_embed.time_proj.scale == 1
    else:
        assert torch.equal(timestep, torch.tensor([0.625]))
        assert adapter.module.time_text_embed.time_proj.scale == 1000
        assert seen["kwargs"]["hidden_states"].shape == (1, 16, 16)  # (8/2)·(8/2) tokens of 4·4 channels
        torch.testing.assert_close(seen["kwargs"]["hidden_states"], pack_latents(x), atol=0, rtol=0)
        assert torch.equal(v, unpack_latents(seen["out"], 8, 8))


def test_pack_unpack_round_trip():
    x = torch.randn(2, 16, 6, 10)
    packed = pack_latents(x)
    assert packed.shape == (2, 15, 64)
    assert torch.equal(packed[0, 0], torch.stack([x[0, :, 0, 0], x[0, :, 0, 1], x[0, :, 1, 0], x[0, :, 1, 1]], 1).flatten())
    assert torch.equal(unpack_latents(packed, 6, 10), x)


def test_cfg_is_the_guided_velocity(family):
    name, _, _, adapter = family
    cond = adapter.encode([adapter.tokenize(PROMPT)])
    x, sigma = _noisy(adapter, 1, seed=3), torch.tensor([0.5])
    uncond = {k.removeprefix("negative_"): v for k, v in cond.items() if k.startswith("negative_")}
    plain = {k: v for k, v in cond.items() if not k.startswith("negative_")}
    adapter.guidance_scale = 1.0
    try:
        v_c, v_u = adapter.velocity(x, sigma, plain), adapter.velocity(x, sigma, uncond)
    finally:
        adapter.guidance_scale = 4.0
    expected = v_u + 4.0 * (v_c - v_u)
    if name == "qwen-image":  # per-token rescale to ‖v_c‖ on packed tokens
        pc, pe = pack_latents(v_c), pack_latents(expected)
        expected = unpack_latents(pe * pc.norm(dim=-1, keepdim=True) / pe.norm(dim=-1, keepdim=True), 8, 8)
    torch.testing.assert_close(adapter.velocity(x, sigma, cond), expected, atol=2e-5, rtol=1e-5)


def test_qwen_text_padding_does_not_change_velocity(family):
    name, _, _, adapter = family
    if name != "qwen-image":
        pytest.skip("Qwen-Image only")
    cond = adapter.encode([adapter.tokenize(PROMPT), adapter.tokenize("b")])
    lengths = cond["prompt_embeds_mask"].sum(1).tolist()
    assert lengths[0] == lengths[1] + len(PROMPT) - 1 and cond["prompt_embeds"].shape[1] == 256
    x, sigma = _noisy(adapter, 2), torch.tensor([0.7, 0.7])
    adapter.guidance_scale = 1.0
    try:
        padded = adapter.velocity(x, sigma, cond)  # "b" padded to the batch's longest prompt, masked
    finally:
        adapter.guidance_scale = 4.0
    n = lengths[1]
    direct = adapter.module(hidden_states=pack_latents(x[1:]), encoder_hidden_states=cond["prompt_embeds"][1:, :n],
                            timestep=sigma[1:], img_shapes=[[(1, 4, 4)]], return_dict=False)[0]
    torch.testing.assert_close(padded[1:], unpack_latents(direct, 8, 8), atol=1e-5, rtol=1e-5)


def test_sigma_shift_and_grid(family):
    name, _, pipe, adapter = family
    seq = adapter.image_seq_len(adapter.latent_shape([]))
    grid = adapter.sigmas(10, seq)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
    if name == "sd3":
        assert seq == 64 and adapter.sigma_shift(10, seq) == 3.0
        scheduler.set_timesteps(10)
    else:
        assert seq == 16
        mu = 0.5 + (0.9 - 0.5) * (seq - 256) / (8192 - 256)
        assert adapter.sigma_shift(10, seq) == pytest.approx(math.exp(mu), rel=1e-12)
        scheduler.set_timesteps(sigmas=[1 - k / 10 for k in range(10)], mu=mu)
        unstretched = dict(adapter.scheduler_config, shift_terminal=None)
        adapter.scheduler_config, saved = unstretched, adapter.scheduler_config
        try:
            torch.testing.assert_close(adapter.sigmas(10, seq), sigma_schedule(10, adapter.sigma_shift(10, seq)),
                                       atol=1e-6, rtol=0)
        finally:
            adapter.scheduler_config = saved
        assert grid[-2].item() == pytest.approx(0.02, abs=1e-6)  # shift_terminal stretch
    assert torch.equal(grid, scheduler.sigmas) and grid.shape == (11,) and grid[-1] == 0


def test_on_policy_ratio_is_one_with_lora_and_cfg(family):
    """Rollout SDE step log-prob, recomputed by the 'actor' with the same weights: ratio 1 to 1e-6."""
    _, _, _, adapter = family
    module, adapter.module = adapter.module, copy.deepcopy(adapter.module)
    _inject_lora(adapter.module, 2, 4.0, adapter.lora_target_modules, "dry")
    try:
        ids = [adapter.tokenize(PROMPT), adapter.tokenize("x")]
        x = _noisy(adapter, 2, seed=5)
        sigma, sigma_next = torch.tensor([1.0, 0.6]), torch.tensor([0.8, 0.4])
        with torch.no_grad():
            step = sde_step(x, adapter.velocity(x, sigma, adapter.encode(ids)), sigma, sigma_next, 0.7,
                            generator=torch.Generator().manual_seed(1))
        v = adapter.velocity(x, sigma, adapter.encode(ids), detach_uncond=True)
        mean, std = sde_mean_std(x, v, sigma, sigma_next, 0.7)
        ratio = torch.exp(gaussian_log_prob(step.x_next, mean, std) - step.log_prob)
        assert torch.allclose(ratio, torch.ones(2), atol=1e-6, rtol=0)
        ratio.sum().backward()
        # B = 0 at init, so gradients reach lora_B (lora_A's are 0); the last block's text-stream
        # output is discarded, so its text projections get none
        grads = [p.grad for n, p in adapter.module.named_parameters() if ".dry." in n and "lora_B" in n]
        assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) >= len(grads) // 2
    finally:
        adapter.module = module


def test_lora_save_loads_in_diffusers(family, tmp_path):
    name, path, _, adapter = family
    original, module = adapter.module, copy.deepcopy(adapter.module)
    adapter.module = module
    base = {k: v.clone() for k, v in original.state_dict().items()}
    _inject_lora(module, 4, 8.0, adapter.lora_target_modules)
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "lora_B.default" in n:
                p.normal_(0, 0.1)
    n_layers = sum(1 for n, _ in module.named_parameters() if "lora_A.default" in n)
    assert n_layers >= 8  # every target name bound somewhere
    file = save_lora(adapter, tmp_path / "lora")
    pipe_cls = StableDiffusion3Pipeline if name == "sd3" else QwenImagePipeline
    fresh = pipe_cls.from_pretrained(path, local_files_only=True)
    fresh.load_lora_weights(str(file.parent))
    loaded = dict(fresh.transformer.named_parameters())
    ours = {n.replace(".default.", "."): p for n, p in module.named_parameters() if "lora_" in n}
    names = {n: p for n, p in loaded.items() if "lora_" in n}
    assert len(names) == len(ours) == 2 * n_layers
    for n, p in names.items():
        key = n.replace(".default_0.", ".")
        assert torch.equal(p, ours[key]), n
    cond = adapter.encode([adapter.tokenize(PROMPT)])
    x, sigma = _noisy(adapter, 1), torch.tensor([0.5])
    v_ours = adapter.velocity(x, sigma, cond)
    adapter.module = fresh.transformer  # same base weights + loaded LoRA (scaling alpha/r restored)
    try:
        v_loaded = adapter.velocity(x, sigma, cond)
    finally:
        adapter.module = original
    torch.testing.assert_close(v_loaded, v_ours, atol=1e-6, rtol=1e-6)
    assert all(torch.equal(base[k], v) for k, v in fresh.transformer.state_dict().items() if k in base)


def _bf16_cuda_adapter(family):
    """The family's tiny pipeline loaded through the registry in bf16 on CUDA, CFG w = 4."""
    name, path, _, _ = family
    return load_adapter(name, str(path), "cuda", "bfloat16", resolution=RES, guidance_scale=4.0,
                        max_sequence_length=16 if name == "sd3" else 256)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_cuda_keeps_fp32_boundary_and_finite_log_probs(family):
    adapter = _bf16_cuda_adapter(family)
    ids = [adapter.tokenize(PROMPT)] * 2
    x = _noisy(adapter, 2).cuda()
    sigma, sigma_next = torch.tensor([0.9, 0.5], device="cuda"), torch.tensor([0.7, 0.3], device="cuda")
    with torch.no_grad():
        v = adapter.velocity(x, sigma, adapter.encode(ids, "cuda"))
        step = sde_step(x, v, sigma, sigma_next, 0.7)
        v2 = adapter.velocity(x, sigma, adapter.encode(ids, "cuda"))
    assert v.dtype == torch.float32 and adapter.compute_dtype() == torch.bfloat16
    assert torch.isfinite(step.log_prob).all()
    mean, std = sde_mean_std(x, v2, sigma, sigma_next, 0.7)
    ratio = torch.exp(gaussian_log_prob(step.x_next, mean, std) - step.log_prob)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0)
    assert adapter.decode(step.x_next).shape == (2, 32, 32, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cudnn_attention_on_cuda_matches_torchs_choice(family):
    from tests.models.test_attention import check_cudnn_matches_torchs_choice

    adapter = _bf16_cuda_adapter(family)
    cond = adapter.encode([adapter.tokenize(PROMPT), adapter.tokenize(PROMPT + " and more words")], "cuda")
    check_cudnn_matches_torchs_choice(adapter, _noisy(adapter, 2).cuda(), torch.tensor([0.9, 0.5], device="cuda"),
                                      cond)


def test_rljob_options_reach_the_adapter(family):
    """`adapter_options(spec)`: the job's CFG weight and resolution, identical for rollout and actor."""
    from omnirl.api.spec import RLJobSpec
    from omnirl.models.registry import adapter_options

    name, path, _, _ = family
    spec = RLJobSpec.model_validate({
        "model": {"family": name, "path": str(path), "resolution": [32, 48]},
        "algorithm": {"sampling": {"guidanceScale": 4.5}},
        "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]})
    options = adapter_options(spec)
    assert options == {"guidance_scale": 4.5, "resolution": (32, 48)}
    adapter = load_adapter(name, str(path), **options)
    assert adapter.guidance_scale == 4.5 and adapter.cfg_enabled
    ids = adapter.tokenize("a red cube")
    f = adapter.vae_scale_factor
    assert adapter.latent_shape(ids)[1:] == (32 // f, 48 // f)
    assert any(k.startswith("negative_") for k in adapter.encode([ids]))


def test_missing_weights_are_refused_before_the_run_and_a_truncated_file_is_named(family, tmp_path, capsys,
                                                                                   monkeypatch):
    """Pre-flight (`omnirl run`) refuses a pipeline directory without the transformer's weights,
    naming spec.model.path and the file (exit 2, nothing started); a sharded index is followed to its
    shards; a truncated transformer or text encoder file is named unreadable by the loader (the text
    encoder's SafetensorError used to escape `load_component` as a crash)."""
    import json
    import os
    import shutil

    import yaml

    from omnirl.cli import main
    from omnirl.models.registry import check_weight_files

    name, path, _, _ = family
    model = tmp_path / "model"
    shutil.copytree(path, model)
    check_weight_files(name, str(model))  # complete: silent
    weights = model / "transformer" / "diffusion_pytorch_model.safetensors"
    kept = weights.read_bytes()
    os.truncate(weights, len(kept) // 2)
    with pytest.raises(OSError, match=f"^{weights} is unreadable \\(truncated or not a safetensors file: "):
        load_adapter(name, str(model), resolution=RES)
    weights.unlink()
    (tmp_path / "train.txt").write_text('a sign that says "42"\n')
    doc = {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "no-weights"},
           "spec": {"model": {"family": name, "path": str(model), "resolution": list(RES)},
                    "data": {"trainPrompts": str(tmp_path / "train.txt")}, "reward": [{"name": "ocr", "kind": "ocr"}]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.delenv("OMNIRL_DEBUG", raising=False)
    assert main(["run", str(tmp_path / "job.yaml"), "--no-ray", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"omnirl run: spec.model.path: {model} is incomplete: {weights} "
                                                   f"not found; family '{name}' loads transformer/ from it"), err
    assert "copy the whole model directory there" in err and not (tmp_path / "o").exists()
    shard = "diffusion_pytorch_model-00002-of-00002.safetensors"
    (weights.parent / f"{weights.name}.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors", "b": shard}}))
    weights.with_name("diffusion_pytorch_model-00001-of-00002.safetensors").write_bytes(kept)
    with pytest.raises(FileNotFoundError, match=f"^{weights.parent / shard} not found"):
        check_weight_files(name, str(model))
    (weights.parent / f"{weights.name}.index.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"^{weights}.index.json is not a sharded-weights index"):
        check_weight_files(name, str(model))
    for shard_file in weights.parent.glob("diffusion_pytorch_model*"):  # back to the one file
        shard_file.unlink()
    weights.write_bytes(kept)
    encoder = model / "text_encoder" / "model.safetensors"
    os.truncate(encoder, encoder.stat().st_size // 2)
    with pytest.raises(OSError, match=f"^{encoder} is unreadable \\(truncated"):
        load_adapter(name, str(model), resolution=RES)


def test_lora_targets_of_no_layer_are_refused_before_the_run(family, tmp_path, capsys, monkeypatch):
    """Pre-flight (`omnirl run`) checks `model.lora.targetModules` on a weightless skeleton of the transformer
    built from its config: a target of no layer is one line naming the field and the model's linear layers,
    exit 2, nothing started (it was exit 4 once every role had loaded the model); the family's defaults and a
    real layer pass."""
    import yaml

    from omnirl.api.errors import ConfigError
    from omnirl.api.spec import LoRASpec
    from omnirl.cli import main
    from omnirl.models.registry import check_lora_targets

    name, path, _, adapter = family
    for targets in ([], ["to_q"]):  # the defaults, one real layer: silent
        check_lora_targets(name, str(path), LoRASpec(enabled=True, targetModules=targets))
    assert list(type(adapter).default_lora_targets) == adapter.lora_target_modules  # what the roles inject
    with pytest.raises(ConfigError, match=r"^spec.model.lora.targetModules: \['qkv_proj'\] match no layer"):
        check_lora_targets(name, str(path), LoRASpec(enabled=True, targetModules=["qkv_proj"]))
    (tmp_path / "train.txt").write_text('a sign that says "42"\n')
    doc = {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "lora-typo"},
           "spec": {"model": {"family": name, "path": str(path), "resolution": list(RES),
                              "lora": {"enabled": True, "targetModules": ["qkv_proj"]}},
                    "data": {"trainPrompts": str(tmp_path / "train.txt")}, "reward": [{"name": "ocr", "kind": "ocr"}]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.delenv("OMNIRL_DEBUG", raising=False)
    assert main(["run", str(tmp_path / "job.yaml"), "--no-ray", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "omnirl run: spec.model.lora.targetModules: ['qkv_proj'] match no layer of the model, so LoRA would train "
        f"nothing; list linear layers of {type(adapter.module).__name__}: "), err
    assert "attn.to_q" in err and not (tmp_path / "o").exists()
