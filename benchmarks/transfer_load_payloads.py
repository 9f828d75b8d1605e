"""What one sample puts on the TransferQueue, by job kind: the load test's payloads.

A sample is published as the rollout role publishes it (`omnirl.rollout.service`): a trajectory
(safetensors under ``tensors:{id}``) and its decoded media (safetensors under ``images:{id}``,
read alone by the reward role). FlowGRPO records the SDE window's W + 1 latents (the window's
inputs and its last output), W log-probs and W + 1 σ, and the clean latent x0 (docs/architecture.md
§2, "Streams, groups and keys"). Latent shapes are the models' own (latent channels × the VAE's
compression); media are uint8 frames ``[T, H, W, 3]`` (an image is ``[H, W, 3]``).

| kind | model | latent x0 | media |
| --- | --- | --- | --- |
| img512 | SD3.5-M, 512² | fp32 [16, 64, 64] (VAE /8, 16 ch) | uint8 [512, 512, 3] |
| img1024 | SD3.5-M, 1024² | fp32 [16, 128, 128] | uint8 [1024, 1024, 3] |
| video33 | Wan2.1-1.3B, 33 × 240×416 | fp32 [16, 9, 30, 52] (VAE /4 in time + 1, /8 in space) | uint8 [33, 240, 416, 3] |
| av81 | LTX-2, 81 × 256×384 + 3 s of 16 kHz audio | fp32 video [128, 11, 8, 12] (VAE /8 in time + 1, /32 in space, 128 ch) and audio [8, 75, 16] (8 ch, 25 latents/s, 64 mel bins / 4), concatenated flat as VeRL-Omni's joint SDE runs them | uint8 [81, 256, 384, 3]; waveform fp32 [1, 48000] in the trajectory |
| tiny | tests | fp32 [4, 8, 8] | uint8 [8, 8, 3] |

The waveform travels in the trajectory here because `TransferQueue.publish(image=...)` takes one
tensor; the bytes Redis carries are the same wherever it is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from omnirl.transfer.codec import encode_tensors

DEFAULT_WINDOW = 3
"""SDE window W of the measured GPU service (FlowGRPO, 3 trained steps): W + 1 latents per trajectory."""


@dataclass(frozen=True)
class PayloadKind:
    """One job kind's sample.

    Attributes:
        name: the CLI name (``--kinds``).
        what: one line for the table.
        latent: shape of x0 (fp32); the trajectory holds W + 1 of them.
        media: shape of the decoded uint8 media (the image key).
        extra: more fp32 tensors of the trajectory (name → shape), e.g. the waveform.
    """

    name: str
    what: str
    latent: tuple[int, ...]
    media: tuple[int, ...]
    extra: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def raw_bytes(self, window: int = DEFAULT_WINDOW) -> int:
        """Σ numel × element size of one sample's tensors (trajectory + media), bytes."""
        floats = prod(self.latent) * (window + 2) + window + (window + 1)
        floats += sum(prod(shape) for _, shape in self.extra)
        return 4 * floats + prod(self.media)


_AUDIO_LATENT = 8 * 75 * 16
KINDS: dict[str, PayloadKind] = {k.name: k for k in (
    PayloadKind("img512", "SD3.5-M 512² image", (16, 64, 64), (512, 512, 3)),
    PayloadKind("img1024", "SD3.5-M 1024² image", (16, 128, 128), (1024, 1024, 3)),
    PayloadKind("video33", "Wan2.1-1.3B 33 × 240×416 video", (16, 9, 30, 52), (33, 240, 416, 3)),
    PayloadKind("av81", "LTX-2 81 × 256×384 video + 3 s 16 kHz audio", (128 * 11 * 8 * 12 + _AUDIO_LATENT,),
                (81, 256, 384, 3), (("waveform", (1, 48_000)),)),
    PayloadKind("tiny", "test payload", (4, 8, 8), (8, 8, 3)),
)}


def make_sample(kind: PayloadKind, window: int = DEFAULT_WINDOW,
                seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One sample's (trajectory, media), random so that nothing compresses.

    Returns:
        ``({"x0": fp32 latent, "latents": fp32 [W+1, *latent], "log_probs": fp32 [W], "sigmas": fp32 [W+1],
        **extra}, uint8 media)``.

    Raises:
        ValueError: window < 1.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    gen = torch.Generator().manual_seed(seed)
    trajectory = {
        "x0": torch.randn(kind.latent, generator=gen),
        "latents": torch.randn((window + 1, *kind.latent), generator=gen),
        "log_probs": torch.randn(window, generator=gen),
        "sigmas": torch.linspace(1.0, 0.5, window + 1),
        **{name: torch.randn(shape, generator=gen) for name, shape in kind.extra},
    }
    media = torch.randint(0, 256, kind.media, generator=gen, dtype=torch.uint8)
    return trajectory, media


def stored_bytes(kind: PayloadKind, window: int = DEFAULT_WINDOW) -> tuple[int, int]:
    """(trajectory, media) bytes as Redis stores them (safetensors files, headers included)."""
    trajectory, media = make_sample(kind, window)
    return len(encode_tensors(trajectory)), len(encode_tensors({"image": media}))
