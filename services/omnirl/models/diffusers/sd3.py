"""`SD3Adapter`: Stable Diffusion 3 / 3.5 (`SD3Transformer2DModel`, `AutoencoderKL`, CLIP-L, CLIP-G, T5).

Mirrors diffusers' `StableDiffusion3Pipeline` (0.42): text conditioning = [CLIP-L ‖ CLIP-G
penultimate hidden states, zero-padded to the T5 width] ++ T5 last hidden states along the
sequence; pooled = CLIP-L ‖ CLIP-G projected embeddings. Time: the transformer takes
timestep = σ·1000 and predicts v = ε − x0 (diffusers' flow-matching convention), so the
adapter's time convention is "sigma". Latents are `[B, 16, H/8, W/8]` (no packing: the
transformer patchifies itself). Decode: z/scaling_factor + shift_factor, then the VAE.

Token-id layout (one flat list, so ids travel unchanged from the controller to rollout and
actor): ``[n_l, n_g, n_t5, *clip_l_ids, *clip_g_ids, *t5_ids]`` — three counts, then each
tokenizer's ids with its special tokens, truncated to its maximum length and NOT padded
(`encode` pads with each tokenizer's pad id, as the pipeline's `padding="max_length"` does).
n_t5 = 0 when the checkpoint has no T5 (its embeddings are then zeros, as in the pipeline).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.models.compile import compile_kwargs
from omnirl.models.diffusers._common import (
    check_latents,
    decode_scaled,
    guided,
    load_component,
)
from omnirl.models.diffusers.base import DiffusersAdapterBase
from omnirl.models.diffusers.sd3_packed import EAGER_BLOCK, PackedBlock, sd3_packed_forward
from omnirl.models.families import register_family
from omnirl.models.protocol import Conditioning

SD3_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
"""Attention projections of `JointTransformerBlock` (incl. SD3.5's `attn2`), Flow-GRPO's choice."""

SD3_SUBFOLDERS = ["transformer", "vae", "scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"]
HEADER = 3


MAX_SEQUENCE_LENGTH = 256


def _has_t5(root: Path) -> bool:
    """Whether an SD3 directory carries the optional T5 encoder (text_encoder_3/ and tokenizer_3/)."""
    return (root / "text_encoder_3").is_dir() and (root / "tokenizer_3").is_dir()


def _load_tokenizers(root: Path) -> list:
    """[CLIP-L, CLIP-G, T5 or None] tokenizers of an SD3 directory (T5 only with text_encoder_3/ + tokenizer_3/)."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    has_t5 = _has_t5(root)
    return [load_component(CLIPTokenizer, root, "tokenizer"), load_component(CLIPTokenizer, root, "tokenizer_2"),
            load_component(T5TokenizerFast, root, "tokenizer_3") if has_t5 else None]


def sd3_tokenize(tokenizers: Sequence, max_sequence_length: int, text: str) -> list[int]:
    """Prompt → ``[n_l, n_g, n_t5, *clip_l, *clip_g, *t5]`` (layout in the module docstring): each
    tokenizer's ids with special tokens, CLIP truncated to its model_max_length, T5 to `max_sequence_length`."""
    clip_length = int(tokenizers[0].model_max_length)
    clip_l = tokenizers[0](text, max_length=clip_length, truncation=True).input_ids
    clip_g = tokenizers[1](text, max_length=clip_length, truncation=True).input_ids
    t5 = []
    if tokenizers[2] is not None:
        t5 = tokenizers[2](text, max_length=max_sequence_length, truncation=True, add_special_tokens=True).input_ids
    return [len(clip_l), len(clip_g), len(t5), *clip_l, *clip_g, *t5]


@register_family("sd3", packed=True, attention=("cudnn",))  # cuDNN: velocity and gradients matched torch's
# own kernel choice on the H200 (bf16; GPU tests in tests/models/test_*.py)
class SD3Adapter(DiffusersAdapterBase):
    """SD3/SD3.5 behind `ModelAdapter`; built from in-memory components (or via `load`).

    Args:
        transformer: `SD3Transformer2DModel` (the trainable `module`).
        vae: `AutoencoderKL` with `scaling_factor`/`shift_factor` in its config.
        scheduler_config: `FlowMatchEulerDiscreteScheduler` config dict (fixed `shift`, 3.0 for SD3.5).
        text_encoders: `[CLIPTextModelWithProjection, CLIPTextModelWithProjection, T5EncoderModel | None]`.
        tokenizers: `[CLIPTokenizer, CLIPTokenizer, T5TokenizerFast | None]` (None only with no T5).
        resolution: default `(height, width)` in pixels, multiple of 16 (8× VAE · patch 2).
        guidance_scale: CFG weight w (SD3.5 recipes: 4.5; Flow-GRPO trains with CFG); 1 = off.
        negative_prompt: the unconditional prompt ("" as in the pipeline).
        max_sequence_length: T5 tokens (pipeline default 256, at most 512).
        cache_size: prompts kept in the conditioning cache.
    """

    pipeline = "StableDiffusion3Pipeline"
    subfolders = SD3_SUBFOLDERS
    default_lora_targets = tuple(SD3_LORA_TARGETS)

    @staticmethod
    def transformer_class():
        """The diffusers class of this family's transformer/ (what `load` reads; `registry.check_lora_targets`
        builds its skeleton from the config)."""
        from diffusers import SD3Transformer2DModel

        return SD3Transformer2DModel

    MAX_SEQUENCE_LENGTH = MAX_SEQUENCE_LENGTH

    latent_channels: int
    patch_size: int
    _packed_block: PackedBlock = EAGER_BLOCK  # `compile_packed` swaps in compiled stages

    def __init__(self, transformer: nn.Module, vae: nn.Module, scheduler_config: dict,
                 text_encoders: Sequence[nn.Module | None], tokenizers: Sequence, *,
                 resolution: Sequence[int] = (512, 512), guidance_scale: float = 1.0,
                 negative_prompt: str = "", max_sequence_length: int = MAX_SEQUENCE_LENGTH, cache_size: int = 4096) -> None:
        if len(text_encoders) != 3 or len(tokenizers) != 3:
            raise ValueError("SD3 needs text_encoders and tokenizers for [CLIP-L, CLIP-G, T5 or None]")
        if (text_encoders[2] is None) != (tokenizers[2] is None):
            raise ValueError("text_encoders[2] (T5) and tokenizers[2] must both be given or both be None")
        if not 1 <= max_sequence_length <= 512:
            raise ValueError(f"max_sequence_length must be in [1, 512], got {max_sequence_length}")
        self.latent_channels = int(transformer.config.in_channels)
        self.patch_size = int(transformer.config.patch_size)
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
        super().__init__(transformer, vae, scheduler_config, resolution=resolution,
                         guidance_scale=guidance_scale, cache_size=cache_size)
        self.text_encoders = list(text_encoders)
        self.tokenizers = list(tokenizers)
        self.lora_target_modules = list(self.default_lora_targets)
        self.compile_block_types = ["JointTransformerBlock"]
        self.clip_length = int(tokenizers[0].model_max_length)
        self.max_sequence_length = int(max_sequence_length)
        self.negative_ids = self.tokenize(negative_prompt)

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
             **kwargs) -> SD3Adapter:
        """Load a local SD3/SD3.5 diffusers directory (nothing is downloaded).

        Layout: transformer/, vae/, scheduler/, text_encoder/, text_encoder_2/, tokenizer/,
        tokenizer_2/ and optionally text_encoder_3/ + tokenizer_3/ (T5). `kwargs` go to the
        constructor (resolution, guidance_scale, negative_prompt, max_sequence_length, cache_size).
        Raises FileNotFoundError / OSError as `DiffusersAdapterBase._load_parts`.
        """
        from diffusers import AutoencoderKL
        from transformers import CLIPTextModelWithProjection, T5EncoderModel

        root, transformer, vae, scheduler_config, tokenizers = cls._load_parts(
            path, cls.transformer_class(), AutoencoderKL, dtype, device)
        clip_l = load_component(CLIPTextModelWithProjection, root, "text_encoder", dtype=dtype, device=device)
        clip_g = load_component(CLIPTextModelWithProjection, root, "text_encoder_2", dtype=dtype, device=device)
        t5 = load_component(T5EncoderModel, root, "text_encoder_3", dtype=dtype, device=device) if tokenizers[2] else None
        return cls(transformer, vae, scheduler_config, [clip_l, clip_g, t5], tokenizers, **kwargs)

    # ----------------------------------------------------------------- text
    read_tokenizers = staticmethod(_load_tokenizers)

    @staticmethod
    def optional_text_encoders(root: Path) -> list[str]:
        """T5 (text_encoder_3/) when the directory has it and its tokenizer (`load` reads it then)."""
        return ["text_encoder_3"] if _has_t5(root) else []

    tokenize_with = staticmethod(sd3_tokenize)

    def split_ids(self, ids: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """Inverse of the flat layout: (clip_l, clip_g, t5) id lists.

        Raises:
            ValueError: a header that does not match the list length or the maximum lengths.
        """
        ids = [int(i) for i in ids]
        if len(ids) < HEADER:
            raise ValueError(f"SD3 prompt ids need the 3-count header [n_l, n_g, n_t5, ...]; got {ids}")
        n_l, n_g, n_t = ids[:HEADER]
        if min(n_l, n_g, n_t) < 0 or HEADER + n_l + n_g + n_t != len(ids):
            raise ValueError(f"SD3 prompt ids header {ids[:HEADER]} does not match {len(ids) - HEADER} ids; "
                             "produce ids with SD3Adapter.tokenize")
        if max(n_l, n_g) > self.clip_length or n_t > self.max_sequence_length:
            raise ValueError(f"SD3 prompt ids longer than the encoders accept: CLIP {n_l}/{n_g} > {self.clip_length} "
                             f"or T5 {n_t} > {self.max_sequence_length}")
        if (n_t > 0) != (self.text_encoders[2] is not None):
            raise ValueError(f"SD3 prompt ids carry {n_t} T5 ids but the model {'has' if n_t == 0 else 'lacks'} T5")
        return ids[HEADER:HEADER + n_l], ids[HEADER + n_l:HEADER + n_l + n_g], ids[HEADER + n_l + n_g:]

    @staticmethod
    def _pad(ids: list[int], length: int, pad_id: int, device: torch.device) -> Tensor:
        return torch.tensor([ids + [pad_id] * (length - len(ids))], dtype=torch.long, device=device)

    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        """One prompt's ids → {"prompt_embeds": [1, 2·77 + L_t5 → S, D], "pooled_prompt_embeds": [1, P]}."""
        parts = self.split_ids(ids)
        hidden, pooled = [], []
        for k in range(2):
            encoder, tokenizer = self.text_encoders[k], self.tokenizers[k]
            out = encoder(self._pad(parts[k], self.clip_length, tokenizer.pad_token_id, device), output_hidden_states=True)
            hidden.append(out.hidden_states[-2])
            pooled.append(out[0])
        dtype = self.text_encoders[0].dtype
        clip = torch.cat(hidden, dim=-1).to(dtype)
        if self.text_encoders[2] is not None:
            t5_ids = self._pad(parts[2], self.max_sequence_length, self.tokenizers[2].pad_token_id, device)
            t5 = self.text_encoders[2](t5_ids)[0].to(self.text_encoders[2].dtype)
        else:
            t5 = torch.zeros(1, self.max_sequence_length, self.module.config.joint_attention_dim, dtype=dtype, device=device)
        clip = nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return {"prompt_embeds": torch.cat([clip, t5.to(clip.dtype)], dim=-2),
                "pooled_prompt_embeds": torch.cat(pooled, dim=-1)}

    # ----------------------------------------------------------------- denoiser and VAE
    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditioning, *, detach_uncond: bool = False) -> Tensor:
        """v = ε − x0 `[B, C, H, W]` float32 at σ `[B]`; guided when `has_negative(cond)`.

        The transformer gets timestep = σ·1000 (float32) and the latents in its own dtype; CFG
        runs one forward on [uncond; cond] (2B rows, the pipeline's order), combined in float32 as
        v_u + w·(v_c − v_u). `detach_uncond` stops gradients through v_u (same values, so
        rollout and training stay identical; the forward still costs 2B rows).
        Raises:
            ValueError: wrong shapes/dtypes, or `cond` lacks prompt_embeds/pooled_prompt_embeds.
        """
        check_latents(x, sigma, self.latent_channels)
        embeds, pooled = cond["prompt_embeds"], cond["pooled_prompt_embeds"]
        timestep = sigma.to(torch.float32) * 1000.0
        cfg = self.has_negative(cond)
        hidden = x.to(self.compute_dtype())
        if cfg:
            hidden = torch.cat([hidden, hidden])
            embeds = torch.cat([cond["negative_prompt_embeds"], embeds])
            pooled = torch.cat([cond["negative_pooled_prompt_embeds"], pooled])
            timestep = torch.cat([timestep, timestep])
        out = self.module(hidden_states=hidden, encoder_hidden_states=embeds, pooled_projections=pooled,
                          timestep=timestep, return_dict=False)[0].float()
        if not cfg:
            return out
        v_uncond, v_cond = out.chunk(2)
        return guided(v_cond, v_uncond, self.guidance_scale, detach_uncond)

    def velocity_packed(self, xs: Sequence[Tensor], sigma: Tensor, cond: Conditioning, *,
                        detach_uncond: bool = False) -> list[Tensor]:
        """`velocity` for samples of different latent sizes in ONE transformer forward.

        Args:
            xs: B latents `[C, H_i, W_i]` float32, any mix of sizes.
            sigma: `[B]` σ per sample.
            cond: conditioning with leading dimension B (as `encode` returns; one text length).
        Returns:
            B velocities `[C, H_i, W_i]` float32; sample i's equals `velocity(xs[i][None], ...)`
            up to rounding (see `sd3_packed`). CFG as in `velocity`: the [uncond; cond] rows
            share the one packed forward.
        Raises:
            ValueError: an empty list, wrong shapes/dtypes, or `cond` lacking the SD3 keys.
        """
        if not xs:
            raise ValueError("xs is empty; velocity_packed needs at least one latent")
        if sigma.ndim != 1 or sigma.shape[0] != len(xs):
            raise ValueError(f"sigma must be [B] = [{len(xs)}]; got shape {tuple(sigma.shape)}")
        for i, x in enumerate(xs):
            check_latents(x[None], sigma[i:i + 1], self.latent_channels)
        embeds, pooled = cond["prompt_embeds"], cond["pooled_prompt_embeds"]
        timestep = sigma.to(torch.float32) * 1000.0
        cfg = self.has_negative(cond)
        dtype = self.compute_dtype()
        hidden = [x.to(dtype) for x in xs]
        if cfg:
            hidden = hidden + hidden
            embeds = torch.cat([cond["negative_prompt_embeds"], embeds])
            pooled = torch.cat([cond["negative_pooled_prompt_embeds"], pooled])
            timestep = torch.cat([timestep, timestep])
        out = [o.float() for o in sd3_packed_forward(self.module, hidden, embeds, pooled, timestep,
                                                     block_fn=self._packed_block)]
        if not cfg:
            return out
        n = len(xs)
        return [guided(out[n + i], out[i], self.guidance_scale, detach_uncond) for i in range(n)]

    def compile_packed(self, *, dynamic: bool = True, mode: str | None = None) -> None:
        """`torch.compile` the per-token stages of the packed blocks `velocity_packed` runs (lazily).

        The packed path calls the blocks' submodules, not the (regionally compiled) blocks, so it
        needs its own compiled function; `omnirl.models.compile.compile_adapter_module` calls this.
        """
        self._packed_block = PackedBlock(compile_kwargs(dynamic=dynamic, mode=mode))

    @torch.no_grad()
    def decode(self, x0: Tensor) -> Tensor:
        """Clean latents `[B, C, H, W]` → images `[B, 8H, 8W, 3]` uint8: VAE(z/scaling + shift)."""
        return decode_scaled(self.vae, x0)
