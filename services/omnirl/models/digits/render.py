"""Render digit strings in the fixed slot layout the digits model learns.

Layout: the image is 32 px high and 16·S px wide, S = `slots_for(text)` (4 slots for up to four
characters, 8 for five to eight: two image widths, 64 and 128 px). One character per 16-px slot,
the string centred: its first character sits in slot (S − n)//2. Each character is centred in
its slot, then jittered by up to ±1 px in x and y. Font face (regular/bold/mono/serif) and size
vary per image (Debian's DejaVu set). Black ink on white.

`demo-task.md` measured that this fixed layout, with each patch column told which character it
draws, becomes legible within minutes of CPU pretraining; free placement did not.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

HEIGHT = 32
"""Image height in pixels."""
SLOT_WIDTH = 16
"""Width of one character slot in pixels."""
MAX_SLOTS = 8
"""The widest layout: 8 slots = 128 px."""
JITTER = 1
"""Per-character position jitter, ± pixels (x and y). ±2 px made pretraining ~2× slower to become
legible (held-out OCR reward 0.13 vs 0.67 after 1000 steps in a GPU sweep), so ±1 px."""

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansMono.ttf", "DejaVuSerif.ttf")
"""Four faces: sans, bold (the stroke-weight variation), monospace, serif. All ten upright DejaVu
faces plus a random 1-px stroke learnt markedly slower (same sweep)."""
FONT_SIZES = (20, 22, 24)
"""Font sizes in pixels (a digit at 24 px is ~15 px wide in DejaVu Sans: it fits a slot)."""


def slots_for(text: str) -> int:
    """Number of 16-px slots for `text`: 4 when len(text) ≤ 4, else 8.

    Raises:
        ValueError: empty text or more than `MAX_SLOTS` characters.
    """
    if not 0 < len(text) <= MAX_SLOTS:
        raise ValueError(f"text {text!r} must have 1..{MAX_SLOTS} characters, has {len(text)}")
    return 4 if len(text) <= 4 else MAX_SLOTS


def first_slot(num_chars: int, width_slots: int) -> int:
    """Index of the slot holding the first character: (S − n)//2 (the string is centred)."""
    return (width_slots - num_chars) // 2


@lru_cache(maxsize=64)
def _font(name: str, size: int) -> ImageFont.FreeTypeFont:
    path = FONT_DIR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"font {path} not found; install Debian's fonts-dejavu-core/fonts-dejavu-extra packages"
        )
    return ImageFont.truetype(str(path), size)


def render_text(
    text: str, width_slots: int, rng: np.random.Generator, noise_std: float = 0.0
) -> np.ndarray:
    """Draw `text` in the slot layout.

    Args:
        text: 1..`width_slots` characters.
        width_slots: S, the number of 16-px slots (image width 16·S px).
        rng: the randomness source (font, size, jitter, noise): same seed → same image.
        noise_std: standard deviation of optional additive Gaussian pixel noise, in units of the
            full 0–255 range (0 = none; 0.05 is mild).
    Returns:
        `[32, 16·S]` uint8 grayscale, 255 = white paper, 0 = black ink.
    Raises:
        ValueError: text longer than `width_slots`, empty, or `width_slots` outside 1..8.
    """
    if not 1 <= width_slots <= MAX_SLOTS:
        raise ValueError(f"width_slots must be in 1..{MAX_SLOTS}, got {width_slots}")
    if not 0 < len(text) <= width_slots:
        raise ValueError(f"text {text!r} does not fit {width_slots} slots (needs 1..{width_slots} characters)")
    font = _font(FONT_FILES[int(rng.integers(len(FONT_FILES)))], int(rng.choice(FONT_SIZES)))
    image = Image.new("L", (SLOT_WIDTH * width_slots, HEIGHT), 255)
    draw = ImageDraw.Draw(image)
    start = first_slot(len(text), width_slots)
    for k, ch in enumerate(text):
        left, top, right, bottom = draw.textbbox((0, 0), ch, font=font)
        dx, dy = rng.integers(-JITTER, JITTER + 1, size=2)
        x = (start + k) * SLOT_WIDTH + (SLOT_WIDTH - (right - left)) / 2 - left + dx
        y = (HEIGHT - (bottom - top)) / 2 - top + dy
        draw.text((x, y), ch, fill=0, font=font)
    pixels = np.asarray(image, dtype=np.uint8)
    if noise_std > 0:
        noisy = pixels.astype(np.float32) + rng.normal(0.0, noise_std * 255.0, size=pixels.shape)
        pixels = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
    return pixels
