"""`LTX2Adapter`: LTX-2 / LTX-2.3 text→audio+video (`LTX2VideoTransformer3DModel`, its two VAEs, vocoder, Gemma 3).

Mirrors diffusers' `LTX2Pipeline` (0.42), plain classifier-free guidance only:
- Text: the stripped prompt, Gemma 3 ids with special tokens, truncated to `max_sequence_length` (1024) and
  LEFT-padded; every hidden state of Gemma stacked and flattened `[1, L, H·(layers+1)]`, then the pipeline's
  `connectors` → video and audio text embeddings and their attention mask (`_get_gemma_prompt_embeds`,
  `connectors(..., padding_side="left")`).
- Latents, two slots of one flat sample: `video` `[C, T', H/s, W/s]` (T' = (frames − 1)/t + 1, the VAE's
  factors s and t) and `audio` `[C_a, L_a, M']` with L_a = round(frames/fps · sample_rate/hop/4) and M' = the
  mel bins / 4 (`prepare_latents`, `prepare_audio_latents`). Both live in the pipelines' normalised spaces
  (noise is drawn there); `decode_media` de-normalises each.
- The transformer gets the video tokens `[B, T'·H'·W', C]` (`_pack_latents`) and the audio tokens
  `[B, L_a, C_a·M']` (`_pack_audio_latents`), timestep = sigma = σ·1000, the RoPE coordinates of the clip at
  `fps`, and returns a velocity per stream, v = ε − x0 (the flow-match Euler step): convention "sigma".
- CFG per modality: v_u + w_m·(v_c − v_u), w_m the modality's guidance scale (the pipeline's `guidance_scale`
  and `audio_guidance_scale`; equal to its x0-space "delta" form without rescale); the 2.3 pipeline's extra guidance terms
  (STG, modality isolation, rescale) are not applied — set `stg_scale=0, modality_scale=1,
  guidance_rescale=0` (and the audio ones) when comparing with the pipeline.
- σ grid: linspace(1, 1/N, N) shifted with mu linear in the video token count (`calculate_shift` with the
  pipeline's defaults 1024/4096/0.95/2.05 for keys the config lacks), then 0; audio and video share it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.models.diffusers._common import guided, load_component, require_diffusers
from omnirl.models.diffusers.base import NEGATIVE_PREFIX
from omnirl.models.diffusers.video import FrameRule, VideoGeometry, check_flat, to_uint8_video, token_limit
from omnirl.models.diffusers.video_base import VideoAdapterBase
from omnirl.models.families import register_family
from omnirl.models.protocol import Conditioning

LTX2_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
"""Every attention projection of `LTX2VideoTransformerBlock`: video and audio self- and text cross-attention and
the audio↔video cross-attention both ways (`attn1`, `attn2`, `audio_attn1`, `audio_attn2`,
`audio_to_video_attn`, `video_to_audio_attn`)."""

LTX2_SUBFOLDERS = ["transformer", "vae", "audio_vae", "scheduler", "text_encoder", "tokenizer", "connectors", "vocoder"]
MAX_SEQUENCE_LENGTH = 1024
SHIFT_DEFAULTS = {"base_image_seq_len": 1024, "max_image_seq_len": 4096, "base_shift": 0.95, "max_shift": 2.05}
"""`LTX2Pipeline.__call__`'s fallbacks for scheduler-config keys of its dynamic shift."""


def _load_tokenizers(root: Path) -> list:
    """[Gemma tokenizer] of an LTX-2 directory."""
    from transformers import AutoTokenizer

    return [load_component(AutoTokenizer, root, "tokenizer")]


def ltx2_tokenize(tokenizers: Sequence, max_sequence_length: int, text: str) -> list[int]:
    """Prompt → Gemma ids with special tokens of the stripped prompt, truncated to `max_sequence_length`."""
    return list(tokenizers[0](text.strip(), max_length=max_sequence_length, truncation=True,
                              add_special_tokens=True).input_ids)


def ltx2_sigmas(config: dict, num_steps: int, video_seq_len: int) -> Tensor:
    """`[num_steps + 1]` float32: `LTX2Pipeline`'s grid, σ = linspace(1, 1/N, N) through the scheduler with mu =
    `calculate_shift(video_seq_len, …)` (the config's keys, else `SHIFT_DEFAULTS`), then 0.

    Raises:
        ValueError: num_steps < 1.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    mu = calculate_shift(video_seq_len, *(config.get(key, value) for key, value in SHIFT_DEFAULTS.items()))
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(config)
    scheduler.set_timesteps(sigmas=[1.0 - k / num_steps for k in range(num_steps)], mu=mu)
    return scheduler.sigmas.detach().to("cpu", torch.float32).clone()


@register_family("ltx2", parallel=("ulysses",), modalities=("video", "audio"), sized=False,
                 notes={"sized": "its clip is spec.model.video (frames, height, width, fps); the audio lasts as long"})
class LTX2Adapter(VideoAdapterBase):
    """LTX-2 text→audio+video behind `ModelAdapter`; built from in-memory components (or via `load`).

    Args:
        transformer: `LTX2VideoTransformer3DModel` (the trainable `module`: both streams).
        vae: `AutoencoderKLLTX2Video`; audio_vae: `AutoencoderKLLTX2Audio`; vocoder: `LTX2Vocoder` (or with BWE).
        scheduler_config: `FlowMatchEulerDiscreteScheduler` config.
        text_encoder: Gemma 3; tokenizer: its tokenizer; connectors: `LTX2TextConnectors`.
        video: frames ((frames − 1) % t == 0), height and width (multiples of the VAE's spatial factor x patch), fps.
        guidance_scale: the CFG weight of both streams (1 = off) unless `modalities` sets one per modality.
        modalities: `{"video"|"audio": {"train", "weight", "guidance_scale"}}` (`ModelSpec.modality_settings`):
            the audio stream's own guidance is the pipeline's `audio_guidance_scale`.
        negative_prompt: the unconditional prompt ("" as in the pipeline).
        max_sequence_length: Gemma tokens (None: the pipeline's 1024, or the tokenizer's `model_max_length` if less).
        cache_size: prompts kept in the conditioning cache.
    Raises:
        ValueError: a geometry the VAEs cannot take (naming the nearest valid values), channel mismatches,
            a guidance scale < 1.
    """

    pipeline = "LTX2Pipeline"
    subfolders = LTX2_SUBFOLDERS
    default_lora_targets = tuple(LTX2_LORA_TARGETS)
    MAX_SEQUENCE_LENGTH = MAX_SEQUENCE_LENGTH
    time_convention = "sigma"
    modality_names = ("video", "audio")
    DEFAULT_VIDEO = VideoGeometry(121, 512, 768, 24.0)  # LTX2Pipeline.__call__'s defaults
    DEFAULT_RULES = (FrameRule(8, 1), 32)  # LTX-2's video VAE: temporal 8, spatial 32; patch 1

    @classmethod
    def _configs(cls, root: Path) -> tuple:
        """The video VAE built from its config on the meta device (its compression ratios are derived, not stored)
        and the transformer's config."""
        from diffusers import AutoencoderKLLTX2Video

        with torch.device("meta"):
            vae = AutoencoderKLLTX2Video.from_config(AutoencoderKLLTX2Video.load_config(str(root / "vae")))
        return vae, json.loads((root / "transformer" / "config.json").read_text())

    @classmethod
    def geometry_rules(cls, root: Path) -> tuple[FrameRule, int]:
        """The video VAE's temporal and spatial compression ratios and the transformer's patch sizes."""
        vae, tr = cls._configs(root)
        return (FrameRule(int(vae.temporal_compression_ratio) * int(tr.get("patch_size_t", 1)), 1),
                int(vae.spatial_compression_ratio) * int(tr.get("patch_size", 1)))

    @classmethod
    def config_grid(cls, root: Path, video: VideoGeometry, num_steps: int) -> Tensor:
        """`ltx2_sigmas` for the clip's video tokens."""
        vae, tr = cls._configs(root)
        t = (video.frames - 1) // int(vae.temporal_compression_ratio) + 1
        tokens = (t // int(tr.get("patch_size_t", 1))) * (video.height // int(vae.spatial_compression_ratio)
                                                            // int(tr.get("patch_size", 1))) * (
            video.width // int(vae.spatial_compression_ratio) // int(tr.get("patch_size", 1)))
        config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
        return ltx2_sigmas(config, num_steps, tokens)

    @classmethod
    def audio_rate(cls, root: Path) -> int | None:
        """The vocoder's `output_sampling_rate`."""
        return int(json.loads((root / "vocoder" / "config.json").read_text())["output_sampling_rate"])

    @staticmethod
    def transformer_class():
        """The diffusers class of this family's transformer/ (`load`; `registry.check_lora_targets`)."""
        from diffusers import LTX2VideoTransformer3DModel

        return LTX2VideoTransformer3DModel

    def __init__(self, transformer: nn.Module, vae: nn.Module, audio_vae: nn.Module, vocoder: nn.Module,
                 scheduler_config: dict, text_encoder: nn.Module, tokenizer, connectors: nn.Module, *,
                 video: VideoGeometry, guidance_scale: float = 1.0, modalities: dict[str, dict] | None = None,
                 negative_prompt: str = "", max_sequence_length: int | None = None,
                 cache_size: int = 4096) -> None:
        config = transformer.config
        self.patch_size, self.patch_size_t = int(config.patch_size), int(config.patch_size_t)
        self.latent_channels = int(vae.config.latent_channels)
        if int(config.in_channels) != self.latent_channels * self.patch_size ** 2 * self.patch_size_t:
            raise ValueError(f"LTX-2 transformer in_channels {config.in_channels} must be the video VAE's "
                             f"latent_channels {self.latent_channels} x patch {self.patch_size}^2 x {self.patch_size_t}")
        self.audio_channels = int(audio_vae.config.latent_channels)
        self.audio_mel_bins = int(audio_vae.config.mel_bins) // int(audio_vae.mel_compression_ratio)
        if int(config.audio_in_channels) != self.audio_channels * self.audio_mel_bins:
            raise ValueError(f"LTX-2 transformer audio_in_channels {config.audio_in_channels} must be the audio VAE's "
                             f"latent_channels {self.audio_channels} x mel bins/4 {self.audio_mel_bins}")
        max_sequence_length = token_limit(tokenizer, MAX_SEQUENCE_LENGTH, max_sequence_length)
        self.vae_scale_factor = int(vae.spatial_compression_ratio)
        self.frame_rule = FrameRule(int(vae.temporal_compression_ratio) * self.patch_size_t, 1)
        super().__init__(transformer, vae, scheduler_config, video=video, guidance_scale=guidance_scale,
                         modalities=modalities, cache_size=cache_size)
        self.audio_vae, self.vocoder, self.connectors, self.text_encoder = audio_vae, vocoder, connectors, text_encoder
        self.tokenizers = [tokenizer]
        self.max_sequence_length = int(max_sequence_length)
        self.sample_rate = int(audio_vae.config.sample_rate)
        self.audio_hop = int(audio_vae.config.mel_hop_length)
        self.audio_latent_frames = round(video.frames / video.fps * self.sample_rate / self.audio_hop
                                         / float(audio_vae.temporal_compression_ratio))
        if self.audio_latent_frames < 1:
            raise ValueError(f"{video.frames} frames at {video.fps} fps are too short for one audio latent frame "
                             f"({audio_vae.temporal_compression_ratio * self.audio_hop / self.sample_rate:.3f} s)")
        self.lora_target_modules = list(self.default_lora_targets)
        self.compile_block_types = ["LTX2VideoTransformerBlock"]
        self.negative_ids = self.tokenize(negative_prompt)

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
             **kwargs) -> LTX2Adapter:
        """Load a local LTX-2 diffusers directory (nothing is downloaded).

        Layout: transformer/, vae/, audio_vae/, vocoder/, connectors/, scheduler/, text_encoder/ (Gemma 3),
        tokenizer/. `kwargs` go to the constructor (video, guidance_scale, modalities, negative_prompt,
        max_sequence_length, cache_size).
        Raises FileNotFoundError / OSError as `DiffusersAdapterBase._load_parts`.
        """
        from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video
        from diffusers.pipelines.ltx2 import LTX2TextConnectors

        require_diffusers()
        root, transformer, vae, scheduler_config, tokenizers = cls._load_parts(
            path, cls.transformer_class(), AutoencoderKLLTX2Video, dtype, device)
        audio_vae = load_component(AutoencoderKLLTX2Audio, root, "audio_vae", dtype=dtype, device=device)
        vocoder = load_component(vocoder_class(root), root, "vocoder", dtype=dtype, device=device)
        connectors = load_component(LTX2TextConnectors, root, "connectors", dtype=dtype, device=device)
        text_encoder = load_component(_text_encoder_class(root), root, "text_encoder", dtype=dtype, device=device)
        return cls(transformer, vae, audio_vae, vocoder, scheduler_config, text_encoder, tokenizers[0], connectors,
                   **kwargs)

    @classmethod
    def weight_files(cls, root: Path) -> list[tuple[str, str]]:
        """The diffusers modules (transformer, both VAEs, vocoder, connectors) and the Gemma text encoder."""
        from omnirl.models.diffusers._common import DIFFUSERS_WEIGHTS, TRANSFORMERS_WEIGHTS

        return ([(name, DIFFUSERS_WEIGHTS) for name in ("transformer", "vae", "audio_vae", "vocoder", "connectors")]
                + [("text_encoder", TRANSFORMERS_WEIGHTS)])

    read_tokenizers = staticmethod(_load_tokenizers)
    tokenize_with = staticmethod(ltx2_tokenize)

    # ----------------------------------------------------------------- shapes and σ
    def slots(self) -> list[tuple[str, tuple[int, ...]]]:
        """`video` `[C, T', H/s, W/s]` then `audio` `[C_a, L_a, M']` (the normalised latents the pipeline draws)."""
        s = self.vae_scale_factor
        return [("video", (self.latent_channels, self.latent_frames, self.video.height // s, self.video.width // s)),
                ("audio", (self.audio_channels, self.audio_latent_frames, self.audio_mel_bins))]

    def video_seq_len(self) -> int:
        """Video tokens after the transformer's patching."""
        _, t, h, w = self.slots()[0][1]
        return (t // self.patch_size_t) * (h // self.patch_size) * (w // self.patch_size)

    def sigmas(self, num_steps: int, image_seq_len: int) -> Tensor:
        """The pipeline's grid for `image_seq_len` video tokens (`ltx2_sigmas`)."""
        return ltx2_sigmas(self.scheduler_config, num_steps, image_seq_len)

    # ----------------------------------------------------------------- text
    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        """One prompt → {"video_embeds": [1, L, Dv], "audio_embeds": [1, L, Da], "attention_mask": [1, L]} (L =
        max_sequence_length), through Gemma 3's stacked hidden states and the connectors."""
        ids = [int(i) for i in ids][: self.max_sequence_length]
        pad = self.max_sequence_length - len(ids)
        tokenizer = self.tokenizers[0]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        input_ids = torch.tensor([[pad_id] * pad + ids], dtype=torch.long, device=device)  # Gemma pads on the left
        mask = torch.tensor([[0] * pad + [1] * len(ids)], dtype=torch.long, device=device)
        out = self.text_encoder(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        hidden = torch.stack(out.hidden_states, dim=-1).flatten(2, 3).to(self.text_encoder.dtype)
        video_embeds, audio_embeds, connector_mask = self.connectors(hidden, mask, padding_side="left")
        return {"video_embeds": video_embeds, "audio_embeds": audio_embeds, "attention_mask": connector_mask}

    # ----------------------------------------------------------------- denoiser and VAEs
    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditioning, *, detach_uncond: bool = False) -> Tensor:
        """v = ε − x0 `[B, D]` float32 at σ `[B]`: one joint forward of both streams (the audio↔video cross-attention
        sees both), timestep σ·1000; with CFG the [uncond; cond] rows share it (2B) and each stream is guided with
        its own weight, in float32 (`detach_uncond` stops gradients through the unconditional rows).

        Raises:
            ValueError: wrong shapes/dtypes, or `cond` lacking the LTX-2 keys.
        """
        from diffusers import LTX2Pipeline

        check_flat(x, sigma, self.numel)
        parts = self.split(x)
        dtype = self.compute_dtype()
        _, t, h, w = self.slots()[0][1]
        video = LTX2Pipeline._pack_latents(parts["video"], self.patch_size, self.patch_size_t).to(dtype)
        audio = LTX2Pipeline._pack_audio_latents(parts["audio"]).to(dtype)
        keys = ("video_embeds", "audio_embeds", "attention_mask")
        text = [cond[k] for k in keys]
        cfg = self.has_negative(cond)
        if cfg:  # the pipeline's order: [negative; positive]
            video, audio, sigma = torch.cat([video, video]), torch.cat([audio, audio]), torch.cat([sigma, sigma])
            text = [torch.cat([cond[NEGATIVE_PREFIX + k], v]) for k, v in zip(keys, text, strict=True)]
        rows = video.shape[0]
        timestep = sigma.to(torch.float32) * 1000.0
        rope = self.module.rope.prepare_video_coords(rows, t, h, w, video.device, fps=self.video.fps)
        audio_rope = self.module.audio_rope.prepare_audio_coords(rows, self.audio_latent_frames, audio.device)
        out_video, out_audio = self.module(
            hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text[0],
            audio_encoder_hidden_states=text[1], timestep=timestep, sigma=timestep, encoder_attention_mask=text[2],
            audio_encoder_attention_mask=text[2], num_frames=t, height=h, width=w, fps=self.video.fps,
            audio_num_frames=self.audio_latent_frames, video_coords=rope, audio_coords=audio_rope,
            use_cross_timestep=True, return_dict=False)
        out_video, out_audio = out_video.float(), out_audio.float()
        if cfg:
            out_video = _guide(out_video, self.guidance("video"), detach_uncond)
            out_audio = _guide(out_audio, self.guidance("audio"), detach_uncond)
        c, _, m = self.slots()[1][1]
        v_video = LTX2Pipeline._unpack_latents(out_video, t, h, w, self.patch_size, self.patch_size_t)
        v_audio = LTX2Pipeline._unpack_audio_latents(out_audio, self.audio_latent_frames, num_mel_bins=m)
        return self.join({"video": v_video, "audio": v_audio})

    @torch.no_grad()
    def decode_media(self, x0: Tensor) -> dict[str, Tensor]:
        """Clean joint latents `[B, D]` → {"video": uint8 `[B, frames, H, W, 3]`, "fps": `[B]`, "audio": float32
        `[B, samples]` in [−1, 1] (the vocoder's channels averaged to mono), "audio_sample_rate": int64 `[B]`}.

        Video: z·std/scaling + mean (the VAE's `latents_mean/std` buffers), `vae.decode` (timestep 0 when the VAE is
        timestep-conditioned: the pipeline's `decode_timestep` default, no decode noise). Audio: z·std + mean per
        (channel, mel bin), `audio_vae.decode` → mel spectrogram → `vocoder`, as `LTX2Pipeline.__call__`.
        """
        from diffusers import LTX2Pipeline

        parts = self.split(x0.float())
        vae, audio_vae = self.vae, self.audio_vae
        z = LTX2Pipeline._denormalize_latents(parts["video"], vae.latents_mean, vae.latents_std,
                                              vae.config.scaling_factor)
        vae_dtype = next(vae.parameters()).dtype
        timestep = None
        if vae.config.timestep_conditioning:
            timestep = torch.zeros(z.shape[0], dtype=vae_dtype, device=z.device)
        pixels = vae.decode(z.to(vae_dtype), timestep, return_dict=False)[0]
        c, length, m = parts["audio"].shape[1:]
        stats = [s.to(z.device, torch.float32).view(1, c, 1, m) for s in (audio_vae.latents_mean, audio_vae.latents_std)]
        za = parts["audio"] * stats[1] + stats[0]
        mel = audio_vae.decode(za.to(next(audio_vae.parameters()).dtype), return_dict=False)[0]
        wave = self.vocoder(mel.to(next(self.vocoder.parameters()).dtype)).float()
        batch = z.shape[0]
        return {"video": to_uint8_video(pixels), "fps": self._fps(batch, z.device),
                "audio": wave.reshape(batch, -1, wave.shape[-1]).mean(dim=1).clamp(-1, 1).contiguous(),
                "audio_sample_rate": torch.full((batch,), int(self.vocoder.config.output_sampling_rate),
                                                dtype=torch.int64, device=z.device)}


def _guide(out: Tensor, scale: float, detach_uncond: bool) -> Tensor:
    """[uncond; cond] rows → the guided rows (the conditional ones unchanged when `scale` is 1)."""
    v_uncond, v_cond = out.chunk(2)
    return v_cond if scale == 1.0 else guided(v_cond, v_uncond, scale, detach_uncond)


def vocoder_class(root: Path):
    """`LTX2Vocoder`, or `LTX2VocoderWithBWE` when vocoder/config.json names it (LTX-2.3's 48 kHz vocoder)."""
    from diffusers.pipelines.ltx2 import vocoder as vocoders

    name = json.loads((root / "vocoder" / "config.json").read_text()).get("_class_name", "LTX2Vocoder")
    cls = getattr(vocoders, name, None)
    if cls is None:
        raise ValueError(f"{root / 'vocoder' / 'config.json'} names {name!r}, which diffusers' LTX-2 vocoders lack")
    return cls


def _text_encoder_class(root: Path):
    """The transformers class text_encoder/config.json names (`architectures`): Gemma 3 for LTX-2."""
    import transformers

    names = json.loads((root / "text_encoder" / "config.json").read_text()).get("architectures") or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise ValueError(f"{root / 'text_encoder' / 'config.json'} names no transformers class ({names}); LTX-2 needs "
                         "its Gemma 3 text encoder saved with save_pretrained")
    return cls
