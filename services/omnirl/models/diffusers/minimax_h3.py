"""`MiniMaxH3Adapter`: MiniMax-H3 text→audio+video (`MiniMaxH3Transformer3DModel`, its video and audio VAEs, Qwen3-VL).

Mirrors the `t2va` workflow of diffusers' modular `MiniMaxH3ModularPipeline` (0.42; there is no classic pipeline):
- Text: the prompt verbatim, Qwen2 ids without special tokens; Qwen3-VL's hidden state after decoder layer 50
  (`text_encoder_layer`), all text rows (`MiniMaxH3TextEncoderStep`, `get_qwen3vl_prompt_embeds`; for a text-only
  prompt the Qwen token-type ids are all 0, which is all the pipeline's processor computes for it). Prompts
  differ in length: `encode` pads the embeddings to `max_sequence_length` and records each prompt's length.
- Latents, two slots of one flat sample: `video` `[24, T', H/16, W/16]` with 17n + 5 frames → 5n + 2 latent
  frames, and `audio` `[2, 32, L]` (stereo channel, latent channel, latent frame), L = round(frames/24·40)
  (`MiniMaxH3PrepareLayoutStep`, `MiniMaxH3PrepareLatentsStep`). Both are the VAEs' normalised latents.
- The transformer runs over ONE packed sequence `[text | audio | video]` (`build_packed_sequence`), no
  cross-attention; the structural inputs (timesteps, row tags, positions) are shared by a forward's batch,
  so samples of different text lengths or σ run in separate forwards.
- Time: the transformer takes t = 1 − σ in [0, 1] and predicts a DATA-ward velocity, x0 = x_t + σ·v
  (`MiniMaxH3Scheduler`): convention "data_progress"; `velocity` feeds 1 − σ and negates the output.
- Guidance-distilled: no CFG (every modality's guidance scale must be 1).
- σ grid: `MiniMaxH3Scheduler` of `scheduler/` (video, shift 12) asked for num_steps + 1 grid points
  (its count includes the terminal 0). The released pipeline samples the audio on its own grid (shift 3,
  `audio_scheduler/`); here both modalities share the video's σ (the joint SDE has one σ per sample), and
  `modality_sigmas` says what the audio's σ would be on its own grid.
- Mixed precision: `_keep_in_fp32_modules` (patch projections, timestep MLP, output heads, RoPE) stay float32
  whatever `dtype` is; the compute dtype is the block stack's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.models.diffusers._common import load_component, require_diffusers
from omnirl.models.diffusers.video import FrameRule, VideoGeometry, check_flat, to_uint8_video
from omnirl.models.diffusers.video_base import VideoAdapterBase
from omnirl.models.families import register_family
from omnirl.models.protocol import Conditioning

H3_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
"""Attention projections of every `MiniMaxH3TransformerBlock` and of the token refiner (VeRL-Omni's H3 LoRA set)."""

H3_SUBFOLDERS = ["transformer", "vae", "audio_vae", "scheduler", "text_encoder", "tokenizer"]
MAX_SEQUENCE_LENGTH = 512
H3_FPS = 24.0
"""MiniMax-H3 generates at a fixed 24 fps (`MiniMaxH3ModularPipeline.fps`)."""
DURATION_S = (5.0, 15.0)
"""The clip lengths the released checkpoint generates (`min_duration`, `max_duration`)."""


def _pipeline_fact(name: str):
    """A fixed fact of `MiniMaxH3ModularPipeline` (a property of the class that reads no component)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    return getattr(MiniMaxH3ModularPipeline, name).fget(None)


def _load_tokenizers(root: Path) -> list:
    """[Qwen2 tokenizer] of a MiniMax-H3 directory."""
    from transformers import AutoTokenizer

    return [load_component(AutoTokenizer, root, "tokenizer")]


def h3_tokenize(tokenizers: Sequence, max_sequence_length: int, text: str) -> list[int]:
    """Prompt → Qwen2 ids without special tokens (the `t2va` presentation: the prompt verbatim), truncated."""
    return list(tokenizers[0](text, add_special_tokens=False).input_ids)[:max_sequence_length]


@register_family("minimax-h3", parallel=("ulysses",), modalities=("video", "audio"), sized=False, guidance=False,
                 notes={"sized": "its clip is spec.model.video (17n + 5 frames at 24 fps, 5–15 s)",
                        "guidance": "the checkpoint is guidance-distilled: one forward per step, no negative prompt"})
class MiniMaxH3Adapter(VideoAdapterBase):
    """MiniMax-H3 text→audio+video behind `ModelAdapter`; built from in-memory components (or via `load`).

    Args:
        transformer: `MiniMaxH3Transformer3DModel` (the trainable `module`).
        vae: `AutoencoderKLMiniMaxH3`; audio_vae: `AutoencoderKLMiniMaxH3Audio`.
        scheduler_config: the video `MiniMaxH3Scheduler` config (`shift`).
        text_encoder: `Qwen3VLForConditionalGeneration` (more than 50 decoder layers); tokenizer: its tokenizer.
        video: frames (17n + 5, 5–15 s), height and width (multiples of 32), fps (24).
        modalities: `{"video"|"audio": {"train", "weight", "guidance_scale"}}`; guidance must be 1.
        max_sequence_length: text tokens kept per prompt.
        cache_size: prompts kept in the conditioning cache.
    Raises:
        ValueError: a geometry the VAE or the checkpoint cannot take (naming the nearest valid values), fps ≠ 24,
            a guidance scale > 1 (the checkpoint is guidance-distilled), a text encoder of ≤ 50 layers.
    """

    pipeline = "MiniMaxH3ModularPipeline"
    subfolders = H3_SUBFOLDERS
    default_lora_targets = tuple(H3_LORA_TARGETS)
    MAX_SEQUENCE_LENGTH = MAX_SEQUENCE_LENGTH
    time_convention = "data_progress"
    modality_names = ("video", "audio")
    DEFAULT_VIDEO = VideoGeometry(124, 768, 1344, H3_FPS)  # the t2va blocks' defaults: 124 frames, 16:9 canvas
    DEFAULT_RULES = (FrameRule(17, 5, 5, 2), 32)  # 17-frame chunks of 5 latents (3 dropped); spatial 16, patch 2

    @classmethod
    def geometry_rules(cls, root: Path) -> tuple[FrameRule, int]:
        """The video VAE's chunking (`clip_length`, `tokens_chunk_size`, `token_drop`) and spatial ratio (built from
        its config on the meta device) and the transformer's patch."""
        from diffusers import AutoencoderKLMiniMaxH3

        with torch.device("meta"):
            vae = AutoencoderKLMiniMaxH3.from_config(AutoencoderKLMiniMaxH3.load_config(str(root / "vae")))
        patch = json.loads((root / "transformer" / "config.json").read_text()).get("patch_size", [1, 2, 2])
        chunk = int(vae.tokens_chunk_size)
        return (FrameRule(int(vae.config.clip_length), chunk, chunk, chunk - int(vae.config.token_drop)),
                int(vae.spatial_compression_ratio) * int(patch[2]))

    @classmethod
    def config_grid(cls, root: Path, video: VideoGeometry, num_steps: int) -> Tensor:
        """The video scheduler's grid (`_h3_grid`)."""
        config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
        return _h3_grid(float(config.get("shift", 12.0)), num_steps)

    @classmethod
    def audio_rate(cls, root: Path) -> int | None:
        """The audio VAE's `sampling_rate`."""
        return int(json.loads((root / "audio_vae" / "config.json").read_text())["sampling_rate"])

    @staticmethod
    def transformer_class():
        """The diffusers class of this family's transformer/ (`load`; `registry.check_lora_targets`)."""
        from diffusers import MiniMaxH3Transformer3DModel

        return MiniMaxH3Transformer3DModel

    def __init__(self, transformer: nn.Module, vae: nn.Module, audio_vae: nn.Module, scheduler_config: dict,
                 text_encoder: nn.Module, tokenizer, *, video: VideoGeometry, guidance_scale: float = 1.0,
                 modalities: dict[str, dict] | None = None, max_sequence_length: int = MAX_SEQUENCE_LENGTH,
                 cache_size: int = 4096) -> None:
        config = transformer.config
        self.patch = tuple(int(p) for p in config.patch_size)
        self.patch_size = self.patch[2]
        self.latent_channels = int(vae.config.latent_channels)
        self.audio_channels = int(audio_vae.config.latent_channels)
        if int(config.in_channels) != self.latent_channels or int(config.audio_in_channels) != self.audio_channels:
            raise ValueError(f"MiniMax-H3 transformer in_channels/audio_in_channels {config.in_channels}/"
                             f"{config.audio_in_channels} must equal the VAEs' latent channels "
                             f"{self.latent_channels}/{self.audio_channels}")
        self.vae_scale_factor = int(vae.spatial_compression_ratio)
        chunk = int(vae.tokens_chunk_size)
        self.frame_rule = FrameRule(int(vae.config.clip_length), chunk, chunk, chunk - int(vae.config.token_drop))
        if float(video.fps) != H3_FPS:
            raise ValueError(f"spec.model.video.fps: MiniMax-H3 generates at {H3_FPS:g} fps only, got {video.fps}")
        super().__init__(transformer, vae, scheduler_config, video=video, guidance_scale=guidance_scale,
                         modalities=modalities, cache_size=cache_size)
        lo, hi = DURATION_S
        if not lo <= video.seconds <= hi:
            valid = [f for f in range(int(lo * H3_FPS), int(hi * H3_FPS) + 1) if self.frame_rule.valid(f)]
            raise ValueError(f"spec.model.video.frames: {video.frames} frames are {video.seconds:.2f} s; MiniMax-H3 "
                             f"generates {lo:g}–{hi:g} s at {H3_FPS:g} fps: use {valid[0]} to {valid[-1]} frames "
                             f"({self.frame_rule.describe()})")
        guided = [name for name, m in self.modality_settings.items() if m["guidance_scale"] != 1.0]
        if guided:
            raise ValueError(f"spec.model.modalities.{guided[0]}.guidanceScale: MiniMax-H3 is guidance-distilled (one "
                             "forward per step, no negative prompt); set 1 (algorithm.sampling.guidanceScale: 1)")
        self.text_encoder_layer = int(_pipeline_fact("text_encoder_layer"))
        layers = int(text_encoder.config.text_config.num_hidden_layers)
        if layers <= self.text_encoder_layer:
            raise ValueError(f"MiniMax-H3 conditions on hidden_states[{self.text_encoder_layer}] of Qwen3-VL; the text "
                             f"encoder has only {layers} decoder layers")
        self.text_encoder, self.audio_vae = text_encoder, audio_vae
        self.tokenizers = [tokenizer]
        self.max_sequence_length = int(max_sequence_length)
        self.stereo = int(_pipeline_fact("audio_channels"))
        self.audio_latent_frames = int(round(video.frames / H3_FPS * int(_latents_per_second())))
        self.lora_target_modules = list(self.default_lora_targets)
        self.compile_block_types = ["MiniMaxH3TransformerBlock"]
        self.negative_ids = []

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
             **kwargs) -> MiniMaxH3Adapter:
        """Load a local MiniMax-H3 directory (the modular pipeline's layout; nothing is downloaded).

        Layout: transformer/, vae/, audio_vae/, scheduler/ (video), text_encoder/ (Qwen3-VL), tokenizer/ (the
        pipeline's processor/, audio_scheduler/ and transformer_ref/ are not read). The transformer's
        `_keep_in_fp32_modules` stay float32 whatever `dtype` (diffusers' loader keeps them). `kwargs` go to the
        constructor (video, modalities, max_sequence_length, cache_size).
        Raises FileNotFoundError / OSError as `DiffusersAdapterBase._load_parts`.
        """
        from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
        from transformers import Qwen3VLForConditionalGeneration

        require_diffusers()
        root, transformer, vae, scheduler_config, tokenizers = cls._load_parts(
            path, cls.transformer_class(), AutoencoderKLMiniMaxH3, dtype, device)
        audio_vae = load_component(AutoencoderKLMiniMaxH3Audio, root, "audio_vae", dtype=dtype, device=device)
        text_encoder = load_component(Qwen3VLForConditionalGeneration, root, "text_encoder", dtype=dtype, device=device)
        return cls(transformer, vae, audio_vae, scheduler_config, text_encoder, tokenizers[0], **kwargs)

    @classmethod
    def _load_parts(cls, path, transformer_cls, vae_cls, dtype, device):
        """As `DiffusersAdapterBase._load_parts`, with the scheduler config read as JSON (`MiniMaxH3Scheduler`)."""
        root = cls.check_weights(path)
        transformer = load_component(transformer_cls, root, "transformer", dtype=dtype, device=device)
        vae = load_component(vae_cls, root, "vae", dtype=dtype, device=device)
        config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
        return root, transformer, vae, config, cls.read_tokenizers(root)

    @classmethod
    def weight_files(cls, root: Path) -> list[tuple[str, str]]:
        """The diffusers modules (transformer, both VAEs) and the Qwen3-VL text encoder."""
        from omnirl.models.diffusers._common import DIFFUSERS_WEIGHTS, TRANSFORMERS_WEIGHTS

        return [(name, DIFFUSERS_WEIGHTS) for name in ("transformer", "vae", "audio_vae")] + [
            ("text_encoder", TRANSFORMERS_WEIGHTS)]

    read_tokenizers = staticmethod(_load_tokenizers)
    tokenize_with = staticmethod(h3_tokenize)

    def compute_dtype(self) -> torch.dtype:
        """The block stack's dtype (the fp32-kept projections come first in `parameters()`)."""
        return next(self.module.transformer_blocks.parameters()).dtype

    # ----------------------------------------------------------------- shapes and σ
    def slots(self) -> list[tuple[str, tuple[int, ...]]]:
        """`video` `[24, T', H/16, W/16]`, then `audio` `[2, 32, L]` (stereo channel-major, as the pipeline's
        `audio_latents` input)."""
        f = self.vae_scale_factor
        return [("video", (self.latent_channels, self.latent_frames, self.video.height // f, self.video.width // f)),
                ("audio", (self.stereo, self.audio_channels, self.audio_latent_frames))]

    def video_seq_len(self) -> int:
        """Video rows of the packed sequence."""
        _, t, h, w = self.slots()[0][1]
        return (t // self.patch[0]) * (h // self.patch[1]) * (w // self.patch[2])

    def sigmas(self, num_steps: int, image_seq_len: int) -> Tensor:
        """`[num_steps + 1]` float32: the video scheduler's grid of num_steps + 1 points (linspace(1, 0) through
        shift s·σ/(1 + (s − 1)·σ), `MiniMaxH3Scheduler.set_timesteps`); it ends at 0.

        Raises:
            ValueError: num_steps < 1, or a shift that merges grid points (fewer than num_steps + 1 remain).
        """
        return _h3_grid(float(self.scheduler_config.get("shift", 12.0)), num_steps)

    def modality_sigmas(self, sigma: Tensor, audio_shift: float = 3.0) -> dict[str, Tensor]:
        """σ `[B]` on the video grid → each modality's σ on its own released grid: the audio's is the same grid
        point under `audio_shift` (u = σ/(s − (s − 1)·σ) unshifted, then a·u/(1 + (a − 1)·u)). The adapter's
        `velocity` uses the shared σ; this is what a per-modality SDE would step the audio with."""
        s = float(self.scheduler_config.get("shift", 12.0))
        u = sigma / (s - (s - 1.0) * sigma)
        return {"video": sigma, "audio": audio_shift * u / (1.0 + (audio_shift - 1.0) * u)}

    # ----------------------------------------------------------------- text
    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        """One prompt → {"prompt_embeds": [1, max_sequence_length, D] (zero past the prompt), "text_length": [1]}."""
        ids = [int(i) for i in ids][: self.max_sequence_length]
        if not ids:
            raise ValueError("MiniMax-H3 prompt ids are empty; the prompt needs text (MiniMaxH3Adapter.tokenize)")
        vision = {getattr(self.text_encoder.config, k, None) for k in ("image_token_id", "video_token_id")} - {None}
        if vision & set(ids):
            raise ValueError("a t2va prompt may not contain Qwen3-VL's image/video pad tokens")
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        out = self.text_encoder.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                      mm_token_type_ids=torch.zeros_like(input_ids), use_cache=False,
                                      output_hidden_states=True)
        hidden = out.hidden_states[self.text_encoder_layer].to(self.text_encoder.dtype)
        padded = hidden.new_zeros(1, self.max_sequence_length, hidden.shape[-1])
        padded[:, : len(ids)] = hidden
        return {"prompt_embeds": padded, "text_length": torch.tensor([len(ids)], dtype=torch.int64, device=device)}

    # ----------------------------------------------------------------- denoiser and VAEs
    def _layout(self, text_length: int, device: torch.device) -> dict[str, Tensor]:
        """The `[text | audio | video]` packed layout of one request (`MiniMaxH3PrepareLayoutStep`)."""
        from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

        _, t, h, w = self.slots()[0][1]
        tags = torch.full((text_length,), int(_pipeline_fact("text_tag")), dtype=torch.long)
        position_ids, token_tags, video_indices, audio_indices, text_indices, _, _ = \
            MiniMaxH3PrepareLayoutStep.build_packed_sequence(
                tags, t, h, w, self.audio_latent_frames, self.patch, self.stereo, int(_pipeline_fact("audio_tag")),
                int(_pipeline_fact("video_tag")))
        return {"position_ids": position_ids.to(device), "token_tags": token_tags.to(device),
                "video_indices": video_indices.to(device), "audio_indices": audio_indices.to(device),
                "text_indices": text_indices.to(device)}

    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditioning, *, detach_uncond: bool = False) -> Tensor:
        """v = ε − x0 `[B, D]` float32 at σ `[B]` (both modalities at σ): the transformer's data-ward output negated,
        its timestep t = 1 − σ for every row. Samples sharing a text length and σ share one forward (the packed
        layout and the timesteps are per forward). `detach_uncond` exists for interface parity (no CFG).

        Raises:
            ValueError: wrong shapes/dtypes, or `cond` without prompt_embeds/text_length.
        """
        from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

        check_flat(x, sigma, self.numel)
        parts = self.split(x)
        c, t, h, w = self.slots()[0][1]
        pt, ph, pw = self.patch
        lengths = cond["text_length"].tolist()
        out = torch.empty_like(x)
        groups: dict[tuple[int, float], list[int]] = {}
        for i, (n, s) in enumerate(zip(lengths, sigma.tolist(), strict=True)):
            groups.setdefault((int(n), float(s)), []).append(i)
        for (n, s), rows in groups.items():
            idx = torch.tensor(rows, device=x.device)
            video = patchify_video_latents(parts["video"][idx], self.patch).reshape(len(rows), -1, c * pt * ph * pw)
            audio = parts["audio"][idx].permute(0, 1, 3, 2).reshape(len(rows), -1, self.audio_channels)
            layout = self._layout(n, x.device)
            step = torch.tensor([1.0 - s], dtype=torch.float32, device=x.device)
            index = torch.zeros(layout["token_tags"].shape[0], dtype=torch.long, device=x.device)
            out_video, out_audio = self.module(
                hidden_states=video.to(self.compute_dtype()), audio_hidden_states=audio.to(self.compute_dtype()),
                encoder_hidden_states=cond["prompt_embeds"][idx, :n], timestep=step, timestep_indices=index,
                return_dict=False, **layout)
            v_video = out_video.float().reshape(len(rows), t // pt, h // ph, w // pw, c, pt, ph, pw)
            v_video = v_video.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(len(rows), c, t, h, w)
            v_audio = out_audio.float().reshape(len(rows), self.stereo, self.audio_latent_frames, self.audio_channels)
            joint = self.join({"video": v_video, "audio": v_audio.permute(0, 1, 3, 2)})
            out[idx] = -joint  # data-ward → ε − x0
        return out

    @torch.no_grad()
    def decode_media(self, x0: Tensor) -> dict[str, Tensor]:
        """Clean joint latents `[B, D]` → {"video": uint8 `[B, frames, H, W, 3]`, "fps": `[B]`, "audio": float32
        `[B, samples]` in [−1, 1] (the two stereo channels averaged), "audio_sample_rate": int64 `[B]`}, as the
        pipeline's `MiniMaxH3VideoDecodeStep` (z·std + mean, VAE, ImageNet de-normalisation, clamp to [0, 1]) and
        `MiniMaxH3AudioDecodeStep` (z·std + mean, the mono audio VAE per stereo channel)."""
        parts = self.split(x0.float())
        vae, audio_vae = self.vae, self.audio_vae
        device = x0.device
        c = self.latent_channels
        mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=device).view(1, c, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, dtype=torch.float32, device=device).view(1, c, 1, 1, 1)
        pixels = vae.decode((parts["video"] * std + mean).to(next(vae.parameters()).dtype), return_dict=False)[0]
        pixel_mean, pixel_std = (torch.tensor(_pipeline_fact(k), device=device).view(1, 3, 1, 1, 1)
                                 for k in ("pixel_mean", "pixel_std"))
        video = to_uint8_video(pixels.float() * pixel_std + pixel_mean, signed=False)
        a_mean, a_std = (torch.tensor(getattr(audio_vae.config, k), dtype=torch.float32, device=device).view(1, -1, 1)
                         for k in ("latents_mean", "latents_std"))
        batch = x0.shape[0]
        audio = parts["audio"].reshape(batch * self.stereo, self.audio_channels, self.audio_latent_frames)
        wave = audio_vae.decode((audio * a_std + a_mean).to(next(audio_vae.parameters()).dtype), return_dict=False)[0]
        wave = wave.float().reshape(batch, self.stereo, -1).mean(dim=1).clamp(-1, 1).contiguous()
        return {"video": video, "fps": self._fps(batch, device), "audio": wave,
                "audio_sample_rate": torch.full((batch,), int(audio_vae.config.sampling_rate), dtype=torch.int64,
                                                device=device)}


def _latents_per_second() -> int:
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_AUDIO_LATENTS_PER_SECOND

    return MINIMAX_H3_AUDIO_LATENTS_PER_SECOND


def _h3_grid(shift: float, num_steps: int) -> Tensor:
    """`MiniMaxH3Scheduler(shift).set_timesteps(num_steps + 1).sigmas` as float32, checked to hold num_steps + 1 points."""
    from diffusers import MiniMaxH3Scheduler

    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    scheduler = MiniMaxH3Scheduler(shift=shift)
    scheduler.set_timesteps(num_steps + 1)
    sigmas = scheduler.sigmas.detach().to("cpu", torch.float32).clone()
    if sigmas.numel() != num_steps + 1:
        raise ValueError(f"MiniMax-H3's shift {shift} merges grid points at {num_steps} steps ({sigmas.numel()} remain); "
                         "use fewer steps")
    return sigmas
