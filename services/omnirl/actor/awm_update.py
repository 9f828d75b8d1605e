"""One Advantage Weighted Matching training step on the actor (AWM, arXiv 2509.25050).

Needs only each sample's clean x0, prompt and advantage (ODE rollouts from the current policy).
Each sample gets `timestepsPerSample` draws (σ_k, ε_k), seeded by `derive` (`api/seeds.py`) from the
job seed and the group's (σ; ε too with `groupSharedNoise`) or the sample's ids — σ always
shared by a group, ε too with `groupSharedNoise` — so every actor rank and every recompute sees
the same draws. All draws of a micro-batch go through one forward: x_σ `[K·b, C, H, W]`.

Old log-probs (the ratio's denominator) are the policy's before this batch's first optimiser
step: the first minibatch reuses its own forward (detached: ratio exactly 1), later minibatches
are recomputed without grad before any update, with the same micro-batches, so the ratio they
see is the drift from the earlier updates only.
"""

from __future__ import annotations

import torch

from omnirl.actor.algorithm import Algorithm, PolicyNeeds
from omnirl.actor.batch import GridOf, TrainSample, group_minibatches, group_shapes, micro_batches, modalities_of
from omnirl.actor.policy import PolicySet
from omnirl.actor.ranks import SINGLE, Ranks, check_loss, clip_grad_norm
from omnirl.algorithms import (
    awm_advantages,
    awm_loss,
    grid_indices,
    matching_error,
    stratified_sigmas,
    weighted_matching,
    weighted_mean,
)
from omnirl.algorithms.modalities import Modalities
from omnirl.api.ids import parse_group_id, parse_sample_id
from omnirl.api.seeds import derive
from omnirl.api.spec import AlgorithmSpec, AWMSpec, OptimizerSpec


class AdvantageWeightedMatching(Algorithm):
    """AWM through the algorithm protocol: ODE rollouts of θ, advantage-weighted matching on x0."""

    name = "awm"

    def needs(self, algo: AlgorithmSpec) -> PolicyNeeds:
        """The EMA anchor when `awm.emaKlCoef` > 0 (not rolled out); a reference when `awm.klCoef` > 0."""
        a = algo.awm
        return PolicyNeeds(reference=a.klCoef > 0, old_policy=a.anchor if a.emaKlCoef > 0 else None)

    def update(self, policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample],
               algo: AlgorithmSpec, *, seed: int, step: int, grid_of: GridOf, device: torch.device,
               ranks: Ranks = SINGLE) -> dict:
        """`awm_step` with the job's `awm`, optimizer and advantage-clip settings."""
        return awm_step(policies, optimizer, samples, algo.awm, algo.optimizer, advantage_clip=algo.advantage.clip,
                        grid_of=grid_of, seed=seed, step=step, device=device, ranks=ranks)


def draw_sigmas(group_id: str, spec: AWMSpec, grid: torch.Tensor, seed: int) -> torch.Tensor:
    """The K σ values `[K]` fp32 of a group's draws (stratified; `grid` = the rollout σ grid `[N+1]`;
    `seed` = the job seed)."""
    k = spec.timestepsPerSample
    g = parse_group_id(group_id)
    gen = torch.Generator().manual_seed(derive(seed, "awm-sigma", step=g.step, group=g.prompt, attempt=g.attempt))
    u = torch.rand(k, generator=gen, dtype=torch.float64)
    if spec.timeSampling == "grid":
        return grid[grid_indices(grid.numel() - 1, spec.timestepFraction, k, u)].float()
    return stratified_sigmas(tuple(spec.sigmaRange), k, u)


def draw_noise(sample: TrainSample, spec: AWMSpec, seed: int) -> torch.Tensor:
    """ε `[K, C, H, W]` fp32 of a sample's K draws (the group's when `groupSharedNoise`: sample
    index -1 in the seed; `seed` = the job seed)."""
    r = parse_group_id(sample.group_id) if spec.groupSharedNoise else parse_sample_id(sample.sample_id)
    index = -1 if spec.groupSharedNoise else r.index
    gen = torch.Generator().manual_seed(derive(seed, "awm-eps", step=r.step, group=r.prompt, sample=index, attempt=r.attempt))
    shape = (spec.timestepsPerSample, *sample.x0.shape)
    return torch.randn(shape, generator=gen, dtype=torch.float32)


def awm_step(policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample], spec: AWMSpec,
             opt: OptimizerSpec, *, advantage_clip: float, grid_of: GridOf, seed: int, step: int,
             device: torch.device, ranks: Ranks = SINGLE) -> dict:
    """Train on one batch; returns metrics (loss, policy_loss, kl, ema_kl, matching_error, clip_fraction,
    ratio_max_abs_dev, grad_norm, x0_norm, optimizer_steps).

    Minibatches keep groups whole (`updatesPerStep` of them, groups shuffled by
    `derive(seed, "minibatch", step)`; `seed` = the job seed). Several
    actor ranks: each passes the whole batch and trains its `ranks.share` of the micro-batches;
    metrics are reduced, the same on every rank.

    Args:
        advantage_clip: the controller's advantage clamp c (`spec.algorithm.advantage.clip`).
        grid_of: latent shape → the rollout σ grid `[N+1]` (`adapter.sigma_grid(numSteps, shape, shift)`), for
            `timeSampling: grid`; each group draws on its own size's grid.
    Raises:
        ConfigError: non-finite loss (`ranks.check_loss`: the training diverged).
    """
    plan = [micro_batches(mini, opt.microBatchSize, keep_groups=True)
            for mini in group_minibatches(samples, opt.updatesPerStep, derive(seed, "minibatch", step=step))]
    n_mini = len(plan)
    sizes = [sum(len(mb) for mb in mbs) for mbs in plan]
    sigmas = {g: draw_sigmas(g, spec, grid_of(shape), seed) for g, shape in group_shapes(samples).items()}
    old = _old_log_probs(policies, plan[1:], spec, sigmas, seed, device, ranks) if n_mini > 1 else {}
    sums = {k: 0.0 for k in ("loss", "policy_loss", "kl", "ema_kl", "matching_error", "clip_fraction", "grad_norm")}
    dev = 0.0
    for m, mbs in enumerate(plan):
        optimizer.zero_grad(set_to_none=True)
        for mb, share in ranks.share(mbs):
            out = _micro(policies, mb, spec, sigmas, seed, device, advantage_clip, old if m else None)
            check_loss(out["loss"], "AWM", [s.sample_id for s in mb])
            w = len(mb) / sizes[m] * share
            (out["loss"] * (w * ranks.grad_scale)).backward()
            for key in ("loss", "policy_loss", "kl", "ema_kl", "matching_error", "clip_fraction"):
                sums[key] += float(out[key].detach()) * w / n_mini
            dev = max(dev, float(out["ratio_max_abs_dev"]) * share)
        sums["grad_norm"] += clip_grad_norm(policies.trainable_parameters(), opt.gradClip) / n_mini
        optimizer.step()
    grad_norm = sums.pop("grad_norm")  # already global
    metrics = {**ranks.sum(sums), "grad_norm": grad_norm, "ratio_max_abs_dev": ranks.max(dev)}
    metrics["x0_norm"] = float(torch.stack([s.x0.float().pow(2).mean().sqrt() for s in samples]).mean())
    metrics["optimizer_steps"] = n_mini
    return metrics


def _forward(adapter, mb: list[TrainSample], spec: AWMSpec, sigmas: dict, seed: int, device: torch.device):
    """v `[K·b, ...]` at the K draws of every sample (draw-major), with x0, ε and σ laid out alike."""
    k = spec.timestepsPerSample
    x0 = torch.stack([s.x0 for s in mb]).to(device)
    eps = torch.stack([draw_noise(s, spec, seed) for s in mb], dim=1).to(device)  # [K, b, ...]
    sigma = torch.stack([sigmas[s.group_id] for s in mb], dim=1).to(device)  # [K, b]
    x0 = x0.unsqueeze(0).expand(k, *x0.shape).reshape(-1, *x0.shape[1:])
    eps, sigma = eps.reshape(-1, *eps.shape[2:]), sigma.reshape(-1)
    s4 = sigma.view(-1, *([1] * (x0.dim() - 1)))
    x_t = (1.0 - s4) * x0 + s4 * eps
    cond = adapter.encode([s.prompt_ids for s in mb] * k, device=device)
    return x_t, x0, eps, sigma, cond


def _log_prob(v: torch.Tensor, x0, eps, sigma, spec: AWMSpec, b: int, mods: Modalities | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p = −w(ℓ, σ) `[b, K]`, ℓ `[b, K]`) from draw-major velocities `[K·b, ...]` (ℓ summed over the
    modalities with their weights, `matching_error`)."""
    err = matching_error(v, x0, eps, mods)
    lp = -weighted_matching(err, sigma, spec.weighting, spec.ghuberPower)
    return lp.view(-1, b).t(), err.view(-1, b).t()


def _old_log_probs(policies: PolicySet, plans: list[list[list[TrainSample]]], spec: AWMSpec, sigmas: dict,
                   seed: int, device: torch.device, ranks: Ranks) -> dict[str, torch.Tensor]:
    """log p `[K]` per sample of minibatches 1.. under the weights before any update (no grad)."""
    out: dict[str, torch.Tensor] = {}
    ids = [s.sample_id for mbs in plans for mb in mbs for s in mb]
    with torch.no_grad():
        for mbs in plans:
            for mb, share in ranks.share(mbs):
                x_t, x0, eps, sigma, cond = _forward(policies.adapter, mb, spec, sigmas, seed, device)
                lp, _ = _log_prob(policies.adapter.velocity(x_t, sigma, cond).float(), x0, eps, sigma, spec, len(mb),
                                  modalities_of(policies.adapter, mb))
                if share:
                    out.update({s.sample_id: lp[i].cpu() for i, s in enumerate(mb)})
    return ranks.merge(out, ids)


def _micro(policies: PolicySet, mb: list[TrainSample], spec: AWMSpec, sigmas: dict, seed: int,
           device: torch.device, advantage_clip: float, old: dict | None) -> dict:
    adapter = policies.adapter
    x_t, x0, eps, sigma, cond = _forward(adapter, mb, spec, sigmas, seed, device)
    v = adapter.velocity(x_t, sigma, cond).float()
    mods = modalities_of(adapter, mb)
    lp, err = _log_prob(v, x0, eps, sigma, spec, len(mb), mods)
    old_lp = lp.detach() if old is None else torch.stack([old[s.sample_id] for s in mb]).to(device)
    adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=device)
    adv = awm_advantages(adv, advantage_clip, spec.advantageMax)
    kl = ema_kl = None
    # the anchors' velocities come from no-grad contexts; their gaps to v must be taken outside them,
    # or the KL terms carry no gradient and the anchors never act
    if spec.klCoef > 0:
        with policies.reference() as ref:
            v_ref = ref.velocity(x_t, sigma, cond).float()
        kl = _velocity_gap(v, v_ref, len(mb), mods)
    if spec.emaKlCoef > 0:
        with policies.old() as anchor:
            v_ema = anchor.velocity(x_t, sigma, cond).float()
        ema_kl = _velocity_gap(v, v_ema, len(mb), mods)
    out = awm_loss(lp, old_lp, adv, spec.clipRange, kl=kl, kl_coef=spec.klCoef, ema_kl=ema_kl,
                   ema_kl_coef=spec.emaKlCoef)
    return {**out._asdict(), "matching_error": err.detach().mean()}


def _velocity_gap(v: torch.Tensor, v_other: torch.Tensor, b: int, mods: Modalities | None = None) -> torch.Tensor:
    """mean_i (v − v_other)² per (sample, draw) `[b, K]`, v_other detached (Σ_m w_m · mean over modality m for a
    flat multi-modal latent)."""
    gap = (v - v_other.detach()).pow(2)
    per_row = gap.flatten(1).mean(dim=1) if mods is None else weighted_mean(gap, mods)
    return per_row.view(-1, b).t()


AWM = AdvantageWeightedMatching()
