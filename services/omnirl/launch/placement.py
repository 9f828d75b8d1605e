"""Where each local role process runs: the accelerators it sees, its torch device, its CPU threads.

`omnirl run` places roles the way the manifest asks (`roles.<role>.accelerator`), as Kubernetes
would: each process of a role with `{type: nvidia, count: c}` gets `c` GPUs of its own through
`CUDA_VISIBLE_DEVICES` (Ascend: `ASCEND_RT_VISIBLE_DEVICES`) and uses the first as `cuda:0`.
A manifest that needs more devices than the machine has is refused with the numbers, unless the
user asks to share (`--share-gpus`: processes take the devices round-robin, actor ranks first so
that every rank still has a device of its own) or to run on the CPU (`--device cpu`).

When rank 0 of the actor and a rollout worker share a device, NCCL/HCCL cannot connect them
("Duplicate GPU detected"): when every rollout worker shares the actor's GPU the broadcast uses
CUDA IPC handles (device-to-device), otherwise gloo through host memory.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from omnirl.api.runtime import cpu_role_threads, fixed_local_threads, sync_backend, usable_cores
from omnirl.api.spec import RLJob
from omnirl.api.spec_parallel import actor_world

VISIBLE_ENV = {"nvidia": "CUDA_VISIBLE_DEVICES", "ascend": "ASCEND_RT_VISIBLE_DEVICES"}
"""The variable that restricts a process to some devices, per accelerator type."""
TORCH_TYPE = {"nvidia": "cuda", "ascend": "npu"}
_UNIT = {"nvidia": "GPU", "ascend": "NPU"}
ACCELERATOR_ROLE_THREADS = 2
"""CPU threads of a role whose compute runs on an accelerator (its host side: launches, Redis, codecs)."""


@dataclass(frozen=True)
class Placement:
    """One role process's place.

    Attributes:
        role, index: the process (`role-index`).
        kind: accelerator type it runs on (``"cpu"``, ``"nvidia"``, ``"ascend"``).
        device: its torch device inside the process (``"cpu"``, ``"cuda:0"``, ``"npu:0"``).
        visible: the machine's device ids it sees, as the parent's visibility list names them
            (empty on the CPU).
        threads: torch / onnxruntime intra-op threads.
    """

    role: str
    index: int
    kind: str
    device: str
    visible: tuple[str, ...]
    threads: int

    @property
    def name(self) -> str:
        """``role-index``."""
        return f"{self.role}-{self.index}"

    def environ(self) -> dict[str, str]:
        """The variables outside `RoleEnv` that put the process here: OpenMP threads and the visible
        accelerators (its device and torch threads travel as `RoleEnv.device`/`threads`)."""
        env = {"OMP_NUM_THREADS": str(self.threads)}
        if self.kind in VISIBLE_ENV:
            env[VISIBLE_ENV[self.kind]] = ",".join(self.visible)
        return env


def role_plan(job: RLJob) -> list[tuple[str, int]]:
    """(role, process index) for every process of the job, controller last. A rollout replica of R ranks
    (`roles.rollout.parallel`, docs/parallel.md) is R processes: process p is rank p % R of replica p // R; the
    actor's processes are its ranks, replicas × parallel.ulysses."""
    r = job.spec.roles
    plan = [("rollout", i) for i in range(r.rollout.replicas * r.rollout.parallel.ranks)]
    plan += [("reward", i) for i in range(r.reward.replicas)]
    return plan + [("actor", i) for i in range(actor_world(r.actor.replicas, r.actor.parallel))] + [("controller", 0)]


def visible_devices(kind: str) -> list[str]:
    """The device ids of `kind` this process may hand out (its own visibility list, else 0..n-1).

    Counts CUDA devices with torch (no CUDA context is created) and Ascend devices with torch_npu
    (0 when torch_npu is not installed).
    """
    import torch

    if kind == "nvidia":
        n = torch.cuda.device_count()
    else:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)

            n = torch.npu.device_count()
        except ImportError:
            n = 0
    parent = os.environ.get(VISIBLE_ENV[kind], "")
    ids = [d.strip() for d in parent.split(",") if d.strip()] if parent else [str(i) for i in range(n)]
    return ids[:n]


def place(job: RLJob, *, device: str = "auto", share: bool = False, cores: int | None = None,
          available: dict[str, list[str]] | None = None) -> list[Placement]:
    """Place every process of `role_plan(job)`.

    Args:
        job: the RLJob.
        device: ``"auto"`` (as the manifest asks) or ``"cpu"`` (every role on the CPU).
        share: let processes share devices when the manifest asks for more than the machine has.
        cores: CPU cores to split (default: `usable_cores()`, the cores this process may run on).
        available: device ids per accelerator type (default: `visible_devices`); for tests.

    Returns:
        One `Placement` per process, in `role_plan` order.

    Raises:
        ValueError: `device` is neither auto nor cpu; or the manifest needs more devices of a type
            than the machine has (the message gives the numbers and the two ways out), or actor
            ranks outnumber the devices even when sharing.
    """
    if device not in ("auto", "cpu"):
        raise ValueError(f"--device {device!r}: expected 'auto' (as the manifest asks) or 'cpu'")
    cores = cores or usable_cores()
    roles = job.spec.roles
    plan = role_plan(job)

    def kind_of(role: str) -> str:
        return "cpu" if device == "cpu" else getattr(roles, role).accelerator.type

    assigned: dict[tuple[str, int], tuple[str, ...]] = {}
    for kind in sorted({kind_of(r) for r, _ in plan} - {"cpu"}):
        procs = [(r, i) for r, i in plan if kind_of(r) == kind]
        ids = (available or {}).get(kind) if available is not None else visible_devices(kind)
        ids = list(ids or [])
        assigned.update(_assign(kind, procs, ids, roles, share))
    accel = [p for p in plan if p in assigned]
    spare = max(1, cores - ACCELERATOR_ROLE_THREADS * len(accel) - 1)
    cpu_workers = [p for p in plan if p not in assigned and p[0] != "controller"]
    out = []
    for role, index in plan:
        kind = kind_of(role)
        if (role, index) in assigned:
            out.append(Placement(role, index, kind, f"{TORCH_TYPE[kind]}:0", assigned[role, index],
                                 ACCELERATOR_ROLE_THREADS))
            continue
        if not accel:
            threads = cpu_role_threads(role, job.spec.pipeline.mode, cores)
        else:  # the accelerators do the heavy work: the CPU roles (scorers) split what is left
            threads = 1 if role == "controller" else max(1, spare // max(1, len(cpu_workers)))
        out.append(Placement(role, index, "cpu", "cpu", (), threads))
    fixed = fixed_local_threads()
    if fixed is not None:
        out = [dataclasses.replace(p, threads=fixed) for p in out]
    return out


def _assign(kind: str, procs: list[tuple[str, int]], ids: list[str], roles, share: bool
            ) -> dict[tuple[str, int], tuple[str, ...]]:
    """Device ids per process of one accelerator type (actor ranks first, then the others)."""
    # a model role's process is one rank on one device (its pod's accelerator.count is its ranks per pod)
    count = {p: 1 if p[0] in ("rollout", "actor") else getattr(roles, p[0]).accelerator.count for p in procs}
    need = sum(count.values())
    what = ", ".join(f"{r} {sum(1 for q in procs if q[0] == r)}×{getattr(roles, r).accelerator.count}"
                     for r in dict.fromkeys(r for r, _ in procs))
    label = {"nvidia": "NVIDIA GPUs", "ascend": "Ascend NPUs"}[kind]
    if not ids:
        raise ValueError(f"roles.*.accelerator: the manifest asks for {need} {label} ({what}); this machine has "
                         f"none: run it with --device cpu (every role on the CPU)")
    if need > len(ids) and not share:
        raise ValueError(f"roles.*.accelerator: the manifest asks for {need} {label} ({what}); this machine has "
                         f"{len(ids)}: pass --share-gpus to place several roles on one device, or --device cpu")
    actors = [p for p in procs if p[0] == "actor"]
    if actors and len(actors) * count[actors[0]] > len(ids):
        raise ValueError(f"roles.actor: {len(actors)} ranks × {count[actors[0]]} {label} need a device each, this "
                         f"machine has {len(ids)}: lower roles.actor.replicas or run with --device cpu")
    out, cursor = {}, 0
    for p in actors + [q for q in procs if q[0] != "actor"]:
        out[p] = tuple(ids[(cursor + k) % len(ids)] for k in range(count[p]))
        cursor += count[p]
    return out


def weight_sync_backend(placements: list[Placement]) -> str:
    """`omnirl.api.runtime.sync_backend` for this placement (a shared device forces gloo)."""
    actor = next(p for p in placements if p.role == "actor" and p.index == 0)
    rollouts = [p for p in placements if p.role == "rollout"]
    same = [p.kind == actor.kind != "cpu" and p.visible[:1] == actor.visible[:1] for p in rollouts]
    return sync_backend(actor.kind, [p.kind for p in rollouts], any(same), all(same))


def n_threads(n: int) -> str:
    """`n` CPU threads as a phrase: "1 thread", "2 threads" (the table said "1 threads")."""
    return f"{n} thread{'' if n == 1 else 's'}"


def describe(placements: list[Placement], backend: str) -> str:
    """A few lines saying where each process runs (printed at start)."""
    rows = []
    for p in placements:
        where = "cpu" if p.kind == "cpu" else f"{p.device} = {_UNIT[p.kind]} {','.join(p.visible)}"
        rows.append(f"  {p.name:<14} {where:<24} {n_threads(p.threads)}")
    sync = backend or "by device (nccl/hccl across devices)"
    return "omnirl: placement\n" + "\n".join(rows) + f"\n  weight sync: {sync}"
