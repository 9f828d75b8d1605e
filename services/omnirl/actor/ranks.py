"""This actor rank among the job's actor ranks: data-parallel shares and metric reductions.

With one rank (`SINGLE`) every method is the identity, so the update functions read the same
either way. With W ranks (FSDP2, `omnirl.actor.fsdp`) each rank holds the whole batch, trains
`share(...)` of its micro-batches and joins the reductions; FSDP averages gradients over ranks,
so `grad_scale` = W turns the ranks' local sums back into the batch mean. Every method that
talks to the other ranks is a collective: all ranks call it in the same order.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from omnirl.api.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """rank in [0, world); `device` is where reduction tensors live (cpu for gloo, cuda for nccl).

    `ulysses` consecutive ranks share their micro-batches as one data-parallel rank, each holding a slice of every
    sample's tokens (`roles.actor.parallel.ulysses`, docs/parallel.md): `share` deals micro-batches to the
    data-parallel ranks, and the reductions count each data-parallel rank once. The gradient stays right with the
    same `grad_scale`: FSDP2 averages over all `world` ranks, and a data-parallel rank's gradient is the sum of its
    Ulysses ranks' (each back-propagates its own tokens: `omnirl.models.parallel.ulysses`).
    """

    rank: int = 0
    world: int = 1
    device: str = "cpu"
    ulysses: int = 1

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel rank (its Ulysses group's index)."""
        return self.rank // self.ulysses

    @property
    def dp_world(self) -> int:
        """Data-parallel ranks: `world / ulysses`."""
        return self.world // self.ulysses

    @property
    def leader(self) -> bool:
        """Rank 0: the one that talks to the controller, the rollout workers and the disk."""
        return self.rank == 0

    @property
    def grad_scale(self) -> float:
        """Multiply each local loss by this before backward (FSDP averages gradients over ranks)."""
        return float(self.world)

    @classmethod
    def init(cls, rank: int, world: int, master_addr: str, master_port: int, device: str, ulysses: int = 1) -> Ranks:
        """Join the actor ranks' process group (gloo on cpu, nccl on cuda); world 1 joins nothing.

        Raises:
            ValueError: rank outside [0, world).
            RuntimeError / DistStoreError: the other ranks did not join (torch's timeout).
        """
        if not 0 <= rank < world:
            raise ValueError(f"actor rank {rank} is outside [0, {world}) (RANK / WORLD_SIZE)")
        if world % ulysses:
            raise ValueError(f"{world} actor ranks (WORLD_SIZE) do not divide into Ulysses groups of {ulysses}")
        if world > 1 and not dist.is_initialized():
            kind = torch.device(device).type
            backend = {"cuda": "nccl", "npu": "hccl"}.get(kind, "gloo")
            if kind == "cuda":
                torch.cuda.set_device(torch.device(device))
            elif kind == "npu":
                import torch_npu  # noqa: F401  (registers the hccl backend)
            # between steps the ranks wait in Redis, not in collectives: a collective that takes
            # this long means a rank is gone (NCCL would otherwise wait for it indefinitely)
            dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                    world_size=world, timeout=datetime.timedelta(minutes=15))
        return cls(rank, world, device, ulysses)

    def share(self, micro_batches: Sequence[T]) -> list[tuple[T, float]]:
        """This rank's micro-batches with a weight: 1, or 0 for padding.

        Every data-parallel rank gets ⌈n/W⌉ of them (round robin; a Ulysses group's ranks the same ones), so
        all ranks run the same number of forward and backward passes and FSDP's collectives stay in step; the
        slots past n repeat the last micro-batch with weight 0 (computed, contributes nothing).
        """
        n = len(micro_batches)
        if self.dp_world == 1 or n == 0:
            return [(mb, 1.0) for mb in micro_batches]
        total = math.ceil(n / self.dp_world) * self.dp_world
        return [(micro_batches[min(i, n - 1)], 1.0 if i < n else 0.0)
                for i in range(self.dp_rank, total, self.dp_world)]

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Sum each value over the data-parallel ranks (float64; a Ulysses group's ranks hold the same values)."""
        if self.world == 1:
            return dict(values)
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return dict(zip(keys, (t / self.ulysses).tolist(), strict=True))

    def max(self, value: float) -> float:
        """The largest value over the ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def merge(self, per_sample: dict[str, torch.Tensor], ids: Sequence[str]) -> dict[str, torch.Tensor]:
        """Per-sample tensors computed on different ranks (each id on exactly one) → all of them.

        Every rank passes the same `ids`; each fills its own. Tensors are float32 of one shape, CPU.
        Raises:
            ValueError: an id none of the ranks (or several) computed.
        """
        if self.world == 1:
            return dict(per_sample)
        like = self._shape_of(per_sample)
        buf = torch.zeros((len(ids), *like), dtype=torch.float32, device=self.device)
        count = torch.zeros(len(ids), dtype=torch.float32, device=self.device)
        for i, sid in enumerate(ids):
            if sid in per_sample and self.rank % self.ulysses == 0:  # a Ulysses group's first rank speaks for it
                buf[i] = per_sample[sid].to(self.device, torch.float32)
                count[i] = 1
        dist.all_reduce(buf)
        dist.all_reduce(count)
        if not bool((count == 1).all()):
            bad = [ids[i] for i in (count != 1).nonzero().flatten().tolist()][:4]
            raise ValueError(f"per-sample results must come from exactly one actor rank; ids {bad} did not")
        return {sid: buf[i].cpu() for i, sid in enumerate(ids)}

    def _shape_of(self, per_sample: dict[str, torch.Tensor]) -> list[int]:
        """The common per-sample shape, agreed over the ranks (a rank may hold no sample)."""
        mine = list(next(iter(per_sample.values())).shape) if per_sample else []
        t = torch.tensor([len(mine), *mine, *([0] * (8 - len(mine)))], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t[1:1 + int(t[0])].tolist()

    def agree(self, step: int, items: int, done: bool) -> bool:
        """Check every rank is on the same train request; return whether to skip it (already done).

        The leader's view of `done` decides for all. Raises:
            RuntimeError: the ranks hold different requests (step or batch size), naming both.
        """
        if self.world == 1:
            return done
        t = torch.tensor([step, -step, items, -items, int(done)], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        hi_step, lo_step, hi_items, lo_items = int(t[0]), -int(t[1]), int(t[2]), -int(t[3])
        if (hi_step, hi_items) != (lo_step, lo_items):
            raise RuntimeError(f"actor ranks disagree on the train request: steps {lo_step}..{hi_step}, "
                               f"batch sizes {lo_items}..{hi_items} (rank {self.rank} has step {step})")
        return bool(t[4])

    def close(self) -> None:
        """Leave the ranks' process group (no-op with one rank)."""
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def full(self, tensors: dict[str, torch.Tensor], keep: bool = True) -> dict[str, torch.Tensor]:
        """Sharded (`DTensor`) values gathered to full tensors, in dict order (a collective).

        `keep=False` (ranks that only take part) drops each gathered tensor at once and returns an
        empty dict. With several ranks the kept full tensors move to host memory one by one, so no
        device ever holds the unsharded model (that is what sharding saved).
        """
        from torch.distributed.tensor import DTensor

        out = {}
        for k, v in tensors.items():
            if not isinstance(v, DTensor):
                if keep:
                    out[k] = v
                continue
            t = v.full_tensor()
            if keep:
                out[k] = t.cpu()
        return out


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient L2 norm to `max_norm`; returns the norm before clipping.

    With FSDP2 the norm of sharded (`DTensor`) gradients spans every shard; it is gathered to a
    plain float here (every rank gets the same, so every rank raises alike).

    Raises:
        ConfigError: the norm is NaN or infinite (the training diverged: a learning rate far too high): the
            clipped gradients would be NaN and the optimizer step would make every trained weight NaN. Before,
            that step was applied: the rollouts drew NaN images (reward 0.000), the NaN weights were checkpointed
            and exported, and only the next step failed, on every restart from that checkpoint. A replay of the
            step diverges the same way, so it is a permanent error (the role exits 4), naming the fields to lower.
    """
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    value = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not math.isfinite(value):
        raise ConfigError(f"spec.algorithm.optimizer: the gradient norm is {value} (the training diverged), so "
                          "this update was not applied: it would have made every trained weight NaN; lower "
                          f"spec.algorithm.optimizer.learningRate (or gradClip, now {max_norm:g}), then start again "
                          "or --resume from a checkpoint written before the divergence")
    return value


def check_loss(loss: torch.Tensor, algorithm: str, sample_ids: Sequence[str]) -> None:
    """Raise when a micro-batch's loss (a 0-d tensor) is NaN or infinite, before its backward pass.

    Raises:
        ConfigError: naming the algorithm, the first 4 `sample_ids` and spec.algorithm.optimizer.learningRate. A
            finite gradient norm does not bound the step: at `learningRate: 1e30` step 0's norm was finite, AdamW
            moved every weight by ~1e30, and step 1's loss was NaN. As a ValueError the role exited 1 and the job
            was restarted from scratch `maxRestarts` times, diverging the same way each time (exit 1 after 2 min of
            replays); the seeded replay of the step cannot differ, so it is permanent (the role exits 4).
    """
    if not torch.isfinite(loss):
        raise ConfigError(f"spec.algorithm.optimizer: the {algorithm} loss is {float(loss.detach())} (samples "
                          f"{list(sample_ids)[:4]}; the training diverged); lower spec.algorithm.optimizer.learningRate, "
                          "then start again or --resume from a checkpoint written before the divergence")


SINGLE = Ranks()
