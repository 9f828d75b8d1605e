"""Pretrain the digits model with rectified flow on digit strings rendered on the fly.

Rectified flow / flow matching (Liu et al. 2022, "Flow Straight and Fast", eq. 1; Lipman et al.
2022): x_σ = (1 − σ)·x0 + σ·ε, target v = ε − x0, loss = mean ‖v_θ(x_σ, σ) − v‖². σ is drawn
logit-normal, σ = sigmoid(n), n ~ N(0, 1) (Esser et al. 2024, "Scaling Rectified Flow
Transformers", §3.1). AdamW with linear warm-up then a constant learning rate (so the weights after
N steps do not depend on the total step count: a longer run's step-N snapshot equals a run with
``--steps N``), gradient-norm clip 1, EMA of the weights with decay 0.995; the EMA weights are
what is saved.

Data: random 3–5 digit strings; each step draws one image width (64 px for 3–4 digits with
probability 2/3, else 128 px with 5 digits), so both latent shapes are trained.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from omnirl.models.digits.adapter import WEIGHTS_FILE, count_parameters, save_digits_checkpoint
from omnirl.models.digits.model import DigitsConfig, DigitsDiT
from omnirl.models.digits.render import render_text, slots_for
from omnirl.models.pretraining import DEFAULT_LR, PretrainReport, check_args, train_ema


def sample_batch(rng: np.random.Generator, batch_size: int, alphabet: str) -> tuple[np.ndarray, list[str]]:
    """One training batch of a single width: `[B, 32, W]` uint8 images and their texts.

    With probability 2/3 the texts have 3–4 characters (W = 64), else 5 (W = 128).
    """
    lengths = rng.integers(3, 5, size=batch_size) if rng.random() < 2 / 3 else np.full(batch_size, 5)
    chars = np.array(list(alphabet))
    texts = ["".join(rng.choice(chars, size=int(n))) for n in lengths]
    slots = slots_for(texts[0])
    return np.stack([render_text(t, slots, rng) for t in texts]), texts


def flow_matching_loss(
    module: DigitsDiT, x0: torch.Tensor, prompt_ids: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Rectified-flow loss mean ‖v_θ(x_σ, σ) − (ε − x0)‖² with logit-normal σ.

    Args:
        x0: `[B, 1, 32, W]` float32 clean latents in [−1, 1].
        prompt_ids: `[B, 8]` int64.
        generator: CPU generator for ε and σ (drawn on the CPU, then moved to x0's device, so a
            run draws the same numbers on every device).
    Returns:
        Scalar loss.
    """
    b = x0.shape[0]
    eps = torch.randn(x0.shape, generator=generator).to(x0.device)
    sigma = torch.sigmoid(torch.randn(b, generator=generator)).to(x0.device)
    s = sigma[:, None, None, None]
    x_sigma = (1 - s) * x0 + s * eps
    return F.mse_loss(module(x_sigma, sigma, prompt_ids), eps - x0)


def _to_tensors(images: np.ndarray, texts: list[str], alphabet: str, max_len: int, device: str):
    x0 = torch.from_numpy(images).float().div(127.5).sub(1.0)[:, None].to(device)
    lookup = {ch: i + 1 for i, ch in enumerate(alphabet)}
    ids = [[lookup[c] for c in t] + [0] * (max_len - len(t)) for t in texts]
    return x0, torch.tensor(ids, dtype=torch.int64, device=device)


def pretrain(
    out_dir: str | Path,
    *,
    steps: int,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = DEFAULT_LR,
    device: str = "cpu",
    log_every: int = 50,
    snapshot_every: int | None = None,
    config: DigitsConfig | None = None,
) -> PretrainReport:
    """Train a fresh `DigitsDiT` for `steps` steps and save its EMA weights to `out_dir`.

    Deterministic given `seed` on the same machine, thread count and library versions.

    Args:
        out_dir: checkpoint directory (config.json + model.safetensors).
        steps: optimiser steps (≥ 1).
        seed: seeds the model init (CPU), the rendered data, ε and σ (CPU generator).
        batch_size: images per step.
        lr: peak AdamW learning rate (linear warm-up over 50 steps, then constant). 1.5e-3 became
            legible in fewer steps than 6e-4 or 1e-3 in a GPU sweep.
        device: torch device.
        log_every: print the smoothed loss every this many steps (0 = silent).
        snapshot_every: also save the EMA weights to `out_dir/step-{k}` every k steps (for
            choosing a step count; None = off).
        config: model hyperparameters (default `DigitsConfig()`).
    Returns:
        `PretrainReport`.
    Raises:
        ValueError: steps or batch_size < 1.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps ({steps}) and batch_size ({batch_size}) must be >= 1")
    config = config or DigitsConfig()
    args = {"out": str(out_dir), "steps": steps, "seed": seed, "batch_size": batch_size, "lr": lr, "device": device}
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)  # CPU: the same ε and σ stream on every device
    module = DigitsDiT(config).to(device)

    def batch_loss(module: DigitsDiT) -> torch.Tensor:
        images, texts = sample_batch(rng, batch_size, config.alphabet)
        x0, prompt_ids = _to_tensors(images, texts, config.alphabet, config.max_text_len, device)
        return flow_matching_loss(module, x0, prompt_ids, generator)

    def snapshot(ema: DigitsDiT, step: int, start: float, loss_ema: float) -> None:
        _save(ema, config, Path(out_dir) / f"step-{step}", {**args, "steps": step}, step, start, loss_ema)

    ema, loss_ema, start = train_ema(module, steps=steps, lr=lr, batch_loss=batch_loss, log_every=log_every,
                                     snapshot_every=snapshot_every, snapshot=snapshot)
    return _save(ema, config, Path(out_dir), args, steps, start, loss_ema)


def _save(ema: DigitsDiT, config: DigitsConfig, out: Path, args: dict, steps: int, start: float, loss_ema: float) -> PretrainReport:
    wall = time.perf_counter() - start
    provenance = {
        "command": (
            f"omnirl pretrain --out {args['out']} --steps {steps} --seed {args['seed']} "
            f"--batch-size {args['batch_size']} --lr {args['lr']} --device {args['device']}"
        ),
        "args": args,
        "seed": args["seed"],
        "steps": steps,
        "wall_clock_s": round(wall, 1),
        "final_loss": round(loss_ema, 5),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "num_parameters": count_parameters(ema),
    }
    save_digits_checkpoint(ema, config, out, provenance)
    return PretrainReport(str(out), steps, loss_ema, wall, count_parameters(ema))


def report_dict(report: PretrainReport) -> dict:
    """`PretrainReport` as a JSON-ready dict."""
    return asdict(report)


def main(args) -> int:
    """`omnirl pretrain`: args with out, steps, seed, batch_size, lr (None = `DEFAULT_LR`), device.

    Uses 2 torch threads on CPU unless OMP_NUM_THREADS is set (the shipped checkpoint was trained
    so). Prints the report as JSON; returns the exit code 0.

    Raises:
        ValueError: `--steps` or `--batch-size` below 1, an `--lr` that is not a finite number > 0, `--out`
            already holds a model (it would be overwritten), or an unusable `--device`; each names the flag.
    """
    import json

    lr = check_args(args, WEIGHTS_FILE)
    report = pretrain(args.out, steps=args.steps, seed=args.seed, batch_size=args.batch_size, lr=lr, device=args.device)
    print(json.dumps(report_dict(report), indent=2))
    return 0
