"""`FluxAdapter`: FLUX.1 dev/schnell (`FluxTransformer2DModel`, `AutoencoderKL`, CLIP-L, T5).

Mirrors diffusers' `FluxPipeline` (0.42):
- Text: prompt_embeds = T5 last hidden states `[1, max_sequence_length, 4096]` (padded to
  max_sequence_length, no attention mask, as `_get_t5_prompt_embeds`); pooled = CLIP-L's
  `pooler_output` `[1, 768]` (`_get_clip_prompt_embeds`, padded to 77); txt_ids are zeros.
- Latents: callers see `[B, 16, H/8, W/8]` float32; `velocity` packs 2×2 patches into tokens
  `[B, (H/16)(W/16), 64]` (`_pack_latents`), with img_ids `[(H/16)(W/16), 3]` = (0, row, col)
  (`_prepare_latent_image_ids`), and unpacks the output.
- Time: the pipeline passes `timestep / 1000` of the scheduler's timesteps, i.e. σ itself (the
  transformer multiplies by 1000 inside) and the network predicts v = ε − x0: convention "sigma".
- Guidance: FLUX.1-dev is guidance-distilled (`guidance_embeds`): the guidance scale is an input
  (`guidance = w` per sample, one forward) and there is no classifier-free guidance; schnell has
  neither. The pipeline's optional "true CFG" (negative prompt) is not supported.
- σ grid: σ = linspace(1, 1/N, N) shifted by the scheduler with mu linear in the image token
  count (`_common.dynamic_shift_mu`, the pipeline's `calculate_shift`), then 0.
- Decode: z/scaling_factor + shift_factor, then the VAE.

Token-id layout (one flat list; ids travel unchanged from the controller to rollout and actor):
``[n_clip, n_t5, *clip_ids, *t5_ids]`` — two counts, then each tokenizer's ids with its special
tokens, truncated to its maximum length and NOT padded (`encode` pads with each tokenizer's pad
id, as the pipeline's `padding="max_length"` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.models.diffusers._common import (
    check_latents,
    decode_scaled,
    load_component,
)
from omnirl.models.diffusers.base import DiffusersAdapterBase
from omnirl.models.diffusers.qwen_image import pack_latents, unpack_latents
from omnirl.models.families import register_family
from omnirl.models.protocol import Conditioning

FLUX_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
"""Attention projections: both streams of `FluxTransformerBlock` and (by suffix) q/k/v of
`FluxSingleTransformerBlock` — the attention set of diffusers' FLUX LoRA scripts and Flow-GRPO
(which add the feed-forward `ff.net.*`, also possible via `model.lora.targetModules`). The single
blocks' `proj_mlp`/`proj_out` are left out: they are not in those defaults, and the suffix
"proj_out" would also hit the root output projection `proj_out` (the latent head)."""

FLUX_SUBFOLDERS = ["transformer", "vae", "scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"]
HEADER = 2
DEV_GUIDANCE = 3.5
"""`FluxPipeline.__call__`'s default guidance_scale (the embedded guidance of FLUX.1-dev)."""


def latent_image_ids(height: int, width: int, device: torch.device | str) -> Tensor:
    """Positions of the packed image tokens: `[height·width, 3]` float32 rows (0, row, col).

    `height`/`width` count 2×2 patches (latent H/2, W/2); row-major like `pack_latents`
    (`FluxPipeline._prepare_latent_image_ids`).
    """
    rows = torch.arange(height, device=device).repeat_interleave(width)
    cols = torch.arange(width, device=device).repeat(height)
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).to(torch.float32)


MAX_SEQUENCE_LENGTH = 512


def _load_tokenizers(root: Path) -> list:
    """[CLIP, T5] tokenizers of a FLUX directory."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    return [load_component(CLIPTokenizer, root, "tokenizer"), load_component(T5TokenizerFast, root, "tokenizer_2")]


def flux_tokenize(tokenizers: Sequence, max_sequence_length: int, text: str) -> list[int]:
    """Prompt → ``[n_clip, n_t5, *clip_ids, *t5_ids]`` (layout in the module docstring): CLIP truncated
    to its model_max_length, T5 to `max_sequence_length`."""
    clip = tokenizers[0](text, max_length=int(tokenizers[0].model_max_length), truncation=True).input_ids
    t5 = tokenizers[1](text, max_length=max_sequence_length, truncation=True).input_ids
    return [len(clip), len(t5), *clip, *t5]


@register_family("flux", parallel=("ulysses", "tensor"), notes={"cudnn": "FLUX's gradients through cuDNN were wrong on the H200"})
class FluxAdapter(DiffusersAdapterBase):
    """FLUX.1 behind `ModelAdapter`; built from in-memory components (or via `load`).

    Args:
        transformer: `FluxTransformer2DModel` (the trainable `module`; in_channels = 4·16).
        vae: `AutoencoderKL` (16 latent channels, `scaling_factor`/`shift_factor` in its config).
        scheduler_config: `FlowMatchEulerDiscreteScheduler` config (dynamic shifting).
        text_encoders: `[CLIPTextModel, T5EncoderModel]`.
        tokenizers: `[CLIPTokenizer, T5TokenizerFast]`.
        resolution: default `(height, width)` in pixels, multiple of 16 (8× VAE · 2×2 packing).
        guidance_scale: FLUX.1-dev's embedded guidance w (None → 3.5, the pipeline default); it is
            a network input, not CFG (one forward, no negative prompt). FLUX-schnell (no guidance
            embedding) accepts only None or 1 (the spec default), since it has no guidance input.
        max_sequence_length: T5 tokens (pipeline default 512; 256 is common for schnell).
        cache_size: prompts kept in the conditioning cache.
    Raises:
        ValueError: mismatched channels, a bad guidance_scale or max_sequence_length, or
            encoders/tokenizers not given as a pair.
    """

    pipeline = "FluxPipeline"
    subfolders = FLUX_SUBFOLDERS
    default_lora_targets = tuple(FLUX_LORA_TARGETS)

    @staticmethod
    def transformer_class():
        """The diffusers class of this family's transformer/ (what `load` reads; `registry.check_lora_targets`
        builds its skeleton from the config)."""
        from diffusers import FluxTransformer2DModel

        return FluxTransformer2DModel

    MAX_SEQUENCE_LENGTH = MAX_SEQUENCE_LENGTH

    @classmethod
    def adapter_options(cls, spec) -> dict:
        """As the base's, without `guidance_scale` at guidanceScale 1: FLUX-dev's embedded guidance keeps its
        default (3.5); schnell has none."""
        options = super().adapter_options(spec)
        if spec.algorithm.sampling.guidanceScale == 1.0:
            del options["guidance_scale"]
        return options

    time_convention = "sigma"
    linear_sigmas = True
    patch_size = 2

    def __init__(self, transformer: nn.Module, vae: nn.Module, scheduler_config: dict,
                 text_encoders: Sequence[nn.Module], tokenizers: Sequence, *, resolution: Sequence[int] = (512, 512),
                 guidance_scale: float | None = None, max_sequence_length: int = MAX_SEQUENCE_LENGTH,
                 cache_size: int = 4096) -> None:
        if len(text_encoders) != 2 or len(tokenizers) != 2 or any(m is None for m in (*text_encoders, *tokenizers)):
            raise ValueError("FLUX needs text_encoders [CLIPTextModel, T5EncoderModel] and tokenizers "
                             "[CLIPTokenizer, T5TokenizerFast]")
        config = transformer.config
        self.latent_channels = int(config.in_channels) // 4
        if int(config.out_channels or config.in_channels) != int(config.in_channels) or \
                int(vae.config.latent_channels) != self.latent_channels:
            raise ValueError(f"FLUX transformer in/out channels {config.in_channels}/{config.out_channels} must both be "
                             f"4 x VAE latent_channels ({vae.config.latent_channels})")
        if not 1 <= max_sequence_length <= 512:
            raise ValueError(f"max_sequence_length must be in [1, 512], got {max_sequence_length}")
        self.guidance_embeds = bool(config.guidance_embeds)
        if self.guidance_embeds:
            guidance_scale = DEV_GUIDANCE if guidance_scale is None else float(guidance_scale)
            if not guidance_scale > 0:
                raise ValueError(f"guidance_scale (FLUX-dev embedded guidance) must be > 0, got {guidance_scale}")
        elif guidance_scale not in (None, 1.0):
            raise ValueError(f"guidance_scale={guidance_scale} has no effect on FLUX-schnell (no guidance embedding, "
                             "no CFG); set it to 1 (algorithm.sampling.guidanceScale) or leave it unset")
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
        super().__init__(transformer, vae, scheduler_config, resolution=resolution, guidance_scale=1.0,
                         cache_size=cache_size)
        self.guidance_scale = float(guidance_scale) if guidance_scale is not None else 1.0
        self.text_encoders = list(text_encoders)
        self.tokenizers = list(tokenizers)
        self.clip_length = int(tokenizers[0].model_max_length)
        self.max_sequence_length = int(max_sequence_length)
        self.lora_target_modules = list(self.default_lora_targets)
        self.compile_block_types = ["FluxTransformerBlock", "FluxSingleTransformerBlock"]
        self.negative_ids = []

    @property
    def cfg_enabled(self) -> bool:
        """Always False: FLUX-dev's guidance is an input of the network, schnell has none."""
        return False

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
             **kwargs) -> FluxAdapter:
        """Load a local FLUX.1 diffusers directory (nothing is downloaded).

        Layout: transformer/, vae/, scheduler/, text_encoder/ (CLIP-L), tokenizer/,
        text_encoder_2/ (T5), tokenizer_2/. `kwargs` go to the constructor (resolution,
        guidance_scale, max_sequence_length, cache_size).
        Raises FileNotFoundError / OSError as `DiffusersAdapterBase._load_parts`.
        """
        from diffusers import AutoencoderKL
        from transformers import CLIPTextModel, T5EncoderModel

        root, transformer, vae, scheduler_config, tokenizers = cls._load_parts(
            path, cls.transformer_class(), AutoencoderKL, dtype, device)
        clip = load_component(CLIPTextModel, root, "text_encoder", dtype=dtype, device=device)
        t5 = load_component(T5EncoderModel, root, "text_encoder_2", dtype=dtype, device=device)
        return cls(transformer, vae, scheduler_config, [clip, t5], tokenizers, **kwargs)

    # ----------------------------------------------------------------- text
    read_tokenizers = staticmethod(_load_tokenizers)
    tokenize_with = staticmethod(flux_tokenize)

    def split_ids(self, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Inverse of the flat layout: (clip_ids, t5_ids).

        Raises:
            ValueError: a header that does not match the list length or the maximum lengths.
        """
        ids = [int(i) for i in ids]
        if len(ids) < HEADER:
            raise ValueError(f"FLUX prompt ids need the 2-count header [n_clip, n_t5, ...]; got {ids}")
        n_clip, n_t5 = ids[:HEADER]
        if min(n_clip, n_t5) < 1 or HEADER + n_clip + n_t5 != len(ids):
            raise ValueError(f"FLUX prompt ids header {ids[:HEADER]} does not match {len(ids) - HEADER} ids; "
                             "produce ids with FluxAdapter.tokenize")
        if n_clip > self.clip_length or n_t5 > self.max_sequence_length:
            raise ValueError(f"FLUX prompt ids longer than the encoders accept: CLIP {n_clip} > {self.clip_length} "
                             f"or T5 {n_t5} > {self.max_sequence_length}")
        return ids[HEADER:HEADER + n_clip], ids[HEADER + n_clip:]

    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        """One prompt → {"prompt_embeds": [1, max_sequence_length, D_t5], "pooled_prompt_embeds": [1, D_clip]}."""
        clip_ids, t5_ids = self.split_ids(ids)
        clip, t5 = self.text_encoders
        clip_pad, t5_pad = self.tokenizers[0].pad_token_id, self.tokenizers[1].pad_token_id
        clip_in = torch.tensor([clip_ids + [clip_pad] * (self.clip_length - len(clip_ids))], device=device)
        t5_in = torch.tensor([t5_ids + [t5_pad] * (self.max_sequence_length - len(t5_ids))], device=device)
        pooled = clip(clip_in, output_hidden_states=False).pooler_output.to(clip.dtype)
        embeds = t5(t5_in, output_hidden_states=False)[0].to(t5.dtype)
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    # ----------------------------------------------------------------- denoiser and VAE
    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditioning, *, detach_uncond: bool = False) -> Tensor:
        """v = ε − x0 `[B, 16, H, W]` float32 at σ `[B]` float32 (one transformer forward of B rows).

        Packs 2×2 patches (`[B, (H/2)(W/2), 64]` in the transformer's dtype), img_ids from
        `latent_image_ids`, txt_ids zeros `[L, 3]`, timestep = σ, and for FLUX-dev
        guidance = `guidance_scale` per sample (float32); unpacks the output to float32.
        `detach_uncond` exists for interface parity with the CFG adapters and changes nothing.
        Raises:
            ValueError: wrong shapes/dtypes or odd latent height/width.
        """
        check_latents(x, sigma, self.latent_channels)
        b, _, h, w = x.shape
        if h % 2 or w % 2:
            raise ValueError(f"FLUX latents need even H and W to pack 2x2 patches; got {h}x{w}")
        embeds = cond["prompt_embeds"]
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full((b,), self.guidance_scale, dtype=torch.float32, device=x.device)
        out = self.module(hidden_states=pack_latents(x).to(self.compute_dtype()), timestep=sigma.to(torch.float32),
                          guidance=guidance, pooled_projections=cond["pooled_prompt_embeds"],
                          encoder_hidden_states=embeds,
                          txt_ids=torch.zeros(embeds.shape[1], 3, dtype=torch.float32, device=x.device),
                          img_ids=latent_image_ids(h // 2, w // 2, x.device), return_dict=False)[0]
        return unpack_latents(out.float(), h, w)

    @torch.no_grad()
    def decode(self, x0: Tensor) -> Tensor:
        """Clean latents `[B, 16, H, W]` → images `[B, 8H, 8W, 3]` uint8: VAE(z/scaling + shift)."""
        return decode_scaled(self.vae, x0)
