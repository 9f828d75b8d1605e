"""Save sample images as one PNG grid (local runs write one per validation, docs/local.md "Outputs")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from omnirl.api.prompts import target_text

CAPTION_HEIGHT = 12
PAD = 2


def tile_caption(prompt: str, reward: float | None) -> str:
    """A sample's caption in a grid: its reward (2 decimals; "—" when it has none) and the text its prompt asked
    for, quoted (`target_text`: the quoted part, or the whole line), e.g. `0.45 "36882"`: the score alone left
    the reader to look the prompt up. The reward comes first, so a caption cut to its tile keeps it."""
    try:
        text = target_text(prompt)
    except ValueError:  # one double quote: no quoted part to show, the line as it is
        text = prompt.strip()
    return f'{"—" if reward is None else f"{reward:.2f}"} "{text}"'


def _fit(draw: ImageDraw.ImageDraw, text: str, width: int) -> str:
    """`text`, cut and ended with "…" where it is wider than `width` pixels in the grid's font."""
    if draw.textlength(text) <= width:
        return text
    while text and draw.textlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


def save_image_grid(
    images: list[np.ndarray] | np.ndarray,
    path: str | Path,
    ncols: int = 8,
    captions: list[str] | None = None,
) -> Path:
    """Tile images row-major into a PNG; images of different sizes are padded (grey) to the largest.

    Args:
        images: a list of `[H, W, 3]` uint8 arrays (sizes may differ) or one `[B, H, W, 3]` uint8 array.
        path: output file (parent directories are created).
        ncols: images per row.
        captions: optional text drawn under each image (same length as `images`; `tile_caption`'s for samples),
            cut with "…" where wider than the widest image.
    Returns:
        The path written.
    Raises:
        ValueError: no images, a non-uint8 or non-`[H, W, 3]` image, ncols < 1, or a caption count mismatch.
    """
    images = list(images)
    if not images:
        raise ValueError("images is empty; nothing to put in a grid")
    if ncols < 1:
        raise ValueError(f"ncols must be >= 1, got {ncols}")
    if captions is not None and len(captions) != len(images):
        raise ValueError(f"got {len(captions)} captions for {len(images)} images")
    for k, image in enumerate(images):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"images[{k}] must be [H, W, 3] uint8, got {image.dtype} {list(image.shape)}")
    cell_h = max(im.shape[0] for im in images) + (CAPTION_HEIGHT if captions else 0)
    cell_w = max(im.shape[1] for im in images)
    rows = -(-len(images) // ncols)
    cols = min(ncols, len(images))
    grid = Image.new("RGB", (cols * (cell_w + PAD) + PAD, rows * (cell_h + PAD) + PAD), (128, 128, 128))
    draw = ImageDraw.Draw(grid)
    for k, image in enumerate(images):
        x = PAD + (k % ncols) * (cell_w + PAD)
        y = PAD + (k // ncols) * (cell_h + PAD)
        grid.paste(Image.fromarray(image), (x, y))
        if captions:
            draw.text((x, y + cell_h - CAPTION_HEIGHT), _fit(draw, captions[k], cell_w), fill=(255, 255, 255))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    grid.save(out)
    return out
