"""One FlowGRPO training step on the actor (Flow-GRPO, arXiv 2505.05470).

Per sample, per trained window step j: v_θ at (latents[j], σ_j) → Gaussian transition
(mean, std) → log_prob of the recorded latents[j+1]; ratio against the old log-prob (recomputed
by the actor before any update, or the rollout's own in `bypass` mode); PPO-clip loss plus the
closed-form KL to the reference. The batch is split into `updatesPerStep` minibatches, each one
optimiser step; gradients accumulate over shape-homogeneous micro-batches.
"""

from __future__ import annotations

import random

import torch

from omnirl.actor.algorithm import Algorithm, PolicyNeeds
from omnirl.actor.batch import GridOf, TrainSample, micro_batches, stack_window, trained_mask_of
from omnirl.actor.policy import PolicySet
from omnirl.actor.ranks import SINGLE, Ranks, check_loss, clip_grad_norm
from omnirl.algorithms import (
    auto_band,
    flow_grpo_loss,
    gaussian_kl,
    gaussian_log_prob,
    is_diagnostics,
    per_step_abs_log_ratio,
    rs_mask,
    sde_mean_std,
)
from omnirl.api.seeds import derive
from omnirl.api.spec import AlgorithmSpec, FlowGRPOSpec, OptimizerSpec
from omnirl.models.protocol import ModelAdapter


def window_log_probs(adapter: ModelAdapter, samples: list[TrainSample], device: torch.device,
                     *, with_mean: bool = False):
    """Log-probs `[B, W]` of the recorded window transitions under `adapter`'s velocity.

    Returns (log_prob [B, W], means list of W tensors [B, C, H, W], stds list of W [B]) when
    `with_mean`, else log_prob only. Differentiable when called with grad enabled. A multi-modal latent's
    log-prob is one Gaussian over its trained elements (`trained_mask_of`, docs/omni.md).
    """
    latents, _, sigmas = stack_window(samples)
    latents, sigmas = latents.to(device), sigmas.to(device)
    cond = adapter.encode([s.prompt_ids for s in samples], device=device)
    noise_level, sde_type = samples[0].noise_level, samples[0].sde_type
    mask = trained_mask_of(adapter, samples)
    logps, means, stds = [], [], []
    for j in range(latents.shape[1] - 1):
        v = adapter.velocity(latents[:, j], sigmas[:, j], cond)
        mean, std = sde_mean_std(latents[:, j], v, sigmas[:, j], sigmas[:, j + 1], noise_level, sde_type)
        logps.append(gaussian_log_prob(latents[:, j + 1], mean, std, mask))
        means.append(mean)
        stds.append(std)
    log_prob = torch.stack(logps, dim=1)
    return (log_prob, means, stds) if with_mean else log_prob


class FlowGRPO(Algorithm):
    """FlowGRPO through the algorithm protocol: SDE-window rollouts of θ (its plan: `algorithms/plan.py::FLOW_GRPO`),
    PPO-clip on their log-probs."""

    name = "flow-grpo"

    def needs(self, algo: AlgorithmSpec) -> PolicyNeeds:
        """A reference when `flowGrpo.klCoef` > 0; no old policy (old log-probs are recomputed)."""
        return PolicyNeeds(reference=algo.flowGrpo.klCoef > 0)

    def update(self, policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample],
               algo: AlgorithmSpec, *, seed: int, step: int, grid_of: GridOf, device: torch.device,
               ranks: Ranks = SINGLE) -> dict:
        """`flow_grpo_step` with the job's `flowGrpo` and optimizer settings."""
        return flow_grpo_step(policies, optimizer, samples, algo.flowGrpo, algo.optimizer, seed=seed,
                              step=step, device=device, ranks=ranks, grid_of=grid_of)


def flow_grpo_step(policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample],
                   spec: FlowGRPOSpec, opt: OptimizerSpec, *, seed: int, step: int, device: torch.device,
                   ranks: Ranks = SINGLE, grid_of: GridOf | None = None) -> dict:
    """Train on one batch; return metrics (loss, kl, clip_fraction, ratio, IS diagnostics, RS, and the
    rollout-vs-actor log-prob mismatch: `logprob_mismatch_max`, `logprob_mismatch_mean` and
    `logprob_mismatch_step{k}` = mean |Δ log_prob| at denoising step k, before any update).

    `grid_of`: latent shape → the rollout σ grid `[N+1]`; it names the steps k (window position j otherwise).
    `seed` is the job seed: samples are shuffled into minibatches by `derive(seed, "minibatch", step)`.

    With several actor ranks every rank passes the whole batch and trains its `ranks.share` of
    the micro-batches; metrics are reduced over the ranks, so every rank returns the same.

    Raises:
        ValueError: a sample without a window (FlowGRPO needs SDE rollouts).
        ConfigError: non-finite loss (`ranks.check_loss`: the training diverged).
    """
    if any(s.log_probs.numel() == 0 for s in samples):
        raise ValueError("FlowGRPO needs SDE-window rollouts; got samples without a window (ODE rollouts)")
    rollout_lp = {s.sample_id: s.log_probs for s in samples}
    ids = [s.sample_id for s in samples]
    if spec.rolloutCorrection.mode == "recompute":
        old_lp = _recompute(policies, samples, opt, device, ranks)
        current = old_lp
    else:  # bypass: the rollout's log-probs are the old ones; no extra forward pass
        old_lp = rollout_lp
        current = None  # diagnostics come from the live forward of the first minibatch
    keep_by_id: dict[str, bool] = {i: True for i in ids}
    diag = None
    if current is not None:
        diag = is_diagnostics(torch.stack([current[i] for i in ids]), torch.stack([rollout_lp[i] for i in ids]))
        keep_by_id = dict(zip(ids, _rs_keep(diag.seq_log_is, spec).tolist(), strict=True))

    order = list(samples)
    random.Random(derive(seed, "minibatch", step=step)).shuffle(order)
    n_mini = min(opt.updatesPerStep, len(order))
    sums: dict[str, float] = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0,
                              "ratio_max_abs_dev": 0.0, "grad_norm": 0.0}
    live: dict[str, torch.Tensor] = {}
    for m in range(n_mini):
        minibatch = order[m::n_mini]
        optimizer.zero_grad(set_to_none=True)
        for mb, share in ranks.share(micro_batches(minibatch, opt.microBatchSize)):
            out, log_prob = _micro_loss(policies, mb, old_lp, keep_by_id, spec, device)
            if m == 0 and share:
                live.update({s.sample_id: log_prob[i].detach().cpu() for i, s in enumerate(mb)})
            check_loss(out.loss, "FlowGRPO", [s.sample_id for s in mb])
            (out.loss * (len(mb) / len(minibatch) * share * ranks.grad_scale)).backward()
            w = len(mb) / len(minibatch) / n_mini * share
            sums["loss"] += float(out.loss.detach()) * w
            sums["policy_loss"] += float(out.policy_loss) * w
            sums["kl"] += float(out.kl_loss) * w
            sums["clip_fraction"] += float(out.clip_fraction) * w
            sums["ratio_max_abs_dev"] = max(sums["ratio_max_abs_dev"], float(out.ratio_max_abs_dev) * share)
        sums["grad_norm"] += clip_grad_norm(policies.trainable_parameters(), opt.gradClip) / n_mini
        optimizer.step()
    ratio_dev = ranks.max(sums.pop("ratio_max_abs_dev"))
    grad_norm = sums.pop("grad_norm")  # already global: FSDP's norm spans every shard
    sums = {**ranks.sum(sums), "ratio_max_abs_dev": ratio_dev, "grad_norm": grad_norm}
    if diag is None:
        seen = sorted(s.sample_id for s in order[0::n_mini])
        live = ranks.merge(live, seen)
        current = {i: live[i] for i in seen}
        diag = is_diagnostics(torch.stack([live[i] for i in seen]), torch.stack([rollout_lp[i] for i in seen]))
    sums.update(_mismatch(current, rollout_lp, {s.sample_id: s for s in samples}, grid_of))
    sums.update(
        is_mean_log_ratio=diag.mean_log_ratio, is_weight_mean=diag.is_weight_mean, is_ess=diag.ess,
        is_max_abs_log_ratio=diag.max_abs_log_ratio,
        rs_masked_fraction=1.0 - sum(keep_by_id.values()) / len(keep_by_id),
        optimizer_steps=n_mini,
    )
    return sums


def _recompute(policies: PolicySet, samples: list[TrainSample], opt: OptimizerSpec,
               device: torch.device, ranks: Ranks) -> dict[str, torch.Tensor]:
    """Old log-probs from the actor's current weights, before any update (no grad)."""
    module = policies.adapter.module
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        module.eval()
        for mb, share in ranks.share(micro_batches(samples, opt.microBatchSize)):
            lp = window_log_probs(policies.adapter, mb, device).cpu()
            if share:
                out.update({s.sample_id: lp[i] for i, s in enumerate(mb)})
        module.train()
    return ranks.merge(out, [s.sample_id for s in samples])



def _mismatch(current: dict[str, torch.Tensor], rollout_lp: dict[str, torch.Tensor],
              by_id: dict[str, TrainSample], grid_of: GridOf | None) -> dict[str, float]:
    """Mean |Δ log_prob| per denoising step (keyed by the step's index on the σ grid), plus max and mean."""
    ids = sorted(current)
    gap = per_step_abs_log_ratio(torch.stack([current[i] for i in ids]), torch.stack([rollout_lp[i] for i in ids]))
    first = by_id[ids[0]]  # one window (step indices) per training step: every sample shares it
    if grid_of is None:
        steps = range(len(gap))
    else:  # found on the sample's own grid: with several sizes the σ at one step index may differ
        grid = grid_of(tuple(first.x0.shape))
        steps = [int((grid - s).abs().argmin()) for s in first.sigmas[:-1]]
    out = {f"logprob_mismatch_step{k}": float(g) for k, g in zip(steps, gap, strict=True)}
    full = torch.stack([(current[i] - rollout_lp[i]).abs() for i in ids])
    return {**out, "logprob_mismatch_max": float(full.max()), "logprob_mismatch_mean": float(full.mean())}


def _rs_keep(seq_log_is: torch.Tensor, spec: FlowGRPOSpec) -> torch.Tensor:
    rs = spec.rolloutCorrection.rejectionSampling
    if not rs.enabled:
        return torch.ones_like(seq_log_is, dtype=torch.bool)
    band = auto_band(seq_log_is) if rs.auto else tuple(rs.band)
    return rs_mask(seq_log_is, band)


def _micro_loss(policies: PolicySet, mb: list[TrainSample], old_lp: dict, keep_by_id: dict,
                spec: FlowGRPOSpec, device: torch.device):
    log_prob, means, stds = window_log_probs(policies.adapter, mb, device, with_mean=True)
    kl = None
    if spec.klCoef > 0:
        with policies.reference() as ref:
            _, ref_means, _ = window_log_probs(ref, mb, device, with_mean=True)
        mask = trained_mask_of(policies.adapter, mb)
        kl = torch.stack([gaussian_kl(m, r, s, mask) for m, r, s in zip(means, ref_means, stds, strict=True)], dim=1)
    old = torch.stack([old_lp[s.sample_id] for s in mb]).to(device)
    adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=device)
    weight = torch.tensor([keep_by_id[s.sample_id] for s in mb], dtype=torch.float32, device=device)
    loss = flow_grpo_loss(log_prob, old, adv, spec.clipRange, kl=kl, kl_coef=spec.klCoef, sample_weight=weight)
    return loss, log_prob


FLOW_GRPO = FlowGRPO()
