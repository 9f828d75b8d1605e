"""What the built-in models' pretraining shares (`digits/pretrain.py`, `avdigits/pretrain.py`): the optimiser
schedule, the EMA of the weights that is saved, the report and `omnirl pretrain`'s flag checks.

AdamW (β 0.9/0.999, weight decay 0.01) with a `WARMUP_STEPS` linear warm-up then a constant rate (so the weights
after N steps do not depend on the total step count: a longer run's step-N snapshot equals a `--steps N` run),
gradient-norm clip `GRAD_CLIP`, EMA of the weights with decay `EMA_DECAY` (what is saved). Each family keeps its
own data, loss and checkpoint layout.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

DEFAULT_LR = 1.5e-3
EMA_DECAY = 0.995
LOSS_EMA_DECAY = 0.98
WARMUP_STEPS = 50
GRAD_CLIP = 1.0


@dataclass
class PretrainReport:
    """What `pretrain` did.

    Attributes:
        out_dir: checkpoint directory written.
        steps: optimiser steps taken.
        final_loss: EMA (decay `LOSS_EMA_DECAY`) of the per-step training loss at the end.
        wall_clock_s: seconds spent in the training loop (rendering included).
        num_parameters: parameter count of the model.
    """

    out_dir: str
    steps: int
    final_loss: float
    wall_clock_s: float
    num_parameters: int


def train_ema(module: nn.Module, *, steps: int, lr: float, batch_loss: Callable[[nn.Module], torch.Tensor],
              log_every: int, snapshot_every: int | None,
              snapshot: Callable[[nn.Module, int, float, float], Any]) -> tuple[nn.Module, float, float]:
    """Train `module` (already on its device) for `steps` optimiser steps; returns `(ema, loss_ema, start)`.

    Args:
        batch_loss: draws the next batch and returns its scalar loss under `module` (called once per step, in
            order, so a seeded family draws the same batches on every run).
        log_every: print the smoothed loss every this many steps (0 = silent).
        snapshot_every: call `snapshot(ema, step, start, loss_ema)` every this many steps before the last (None =
            never); `start` is the loop's `time.perf_counter()` at its beginning.
    Returns:
        the EMA copy of the weights, the smoothed loss (`LOSS_EMA_DECAY`) and the loop's start time.
    """
    ema = copy.deepcopy(module).requires_grad_(False)
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    loss_ema, start = None, time.perf_counter()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, step / WARMUP_STEPS)
        loss = batch_loss(module)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), GRAD_CLIP)
        optimizer.step()
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), module.parameters(), strict=True):
                p_ema.lerp_(p, 1.0 - EMA_DECAY)
        value = float(loss.detach())
        loss_ema = value if loss_ema is None else LOSS_EMA_DECAY * loss_ema + (1 - LOSS_EMA_DECAY) * value
        if log_every and step % log_every == 0:
            print(f"step {step}/{steps} loss {loss_ema:.4f} {time.perf_counter() - start:.0f}s", flush=True)
        if snapshot_every and step % snapshot_every == 0 and step < steps:
            snapshot(ema, step, start, loss_ema)
    return ema, loss_ema, start


def check_args(args: Any, weights_file: str) -> float:
    """`omnirl pretrain`'s flags (`steps`, `batch_size`, `lr`, `out`, `device`) checked before anything trains; on
    the CPU 2 torch threads unless OMP_NUM_THREADS is set (the shipped checkpoints were trained so). Returns the
    learning rate (`--lr`, else `DEFAULT_LR`).

    Raises:
        ValueError: `--steps` or `--batch-size` below 1, an `--lr` that is not a finite number > 0, an `--out` that
            already holds a model (`weights_file`: it would be overwritten), or an unusable `--device`; each names
            the flag.
    """
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):  # torch: "Invalid learning rate: -1.0"
        raise ValueError(f"--lr {args.lr}: must be a finite number > 0 (default {DEFAULT_LR:g}, the shipped model's)")
    weights = Path(args.out) / weights_file
    if weights.exists():  # e.g. --out services/omnirl/models/digits/weights: the shipped model, overwritten
        raise ValueError(f"--out {args.out}: already holds a model ({weights}); pretraining would overwrite it: "
                         "choose another --out or remove it")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device {args.device}: not a torch device; use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA device on this machine; use --device cpu")
    if args.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(2)
    return DEFAULT_LR if args.lr is None else args.lr
