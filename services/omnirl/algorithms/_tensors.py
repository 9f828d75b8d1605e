"""Shared input checks and casts for the algorithm functions (private).

Every public function in `omnirl.algorithms` computes in float32: inputs in bf16/fp16 are cast
in here, so rollout (bf16 model outputs) and training see the same arithmetic (docs/architecture.md §4:
keep the SDE step, latents and log-probs in fp32).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def f32(t: Tensor, name: str) -> Tensor:
    """`t` as float32 (a no-op when it already is); raises TypeError for non-floating tensors."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t.float()


def batch_tensor(x: Tensor, name: str, min_dim: int = 1) -> Tensor:
    """`x` as float32 with a leading batch dimension (at least `min_dim` dims, batch ≥ 1)."""
    x = f32(x, name)
    if x.dim() < min_dim or x.shape[0] == 0:
        raise ValueError(f"{name} must have shape [B, ...] with B >= 1 and at least {min_dim} dims, "
                         f"got {tuple(x.shape)}")
    return x


def per_sample(t: Tensor | float, batch: int, name: str, like: Tensor) -> Tensor:
    """A per-sample value as a float32 `[B]` tensor on `like`'s device.

    Accepts a Python float, a 0-dim tensor (broadcast to every sample) or a `[B]` tensor.
    """
    if not isinstance(t, Tensor):
        t = torch.tensor(float(t))
    t = f32(t, name).to(like.device)
    if t.dim() == 0:
        return t.expand(batch)
    if t.shape != (batch,):
        raise ValueError(f"{name} must have shape [B] = [{batch}] (or be a scalar), got {tuple(t.shape)}")
    return t


def positive_std(std: Tensor | float, batch: int, like: Tensor, what: str) -> Tensor:
    """A per-sample std (`per_sample`) that must be > 0 for `what` (a Gaussian density or KL).

    Raises:
        ValueError: some std ≤ 0 or NaN, naming the indices.
    """
    std = per_sample(std, batch, "std", like)
    require(std > 0, f"std must be > 0 for {what}",
            lambda: f"std <= 0 (or NaN) at indices {(~(std > 0)).nonzero().flatten().tolist()}")
    return std


def bcast(t: Tensor, like: Tensor) -> Tensor:
    """A `[B]` tensor viewed as `[B, 1, ..., 1]` to broadcast over `like`'s trailing dims."""
    return t.reshape(t.shape[0], *([1] * (like.dim() - 1)))


def require(ok: Tensor, what: str, detail: Callable[[], str] | None = None) -> None:
    """Raise ValueError(`what`; `detail()`) unless every element of the bool tensor `ok` is true.

    On the CPU the check is immediate and `detail` (which may read values, e.g. the failing
    indices) completes the message. On an accelerator it is queued (`torch._assert_async`) so
    the rollout and training loops never wait for the device just to validate: a violation then
    fails the next synchronising call with a device-side assert naming `what`. `detail` is never
    called there — reading the failing values would itself wait for the device (it cost the
    step-wise engine several host syncs per denoising step, ~5% of its throughput on an H200).
    """
    if ok.device.type == "cpu":
        if not bool(ok.all()):
            raise ValueError(what + (f"; {detail()}" if detail is not None else ""))
        return
    # torch refuses assert messages of 255 characters or more
    torch._assert_async(ok.all(), ("omnirl.algorithms check failed: " + what)[:250])


def same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    """Raise ValueError unless `a` and `b` have the same shape."""
    if a.shape != b.shape:
        raise ValueError(f"{name_a} {tuple(a.shape)} and {name_b} {tuple(b.shape)} must have the same shape")


def element_mean(t: Tensor) -> Tensor:
    """Mean over every non-batch dim: `[B, ...]` → `[B]` (identity on `[B]`)."""
    return t.reshape(t.shape[0], -1).mean(dim=1)
