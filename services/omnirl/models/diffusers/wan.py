"""`WanAdapter`: Wan 2.1 / 2.2 text→video (`WanTransformer3DModel`, `AutoencoderKLWan`, UMT5).

Mirrors diffusers' `WanPipeline` (0.42):
- Text: the prompt cleaned as the pipeline cleans it (`prompt_clean`), tokenized with special tokens,
  truncated to `max_sequence_length` (512), padded; UMT5's last hidden state with the attention mask,
  zeroed past the prompt's length → `[1, max_sequence_length, 4096]` (`_get_t5_prompt_embeds`).
- Latents: `[C, T', H/8, W/8]` (C = z_dim, 16 for Wan 2.1, 48 for Wan 2.2-TI2V-5B whose VAE is 16×), with
  T' = (frames − 1)/4 + 1 (`prepare_latents`); the sample is that latent flattened (`slots`: one `video`
  slot). The latents are the VAE's normalised space: `decode_media` maps z ↦ z·std + mean first.
- Time: the transformer takes timestep = σ·1000 (the flow schedulers' `timesteps`; per token for Wan 2.2's
  `expand_timesteps`) and predicts v = ε − x0 (UniPC's `flow_prediction`, x0 = x − σ·v): convention "sigma".
- CFG: v_u + w·(v_c − v_u) with the negative prompt's embeddings ("" as in the pipeline).
- σ grid: the scheduler of `scheduler/scheduler_config.json` (UniPC with `use_flow_sigmas` and its
  `flow_shift`, or FlowMatchEuler) asked for `num_steps` σ values, as the pipeline's `set_timesteps`.
- Wan 2.2-A14B (two experts, `transformer_2` + `boundary_ratio`) is not supported: `load` refuses it.

Token ids: the tokenizer's ids with special tokens, truncated, NOT padded (`encode` pads with pad id 0
and masks the rest, as the pipeline's `padding="max_length"` does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.models.diffusers._common import guided, load_component, require_diffusers
from omnirl.models.diffusers.video import FrameRule, VideoGeometry, check_flat, to_uint8_video, token_limit
from omnirl.models.diffusers.video_base import VideoAdapterBase
from omnirl.models.families import register_family
from omnirl.models.protocol import Conditioning

WAN_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
"""Self- and cross-attention projections of every `WanTransformerBlock` (attn1 and attn2): diffusers'
Wan LoRA training defaults and the Wan GRPO recipes."""

WAN_SUBFOLDERS = ["transformer", "vae", "scheduler", "text_encoder", "tokenizer"]
MAX_SEQUENCE_LENGTH = 512


def _load_tokenizers(root: Path) -> list:
    """[UMT5 tokenizer] of a Wan directory (`AutoTokenizer`, as the pipeline declares it)."""
    from transformers import AutoTokenizer

    return [load_component(AutoTokenizer, root, "tokenizer")]


def wan_tokenize(tokenizers: Sequence, max_sequence_length: int, text: str) -> list[int]:
    """Prompt → its UMT5 ids with special tokens, cleaned as `WanPipeline` cleans it (`prompt_clean`:
    ftfy when installed, HTML entities, whitespace) and truncated to `max_sequence_length`."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    return list(tokenizers[0](prompt_clean(text), max_length=max_sequence_length, truncation=True,
                              add_special_tokens=True).input_ids)


def check_single_expert(root: Path) -> None:
    """Refuse a Wan 2.2-A14B directory (a second expert `transformer_2/`, switched at `boundary_ratio`).

    Raises:
        ValueError: naming the directory and the supported checkpoints.
    """
    index = root / "model_index.json"
    config = json.loads(index.read_text()) if index.is_file() else {}
    if (root / "transformer_2").is_dir() or config.get("boundary_ratio") is not None:
        raise ValueError(f"{root} is a two-expert Wan 2.2 checkpoint (transformer_2/, boundary_ratio); family 'wan' "
                         "trains one transformer: use Wan2.1-T2V (1.3B, 14B) or Wan2.2-TI2V-5B")


@register_family("wan", parallel=("ulysses",), modalities=("video",), sized=False,
                 notes={"sized": "its clip is spec.model.video (frames, height, width, fps)"})
class WanAdapter(VideoAdapterBase):
    """Wan text→video behind `ModelAdapter`; built from in-memory components (or via `load`).

    Args:
        transformer: `WanTransformer3DModel` (the trainable `module`).
        vae: `AutoencoderKLWan` (`scale_factor_temporal`, `scale_factor_spatial`, `latents_mean/std` in its config).
        scheduler_config: the pipeline's scheduler config (UniPC or FlowMatchEuler, with its `_class_name`).
        text_encoder: `UMT5EncoderModel`.
        tokenizer: its tokenizer.
        video: frames ((frames − 1) % 4 == 0), height and width (multiples of 16), fps.
        guidance_scale: CFG weight w (Wan recipes 4.5–5); 1 = off.
        modalities: `{"video": {"train", "weight", "guidance_scale"}}` (`ModelSpec.modality_settings`); its
            guidance_scale wins over `guidance_scale`.
        negative_prompt: the unconditional prompt ("" as in the pipeline).
        max_sequence_length: UMT5 tokens (None: the pipeline's 512, or the tokenizer's `model_max_length` if less).
        expand_timesteps: Wan 2.2-TI2V's per-token timestep (`model_index.json`'s `expand_timesteps`).
        cache_size: prompts kept in the conditioning cache.
    Raises:
        ValueError: a geometry the VAE cannot take (naming the nearest valid values), channel mismatch,
            guidance_scale < 1, max_sequence_length outside [1, 512].
    """

    pipeline = "WanPipeline"
    subfolders = WAN_SUBFOLDERS
    default_lora_targets = tuple(WAN_LORA_TARGETS)
    MAX_SEQUENCE_LENGTH = MAX_SEQUENCE_LENGTH
    time_convention = "sigma"
    DEFAULT_VIDEO = VideoGeometry(81, 480, 832, 16.0)  # WanPipeline.__call__'s defaults (Wan 2.1 at 16 fps)
    DEFAULT_RULES = (FrameRule(4, 1), 16)  # Wan 2.1's VAE: temporal 4, spatial 8; patch (1, 2, 2)

    @classmethod
    def geometry_rules(cls, root: Path) -> tuple[FrameRule, int]:
        """`vae/config.json`'s `scale_factor_temporal` / `scale_factor_spatial` and the transformer's patch."""
        vae = json.loads((root / "vae" / "config.json").read_text())
        patch = json.loads((root / "transformer" / "config.json").read_text()).get("patch_size", [1, 2, 2])
        return (FrameRule(int(vae.get("scale_factor_temporal") or 4), 1),
                int(vae.get("scale_factor_spatial") or 8) * int(patch[1]))

    @classmethod
    def config_grid(cls, root: Path, video: VideoGeometry, num_steps: int) -> Tensor:
        """The scheduler's σ (`scheduler_grid`): Wan's does not depend on the clip."""
        return scheduler_grid(read_scheduler_config(root), num_steps)

    @staticmethod
    def transformer_class():
        """The diffusers class of this family's transformer/ (`load`; `registry.check_lora_targets`)."""
        from diffusers import WanTransformer3DModel

        return WanTransformer3DModel

    def __init__(self, transformer: nn.Module, vae: nn.Module, scheduler_config: dict, text_encoder: nn.Module,
                 tokenizer, *, video: VideoGeometry, guidance_scale: float = 1.0,
                 modalities: dict[str, dict] | None = None, negative_prompt: str = "",
                 max_sequence_length: int | None = None, expand_timesteps: bool = False,
                 cache_size: int = 4096) -> None:
        config = transformer.config
        self.latent_channels = int(vae.config.z_dim)
        if int(config.in_channels) != self.latent_channels or int(config.out_channels or config.in_channels) != self.latent_channels:
            raise ValueError(f"Wan transformer in/out channels {config.in_channels}/{config.out_channels} must equal the "
                             f"VAE's z_dim {self.latent_channels} (text-to-video checkpoints only)")
        max_sequence_length = token_limit(tokenizer, MAX_SEQUENCE_LENGTH, max_sequence_length)
        self.patch = tuple(int(p) for p in config.patch_size)
        self.patch_size = self.patch[1]
        self.vae_scale_factor = int(vae.config.scale_factor_spatial)
        self.frame_rule = FrameRule(int(vae.config.scale_factor_temporal), 1)
        super().__init__(transformer, vae, scheduler_config, video=video, guidance_scale=guidance_scale,
                         modalities=modalities, cache_size=cache_size)
        self.text_encoder = text_encoder
        self.tokenizers = [tokenizer]
        self.max_sequence_length = int(max_sequence_length)
        self.expand_timesteps = bool(expand_timesteps)
        self.lora_target_modules = list(self.default_lora_targets)
        self.compile_block_types = ["WanTransformerBlock"]
        self.negative_ids = self.tokenize(negative_prompt)

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
             **kwargs) -> WanAdapter:
        """Load a local Wan diffusers directory (nothing is downloaded).

        Layout: transformer/, vae/, scheduler/, text_encoder/ (UMT5), tokenizer/. The VAE is kept in
        float32 whatever `dtype` is (Wan's own recommendation: its decode degrades in bf16). `kwargs` go
        to the constructor (video, guidance_scale, negative_prompt, max_sequence_length, cache_size).
        Raises:
            FileNotFoundError / OSError: as `DiffusersAdapterBase._load_parts`.
            ValueError: a two-expert Wan 2.2-A14B directory (`check_single_expert`).
        """
        from diffusers import AutoencoderKLWan
        from transformers import UMT5EncoderModel

        require_diffusers()
        root = cls.check_weights(path)
        check_single_expert(root)
        transformer = load_component(cls.transformer_class(), root, "transformer", dtype=dtype, device=device)
        vae = load_component(AutoencoderKLWan, root, "vae", dtype=torch.float32, device=device)
        scheduler_config = read_scheduler_config(root)
        tokenizers = cls.read_tokenizers(root)
        text_encoder = load_component(UMT5EncoderModel, root, "text_encoder", dtype=dtype, device=device)
        index = json.loads((root / "model_index.json").read_text()) if (root / "model_index.json").is_file() else {}
        kwargs.setdefault("expand_timesteps", bool(index.get("expand_timesteps", False)))
        return cls(transformer, vae, scheduler_config, text_encoder, tokenizers[0], **kwargs)

    read_tokenizers = staticmethod(_load_tokenizers)
    tokenize_with = staticmethod(wan_tokenize)

    # ----------------------------------------------------------------- shapes and σ
    def slots(self) -> list[tuple[str, tuple[int, ...]]]:
        """One `video` slot `[C, T', H/f, W/f]`."""
        f = self.vae_scale_factor
        return [("video", (self.latent_channels, self.latent_frames, self.video.height // f, self.video.width // f))]

    def video_seq_len(self) -> int:
        """Tokens after the transformer's `(1, 2, 2)` patching: T'·(H'/2)·(W'/2)."""
        _, t, h, w = self.slots()[0][1]
        return (t // self.patch[0]) * (h // self.patch[1]) * (w // self.patch[2])

    def sigmas(self, num_steps: int, image_seq_len: int) -> Tensor:
        """The σ values `[num_steps + 1]` the pipeline's scheduler steps through (`set_timesteps(num_steps)`),
        ending at 0. UniPC's flow grid: linspace(1, 1/1000, N) shifted by `flow_shift` (its first σ is
        1 − 1e-6), then 0."""
        return scheduler_grid(self.scheduler_config, num_steps)

    # ----------------------------------------------------------------- text
    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        """One prompt → {"prompt_embeds": [1, max_sequence_length, D]} (zero past the prompt, as the pipeline)."""
        ids = [int(i) for i in ids][: self.max_sequence_length]
        if not ids:
            raise ValueError("Wan prompt ids are empty; produce them with WanAdapter.tokenize")
        pad = self.max_sequence_length - len(ids)
        pad_id = self.tokenizers[0].pad_token_id or 0
        input_ids = torch.tensor([ids + [pad_id] * pad], dtype=torch.long, device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * pad], dtype=torch.long, device=device)
        hidden = self.text_encoder(input_ids, mask).last_hidden_state.to(self.text_encoder.dtype)
        hidden[:, len(ids):] = 0
        return {"prompt_embeds": hidden}

    # ----------------------------------------------------------------- denoiser and VAE
    def _timestep(self, sigma: Tensor, rows: int) -> Tensor:
        t = sigma.to(torch.float32) * 1000.0
        if not self.expand_timesteps:
            return t
        return t[:, None].expand(rows, self.video_seq_len())  # Wan 2.2-TI2V: one timestep per token

    def compute_dtype(self) -> torch.dtype:
        """The patch embedding's dtype, which the latents must match: Wan keeps `scale_shift_table` (its first
        parameter) and the time embedder in float32 (`_keep_in_fp32_modules`), so the first parameter's dtype
        is float32 even for a bfloat16 checkpoint."""
        return self.module.patch_embedding.weight.dtype

    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditioning, *, detach_uncond: bool = False) -> Tensor:
        """v = ε − x0 `[B, D]` float32 at σ `[B]`: one transformer forward on the video latents `[B, C, T', H', W']`
        in the transformer's dtype, timestep σ·1000; CFG runs [uncond; cond] in one forward of 2B rows and
        combines in float32 (`detach_uncond` stops gradients through v_u, values unchanged).

        Raises:
            ValueError: wrong shapes/dtypes, or `cond` without prompt_embeds.
        """
        check_flat(x, sigma, self.numel)
        video = self.split(x)["video"].to(self.compute_dtype())
        embeds = cond["prompt_embeds"]
        cfg = self.has_negative(cond)
        if cfg:
            video = torch.cat([video, video])
            embeds = torch.cat([cond["negative_prompt_embeds"], embeds])
            sigma = torch.cat([sigma, sigma])
        out = self.module(hidden_states=video, timestep=self._timestep(sigma, video.shape[0]),
                          encoder_hidden_states=embeds, return_dict=False)[0].float()
        if cfg:
            v_uncond, v_cond = out.chunk(2)
            out = guided(v_cond, v_uncond, self.guidance("video"), detach_uncond)
        return out.reshape(out.shape[0], -1)

    @torch.no_grad()
    def decode_media(self, x0: Tensor) -> dict[str, Tensor]:
        """Clean joint latents `[B, D]` → {"video": uint8 `[B, frames, H, W, 3]`, "fps": float32 `[B]`}:
        z·std + mean (the VAE config's `latents_mean/std`), `AutoencoderKLWan.decode`, [−1, 1] → uint8."""
        vae = self.vae
        z = self.split(x0.float())["video"]
        c = self.latent_channels
        mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=z.device).view(1, c, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, dtype=torch.float32, device=z.device).view(1, c, 1, 1, 1)
        dtype = next(vae.parameters()).dtype
        pixels = vae.decode((z * std + mean).to(dtype), return_dict=False)[0]
        return {"video": to_uint8_video(pixels), "fps": self._fps(z.shape[0], z.device)}


def read_scheduler_config(root: Path) -> dict:
    """`root/scheduler/scheduler_config.json` as a dict (any scheduler class: Wan ships UniPC).

    Raises:
        FileNotFoundError: the file is missing. ValueError: it is not JSON.
    """
    path = root / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; the model directory needs scheduler/ as save_pretrained writes it")
    try:
        return dict(json.loads(path.read_text()))
    except ValueError as err:
        raise ValueError(f"{path} is not JSON: {err}") from err


def scheduler_grid(config: dict, num_steps: int) -> Tensor:
    """`[num_steps + 1]` float32: the σ values of the diffusers scheduler `config` names (`_class_name`) after
    `set_timesteps(num_steps)`, ending at 0 (what a pipeline without dynamic shifting steps through).

    Raises:
        ValueError: num_steps < 1, a scheduler class diffusers lacks, or a grid that does not end at 0.
    """
    import diffusers

    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    name = config.get("_class_name", "FlowMatchEulerDiscreteScheduler")
    cls = getattr(diffusers, name, None)
    if cls is None:
        raise ValueError(f"scheduler/scheduler_config.json names {name!r}, which diffusers {diffusers.__version__} lacks")
    scheduler = cls.from_config(config)
    scheduler.set_timesteps(num_steps)
    sigmas = torch.as_tensor(scheduler.sigmas).detach().to("cpu", torch.float32).clone()
    if sigmas.numel() != num_steps + 1 or float(sigmas[-1]) != 0.0:
        raise ValueError(f"{name} gave {sigmas.numel()} sigmas ending at {float(sigmas[-1])} for {num_steps} steps; "
                         "a flow-matching grid of num_steps + 1 values ending at 0 is needed")
    return sigmas
