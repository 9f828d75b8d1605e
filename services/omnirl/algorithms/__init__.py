"""Pure float32 tensor math of diffusion RL (DESIGN.md §3): no config objects, no I/O, no state.

Modules: `sigmas` (σ grid), `sde` (ODE / Flow-GRPO SDE / CPS step and log-prob), `window`
(stochastic step window), `advantages` (group-relative advantages), `flow_grpo` (PPO-clip loss),
`kl` (closed-form Gaussian KL), `rollout_correction` (IS diagnostics, RS mask), `nft`
(DiffusionNFT loss and old-policy EMA).
"""

from omnirl.algorithms.advantages import AdvantageResult, group_advantages
from omnirl.algorithms.flow_grpo import GRPOLoss, flow_grpo_loss
from omnirl.algorithms.kl import gaussian_kl
from omnirl.algorithms.nft import (
    NFTLoss,
    ema_update_,
    implicit_velocities,
    nft_loss,
    old_policy_decay,
    optimality_probability,
)
from omnirl.algorithms.rollout_correction import ISDiagnostics, auto_band, is_diagnostics, rs_mask
from omnirl.algorithms.sde import SDEStep, gaussian_log_prob, ode_step, sde_mean_std, sde_step
from omnirl.algorithms.sigmas import sigma_schedule
from omnirl.algorithms.window import select_window

__all__ = [
    "AdvantageResult",
    "GRPOLoss",
    "ISDiagnostics",
    "NFTLoss",
    "SDEStep",
    "auto_band",
    "ema_update_",
    "flow_grpo_loss",
    "gaussian_kl",
    "gaussian_log_prob",
    "group_advantages",
    "implicit_velocities",
    "is_diagnostics",
    "nft_loss",
    "ode_step",
    "old_policy_decay",
    "optimality_probability",
    "rs_mask",
    "sde_mean_std",
    "sde_step",
    "select_window",
    "sigma_schedule",
]
