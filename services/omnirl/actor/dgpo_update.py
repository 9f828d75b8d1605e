"""One DGPO training step on the actor (Direct Group Preference Optimization, arXiv 2510.08425).

Needs each sample's clean x0, prompt and advantage (ODE rollouts of θ). The draws (σ, ε) are
AWM's (`omnirl.actor.awm_update.draw_sigmas` / `draw_noise`: σ shared by a group, ε too with
`groupSharedNoise`); per micro-batch one θ forward and one reference forward (no grad) of
K × b rows give ℓ_θ and ℓ_ref, and `omnirl.algorithms.dgpo.dgpo_loss` weights each member's ℓ_θ
by its group's σ(s). Micro-batches keep groups whole (the group sum needs every member).

Not implemented from the authors' code: the PPO-style clip on exp(ℓ_old − ℓ_θ) (`clip_dsm`),
training-time CFG on the reference (`kl_cfg`).
"""

from __future__ import annotations

import torch

from omnirl.actor.algorithm import Algorithm, PolicyNeeds
from omnirl.actor.awm_update import _forward, _velocity_gap, draw_sigmas
from omnirl.actor.batch import GridOf, TrainSample, group_minibatches, group_shapes, micro_batches, modalities_of
from omnirl.actor.policy import PolicySet
from omnirl.actor.ranks import SINGLE, Ranks, check_loss, clip_grad_norm
from omnirl.algorithms import dgpo_loss, matching_error
from omnirl.api.seeds import derive
from omnirl.api.spec import OptimizerSpec
from omnirl.api.spec_algorithm import AlgorithmSpec, DGPOSpec

_METRICS = ("loss", "policy_loss", "kl", "group_nll", "group_weight", "matching_error")


class DirectGroupPreference(Algorithm):
    """DGPO through the algorithm protocol: ODE rollouts of θ, group-preference-weighted matching on x0."""

    name = "dgpo"

    def needs(self, algo: AlgorithmSpec) -> PolicyNeeds:
        """The base model when it is the preference reference or `klCoef` > 0; the EMA anchor for `reference: ema`."""
        d = algo.dgpo
        return PolicyNeeds(reference=d.reference == "base" or d.klCoef > 0,
                           old_policy=d.anchor if d.reference == "ema" else None)

    def update(self, policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample],
               algo: AlgorithmSpec, *, seed: int, step: int, grid_of: GridOf, device: torch.device,
               ranks: Ranks = SINGLE) -> dict:
        """`dgpo_step` with the job's `dgpo` and optimizer settings."""
        return dgpo_step(policies, optimizer, samples, algo.dgpo, algo.optimizer, grid_of=grid_of, seed=seed, step=step,
                         device=device, ranks=ranks)


def dgpo_step(policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample], spec: DGPOSpec,
              opt: OptimizerSpec, *, grid_of: GridOf, seed: int, step: int, device: torch.device,
              ranks: Ranks = SINGLE) -> dict:
    """Train on one batch; returns metrics (loss, policy_loss, kl, group_nll, group_weight (mean σ(s)),
    matching_error, grad_norm, x0_norm, optimizer_steps).

    Minibatches keep groups whole (`updatesPerStep` of them, groups shuffled by `derive(seed,
    "minibatch", step)`; `seed` = the job seed); several
    actor ranks each train their `ranks.share` of the micro-batches, metrics reduced.

    Args:
        grid_of: latent shape → the rollout σ grid `[N+1]`, for `timeSampling: grid` (each group its own size's).
    Raises:
        ConfigError: non-finite loss (`ranks.check_loss`: the training diverged).
    """
    plan = [micro_batches(mini, opt.microBatchSize, keep_groups=True)
            for mini in group_minibatches(samples, opt.updatesPerStep, derive(seed, "minibatch", step=step))]
    sizes = [sum(len(mb) for mb in mbs) for mbs in plan]
    sigmas = {g: draw_sigmas(g, spec, grid_of(shape), seed) for g, shape in group_shapes(samples).items()}
    sums = dict.fromkeys(_METRICS, 0.0)
    grad_norm = 0.0
    for m, mbs in enumerate(plan):
        optimizer.zero_grad(set_to_none=True)
        for mb, share in ranks.share(mbs):
            out = _micro(policies, mb, spec, sigmas, seed, device)
            check_loss(out["loss"], "DGPO", [s.sample_id for s in mb])
            w = len(mb) / sizes[m] * share
            (out["loss"] * (w * ranks.grad_scale)).backward()
            for key in _METRICS:
                sums[key] += float(out[key].detach()) * w / len(plan)
        grad_norm += clip_grad_norm(policies.trainable_parameters(), opt.gradClip) / len(plan)
        optimizer.step()
    metrics = {**ranks.sum(sums), "grad_norm": grad_norm}
    metrics["x0_norm"] = float(torch.stack([s.x0.float().pow(2).mean().sqrt() for s in samples]).mean())
    metrics["optimizer_steps"] = len(plan)
    return metrics


def _micro(policies: PolicySet, mb: list[TrainSample], spec: DGPOSpec, sigmas: dict, seed: int,
           device: torch.device) -> dict:
    b = len(mb)
    x_t, x0, eps, sigma, cond = _forward(policies.adapter, mb, spec, sigmas, seed, device)
    v = policies.adapter.velocity(x_t, sigma, cond).float()
    v_base = None
    if policies.has_ref:
        with policies.reference() as base:
            v_base = base.velocity(x_t, sigma, cond).float()
    if spec.reference == "ema":
        with policies.old() as anchor:
            v_ref = anchor.velocity(x_t, sigma, cond).float()
    else:
        v_ref = v_base
    mods = modalities_of(policies.adapter, mb)  # a flat multi-modal latent: Σ_m w_m · ℓ_m
    err = matching_error(v, x0, eps, mods).view(-1, b).t()  # [b, K]
    err_ref = matching_error(v_ref, x0, eps, mods).view(-1, b).t()
    adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=device)
    ids = {g: i for i, g in enumerate(dict.fromkeys(s.group_id for s in mb))}
    groups = torch.tensor([ids[s.group_id] for s in mb], dtype=torch.int64, device=device)
    kl = _velocity_gap(v, v_base, b, mods) if spec.klCoef > 0 else None
    out = dgpo_loss(err, err_ref, adv, groups, spec.betaDpo, kl=kl, kl_coef=spec.klCoef)
    return {**out._asdict(), "group_weight": out.group_weight.mean(), "matching_error": err.detach().mean()}


DGPO = DirectGroupPreference()
