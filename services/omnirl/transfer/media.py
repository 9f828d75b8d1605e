"""Media: a decoded sample as named tensors (docs/omni.md, "Media"; OMNI-CONTRACT §3).

One sample's media is a `dict[str, Tensor]`:

| key | dtype, shape | what |
| --- | --- | --- |
| `image` | uint8 `[H, W, 3]` | an image sample (the one-modality case) |
| `video` | uint8 `[T, H, W, 3]` | the frames |
| `audio` | float32 `[L]` | a mono waveform in [−1, 1] |
| `audio_sample_rate` | int64 0-d | Hz, with `audio` |
| `fps` | float32 0-d | frames per second, with `video` |

An adapter's `decode_media(x0 [B, D])` returns the batched dict (every value with leading dim B); the
TransferQueue stores one sample's dict as one safetensors blob under the image key
(`TransferQueue.publish(media=)`, `load_media`), raw bytes end to end. Whatever reads a sample as one
picture (the validation grid, group scorers, image scorers) gets `poster(media)`: the image itself, or a
video's frames side by side.
"""

from __future__ import annotations

import numpy as np
import torch

Media = dict[str, torch.Tensor]
MEDIA_KEYS: dict[str, tuple[torch.dtype, int]] = {
    "image": (torch.uint8, 3), "video": (torch.uint8, 4), "audio": (torch.float32, 1),
    "audio_sample_rate": (torch.int64, 0), "fps": (torch.float32, 0),
}
"""Key → (dtype, dimensions) of one sample's media."""
POSTER_FRAMES = 8
"""A poster shows at most this many frames, evenly spaced."""


def check_media(media: Media, where: str = "media") -> Media:
    """`media` after checking every key is a known one with its dtype and rank, `video` is RGB, `audio` comes with
    `audio_sample_rate` and `video` with `fps`, and there is an `image` or a `video` or an `audio`.

    Raises:
        ValueError: naming `where`, the key and the expected dtype and shape.
    """
    unknown = sorted(set(media) - set(MEDIA_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; media keys are {sorted(MEDIA_KEYS)}")
    for key, value in media.items():
        dtype, dims = MEDIA_KEYS[key]
        if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != dims:
            got = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"{where}[{key!r}]: expected {dtype} with {dims} dimensions, got {got}")
    for key in ("image", "video"):
        if key in media and media[key].shape[-1] != 3:
            raise ValueError(f"{where}[{key!r}]: expected RGB (last dimension 3), got {list(media[key].shape)}")
    for key, needs in (("audio", "audio_sample_rate"), ("video", "fps")):
        if key in media and needs not in media:
            raise ValueError(f"{where}: {key} without {needs}")
    if not {"image", "video", "audio"} & set(media):
        raise ValueError(f"{where}: holds no image, video or audio (keys {sorted(media)})")
    return media


def unbatch(media: Media, n: int) -> list[Media]:
    """Batched media (every value with leading dim `n`) → n per-sample dicts (views)."""
    return [{k: v[i] for k, v in media.items()} for i in range(n)]


def poster(media: Media) -> torch.Tensor:
    """One picture of a sample, uint8 `[H, W, 3]`: its `image`, else up to `POSTER_FRAMES` evenly spaced frames
    of its `video` side by side, else (audio alone) a 1×1 white pixel.

    Raises:
        ValueError: media with neither (`check_media`'s rule).
    """
    if "image" in media:
        return media["image"]
    if "video" in media:
        video = media["video"]
        index = torch.linspace(0, video.shape[0] - 1, min(POSTER_FRAMES, video.shape[0])).round().long()
        frames = video[index]
        return frames.permute(1, 0, 2, 3).reshape(frames.shape[1], -1, 3).contiguous()
    if "audio" in media:
        return torch.full((1, 1, 3), 255, dtype=torch.uint8)
    raise ValueError(f"media holds no image, video or audio (keys {sorted(media)})")


def to_numpy(media: Media) -> dict[str, np.ndarray]:
    """One sample's media as numpy (what `score_media` scorers take); 0-d values become numpy scalars' arrays."""
    return {k: v.numpy() for k, v in media.items()}
