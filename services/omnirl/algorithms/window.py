"""Which denoising steps are stochastic (and trained): a seeded contiguous window.

References: Flow-GRPO "Fast" recipes (github.com/yifan123/flow_grpo) and MixGRPO (arXiv
2507.21802) make only a window of 1–3 steps stochastic and train only those; the rest of the
trajectory is the ODE step. The window must be identical for every member of a group (seed it
per training step, not per request): per-request windows inflated reward std ~4× and collapsed
training in one reported case (references/algorithms.md). The last step (σ → 0) is never
trained: it is nearly deterministic and ill-conditioned.
"""

from __future__ import annotations

import torch


def _check_int(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")


def select_window(seed: int, num_steps: int, window_size: int, window_range: tuple[int, int]) -> list[int]:
    """Indices of the stochastic (trained) denoising steps: a contiguous window.

    window_range = (lo, hi) is half-open like `range(lo, hi)`: the window lies inside it. The
    start is drawn uniformly from {lo, …, hi − window_size} with a CPU `torch.Generator` seeded
    by `seed`, so the same seed always gives the same window (the controller seeds it per
    training step, so every member of a group and every request of that step share it). Step i
    denoises σ_i → σ_{i+1} of `sigma_schedule(num_steps)`.

    Args:
        seed: generator seed (an int accepted by `torch.Generator.manual_seed`).
        num_steps: denoising steps N of the trajectory (≥ 2: the last one is never trained).
        window_size: W, number of stochastic steps (≥ 1).
        window_range: (lo, hi) with 0 ≤ lo, lo + W ≤ hi ≤ N − 1.
    Returns:
        `[start, start + 1, …, start + W − 1]`, never containing N − 1.
    Raises:
        TypeError: a non-int argument.
        ValueError: the range includes the last step (hi > N − 1), is empty or negative, or the
            window does not fit (hi − lo < W); the message names the parameters.
    """
    lo, hi = window_range
    for value, name in ((seed, "seed"), (num_steps, "num_steps"), (window_size, "window_size"),
                        (lo, "window_range[0]"), (hi, "window_range[1]")):
        _check_int(value, name)
    params = f"num_steps={num_steps}, window_size={window_size}, window_range=({lo}, {hi})"
    if num_steps < 2 or window_size < 1:
        raise ValueError(f"need num_steps >= 2 and window_size >= 1, got {params}")
    if hi > num_steps - 1:
        raise ValueError(f"window_range would include the last step (index {num_steps - 1}), which must "
                         f"never be trained: need window_range[1] <= num_steps - 1; got {params}")
    if lo < 0 or hi - lo < window_size:
        raise ValueError(f"window does not fit: need 0 <= window_range[0] and "
                         f"window_range[1] - window_range[0] >= window_size; got {params}")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    start = int(torch.randint(lo, hi - window_size + 1, (1,), generator=generator).item())
    return list(range(start, start + window_size))
