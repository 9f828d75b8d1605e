"""`VideoAdapterBase`: what the `wan`, `ltx2` and `minimax-h3` adapters share beyond `DiffusersAdapterBase`.

A video family's sample is one flat float32 latent `[D]` (`video.py`): `latent_shape` is `(D,)`, and
`slots` / `latent_layout` say which span of it is which modality, so the engine, the queue and the
trajectory record keep their one-tensor-per-sample shape logic. The geometry (frames, size, fps) is
the job's `spec.model.video`, checked at construction against the VAE's factors (`check_geometry`).
Per-request resolutions (`model.resolutions`) are not supported for video: every sample of a job has
the one geometry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.algorithms.sigmas import sigma_schedule
from omnirl.models.diffusers.base import DiffusersAdapterBase
from omnirl.models.diffusers.video import FrameRule, VideoGeometry, check_geometry, join_flat, split_flat


class VideoAdapterBase(DiffusersAdapterBase):
    """Shared state of the video adapters. A subclass sets `frame_rule`, `vae_scale_factor`, `patch_size`
    before calling this constructor, and implements `slots`, `video_seq_len`, `velocity` and `decode_media`.

    Args:
        transformer, vae, scheduler_config, guidance_scale, cache_size: as `DiffusersAdapterBase`.
        video: the clip's geometry (`spec.model.video`).
    Raises:
        ValueError: a frame count or size the VAE cannot take (the message names the nearest valid
            values), guidance_scale < 1.
    """

    frame_rule: FrameRule
    modality_names: tuple[str, ...] = ("video",)
    """The modalities a sample carries, in slot order (video first)."""

    def __init__(self, transformer: nn.Module, vae: nn.Module, scheduler_config: dict, *, video: VideoGeometry,
                 guidance_scale: float, modalities: Mapping[str, Mapping] | None, cache_size: int) -> None:
        self.video = check_geometry(video, self.frame_rule, self.vae_scale_factor * self.patch_size)
        super().__init__(transformer, vae, scheduler_config, resolution=(video.height, video.width),
                         guidance_scale=guidance_scale, cache_size=cache_size)
        self.modality_settings = resolve_modalities(self.family, self.modality_names, modalities, self.guidance_scale)

    def guidance(self, modality: str) -> float:
        """The CFG weight of `modality`'s velocity (1 = unguided)."""
        return self.modality_settings[modality]["guidance_scale"]

    @property
    def cfg_enabled(self) -> bool:
        """True when some modality is guided: `encode` adds the negative prompt and `velocity` runs 2B rows."""
        return any(m["guidance_scale"] > 1.0 for m in self.modality_settings.values())

    # ----------------------------------------------------------------- the family's registry hooks
    DEFAULT_VIDEO: VideoGeometry
    """The clip a job generates when `spec.model.video` is null (the family pipeline's own defaults)."""
    DEFAULT_RULES: tuple[FrameRule, int]
    """(frame rule, spatial multiple) of the released checkpoints' VAE and patch, for a `model.path` not here."""

    @classmethod
    def geometry_rules(cls, root: Path) -> tuple[FrameRule, int]:
        """(frame rule, what height and width must be multiples of) from the configs in `root` (no weights read)."""
        raise NotImplementedError

    @classmethod
    def job_video(cls, spec) -> VideoGeometry:
        """The clip of a job: `spec.model.video`, else `DEFAULT_VIDEO`."""
        video = spec.model.video
        if video is None:
            return cls.DEFAULT_VIDEO
        return VideoGeometry(int(video.frames), int(video.height), int(video.width), float(video.fps))

    @classmethod
    def adapter_options(cls, spec) -> dict:
        """`load` options of an RLJob (rollout, actor and eval alike): the clip, the CFG weight and each modality's
        training, loss weight and guidance (`ModelSpec.modality_settings`)."""
        guidance = spec.algorithm.sampling.guidanceScale
        return {"video": cls.job_video(spec), "guidance_scale": guidance,
                "modalities": spec.model.modality_settings(guidance)}

    @classmethod
    def check_media(cls, spec) -> str:
        """`omnirl validate` and `omnirl run`'s check of the clip against the VAE's temporal and spatial factors
        and the transformer's patch: read from `model.path`'s configs when they are here, else the released
        checkpoints' (`DEFAULT_RULES`). Returns the line saying which factors were used.

        Raises:
            ValueError: naming `spec.model.video.<key>` and the nearest valid values (`check_geometry`), or
                `spec.model.audio` when it disagrees with the clip (`check_audio`).
        """
        root = Path(spec.model.path)
        here = (root / "vae" / "config.json").is_file() and (root / "transformer" / "config.json").is_file()
        rule, multiple = cls.geometry_rules(root) if here else cls.DEFAULT_RULES
        video = check_geometry(cls.job_video(spec), rule, multiple)
        cls.check_audio(spec, video, root if here else None)
        source = f"from {root}" if here else "the released checkpoints' (model.path is not here)"
        return (f"{cls.family} clip: {video.frames} frames of {video.height}x{video.width} at {video.fps:g} fps "
                f"({rule.describe()}, sizes multiples of {multiple}: {source})")

    @classmethod
    def check_audio(cls, spec, video: VideoGeometry, root: Path | None) -> None:
        """`spec.model.audio` of an audio family against the clip: its length is the clip's (frames / fps), its rate
        the model's (`audio_rate(root)`, when the configs are here).

        Raises:
            ValueError: naming `spec.model.audio.seconds` or `.sampleRate` and the value to write.
        """
        audio = spec.model.audio
        if audio is None or "audio" not in cls.modality_names:
            return
        if abs(float(audio.seconds) - video.seconds) > 1e-6:
            raise ValueError(f"spec.model.audio.seconds: {audio.seconds:g} s, but the clip is {video.frames} frames at "
                             f"{video.fps:g} fps = {video.seconds:g} s and {cls.family}'s audio lasts as long as its "
                             f"video; write {video.seconds:g} or remove audio")
        rate = cls.audio_rate(root) if root is not None else None
        if rate is not None and int(audio.sampleRate) != rate:
            raise ValueError(f"spec.model.audio.sampleRate: {audio.sampleRate} Hz, but the model in {root} makes "
                             f"{rate} Hz; write {rate} or remove it")

    @classmethod
    def audio_rate(cls, root: Path) -> int | None:
        """The sample rate of the waveform `decode_media` returns, from the configs in `root` (None: no audio)."""
        return None

    @classmethod
    def describe_default_grid(cls, spec) -> str:
        """The family's own grid for the job's clip when `model.path`'s configs are here (first and last steps),
        else the scheduler config it will read."""
        n, root = spec.algorithm.sampling.numSteps, Path(spec.model.path)
        config = root / "scheduler" / "scheduler_config.json"
        try:
            grid = cls.config_grid(root, cls.job_video(spec), n)
        except (OSError, ValueError, KeyError):
            return f"σ grid: family default ({cls.family}: its scheduler's grid, {n} steps; {config} not readable here)"
        g = [f"{x:.4f}" for x in grid.tolist()]
        return f"σ grid: family default ({cls.family}, from {config}), {n} steps: {g[0]}, {g[1]} … {g[-2]}, {g[-1]}"

    @classmethod
    def config_grid(cls, root: Path, video: VideoGeometry, num_steps: int) -> Tensor:
        """The family's σ grid for `video` from the configs in `root` (no weights read)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- the joint latent
    def slots(self) -> list[tuple[str, tuple[int, ...]]]:
        """`(modality, per-sample latent shape)` in the order they are concatenated (video first)."""
        raise NotImplementedError

    @property
    def numel(self) -> int:
        """D, the length of one sample's flat joint latent."""
        return sum(int(torch.Size(shape).numel()) for _, shape in self.slots())

    @property
    def latent_frames(self) -> int:
        """T', the latent frames of the job's clip."""
        return self.frame_rule.latent_frames(self.video.frames)

    def latent_shape(self, prompt_ids: list[int], resolution: Sequence[int] | None = None) -> tuple[int]:
        """`(D,)`: every sample of a video job has the one geometry of `spec.model.video`.

        Raises:
            ValueError: a per-request `resolution` other than the job's (video jobs take no `model.resolutions`).
        """
        if resolution is not None and tuple(resolution) != (self.video.height, self.video.width):
            raise ValueError(f"{self.family} generates spec.model.video's {self.video.height}x{self.video.width} for "
                             f"every sample; a request for {tuple(resolution)} is not supported (no model.resolutions "
                             "for video families)")
        return (self.numel,)

    def latent_layout(self, prompt_ids: list[int] | None = None):
        """The flat latent's slots (`omnirl.models.layout.LatentLayout`): each modality's shape and, from the
        manifest's `spec.model.modalities`, whether it is trained, its loss weight and its guidance."""
        from omnirl.models.layout import LatentLayout, ModalitySlot

        return LatentLayout([ModalitySlot(name, tuple(shape), trained=self.modality_settings[name]["train"],
                                          weight=self.modality_settings[name]["weight"],
                                          guidance_scale=self.modality_settings[name]["guidance_scale"])
                             for name, shape in self.slots()])

    def split(self, x: Tensor) -> dict[str, Tensor]:
        """Flat joint latents `[B, D]` → `{modality: [B, *shape]}` (views)."""
        return split_flat(x, self.slots())

    def join(self, parts: dict[str, Tensor]) -> Tensor:
        """`{modality: [B, *shape]}` → flat `[B, D]` (the inverse of `split`)."""
        return join_flat(parts, self.slots())

    # ----------------------------------------------------------------- σ
    def video_seq_len(self) -> int:
        """Video tokens the transformer sees for the job's clip (after its patching)."""
        raise NotImplementedError

    def image_seq_len(self, latent_shape: Sequence[int]) -> int:
        """The transformer's video tokens (what dynamic shifting keys on); the flat shape says nothing more."""
        return self.video_seq_len()

    def sigma_grid(self, num_steps: int, latent_shape: Sequence[int], shift: float | None = None) -> Tensor:
        """The σ grid `[num_steps + 1]` float32: the family's own (`sigmas`) when `shift` is None, else the
        manifest's override `sigma_schedule(num_steps, shift)`.

        Raises:
            ValueError: num_steps < 1, shift ≤ 0, or a latent shape other than `(D,)`.
        """
        if tuple(latent_shape) != (self.numel,):
            raise ValueError(f"{self.family} latents are flat ({self.numel},); got shape {tuple(latent_shape)}")
        if shift is not None:
            return sigma_schedule(num_steps, shift)
        return self.sigmas(num_steps, self.video_seq_len())

    # ----------------------------------------------------------------- media
    def decode_media(self, x0: Tensor) -> dict[str, Tensor]:
        """Clean joint latents `[B, D]` → the batched media dict (docs/families-video.md): `"video"` uint8
        `[B, T, H, W, 3]`, `"fps"` float32 `[B]`, and for audio families `"audio"` float32 `[B, L]` in [−1, 1]
        and `"audio_sample_rate"` int64 `[B]`."""
        raise NotImplementedError

    @torch.no_grad()
    def decode(self, x0: Tensor) -> Tensor:
        """The middle frame of each clip `[B, H, W, 3]` uint8: an image view of a video sample, for image-only
        consumers (a poster frame); media-aware callers use `decode_media`."""
        video = self.decode_media(x0)["video"]
        return video[:, video.shape[1] // 2].contiguous()

    def _fps(self, batch: int, device: torch.device | str) -> Tensor:
        return torch.full((batch,), float(self.video.fps), dtype=torch.float32, device=device)


def resolve_modalities(family: str, names: Sequence[str], modalities: Mapping[str, Mapping] | None,
                       guidance_scale: float) -> dict[str, dict]:
    """Each of `names` with its `train` (bool, default True), `weight` (float, default 1) and `guidance_scale`
    (default `guidance_scale`), from the manifest's `spec.model.modalities` as `ModelSpec.modality_settings` hands it.

    Raises:
        ValueError: a modality the family does not make, an unknown key, a guidance scale < 1, or none trained.
    """
    given = dict(modalities or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"family {family} makes {', '.join(names)}; spec.model.modalities names {', '.join(unknown)}")
    out = {}
    for name in names:
        setting = dict(given.get(name) or {})
        extra = sorted(set(setting) - {"train", "weight", "guidance_scale"})
        if extra:
            raise ValueError(f"spec.model.modalities.{name}: unknown keys {extra} (train, weight, guidance_scale)")
        g = float(setting.get("guidance_scale", guidance_scale))
        if not g >= 1.0:
            raise ValueError(f"spec.model.modalities.{name}.guidanceScale must be >= 1 (1 = no CFG), got {g}")
        out[name] = {"train": bool(setting.get("train", True)), "weight": float(setting.get("weight", 1.0)),
                     "guidance_scale": g}
    if not any(m["train"] for m in out.values()):
        raise ValueError(f"spec.model.modalities: no modality of {family} is trained; keep train: true on one")
    return out
