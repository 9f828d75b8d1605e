"""`QwenImageAdapter`: Qwen-Image (`QwenImageTransformer2DModel`, `AutoencoderKLQwenImage`, Qwen2.5-VL).

Mirrors diffusers' `QwenImagePipeline` (0.42):
- Text: the prompt is wrapped in the chat template below, encoded by Qwen2.5-VL; the last hidden
  states minus the first `DROP_IDX` (system-prompt) tokens are the conditioning, padded with zeros
  to `max_sequence_length` and masked (`prompt_embeds_mask`, 1 = token, 0 = padding).
- Latents: callers see `[B, 16, H/8, W/8]`; `velocity` packs 2×2 patches into tokens
  `[B, (H/2)(W/2), 64]` for the transformer and unpacks its output.
- Time: the transformer takes σ itself (its `Timesteps` embedding multiplies by 1000, so the
  effective timestep is σ·1000 as in SD3) and predicts v = ε − x0: time convention "sigma".
- σ grid: σ = linspace(1, 1/N, N), dynamic ("exponential") shift with mu linear in the image
  token count, then the `shift_terminal` stretch (see `sigmas`).
- CFG ("true CFG"): v = v_u + w(v_c − v_u), rescaled per token to the norm of v_c.
- Decode: z·latents_std + latents_mean per channel, then the VAE on a one-frame video.

Token ids are the templated prompt's ids (truncated to max_sequence_length + DROP_IDX), unpadded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.models.diffusers._common import (
    check_latents,
    load_component,
    to_uint8_images,
)
from omnirl.models.diffusers.base import DiffusersAdapterBase
from omnirl.models.families import register_family
from omnirl.models.protocol import Conditioning

PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
"""`QwenImagePipeline.prompt_template_encode` (diffusers 0.42); a test compares the two."""
DROP_IDX = 34
"""`QwenImagePipeline.prompt_template_encode_start_idx`: template tokens dropped from the embeddings."""

QWEN_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
"""Attention projections of `QwenImageTransformerBlock` (image and text streams)."""

QWEN_SUBFOLDERS = ["transformer", "vae", "scheduler", "text_encoder", "tokenizer"]


def pack_latents(x: Tensor) -> Tensor:
    """`[B, C, H, W]` → `[B, (H/2)(W/2), 4C]`: 2×2 patches as tokens (`QwenImagePipeline._pack_latents`)."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: Tensor, height: int, width: int) -> Tensor:
    """`[B, (H/2)(W/2), 4C]` → `[B, C, H, W]`, the inverse of `pack_latents`."""
    b, _, d = tokens.shape
    c = d // 4
    return tokens.view(b, height // 2, width // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, height, width)


def norm_preserving_cfg(v_cond: Tensor, v_uncond: Tensor, scale: float, detach_uncond: bool) -> Tensor:
    """Qwen-Image's true CFG on packed tokens `[B, N, D]` (float32).

    v = v_u + w·(v_c − v_u) (arXiv 2207.12598 eq. 6), then rescaled per token so that
    ‖v‖ = ‖v_c‖ over the last dimension (diffusers `QwenImagePipeline.__call__`).
    """
    if detach_uncond:
        v_uncond = v_uncond.detach()
    combined = v_uncond + scale * (v_cond - v_uncond)
    return combined * (torch.linalg.vector_norm(v_cond, dim=-1, keepdim=True)
                       / torch.linalg.vector_norm(combined, dim=-1, keepdim=True))


MAX_SEQUENCE_LENGTH = 512


def _load_tokenizers(root: Path) -> list:
    """[the `Qwen2Tokenizer`] of a Qwen-Image directory."""
    from transformers import Qwen2Tokenizer

    return [load_component(Qwen2Tokenizer, root, "tokenizer")]


def qwen_tokenize(tokenizers: Sequence, max_sequence_length: int, text: str) -> list[int]:
    """Prompt → ids of `PROMPT_TEMPLATE.format(text)`, truncated to max_sequence_length + DROP_IDX."""
    return list(tokenizers[0](PROMPT_TEMPLATE.format(text), max_length=max_sequence_length + DROP_IDX,
                          truncation=True).input_ids)


@register_family("qwen-image", parallel=("ulysses", "tensor"), attention=("cudnn",))  # cuDNN: velocity and gradients matched torch's own
# kernel choice on the H200 (bf16; GPU tests in tests/models/test_*.py)
class QwenImageAdapter(DiffusersAdapterBase):
    """Qwen-Image behind `ModelAdapter`; built from in-memory components (or via `load`).

    Args:
        transformer: `QwenImageTransformer2DModel` (the trainable `module`; not guidance-distilled).
        vae: `AutoencoderKLQwenImage` (`latents_mean`/`latents_std` in its config).
        scheduler_config: `FlowMatchEulerDiscreteScheduler` config (dynamic shifting).
        text_encoder: `Qwen2_5_VLForConditionalGeneration`.
        tokenizer: `Qwen2Tokenizer`.
        resolution: default `(height, width)` in pixels, multiple of 16.
        guidance_scale: true-CFG weight w (VeRL-Omni recipes: 4); 1 = off.
        negative_prompt: the unconditional prompt (" " as in Qwen-Image's examples).
        max_sequence_length: text tokens kept after the template (pipeline default 512, ≤ 1024).
        text_bucket: `velocity` trims the text padding to the batch's longest prompt rounded up
            to this multiple (masked tokens change nothing; fewer distinct shapes for compile).
        cache_size: prompts kept in the conditioning cache.
    Raises:
        ValueError: a guidance-distilled transformer, mismatched channels, bad lengths.
    """

    pipeline = "QwenImagePipeline"
    subfolders = QWEN_SUBFOLDERS
    default_lora_targets = tuple(QWEN_LORA_TARGETS)

    @staticmethod
    def transformer_class():
        """The diffusers class of this family's transformer/ (what `load` reads; `registry.check_lora_targets`
        builds its skeleton from the config)."""
        from diffusers import QwenImageTransformer2DModel

        return QwenImageTransformer2DModel

    MAX_SEQUENCE_LENGTH = MAX_SEQUENCE_LENGTH

    linear_sigmas = True
    patch_size = 2

    def __init__(self, transformer: nn.Module, vae: nn.Module, scheduler_config: dict, text_encoder: nn.Module,
                 tokenizer, *, resolution: Sequence[int] = (512, 512), guidance_scale: float = 1.0,
                 negative_prompt: str = " ", max_sequence_length: int = MAX_SEQUENCE_LENGTH, text_bucket: int = 32,
                 cache_size: int = 4096) -> None:
        config = transformer.config
        if config.guidance_embeds:
            raise ValueError("guidance-distilled Qwen-Image transformers (guidance_embeds=True) are not supported")
        self.latent_channels = int(config.in_channels) // 4
        if int(config.out_channels or config.in_channels) != self.latent_channels:
            raise ValueError(f"transformer out_channels {config.out_channels} != in_channels/4 = {self.latent_channels}")
        if not 1 <= max_sequence_length <= 1024 or text_bucket < 1:
            raise ValueError(f"need 1 <= max_sequence_length <= 1024 and text_bucket >= 1; got "
                             f"{max_sequence_length}, {text_bucket}")
        self.vae_scale_factor = 2 ** len(vae.temperal_downsample)
        super().__init__(transformer, vae, scheduler_config, resolution=resolution,
                         guidance_scale=guidance_scale, cache_size=cache_size)
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.tokenizers = [tokenizer]
        self.max_sequence_length = int(max_sequence_length)
        self.text_bucket = int(text_bucket)
        self.lora_target_modules = list(self.default_lora_targets)
        self.compile_block_types = ["QwenImageTransformerBlock"]
        self.negative_ids = self.tokenize(negative_prompt)

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
             **kwargs) -> QwenImageAdapter:
        """Load a local Qwen-Image diffusers directory (nothing is downloaded).

        Layout: transformer/, vae/, scheduler/, text_encoder/, tokenizer/. `kwargs` go to the
        constructor.
        Raises FileNotFoundError / OSError as `DiffusersAdapterBase._load_parts`.
        """
        from diffusers import AutoencoderKLQwenImage
        from transformers import Qwen2_5_VLForConditionalGeneration

        root, transformer, vae, scheduler_config, (tokenizer,) = cls._load_parts(
            path, cls.transformer_class(), AutoencoderKLQwenImage, dtype, device)
        text_encoder = load_component(Qwen2_5_VLForConditionalGeneration, root, "text_encoder", dtype=dtype, device=device)
        return cls(transformer, vae, scheduler_config, text_encoder, tokenizer, **kwargs)

    # ----------------------------------------------------------------- text
    read_tokenizers = staticmethod(_load_tokenizers)
    tokenize_with = staticmethod(qwen_tokenize)

    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        """One prompt → {"prompt_embeds": [1, L, D] (zero-padded), "prompt_embeds_mask": [1, L] int64}."""
        if not DROP_IDX < len(ids) <= self.max_sequence_length + DROP_IDX:
            raise ValueError(f"Qwen-Image prompt ids must hold the template: {DROP_IDX} < len <= "
                             f"{self.max_sequence_length + DROP_IDX}; got {len(ids)} (use QwenImageAdapter.tokenize)")
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        out = self.text_encoder(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_hidden_states=True)
        hidden = out.hidden_states[-1][:, DROP_IDX:].to(self.text_encoder.dtype)
        n = hidden.shape[1]
        embeds = nn.functional.pad(hidden, (0, 0, 0, self.max_sequence_length - n))
        mask = torch.zeros(1, self.max_sequence_length, dtype=torch.long, device=device)
        mask[:, :n] = 1
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def _trim(self, masks: list[Tensor]) -> int:
        """Text length to keep: the longest valid prefix in the batch, rounded up to `text_bucket`."""
        positions = torch.arange(1, masks[0].shape[1] + 1, device=masks[0].device)
        longest = max(int((m.bool() * positions).amax()) for m in masks)
        return min(masks[0].shape[1], -(-max(longest, 1) // self.text_bucket) * self.text_bucket)

    # ----------------------------------------------------------------- denoiser and VAE
    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditioning, *, detach_uncond: bool = False) -> Tensor:
        """v = ε − x0 `[B, C, H, W]` float32 at σ `[B]`; true CFG when `has_negative(cond)`.

        Packs 2×2 patches, calls the transformer with timestep = σ (it scales by 1000 inside),
        the text trimmed to the batch's longest prompt (see `text_bucket`) and its mask; with CFG
        one forward over [uncond; cond] (2B rows), combined in float32 by `norm_preserving_cfg`.
        `detach_uncond` stops gradients through v_u (values unchanged).
        Raises:
            ValueError: wrong shapes/dtypes or odd latent height/width.
        """
        check_latents(x, sigma, self.latent_channels)
        _, _, h, w = x.shape
        if h % 2 or w % 2:
            raise ValueError(f"Qwen-Image latents need even H and W to pack 2x2 patches; got {h}x{w}")
        cfg = self.has_negative(cond)
        embeds, mask = cond["prompt_embeds"], cond["prompt_embeds_mask"]
        if cfg:
            embeds = torch.cat([cond["negative_prompt_embeds"], embeds])
            mask = torch.cat([cond["negative_prompt_embeds_mask"], mask])
        length = self._trim([mask])
        tokens = pack_latents(x).to(self.compute_dtype())
        timestep = sigma.to(torch.float32)
        if cfg:
            tokens, timestep = torch.cat([tokens, tokens]), torch.cat([timestep, timestep])
        out = self.module(hidden_states=tokens, encoder_hidden_states=embeds[:, :length],
                          encoder_hidden_states_mask=mask[:, :length], timestep=timestep,
                          img_shapes=[[(1, h // 2, w // 2)]] * tokens.shape[0], return_dict=False)[0].float()
        if cfg:
            v_uncond, v_cond = out.chunk(2)
            out = norm_preserving_cfg(v_cond, v_uncond, self.guidance_scale, detach_uncond)
        return unpack_latents(out, h, w)

    @torch.no_grad()
    def decode(self, x0: Tensor) -> Tensor:
        """Clean latents `[B, C, H, W]` → images `[B, f·H, f·W, 3]` uint8 (z·std + mean, one frame)."""
        config = self.vae.config
        c = self.latent_channels
        mean = torch.tensor(config.latents_mean, dtype=torch.float32, device=x0.device).view(1, c, 1, 1, 1)
        std = torch.tensor(config.latents_std, dtype=torch.float32, device=x0.device).view(1, c, 1, 1, 1)
        z = x0.float()[:, :, None] * std + mean
        vae_dtype = next(self.vae.parameters()).dtype
        pixels = self.vae.decode(z.to(vae_dtype), return_dict=False)[0][:, :, 0]
        return to_uint8_images(pixels)
