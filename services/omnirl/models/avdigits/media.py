"""The audio+video digits task's sample: its latent, the renderer/synthesizer that makes training
latents, and the deterministic decoder latent → media (8 video frames + 1 s of mono audio).

A right sample for `A sign that says "<number>" with <k> beeps` (docs/omni.md, "The built-in
audio+video task"): the number is drawn on exactly k consecutive frames (blank otherwise), a beep
sounds on each of those frames, and the beep's pitch is 300 + 100·d Hz for the number's first digit d.

The latent (no VAE: fixed transforms chosen so that a ~1 M-parameter model learns on two shared CPU
cores in minutes; docs/omni.md says why):

- **video** `[520]` = the sign `[16, 32]` (half resolution, pixels in [−1, 1], white paper = +1, black
  ink = −1, as the digits model's) then the ink of each of the 8 frames `[8]` in [−1, 1] (−1 blank, +1
  the sign). Frame f is the sign blended onto white by ink_f = clamp(i_f, 0, 1), in the latent's
  pixels 1 − ink_f·(1 − sign), decoded by 2× bilinear upsampling to 32×64, grey in RGB. A sign shown on
  several frames is the same drawing (a static sign), so the latent holds it once: the extreme of the
  temporal compression a video VAE does (Wan's packs 4 frames into one latent frame), which leaves the
  model 12 video rows instead of 32 and puts the "which frames" decision in 8 numbers. Half resolution
  quarters the sign; the OCR reads the upsampled frames as well as full-resolution ones
  (tests/models/test_avdigits.py).
- **audio** `[24]` = the loudness of each frame's beep `[8]` then a pitch profile `[16]` over pure-tone bins at
  200, 300, …, 1700 Hz, values in [−1, 1] (−1 off, +1 on). Decoded by additive synthesis: in the first half of
  frame f (62.5 ms) bin b sounds with amplitude clamp(l_f, 0, 1)·clamp(p_b, 0, 1) (the lower half of the range is
  silence, so sampling noise around −1 stays silent; the same rule for the ink), the second half is the gap that
  makes consecutive beeps two onsets; 4 ms linear ramps, a sine per bin with a phase continuous over the second,
  summed, × 0.5, clipped to [−1, 1]. Per-frame tone parameters, as the video's per-frame ink: a beep is one number
  and its pitch one row of the profile, so "which frames beep" and "which pitch" are decisions the model learns
  in minutes (a 16-cell × 16-bin magnitude grid, tried first, spread each beep over 256 mostly silent values
  and stayed silent or everywhere after 500 pretraining steps: pitch and sync terms ≈ 0.05 and 0.01).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

FRAMES = 8
FRAME_HEIGHT = 32
FRAME_WIDTH = 64
"""Decoded frame size in pixels (4 character slots of 16 px: numbers of 2–4 digits)."""
LATENT_HEIGHT = FRAME_HEIGHT // 2
LATENT_WIDTH = FRAME_WIDTH // 2
FPS = 8.0
SAMPLE_RATE = 8000
AUDIO_SECONDS = FRAMES / FPS
CELLS_PER_FRAME = 2
AUDIO_CELLS = FRAMES * CELLS_PER_FRAME
AUDIO_BINS = 16
BIN_HZ = tuple(200.0 + 100.0 * b for b in range(AUDIO_BINS))
"""Tone frequency of each audio bin, Hz: 200 … 1700."""
CELL_SAMPLES = int(SAMPLE_RATE / FPS) // CELLS_PER_FRAME
AUDIO_SAMPLES = CELL_SAMPLES * AUDIO_CELLS
RAMP_SAMPLES = 32
"""4 ms at 8 kHz: the linear ramp between cells (no clicks at a beep's edges)."""
TONE_GAIN = 0.5
SIGN_NUMEL = LATENT_HEIGHT * LATENT_WIDTH
VIDEO_SHAPE = (SIGN_NUMEL + FRAMES,)
"""The video latent: the sign `[16, 32]` flattened, then the ink of each frame `[8]`."""
AUDIO_SHAPE = (FRAMES + AUDIO_BINS,)
"""The audio latent: the loudness of each frame's beep `[8]`, then the pitch profile `[16]`."""
MAX_BEEPS = 4
MIN_DIGITS, MAX_DIGITS = 2, 4


def pitch_hz(first_digit: int) -> float:
    """The beep pitch of a number whose first digit is d: 300 + 100·d Hz (300 … 1200)."""
    return 300.0 + 100.0 * int(first_digit)


def pitch_bin(first_digit: int) -> int:
    """The audio bin of `pitch_hz(first_digit)`: d + 1."""
    return BIN_HZ.index(pitch_hz(first_digit))


@dataclass(frozen=True)
class Sign:
    """What one training sample shows: the number, the beep count k and the first inked frame.

    Raises:
        ValueError: a number that is not 2–4 digits, k outside 1..4, or frames that do not fit.
    """

    number: str
    beeps: int
    start: int

    def __post_init__(self) -> None:
        if not (self.number.isdigit() and MIN_DIGITS <= len(self.number) <= MAX_DIGITS):
            raise ValueError(f"number {self.number!r} must have {MIN_DIGITS}–{MAX_DIGITS} digits")
        if not 1 <= self.beeps <= MAX_BEEPS:
            raise ValueError(f"beeps {self.beeps} must be in 1..{MAX_BEEPS}")
        if not 0 <= self.start <= FRAMES - self.beeps:
            raise ValueError(f"start {self.start} with {self.beeps} beeps does not fit {FRAMES} frames")

    @property
    def frames(self) -> range:
        """The inked (and beeping) frames."""
        return range(self.start, self.start + self.beeps)


GLYPH_FONT = ("DejaVuSans-Bold.ttf", 22)
"""One face and size, no jitter: a sign looks the same on every frame and in every sample of a number, so the
model's minutes go to the joint part of the task (which frames, which beeps, which pitch), not to fonts."""


def render_sign(number: str) -> np.ndarray:
    """`number` drawn in the digits model's slot layout (one character per 16-px slot, centred in 4 slots) with
    `GLYPH_FONT`: `[32, 64]` uint8, 255 = white paper, 0 = ink."""
    from PIL import Image, ImageDraw

    from omnirl.models.digits.render import _font, first_slot

    font = _font(*GLYPH_FONT)
    image = Image.new("L", (FRAME_WIDTH, FRAME_HEIGHT), 255)
    draw = ImageDraw.Draw(image)
    start, slot = first_slot(len(number), 4), FRAME_WIDTH // 4
    for k, ch in enumerate(number):
        left, top, right, bottom = draw.textbbox((0, 0), ch, font=font)
        draw.text(((start + k) * slot + (slot - (right - left)) / 2 - left, (FRAME_HEIGHT - (bottom - top)) / 2 - top),
                  ch, fill=0, font=font)
    return np.asarray(image, dtype=np.uint8)


def downsample(glyph: np.ndarray) -> np.ndarray:
    """`[32, 64]` uint8 (255 = white) → `[16, 32]` float32 in [−1, 1] by 2×2 box averaging."""
    x = glyph.astype(np.float32).reshape(LATENT_HEIGHT, 2, LATENT_WIDTH, 2).mean(axis=(1, 3))
    return x / 127.5 - 1.0


def sign_latents(sign: Sign, glyph: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The clean latents of `sign`: video `[520]` (sign, then ink per frame) and audio `[24]` (loudness per frame,
    then the pitch profile), float32 in [−1, 1].

    Args:
        sign: the number, k and the first inked frame.
        glyph: the number rendered at full resolution, `[32, 64]` uint8 (`render_sign`).
    """
    ink = -np.ones(FRAMES, dtype=np.float32)
    pitch = -np.ones(AUDIO_BINS, dtype=np.float32)
    pitch[pitch_bin(int(sign.number[0]))] = 1.0
    for f in sign.frames:
        ink[f] = 1.0
    return np.concatenate([downsample(glyph).reshape(-1), ink]), np.concatenate([ink, pitch])


def frames_of(video: torch.Tensor) -> torch.Tensor:
    """Video latents `[B, 520]` → the frames in latent pixels `[B, 8, 16, 32]`: 1 − ink_f·(1 − sign), ink_f =
    clamp(i_f, 0, 1)."""
    sign = video[:, :SIGN_NUMEL].float().reshape(-1, 1, LATENT_HEIGHT, LATENT_WIDTH)
    ink = video[:, SIGN_NUMEL:].float().clamp(0.0, 1.0)[:, :, None, None]
    return 1.0 - ink * (1.0 - sign.clamp(-1.0, 1.0))


def decode_video(video: torch.Tensor) -> torch.Tensor:
    """Video latents `[B, 520]` → frames `[B, 8, 32, 64, 3]` uint8 (`frames_of`, 2× bilinear, grey RGB)."""
    b = video.shape[0]
    frames = frames_of(video).reshape(b * FRAMES, 1, LATENT_HEIGHT, LATENT_WIDTH)
    up = F.interpolate(frames, scale_factor=2, mode="bilinear", align_corners=False)
    pixels = ((up.clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    return pixels.reshape(b, FRAMES, FRAME_HEIGHT, FRAME_WIDTH, 1).expand(-1, -1, -1, -1, 3).contiguous()


def amplitudes(audio: torch.Tensor) -> torch.Tensor:
    """Audio latents `[B, 24]` → tone amplitudes `[B, 16 cells, 16 bins]` in [0, 1]: cell 2f (the first half of frame
    f) clamp(l_f, 0, 1)·clamp(p_b, 0, 1), cell 2f + 1 silent."""
    loud = audio[:, :FRAMES].float().clamp(0.0, 1.0)
    pitch = audio[:, FRAMES:].float().clamp(0.0, 1.0)
    beeps = loud[:, :, None] * pitch[:, None, :]  # [B, frames, bins]
    gap = torch.zeros_like(beeps)
    return torch.stack([beeps, gap], dim=2).reshape(audio.shape[0], AUDIO_CELLS, AUDIO_BINS)


def decode_audio(audio: torch.Tensor) -> torch.Tensor:
    """Audio latents `[B, 24]` → waveforms `[B, 8000]` float32 in [−1, 1] at `SAMPLE_RATE` (module docstring)."""
    amp = amplitudes(audio)  # [B, cells, bins]
    env = amp.transpose(1, 2).repeat_interleave(CELL_SAMPLES, dim=2)  # [B, bins, L]: held per cell
    kernel = torch.full((1, 1, RAMP_SAMPLES), 1.0 / RAMP_SAMPLES, dtype=env.dtype)
    b = env.shape[0]
    padded = F.pad(env.reshape(b * AUDIO_BINS, 1, -1), (RAMP_SAMPLES // 2, RAMP_SAMPLES - 1 - RAMP_SAMPLES // 2),
                   mode="replicate")
    env = F.conv1d(padded, kernel).reshape(b, AUDIO_BINS, -1)  # linear ramps at the cell edges
    t = torch.arange(AUDIO_SAMPLES, dtype=torch.float64) / SAMPLE_RATE
    tones = torch.sin(2.0 * torch.pi * torch.tensor(BIN_HZ, dtype=torch.float64)[:, None] * t[None]).float()
    return (TONE_GAIN * (env * tones[None]).sum(dim=1)).clamp(-1.0, 1.0)


def decode_media(video: torch.Tensor, audio: torch.Tensor) -> dict[str, torch.Tensor]:
    """Video latents `[B, 520]` and audio latents `[B, 24]` → batched media (docs/omni.md, "Media"): `video`
    uint8 `[B, 8, 32, 64, 3]`, `audio` float32 `[B, 8000]`,
    `audio_sample_rate` int64 `[B]` (8000 Hz), `fps` float32 `[B]` (8)."""
    b = video.shape[0]
    return {"video": decode_video(video), "audio": decode_audio(audio),
            "audio_sample_rate": torch.full((b,), SAMPLE_RATE, dtype=torch.int64),
            "fps": torch.full((b,), FPS, dtype=torch.float32)}
