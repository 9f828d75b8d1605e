"""The actor's optimisation state: policies, AdamW, the algorithm step, checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

from omnirl.actor.algorithm import algorithm_for
from omnirl.actor.batch import TrainSample
from omnirl.actor.checkpoint import load_checkpoint, optimizer_from_flat, optimizer_to_flat, save_checkpoint
from omnirl.actor.fsdp import enable_activation_checkpointing
from omnirl.actor.policy import PolicySet
from omnirl.actor.ranks import SINGLE, Ranks
from omnirl.algorithms import old_policy_decay
from omnirl.api.seeds import derive
from omnirl.api.spec import RLJobSpec
from omnirl.models.protocol import ModelAdapter


class Trainer:
    """Runs the job's algorithm (`algorithm_for(spec.algorithm.name)`) on one adapter.

    Args:
        adapter: the model (its module is trained in place).
        spec: the job spec (algorithm, optimizer, LoRA, seed).
        device: where the model runs.
        ranks: this actor rank among several (FSDP2 data parallel; `Ranks.init` joined them).
    """

    def __init__(self, adapter: ModelAdapter, spec: RLJobSpec, device: str | torch.device = "cpu",
                 ranks: Ranks = SINGLE) -> None:
        algo = spec.algorithm
        self.spec = spec
        self.device = torch.device(device)
        self.ranks = ranks
        self.algorithm = algorithm_for(algo.name)
        needs = self.algorithm.needs(algo)
        self.old_policy = needs.old_policy  # its refresh schedule; None: no old policy
        # LoRA's A is drawn from torch's global generator: from the job's seed, so every actor rank starts from the
        # same adapters (FSDP2 shards each rank's own copy) and a run of the same seed from the same ones (was: a
        # random start per process, so a 2-rank actor trained a mixture of two inits, docs/parallel.md)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive(spec.seed, "lora-init"))
            self.policies = PolicySet(adapter, spec.model.lora, need_ref=needs.reference,
                                      need_old=needs.old_policy is not None, rollout_old=needs.rollout_old)
        blocks = getattr(adapter, "compile_block_types", None)
        if spec.model.gradientCheckpointing:
            enable_activation_checkpointing(adapter.module, blocks)
        if ranks.world > 1:
            self.policies.shard(ranks, blocks, replicate=spec.roles.actor.parallel.replicate)
        if spec.model.compile:
            self.policies.compile()
        o = algo.optimizer
        self.optimizer = torch.optim.AdamW(
            self.policies.trainable_parameters(), lr=o.learningRate, betas=tuple(o.betas), weight_decay=o.weightDecay
        )
        self.optimizer_steps = 0

    def train_step(self, samples: list[TrainSample], step: int) -> dict:
        """One training step on a complete batch; returns the algorithm's metrics.

        Raises:
            ValueError: an empty batch, or what the update raises (non-finite loss...).
        """
        if not samples:
            raise ValueError(f"step {step}: empty training batch")
        algo = self.spec.algorithm
        seed = self.spec.seed  # each update derives its draws from it (api/seeds.py)
        grids: dict[tuple[int, ...], torch.Tensor] = {}

        def grid_of(shape: tuple[int, ...]) -> torch.Tensor:
            # the rollout engine's σ grid for this latent shape (model.resolutions: several per batch)
            if shape not in grids:
                grids[shape] = self.policies.adapter.sigma_grid(algo.sampling.numSteps, shape, algo.sampling.shift)
            return grids[shape]

        metrics = self.algorithm.update(self.policies, self.optimizer, samples, algo, seed=seed, step=step, grid_of=grid_of,
                                        device=self.device, ranks=self.ranks)
        before = self.optimizer_steps
        self.optimizer_steps += int(metrics["optimizer_steps"])
        if self.policies.has_old:
            p = self.old_policy
            k = p.refreshEvery
            if self.optimizer_steps // k > before // k:
                decay = old_policy_decay(self.optimizer_steps, p.schedule, p.decayMax, p.rampSteps)
                self.policies.refresh_old(decay)
                metrics["old_policy_decay"] = decay
        return metrics

    def rollout_tensors(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """The tensors rollout workers must bind (see `PolicySet.rollout_tensors`; `keep=False`
        on ranks that only join the gather)."""
        return self.policies.rollout_tensors(keep)

    def save(self, root: str | Path, step: int, state: dict,
             policy: dict[str, torch.Tensor] | None = None) -> Path | None:
        """Checkpoint under `root`; `state` (JSON) gets the optimizer step count and RNG seed added.

        With several ranks every rank calls it (sharded tensors are gathered, a collective) and
        only the leader writes; the others return None. `policy`: the rollout tensors when the
        caller already gathered them (every rank must then pass it, so none gathers again).
        """
        state = {**state, "optimizer_steps": self.optimizer_steps, "lora": self.policies.lora,
                 "torch_rng_seed": int(torch.initial_seed()), "actor_ranks": self.ranks.world}
        if self.policies.lora:  # what the adapters mean: `omnirl eval`/`export` refuse a manifest that differs
            lora = self.spec.model.lora
            state["lora_settings"] = {"rank": lora.rank, "alpha": lora.alpha, "targetModules": list(lora.targetModules)}
        keep = self.ranks.leader  # the others only join the gathers
        old = self.ranks.full(self.policies.named_tensors("old"), keep) if self.policies.has_old else None
        policy = self.rollout_tensors(keep) if policy is None else policy
        trained = self.policies.trained_tensors(keep)
        opt_tensors, opt_meta = optimizer_to_flat(self.optimizer)
        opt_tensors = self.ranks.full(opt_tensors, keep)
        if not self.ranks.leader:
            return None
        return save_checkpoint(root, step, policy=policy, trained=trained, old=old,
                               optimizer=(opt_tensors, opt_meta), state=state, keep=self.spec.checkpoint.keep)

    def load(self, path: str | Path) -> dict:
        """Restore from a checkpoint directory (or its parent with `latest`); returns its state.json."""
        ck = load_checkpoint(path)
        self.policies.load_trained_tensors(ck["trained"], ck["old"])
        optimizer_from_flat(self.optimizer, *self._shard_optimizer_state(*ck["optimizer"]))
        self.optimizer_steps = int(ck["state"]["optimizer_steps"])
        return ck["state"]

    def _shard_optimizer_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> tuple[dict, dict]:
        """Full optimizer-state tensors → this rank's shards, placed like their parameters."""
        if self.ranks.world == 1:
            return tensors, meta
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        out = {}
        for key, value in tensors.items():
            param = params[int(key.split(".", 2)[1])]
            if isinstance(param, DTensor) and value.shape == param.shape:
                value = distribute_tensor(value.to(param.device, param.dtype), param.device_mesh, param.placements)
            out[key] = value
        return out, meta

