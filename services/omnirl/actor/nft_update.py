"""One DiffusionNFT training step on the actor (DiffusionNFT, arXiv 2509.16117).

Needs only the clean x0 and its advantage. For each sample, `timestepsPerSample` stratified σ
draws; x_σ = (1−σ)·x0 + σ·ε; loss on the implicit positive/negative policies built from v_θ and
the old policy's v_old, plus an optional velocity KL 𝛽_KL·mean((v_θ − v_ref)²) to the base model.

Decisive on the built-in task (`references/demo-task.md`): every member of a group shares the
same σ and ε, so the part of the gradient common to the group cancels and what is left is the
reward-weighted difference. Draws are seeded by `derive(job seed, "nft", step, group, attempt,
draw)` (`api/seeds.py`), so they are reproducible.
"""

from __future__ import annotations

import torch

from omnirl.actor.algorithm import Algorithm, PolicyNeeds
from omnirl.actor.batch import GridOf, TrainSample, group_minibatches, micro_batches, modalities_of
from omnirl.actor.policy import PolicySet
from omnirl.actor.ranks import SINGLE, Ranks, check_loss, clip_grad_norm
from omnirl.algorithms import nft_loss, optimality_probability, weighted_mean
from omnirl.api.ids import parse_group_id
from omnirl.api.seeds import derive
from omnirl.api.spec import AlgorithmSpec, NFTSpec, OptimizerSpec


class DiffusionNFT(Algorithm):
    """DiffusionNFT through the algorithm protocol: ODE rollouts of v_old, training on x0 alone."""

    name = "diffusion-nft"

    def needs(self, algo: AlgorithmSpec) -> PolicyNeeds:
        """v_old (rolled out, refreshed by `nft.oldPolicy`); a reference when `nft.klCoef` > 0."""
        return PolicyNeeds(reference=algo.nft.klCoef > 0, old_policy=algo.nft.oldPolicy, rollout_old=True)

    def update(self, policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample],
               algo: AlgorithmSpec, *, seed: int, step: int, grid_of: GridOf, device: torch.device,
               ranks: Ranks = SINGLE) -> dict:
        """`nft_step` with the job's `nft` and optimizer settings (the σ draws ignore the grid)."""
        return nft_step(policies, optimizer, samples, algo.nft, algo.optimizer, seed=seed, step=step, device=device,
                        ranks=ranks)


def group_noise(group_id: str, draw: int, n_draws: int, shape: tuple[int, ...], seed: int,
                sigma_range: tuple[float, float]) -> tuple[float, torch.Tensor]:
    """(σ, ε `[C, H, W]` fp32) shared by every member of a group for one stratified draw.

    σ is uniform inside stratum `draw` of `n_draws` equal strata of [0, 1], clamped to
    `sigma_range`. `seed` is the job seed; the group id gives step, prompt and attempt.
    """
    g = parse_group_id(group_id)
    gen = torch.Generator().manual_seed(derive(seed, "nft", step=g.step, group=g.prompt, attempt=g.attempt, draw=draw))
    u = float(torch.rand((), generator=gen))
    lo, hi = sigma_range
    sigma = min(max((draw + u) / n_draws, lo), hi)
    return sigma, torch.randn(shape, generator=gen, dtype=torch.float32)


def nft_step(policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample], spec: NFTSpec,
             opt: OptimizerSpec, *, seed: int, step: int, device: torch.device, ranks: Ranks = SINGLE) -> dict:
    """Train on one batch; returns metrics (loss, positive/negative loss, kl, grad_norm, x0 norm).

    `seed` is the job seed (`spec.seed`); the minibatch order is `derive(seed, "minibatch", step)`.

    Several actor ranks: each passes the whole batch and trains its `ranks.share` of the
    micro-batches (see `flow_grpo_step`); metrics are reduced, the same on every rank.

    Raises:
        ConfigError: non-finite loss (`ranks.check_loss`: the training diverged).
    """
    minibatches = group_minibatches(samples, opt.updatesPerStep, derive(seed, "minibatch", step=step))
    n_mini = len(minibatches)
    k = spec.timestepsPerSample
    sums = {"loss": 0.0, "positive_loss": 0.0, "negative_loss": 0.0, "kl": 0.0, "grad_norm": 0.0}
    for minibatch in minibatches:
        optimizer.zero_grad(set_to_none=True)
        for mb, share in ranks.share(micro_batches(minibatch, opt.microBatchSize, keep_groups=True)):
            for draw in range(k):
                out = _draw_loss(policies, mb, draw, spec, seed, device)
                check_loss(out["loss"], "NFT", [s.sample_id for s in mb])
                w = len(mb) / len(minibatch) / k * share
                (out["loss"] * (w * ranks.grad_scale)).backward()
                for key in ("loss", "positive_loss", "negative_loss", "kl"):
                    sums[key] += float(out[key].detach()) * w / n_mini
        sums["grad_norm"] += clip_grad_norm(policies.trainable_parameters(), opt.gradClip) / n_mini
        optimizer.step()
    grad_norm = sums.pop("grad_norm")  # already global
    sums = {**ranks.sum(sums), "grad_norm": grad_norm}
    sums["x0_norm"] = float(torch.stack([s.x0.float().pow(2).mean().sqrt() for s in samples]).mean())
    sums["optimizer_steps"] = n_mini
    return sums


def _draw_loss(policies: PolicySet, mb: list[TrainSample], draw: int, spec: NFTSpec, seed: int,
               device: torch.device) -> dict:
    x0 = torch.stack([s.x0 for s in mb]).to(device)
    shape = tuple(x0.shape[1:])
    per_group = {g: group_noise(g, draw, spec.timestepsPerSample, shape, seed, spec.sigmaRange)
                 for g in dict.fromkeys(s.group_id for s in mb)}
    sigma = torch.tensor([per_group[s.group_id][0] for s in mb], dtype=torch.float32, device=device)
    eps = torch.stack([per_group[s.group_id][1] for s in mb]).to(device)
    s = sigma.view(-1, *([1] * (x0.dim() - 1)))  # [b, 1, 1, 1] for images, [b, 1] for a flat multi-modal latent
    x_t = (1.0 - s) * x0 + s * eps
    adapter = policies.adapter
    mods = modalities_of(adapter, mb)
    cond = adapter.encode([s.prompt_ids for s in mb], device=device)
    adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=device)
    r = optimality_probability(adv, spec.advantageMax)
    with policies.old() as old:
        v_old = old.velocity(x_t, sigma, cond).float()
    v_theta = adapter.velocity(x_t, sigma, cond).float()
    out = nft_loss(x0, x_t, sigma, v_theta, v_old, r, spec.beta, mods)
    loss, kl = out.loss, torch.zeros((), device=device)
    if spec.klCoef > 0:
        with policies.reference() as ref:
            v_ref = ref.velocity(x_t, sigma, cond).float()
        gap = (v_theta - v_ref).pow(2)
        kl = gap.mean() if mods is None else weighted_mean(gap, mods).mean()
        loss = loss + spec.klCoef * kl
    return {"loss": loss, "positive_loss": out.positive_loss, "negative_loss": out.negative_loss,
            "kl": kl.detach()}


DIFFUSION_NFT = DiffusionNFT()
