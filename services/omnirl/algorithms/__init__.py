"""Pure float32 tensor math of diffusion RL (docs/algorithms/): no config objects, no I/O, no state.

Modules: `sigmas` (σ grid), `sde` (ODE / Flow-GRPO SDE / CPS step and log-prob), `window`
(stochastic step window), `advantages` (group-relative advantages), `flow_grpo` (PPO-clip loss),
`kl` (closed-form Gaussian KL), `rollout_correction` (IS diagnostics, RS mask), `nft`
(DiffusionNFT loss and old-policy EMA), `awm` (Advantage Weighted Matching loss and σ draws), `dgpo`
(Direct Group Preference Optimization group weights and loss), `modalities` (per-modality
reductions of a flat multi-modal latent: the joint log-prob's trained mean, the losses' weighted sum).
"""

from omnirl.algorithms.advantages import AdvantageResult, group_advantages
from omnirl.algorithms.awm import (
    AWMLoss,
    awm_advantages,
    awm_loss,
    grid_indices,
    matching_error,
    stratified_sigmas,
    weighted_matching,
)
from omnirl.algorithms.dgpo import DGPOLoss, dgpo_loss, group_preference
from omnirl.algorithms.flow_grpo import GRPOLoss, flow_grpo_loss
from omnirl.algorithms.kl import gaussian_kl
from omnirl.algorithms.modalities import Modalities, modality_means, trained_mean, weighted_mean
from omnirl.algorithms.nft import (
    NFTLoss,
    ema_update_,
    implicit_velocities,
    nft_loss,
    old_policy_decay,
    optimality_probability,
)
from omnirl.algorithms.rollout_correction import (
    ISDiagnostics,
    auto_band,
    is_diagnostics,
    per_step_abs_log_ratio,
    rs_mask,
)
from omnirl.algorithms.sde import SDEStep, gaussian_log_prob, ode_step, sde_mean_std, sde_step
from omnirl.algorithms.sigmas import sigma_schedule
from omnirl.algorithms.window import select_window

__all__ = [
    "AWMLoss",
    "AdvantageResult",
    "DGPOLoss",
    "GRPOLoss",
    "ISDiagnostics",
    "Modalities",
    "NFTLoss",
    "SDEStep",
    "auto_band",
    "awm_advantages",
    "awm_loss",
    "dgpo_loss",
    "ema_update_",
    "flow_grpo_loss",
    "gaussian_kl",
    "gaussian_log_prob",
    "grid_indices",
    "group_advantages",
    "group_preference",
    "implicit_velocities",
    "is_diagnostics",
    "matching_error",
    "modality_means",
    "nft_loss",
    "ode_step",
    "old_policy_decay",
    "optimality_probability",
    "per_step_abs_log_ratio",
    "rs_mask",
    "sde_mean_std",
    "sde_step",
    "select_window",
    "sigma_schedule",
    "stratified_sigmas",
    "trained_mean",
    "weighted_mean",
    "weighted_matching",
]
