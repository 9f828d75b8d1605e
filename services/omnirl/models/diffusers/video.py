"""What the video families (`wan`, `ltx2`, `minimax-h3`) share: the frame-count and size rules of their
VAEs, the flat joint latent, and the pixel conversions of decoded media.

A video family's sample is ONE flat float32 latent `[D]` (docs/families-video.md, the multi-modal
contract): each modality's latent (video `[C, T', H', W']`, audio as the family lays it out) flattened
and concatenated in slot order, video first. `slots` name those parts; `split_flat` / `join_flat`
convert between the flat form and the per-modality tensors the transformer reads.

Geometry: a VAE compresses time by a factor and space by another; the transformer patchifies the
latent again. A frame count is valid when the VAE maps it onto whole latent frames (`FrameRule`), a
size when it is a multiple of the VAE's spatial factor times the patch (`check_geometry`); the
messages name the nearest valid values, so `omnirl validate` can say what to write instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

import torch
from torch import Tensor

from omnirl.models.diffusers._common import check_float32_and_sigma


@dataclass(frozen=True)
class FrameRule:
    """Pixel frame counts a video VAE encodes onto whole latent frames: `frames = period·k + offset`, k ≥ 0.

    Wan (temporal factor 4): period 4, offset 1 (1, 5, 9, …, 33, …, 81). LTX-2 (factor 8): 8, 1 (…, 121).
    MiniMax-H3 (17 pixel frames per 5-latent chunk): 17, 5 (…, 124, …).

    Attributes:
        period: frames per step of the rule (the VAE's temporal factor, or its chunk length).
        offset: the smallest valid count (the VAE's causal first frame, or its partial chunk).
        latents_per_period: latent frames each period adds (1 for Wan and LTX-2, 5 for MiniMax-H3).
        latents_at_offset: latent frames of `offset` pixel frames (1 for Wan and LTX-2, 2 for MiniMax-H3).
    """

    period: int
    offset: int
    latents_per_period: int = 1
    latents_at_offset: int = 1

    def valid(self, frames: int) -> bool:
        """Whether `frames` pixel frames encode onto whole latent frames."""
        return frames >= self.offset and (frames - self.offset) % self.period == 0

    def nearest(self, frames: int) -> list[int]:
        """The valid counts nearest `frames`: `[frames]` when it is valid, else the one below (when there is
        one) and the one above, ascending."""
        if frames <= self.offset:
            return [self.offset]
        below = self.offset + (frames - self.offset) // self.period * self.period
        return [frames] if below == frames else [below, below + self.period]

    def latent_frames(self, frames: int) -> int:
        """Latent frames T' of `frames` (valid) pixel frames.

        Raises:
            ValueError: `frames` is not valid (the message names the nearest valid counts).
        """
        if not self.valid(frames):
            raise ValueError(f"{frames} frames do not fit the VAE ({self.describe()}); use {self.nearest(frames)}")
        return self.latents_at_offset + (frames - self.offset) // self.period * self.latents_per_period

    def describe(self) -> str:
        """The rule in words, e.g. `4k+1`."""
        return f"frames = {self.period}k+{self.offset}"


@dataclass(frozen=True)
class VideoGeometry:
    """What a job generates: `frames` pixel frames of `height` × `width` pixels shown at `fps` frames/s."""

    frames: int
    height: int
    width: int
    fps: float

    @property
    def seconds(self) -> float:
        """The clip's duration in seconds, frames / fps."""
        return self.frames / self.fps


def nearest_multiples(value: int, multiple: int) -> list[int]:
    """The multiples of `multiple` nearest `value` (the one below when > 0, and the one above), ascending."""
    below = value // multiple * multiple
    return sorted({v for v in (below, below + multiple) if v > 0})


def check_geometry(geometry: VideoGeometry, rule: FrameRule, spatial_multiple: int, *,
                   field: str = "spec.model.video") -> VideoGeometry:
    """Check a clip's frame count and size against its VAE and patch, naming the nearest valid values.

    Args:
        geometry: frames, height, width (pixels), fps.
        rule: the VAE's frame rule.
        spatial_multiple: what height and width must be multiples of (VAE spatial factor × patch size).
        field: the manifest field the message names.
    Returns:
        `geometry`.
    Raises:
        ValueError: one line naming `field`'s key, the value, the rule and the nearest valid values.
    """
    for name, value in (("frames", geometry.frames), ("height", geometry.height), ("width", geometry.width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}.{name} must be a positive integer, got {value!r}")
    if not geometry.fps > 0:
        raise ValueError(f"{field}.fps must be > 0 frames per second, got {geometry.fps!r}")
    if not rule.valid(geometry.frames):
        raise ValueError(f"{field}.frames: {geometry.frames} does not fit the VAE ({rule.describe()}); "
                         f"nearest valid: {' or '.join(map(str, rule.nearest(geometry.frames)))}")
    for name, value in (("height", geometry.height), ("width", geometry.width)):
        if value % spatial_multiple:
            raise ValueError(f"{field}.{name}: {value} is not a multiple of {spatial_multiple} (VAE spatial factor x "
                             f"patch size); nearest valid: {' or '.join(map(str, nearest_multiples(value, spatial_multiple)))}")
    return geometry


def split_flat(x: Tensor, slots: Sequence[tuple[str, tuple[int, ...]]]) -> dict[str, Tensor]:
    """Flat joint latents `[B, D]` → `{name: [B, *shape]}` in slot order (views, no copy).

    Raises:
        ValueError: `x` is not `[B, D]` with D = the slots' total size.
    """
    sizes = [prod(shape) for _, shape in slots]
    if x.ndim != 2 or x.shape[1] != sum(sizes):
        raise ValueError(f"joint latents must be [B, {sum(sizes)}] ({', '.join(f'{n} {list(s)}' for n, s in slots)}); "
                         f"got {list(x.shape)}")
    parts = torch.split(x, sizes, dim=1)
    return {name: part.reshape(x.shape[0], *shape) for (name, shape), part in zip(slots, parts, strict=True)}


def join_flat(parts: Mapping[str, Tensor], slots: Sequence[tuple[str, tuple[int, ...]]]) -> Tensor:
    """`{name: [B, *shape]}` → flat `[B, D]`, concatenated in slot order (the inverse of `split_flat`).

    Raises:
        ValueError: a slot missing from `parts` or of the wrong shape.
    """
    flat = []
    for name, shape in slots:
        if name not in parts:
            raise ValueError(f"no {name!r} latents to join; the layout has {[n for n, _ in slots]}")
        part = parts[name]
        if tuple(part.shape[1:]) != tuple(shape):
            raise ValueError(f"{name} latents must be [B, {', '.join(map(str, shape))}]; got {list(part.shape)}")
        flat.append(part.reshape(part.shape[0], -1))
    return torch.cat(flat, dim=1)


def check_flat(x: Tensor, sigma: Tensor, numel: int) -> None:
    """Check joint latents `x` `[B, numel]` float32 and `sigma` `[B]`.

    Raises:
        ValueError: wrong rank, size, dtype or σ length.
    """
    if x.ndim != 2 or x.shape[1] != numel:
        raise ValueError(f"x must be joint latents [B, {numel}]; got shape {tuple(x.shape)}")
    check_float32_and_sigma(x, sigma)


def to_uint8_video(pixels: Tensor, *, signed: bool = True) -> Tensor:
    """A VAE's video `[B, 3, T, H, W]` → `[B, T, H, W, 3]` uint8.

    `signed`: pixels in [−1, 1] (Wan, LTX-2), mapped x ↦ round(clamp(x/2 + 0.5, 0, 1)·255) as diffusers'
    `VideoProcessor.postprocess_video` then 8 bits; False: pixels already in [0, 1] (MiniMax-H3 after its
    ImageNet de-normalisation).
    """
    video = pixels.float()
    if signed:
        video = video / 2 + 0.5
    return (video.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).contiguous()


def token_limit(tokenizer, pipeline_max: int, requested: int | None) -> int:
    """The text tokens a prompt is padded to: `requested`, else the pipeline's default `pipeline_max` or the
    tokenizer's `model_max_length` when that is smaller.

    Raises:
        ValueError: `requested` outside [1, pipeline_max].
    """
    if requested is None:
        own = getattr(tokenizer, "model_max_length", None)
        return int(min(pipeline_max, own)) if isinstance(own, int) and own > 0 else pipeline_max
    if not 1 <= requested <= pipeline_max:
        raise ValueError(f"max_sequence_length must be in [1, {pipeline_max}], got {requested}")
    return int(requested)
