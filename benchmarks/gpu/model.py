"""The benchmark model: an SD3.5-Medium-sized `SD3Transformer2DModel` with random weights.

No text encoders or VAE travel to the benchmark machine (nothing can be downloaded there), so
`BenchSD3Adapter` keeps the real `SD3Adapter.velocity` (the code path rollout and actor run) and
replaces only the ends: a prompt's conditioning is a seeded random tensor of the real shape
(333 tokens × 4096 = 2·77 CLIP + 256 T5; pooled 2048), and `decode` returns a latent preview
(channels 0–2 as an 8-bit image at latent resolution) instead of a VAE decode — the
benchmarks time the denoiser, which is what MFU is about.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch
from torch import Tensor

from omnirl.models.attention import resolve, use_backend
from omnirl.models.diffusers.base import DiffusersAdapterBase
from omnirl.models.diffusers.sd3 import SD3_LORA_TARGETS, SD3Adapter

SD35_MEDIUM = {
    "sample_size": 128, "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 24,
    "attention_head_dim": 64, "num_attention_heads": 24, "joint_attention_dim": 4096,
    "caption_projection_dim": 1536, "pooled_projection_dim": 2048, "pos_embed_max_size": 384,
    "dual_attention_layers": list(range(13)), "qk_norm": "rms_norm",
}
"""stabilityai/stable-diffusion-3.5-medium transformer/config.json (2.24 B parameters)."""

TINY = {**SD35_MEDIUM, "num_layers": 3, "attention_head_dim": 8, "num_attention_heads": 2, "joint_attention_dim": 32,
        "caption_projection_dim": 16, "pooled_projection_dim": 24, "dual_attention_layers": [0], "sample_size": 32,
        "pos_embed_max_size": 96}
"""A CPU-sized variant with the same block structure (dual attention, qk-norm, context_pre_only last block)."""

TEXT_TOKENS = 333
SD35_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0}


def build_transformer(config: dict, device: torch.device | str, dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """A randomly initialised `SD3Transformer2DModel(**config)` on `device` in `dtype`."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    with torch.device(device):
        module = SD3Transformer2DModel(**config)
    return module.to(dtype=dtype).eval()


class BenchSD3Adapter(SD3Adapter):
    """`SD3Adapter` over a random-weight transformer, with synthetic text and a preview decode.

    Args:
        transformer: an `SD3Transformer2DModel` (see `build_transformer`).
        resolution: default `(height, width)` in pixels (a request's prompt may change it:
            `latent_shape` reads a `@768` or `@768x512` suffix in the prompt text, see `tokenize`).
        text_tokens: conditioning length (333 = SD3.5's 2·77 CLIP + 256 T5).
        attention: the SDPA backend the blocks run: a `spec.model.attention` value ("auto" as
            `omnirl run` resolves it: cuDNN on Hopper in bf16; "torch": torch's choice per call)
            or any name in `omnirl.models.attention.BACKENDS` ("flash", "efficient").
    """

    def __init__(self, transformer, *, resolution: Sequence[int] = (512, 512), text_tokens: int = TEXT_TOKENS,
                 attention: str = "auto") -> None:
        self.latent_channels = int(transformer.config.in_channels)
        self.patch_size = int(transformer.config.patch_size)
        self.vae_scale_factor = 8
        DiffusersAdapterBase.__init__(self, transformer, None, SD35_SCHEDULER, resolution=resolution,
                                      guidance_scale=1.0, cache_size=4096)
        self.text_encoders, self.tokenizers = [None, None, None], [None, None, None]
        self.lora_target_modules = list(SD3_LORA_TARGETS)
        self.compile_block_types = ["JointTransformerBlock"]
        self.text_tokens = int(text_tokens)
        self.negative_ids = [0]
        self.attention = resolve(attention, "sd3", transformer, transformer.device, transformer.dtype)
        use_backend(transformer, self.compile_block_types, self.attention)

    def tokenize(self, text: str) -> list[int]:
        """UTF-8 bytes of the prompt, then the image height and width in pixels (`"... @768"` → 768×768,
        `"... @768x512"` → 768 high, 512 wide; no `@`: the default resolution)."""
        size = text.rsplit("@", 1)[1] if "@" in text else "x".join(map(str, self.resolution))
        h, _, w = size.partition("x")
        return [*text.encode(), int(h), int(w or h)]

    def latent_shape(self, prompt_ids: list[int], resolution: Sequence[int] | None = None) -> tuple[int, int, int]:
        """`(16, height/8, width/8)`: height and width travel as the last two ids (see `tokenize`)."""
        return super().latent_shape(prompt_ids, resolution or (int(prompt_ids[-2]), int(prompt_ids[-1])))

    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        """Seeded random embeddings `[1, 333, 4096]` and pooled `[1, 2048]` (seed = CRC32 of the ids)."""
        gen = torch.Generator().manual_seed(zlib.crc32(bytes(str(ids), "ascii")))
        cfg, dtype = self.module.config, self.compute_dtype()
        embeds = torch.randn(1, self.text_tokens, cfg.joint_attention_dim, generator=gen)
        pooled = torch.randn(1, cfg.pooled_projection_dim, generator=gen)
        return {"prompt_embeds": embeds.to(device, dtype), "pooled_prompt_embeds": pooled.to(device, dtype)}

    @torch.no_grad()
    def decode(self, x0: Tensor) -> Tensor:
        """Latent preview: `[B, 16, h, w]` → `[B, h, w, 3]` uint8 from channels 0–2 (no VAE)."""
        rgb = x0[:, :3].float().clamp(-2, 2).add(2).mul(255 / 4).round().to(torch.uint8)
        return rgb.permute(0, 2, 3, 1).contiguous()
