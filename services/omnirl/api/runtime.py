"""The role process contract: what every role reads from its environment.

The local launcher and the Kubernetes operator set the same variables, so a role behaves the
same on a laptop and in a pod. See the README's "Role processes" table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RoleEnv:
    """Settings of one role process.

    Attributes:
        job_name: RLJob name; every Redis key is `omnirl:{job}:...`.
        redis_url: the TransferQueue's Redis.
        weight_sync_host, weight_sync_port: the actor's TCPStore (weight broadcast rendezvous).
        worker_id: unique id of this replica (consumer name, weight-sync member id).
        out_dir: run output directory (metrics.jsonl, samples/, checkpoints/, ledger/).
        metrics_port: Prometheus port (0 = none).
        health_port: gRPC health port (0 = none).
        report_status: "kubernetes" to patch the RLJob's status, "" otherwise.
        namespace: the RLJob's namespace (Kubernetes).
        device: torch device of this role: "cpu", "cuda" / "npu" (the process's first visible
            device, or LOCAL_RANK's when set; see `omnirl.launch.roles.resolve_device`) or an
            indexed one ("cuda:1").
        weight_sync_backend: the actor's broadcast transport ("gloo", "nccl", "hccl"), or ""
            to choose by device (see `sync_backend`).
        threads: torch intra-op threads (0 = torch's default).
        rank, world_size, master_addr, master_port: the actor ranks' rendezvous (RANK,
            WORLD_SIZE, MASTER_ADDR, MASTER_PORT; one rank when unset).
        export: the controller exports each checkpoint to `out_dir/exports/` (OMNIRL_EXPORT,
            default 1; the operator sets 0 when the run directory is not shared with the actor).
    """

    job_name: str
    redis_url: str
    weight_sync_host: str
    weight_sync_port: int
    worker_id: str
    out_dir: str
    metrics_port: int = 0
    health_port: int = 0
    report_status: str = ""
    namespace: str = "default"
    device: str = "cpu"
    weight_sync_backend: str = ""
    threads: int = 0
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29400
    export: bool = True

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> RoleEnv:
        """Read the OMNIRL_* variables.

        Raises:
            KeyError: a required variable is missing (the message names it and who sets it).
            ValueError: a port or thread count is not an integer.
        """
        env = os.environ if environ is None else environ

        def need(name: str) -> str:
            if not env.get(name):
                raise KeyError(f"{name} is not set: the launcher (`omnirl run`) or the operator sets it")
            return env[name]

        addr = env.get("OMNIRL_WEIGHT_SYNC_ADDR", "127.0.0.1:29500")
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"OMNIRL_WEIGHT_SYNC_ADDR={addr!r} must be host:port")
        return cls(
            job_name=need("OMNIRL_JOB_NAME"),
            redis_url=need("OMNIRL_REDIS_URL"),
            weight_sync_host=host,
            weight_sync_port=int(port),
            worker_id=env.get("OMNIRL_WORKER_ID") or f"{os.uname().nodename}-{os.getpid()}",
            out_dir=env.get("OMNIRL_OUT", "."),
            metrics_port=int(env.get("OMNIRL_METRICS_PORT", "0")),
            health_port=int(env.get("OMNIRL_HEALTH_PORT", "0")),
            report_status=env.get("OMNIRL_REPORT_STATUS", ""),
            namespace=env.get("OMNIRL_NAMESPACE", "default"),
            device=env.get("OMNIRL_DEVICE", "cpu"),
            weight_sync_backend=env.get("OMNIRL_WEIGHT_SYNC_BACKEND", ""),
            threads=int(env.get("OMNIRL_THREADS", "0")),
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29400")),
            export=env.get("OMNIRL_EXPORT", "1") != "0",
        )


def sync_backend(actor: str, rollouts: list[str], shared_device: bool = False, all_shared: bool = False) -> str:
    """`OMNIRL_WEIGHT_SYNC_BACKEND` for a job.

    - ``"cuda-ipc"``: actor rank 0 and every rollout worker share one NVIDIA GPU (device-to-device
      copies through CUDA IPC handles; NCCL refuses two ranks on one GPU);
    - ``"gloo"`` (through host memory): the actor runs on the CPU, a rollout worker runs on another
      kind of device, or only some rollout workers share the actor's device;
    - ``""`` otherwise: the actor picks NCCL (nvidia) or HCCL (ascend) by its device.

    Args:
        actor: the actor's accelerator type (``"cpu"``, ``"nvidia"``, ``"ascend"``).
        rollouts: each rollout worker's accelerator type.
        shared_device: actor rank 0 and some rollout worker use the same physical device.
        all_shared: every rollout worker uses actor rank 0's device.
    """
    if actor == "cpu" or any(r != actor for r in rollouts):
        return "gloo"
    if all_shared and actor == "nvidia":
        return "cuda-ipc"
    return "gloo" if shared_device else ""
