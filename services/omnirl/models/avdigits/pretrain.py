"""Pretrain the audio+video digits model by rectified flow on signs rendered and beeps synthesized on the fly.

Rectified flow (Liu et al. 2022, eq. 1): x_σ = (1 − σ)·x0 + σ·ε, target v = ε − x0, σ logit-normal
(Esser et al. 2024, §3.1). The loss is the mean of four parts' mean squared errors, the sign, the frames' ink,
the beeps' loudness and the pitch profile (¼ each): a plain element mean gave the 8 ink values and the 8
loudness values 1.5% of the gradient each although they decide three of the task's four rewards. AdamW with a 50-step linear warm-up then a constant rate (a
longer run's step-N snapshot equals a `--steps N` run), gradient-norm clip 1, EMA 0.995 of the weights
(what is saved). One prompt in ten is the unconditional one (all ids 0) so the model has a guidance branch.

Data per sample (`avdigits/media.py`): a number of 2–4 digits (length uniform, no leading zero),
k uniform in 1..4, the first inked frame uniform in 0..8−k; the number drawn at 32×64 in one face
(`media.render_sign`), downsampled 2×.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from omnirl.models.avdigits.adapter import WEIGHTS_FILE, save_avdigits_checkpoint, tokenize_prompt
from omnirl.models.avdigits.media import (
    FRAMES,
    MAX_BEEPS,
    MAX_DIGITS,
    MIN_DIGITS,
    SIGN_NUMEL,
    Sign,
    render_sign,
    sign_latents,
)
from omnirl.models.avdigits.model import AVDigitsConfig, AVDigitsDiT
from omnirl.models.avdigits.prompts import make_prompt
from omnirl.models.pretraining import DEFAULT_LR, PretrainReport, check_args, train_ema

UNCONDITIONAL_P = 0.1


def sample_signs(rng: np.random.Generator, batch_size: int) -> list[Sign]:
    """`batch_size` random signs (module docstring's law)."""
    signs = []
    for _ in range(batch_size):
        n = int(rng.integers(MIN_DIGITS, MAX_DIGITS + 1))
        number = str(int(rng.integers(10 ** (n - 1), 10**n)))
        k = int(rng.integers(1, MAX_BEEPS + 1))
        signs.append(Sign(number, k, int(rng.integers(0, FRAMES - k + 1))))
    return signs


def batch_tensors(signs: list[Sign], device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Clean flat latents `[B, 544]` float32 and prompt ids `[B, 5]` int64 of `signs`."""
    x0, ids = [], []
    for sign in signs:
        video, audio = sign_latents(sign, render_sign(sign.number))
        x0.append(np.concatenate([video, audio]))
        ids.append(tokenize_prompt(make_prompt(sign.number, sign.beeps)))
    return torch.from_numpy(np.stack(x0)).to(device), torch.tensor(ids, dtype=torch.int64, device=device)


def flow_matching_loss(module: AVDigitsDiT, x0: torch.Tensor, ids: torch.Tensor, generator: torch.Generator
                       ) -> torch.Tensor:
    """¼·(mean_sign + mean_ink + mean_loudness + mean_pitch) of (v_θ − (ε − x0))² with logit-normal σ; ε and σ
    drawn on the CPU from `generator` (the same stream on every device)."""
    b = x0.shape[0]
    eps = torch.randn(x0.shape, generator=generator).to(x0.device)
    sigma = torch.sigmoid(torch.randn(b, generator=generator)).to(x0.device)
    x_sigma = (1 - sigma[:, None]) * x0 + sigma[:, None] * eps
    err = (module(x_sigma, sigma, ids) - (eps - x0)).pow(2)
    bounds = (0, SIGN_NUMEL, SIGN_NUMEL + FRAMES, SIGN_NUMEL + 2 * FRAMES, err.shape[1])
    return sum(err[:, lo:hi].mean() for lo, hi in zip(bounds, bounds[1:], strict=False)) / 4.0


def pretrain(out_dir: str | Path, *, steps: int, seed: int = 0, batch_size: int = 64, lr: float = DEFAULT_LR,
             device: str = "cpu", log_every: int = 50, snapshot_every: int | None = None,
             config: AVDigitsConfig | None = None, init: str | Path | None = None) -> PretrainReport:
    """Train an `AVDigitsDiT` for `steps` steps; save its EMA weights to `out_dir` (and every `snapshot_every`
    steps to `out_dir/step-{k}`). Deterministic given `seed`, `init`, machine, threads and versions.

    Args:
        init: a checkpoint directory whose tensors of the same name and shape start the weights (and the EMA)
            instead of the seeded initialisation; the others keep it (a warm start after a change of the latent).
    Raises:
        ValueError: steps or batch_size < 1, or an `init` with no tensor in common with the model.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps ({steps}) and batch_size ({batch_size}) must be >= 1")
    config = config or AVDigitsConfig()
    args = {"out": str(out_dir), "steps": steps, "seed": seed, "batch_size": batch_size, "lr": lr, "device": device}
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    module = AVDigitsDiT(config)
    if init is not None:
        args["init"] = str(init)
        _warm_start(module, Path(init))
    module = module.to(device)

    def batch_loss(module: AVDigitsDiT) -> torch.Tensor:
        x0, ids = batch_tensors(sample_signs(rng, batch_size), device)
        drop = torch.from_numpy(rng.random(batch_size) < UNCONDITIONAL_P).to(device)
        ids = torch.where(drop[:, None], torch.zeros_like(ids), ids)
        return flow_matching_loss(module, x0, ids, generator)

    def snapshot(ema: AVDigitsDiT, step: int, start: float, loss_ema: float) -> None:
        _save(ema, Path(out_dir) / f"step-{step}", {**args, "steps": step}, step, start, loss_ema)

    ema, loss_ema, start = train_ema(module, steps=steps, lr=lr, batch_loss=batch_loss, log_every=log_every,
                                     snapshot_every=snapshot_every, snapshot=snapshot)
    return _save(ema, Path(out_dir), args, steps, start, loss_ema)


def _warm_start(module: AVDigitsDiT, init: Path) -> None:
    """Copy the tensors of `init`'s model.safetensors that `module` has with the same shape."""
    from safetensors.torch import load_file

    state = load_file(str(init / WEIGHTS_FILE))
    own = module.state_dict()
    shared = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if not shared:
        raise ValueError(f"--init {init}: no tensor in common with the model; pass an av-digits checkpoint")
    module.load_state_dict(shared, strict=False)


def _save(ema: AVDigitsDiT, out: Path, args: dict, steps: int, start: float, loss_ema: float) -> PretrainReport:
    wall = time.perf_counter() - start
    n_params = sum(p.numel() for p in ema.parameters())
    provenance = {
        "command": (f"omnirl pretrain --family av-digits --out {args['out']} --steps {steps} --seed {args['seed']} "
                    f"--batch-size {args['batch_size']} --lr {args['lr']} --device {args['device']}"
                    + (f" --init {args['init']}" if "init" in args else "")),
        "args": args, "seed": args["seed"], "steps": steps, "wall_clock_s": round(wall, 1),
        "final_loss": round(loss_ema, 5), "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(), "num_parameters": n_params,
    }
    save_avdigits_checkpoint(ema, out, provenance)
    return PretrainReport(str(out), steps, loss_ema, wall, n_params)


def main(args) -> int:
    """`omnirl pretrain --family av-digits`: as the digits model's `main` (flags, checks, 2 CPU threads); prints
    the report as JSON, returns 0.

    Raises:
        ValueError: a bad --steps, --batch-size or --lr, an --out that already holds a model, or a bad --device.
    """
    import json

    lr = check_args(args, WEIGHTS_FILE)
    report = pretrain(args.out, steps=args.steps, seed=args.seed, batch_size=args.batch_size, lr=lr,
                      device=args.device, snapshot_every=getattr(args, "snapshot_every", None),
                      init=getattr(args, "init", None))
    print(json.dumps(asdict(report), indent=2))
    return 0
