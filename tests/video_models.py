"""Tiny random video pipelines of the real diffusers classes, built and saved locally (nothing downloaded).

`save_tiny(family, path)` writes a diffusers directory that `omnirl`'s `wan`, `ltx2` and `minimax-h3`
families load, and that the family's own diffusers pipeline loads too (`WanPipeline`, `LTX2Pipeline`,
`MiniMaxH3ModularPipeline`): the references the adapter tests compare against. Tokenizers are built from a
character vocabulary written here. Every size is the smallest the classes accept, so a forward and a
backward run on a CPU in well under a second.

The dimension ties of LTX-2 (docs/families-video.md): the connectors' heads x head dim equal the text
encoder's hidden size; the audio VAE's `base_channels` equal its latent channels x mel bins / 4; the
vocoder's input channels equal the audio VAE's output channels x mel bins.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789\"' "
GEOMETRY = {  # frames, height, width, fps each tiny family generates
    "wan": (9, 16, 16, 8.0),
    "ltx2": (9, 32, 32, 25.0),
    "minimax-h3": (124, 32, 32, 24.0),
}
MAX_SEQUENCE_LENGTH = 16


def _t5_vocab() -> list[tuple[str, float]]:
    return [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)] + [(c, -3.0) for c in CHARS.strip()]


def _char_tokenizer(cls, specials: dict[str, int], **kwargs):
    """A fast tokenizer of `cls` over single characters (`tokenizers` WordLevel): ids are stable and short."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = dict(specials)
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=kwargs.get("unk_token", "<unk>")))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    bos = kwargs.get("bos_token")
    if bos is not None:  # Gemma's tokenizer starts every text with <bos>
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return cls(tokenizer_object=tok, model_max_length=MAX_SEQUENCE_LENGTH, **kwargs)


def wan_pipeline(*, expand_timesteps: bool = False):
    """A tiny `WanPipeline` (Wan 2.1 layout: UMT5, 16-channel VAE with factors 4 and 8, UniPC flow scheduler)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import T5TokenizerFast, UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    vocab = _t5_vocab()
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(vocab), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)).eval()
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                                        num_train_timesteps=1000)
    return WanPipeline(tokenizer=T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=MAX_SEQUENCE_LENGTH), text_encoder=text_encoder, vae=vae,
                       scheduler=scheduler, transformer=transformer, expand_timesteps=expand_timesteps)


def ltx2_pipeline():
    """A tiny `LTX2Pipeline`: Gemma3 (with a tiny SigLIP tower), connectors, video VAE (factors 2 and 2), audio
    VAE (16 kHz, 8 mel bins, hop 160), vocoder, and a transformer with both streams and their cross-attention."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        GemmaTokenizerFast,
        SiglipVisionConfig,
    )

    torch.manual_seed(0)
    tokenizer = _char_tokenizer(GemmaTokenizerFast, {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3},
                                bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    text = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                            sliding_window=8, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=14, patch_size=7)
    text_encoder = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision,
                                                               mm_tokens_per_image=4)).eval()
    hidden = text.hidden_size
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=hidden, rope_double_precision=False, rope_type="split")
    connectors = LTX2TextConnectors(  # 4 heads x 8 = 32 = the text encoder's hidden size
        caption_channels=hidden, text_proj_in_factor=text.num_hidden_layers + 1, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8, video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4, audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
        rope_double_precision=False, causal_temporal_positioning=False, rope_type="split")
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
        layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False)
    audio_vae = AutoencoderKLLTX2Audio(  # base_channels 4 = latent 2 x mel 8 / 4
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8)
    vocoder = LTX2Vocoder(  # in 16 = audio VAE output 2 x mel 8
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins, hidden_channels=32, out_channels=2,
        upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1, output_sampling_rate=16000)
    return LTX2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, audio_vae=audio_vae,
                        text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors,
                        transformer=transformer, vocoder=vocoder)


def save_tiny(family: str, path: Path) -> Path:
    """Build the tiny pipeline of `family` and save it to `path` (`save_pretrained`, safetensors). Returns `path`."""
    torch.set_num_threads(1)
    if family == "wan":
        wan_pipeline().save_pretrained(path)
    elif family == "ltx2":
        ltx2_pipeline().save_pretrained(path)
    elif family == "minimax-h3":
        save_minimax_h3(path)
    else:
        raise ValueError(f"no tiny pipeline for family {family!r}")
    return Path(path)


def minimax_h3_components() -> dict:
    """The tiny MiniMax-H3 components: Qwen3-VL with 51 decoder layers (the family reads hidden_states[50]) of width
    16, a 4-channel video VAE (factors 16 and 4, 17-frame chunks), a 4-channel audio VAE (hop 4 at 160 Hz: 40 latents
    per second, as the released one), the transformer, and the two schedulers (video shift 12, audio shift 3)."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import Qwen2TokenizerFast, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>"]
    tokenizer = _char_tokenizer(Qwen2TokenizerFast, {s: i for i, s in enumerate(specials)}, unk_token="<|endoftext|>",
                                pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in specials}
    config = Qwen3VLConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 51,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 256,
                     "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "deepstack_visual_indexes": [], "num_position_embeddings": 16},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    text_encoder = Qwen3VLForConditionalGeneration(config).eval()
    transformer = MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=8, hidden_size=16, num_layers=2, num_refiner_layers=1, ffn_dim=32,
        in_channels=4, audio_in_channels=4, patch_size=(1, 2, 2), text_dim=16, freq_dim=16, time_embed_hidden_dim=16,
        time_embed_dim=8, rope_freq_dim=1)
    vae = AutoencoderKLMiniMaxH3(
        latent_channels=4, block_out_channels=(8,) * 6, layers_per_block=1, norm_num_groups=4, decoder_num_layers=1,
        decoder_num_attention_heads=2, decoder_attention_head_dim=8, decoder_num_register_tokens=1, decoder_ffn_mult=1,
        latents_mean=(0.1,) * 4, latents_std=(1.5,) * 4)
    audio_vae = AutoencoderKLMiniMaxH3Audio(
        encoder_dim=4, encoder_rates=(2, 2), latent_dim=8, latent_channels=4, num_attention_heads=2, decoder_dim=8,
        decoder_rates=(2, 2), decoder_kernel_sizes=(4, 4), resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1,),),
        sampling_rate=160, latents_mean=[0.05] * 4, latents_std=[0.8] * 4)
    return {"transformer": transformer, "vae": vae, "audio_vae": audio_vae, "text_encoder": text_encoder,
            "tokenizer": tokenizer, "scheduler": MiniMaxH3Scheduler(shift=12.0),
            "audio_scheduler": MiniMaxH3Scheduler(shift=3.0)}


def save_minimax_h3(path: Path) -> None:
    """A tiny MiniMax-H3 directory as `MiniMaxH3ModularPipeline.save_pretrained` writes it (modular_model_index.json and
    a folder per component). Its processor (`Qwen3VLProcessor`) is left out: building one needs torchvision, and the
    `t2va` text path needs only the token ids."""
    from diffusers.modular_pipelines import MiniMaxH3Blocks, MiniMaxH3ModularPipeline

    pipe = MiniMaxH3ModularPipeline(blocks=MiniMaxH3Blocks())
    pipe.update_components(**minimax_h3_components())
    pipe.save_pretrained(str(path), overwrite_modular_index=True)
