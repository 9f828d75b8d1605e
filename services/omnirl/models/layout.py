"""`LatentLayout`: how a multi-modal sample's latent is one flat fp32 vector (docs/omni.md, OMNI-CONTRACT §1).

Each modality's latent (video `[C, T, H, W]`, audio `[C, L]`, …) is flattened and concatenated in slot
order, video first, then audio, into one `[D]` vector, so the rollout engine, the TransferQueue and the
trajectory record (`latents [W+1, D]`) need no new shape logic. An adapter of a multi-modal family
returns `latent_shape(...) == (D,)` and exposes `latent_layout(prompt_ids) -> LatentLayout`; image
adapters expose none (the one-modality case, today's path).

Which modalities the policy trains and with what loss weight come from the manifest
(`spec.model.modalities`); the algorithms get them as `omnirl.algorithms.modalities.Modalities`
(`LatentLayout.modalities`). Classifier-free guidance per modality is `guided`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from omnirl.algorithms.modalities import Modalities, check_modalities

ModalityName = Literal["video", "audio", "image"]
MODALITY_ORDER: tuple[str, ...] = ("video", "audio", "image")
"""Slot order of a flat latent: video first, then audio (the contract; the split index is video's size)."""


@dataclass(frozen=True)
class ModalitySlot:
    """One modality of a flat latent.

    Attributes:
        name: "video", "audio" or "image".
        shape: the per-sample latent shape of this modality (no batch dimension).
        trained: part of the policy (False: sampled by the ODE inside the SDE window, in no loss).
        weight: its loss weight in DiffusionNFT / AWM / DGPO before normalisation (> 0 when trained).
        guidance_scale: the classifier-free guidance scale of this modality's velocity (1 = off).
    """

    name: str
    shape: tuple[int, ...]
    trained: bool = True
    weight: float = 1.0
    guidance_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in MODALITY_ORDER:
            raise ValueError(f"modality {self.name!r} is not one of {MODALITY_ORDER}")
        if not self.shape or any(int(n) < 1 for n in self.shape):
            raise ValueError(f"modality {self.name}: shape {self.shape} must be non-empty with sizes >= 1")
        if not (math.isfinite(self.weight) and self.weight >= 0) or (self.trained and self.weight == 0):
            raise ValueError(f"modality {self.name}: weight {self.weight} must be finite, >= 0 and > 0 when trained")

    @property
    def numel(self) -> int:
        """Elements of one sample's latent of this modality."""
        return math.prod(self.shape)


class LatentLayout:
    """Slots of a flat multi-modal latent, in order (video, then audio).

    Args:
        slots: the modalities, each name once, in `MODALITY_ORDER`; at least one trained.
    Raises:
        ValueError: no slot, a repeated or out-of-order name, or no trained slot.
    """

    def __init__(self, slots: tuple[ModalitySlot, ...] | list[ModalitySlot]) -> None:
        slots = tuple(slots)
        names = [s.name for s in slots]
        if not slots or len(set(names)) != len(names) or names != sorted(names, key=MODALITY_ORDER.index):
            raise ValueError(f"layout slots {names} must be distinct modalities in the order {MODALITY_ORDER}")
        if not any(s.trained for s in slots):
            raise ValueError(f"layout {names}: at least one modality must be trained")
        self.slots = slots

    @property
    def numel(self) -> int:
        """D, the flat latent's size."""
        return sum(s.numel for s in self.slots)

    @property
    def segments(self) -> list[tuple[str, int, int]]:
        """`(name, start, stop)` of each slot in the flat latent."""
        out, start = [], 0
        for s in self.slots:
            out.append((s.name, start, start + s.numel))
            start += s.numel
        return out

    def slot(self, name: str) -> ModalitySlot:
        """The slot called `name`. Raises KeyError naming the slots there are."""
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(f"no modality {name!r} in this layout ({', '.join(s.name for s in self.slots)})")

    def split(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """`[B, D]` → {name: `[B, *shape]`} (views of `x`).

        Raises:
            ValueError: x is not `[B, D]`.
        """
        if x.dim() != 2 or x.shape[1] != self.numel:
            raise ValueError(f"expected a flat latent [B, {self.numel}], got {tuple(x.shape)}")
        return {name: x[:, lo:hi].reshape(x.shape[0], *self.slot(name).shape) for name, lo, hi in self.segments}

    def join(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """{name: `[B, *shape]`} → `[B, D]` in slot order (the inverse of `split`).

        Raises:
            ValueError: a missing or extra modality, or a part of the wrong shape.
        """
        if set(parts) != {s.name for s in self.slots}:
            raise ValueError(f"join needs exactly the modalities {[s.name for s in self.slots]}, got {sorted(parts)}")
        flat = []
        for s in self.slots:
            part = parts[s.name]
            if tuple(part.shape[1:]) != s.shape:
                raise ValueError(f"modality {s.name}: expected [B, {', '.join(map(str, s.shape))}], "
                                 f"got {tuple(part.shape)}")
            flat.append(part.reshape(part.shape[0], -1))
        return torch.cat(flat, dim=1)

    def trained_mask(self) -> torch.Tensor:
        """`[D]` bool: True on the elements of trained modalities."""
        return torch.cat([torch.full((s.numel,), s.trained, dtype=torch.bool) for s in self.slots])

    @property
    def all_trained(self) -> bool:
        """Whether every modality is trained (the SDE step and log-prob need no mask then)."""
        return all(s.trained for s in self.slots)

    def modalities(self) -> Modalities:
        """The algorithms' view: each slot's `(start, stop)` and its weight normalised over the trained slots
        (an untrained slot weighs 0)."""
        total = sum(s.weight for s in self.slots if s.trained)
        weights = tuple(s.weight / total if s.trained else 0.0 for s in self.slots)
        return check_modalities(Modalities(tuple((lo, hi) for _, lo, hi in self.segments), weights))

    @property
    def guidance_scales(self) -> dict[str, float]:
        """{name: guidance scale}."""
        return {s.name: s.guidance_scale for s in self.slots}

    def needs_guidance(self) -> bool:
        """Whether any modality is guided (an unconditional forward is needed)."""
        return any(s.guidance_scale != 1.0 for s in self.slots)

    def __repr__(self) -> str:
        return "LatentLayout(" + ", ".join(f"{s.name}{list(s.shape)}" + ("" if s.trained else " untrained")
                                           for s in self.slots) + ")"


def guided(v_cond: torch.Tensor, v_uncond: torch.Tensor, layout: LatentLayout) -> torch.Tensor:
    """Classifier-free guidance per modality on flat velocities `[B, D]` (Ho & Salimans 2022, per slot):
    v_m = v_uncond,m + g_m·(v_cond,m − v_uncond,m) with each slot's own g_m (`ModalitySlot.guidance_scale`);
    g_m = 1 gives v_cond,m exactly.

    Raises:
        ValueError: the velocities are not `[B, D]` of this layout or differ in shape.
    """
    if v_cond.shape != v_uncond.shape:
        raise ValueError(f"conditional {tuple(v_cond.shape)} and unconditional {tuple(v_uncond.shape)} velocities differ")
    cond, uncond = layout.split(v_cond), layout.split(v_uncond)
    parts = {}
    for s in layout.slots:
        g = s.guidance_scale
        parts[s.name] = cond[s.name] if g == 1.0 else uncond[s.name] + g * (cond[s.name] - uncond[s.name])
    return layout.join(parts)
