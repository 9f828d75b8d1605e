"""The role process contract: what every role reads from its environment.

`RoleEnv` is the one owner of the variables: the local launcher (`launch/local.py::role_env`) and
the Kubernetes operator (`omnirl_operator/pods.py::role_env`) both write `RoleEnv.to_environ()`,
and `omnirl role` (`launch/roles.py`) reads `RoleEnv.from_environ()`, so a role behaves the same
on a laptop and in a pod. docs/architecture.md §3 "Role processes" has the table. Torch-free: the
operator imports it.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from urllib.parse import quote, urlsplit, urlunsplit

from omnirl.api.errors import ConfigError, config_errors
from omnirl.api.exits import CONFIG_ERROR_EXIT, JOB_FAILED_EXIT, PERMANENT_EXITS, STORAGE_ERROR_EXIT  # noqa: F401

# the role exit codes imported above are owned by `omnirl.api.exits`, which every module here imports them from; the
# names stay importable from here for code written against this module before (tests/test_docs_reference.py)
# RoleEnv field → environment variable (`weight_sync_addr` = host:port of two fields)
VARIABLES = {
    "job_name": "OMNIRL_JOB_NAME", "redis_url": "OMNIRL_REDIS_URL", "weight_sync_addr": "OMNIRL_WEIGHT_SYNC_ADDR",
    "worker_id": "OMNIRL_WORKER_ID", "out_dir": "OMNIRL_OUT", "metrics_port": "OMNIRL_METRICS_PORT",
    "health_port": "OMNIRL_HEALTH_PORT", "report_status": "OMNIRL_REPORT_STATUS", "namespace": "OMNIRL_NAMESPACE",
    "device": "OMNIRL_DEVICE", "weight_sync_backend": "OMNIRL_WEIGHT_SYNC_BACKEND", "threads": "OMNIRL_THREADS",
    "rank": "RANK", "world_size": "WORLD_SIZE", "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT",
    "export": "OMNIRL_EXPORT", "resume": "OMNIRL_RESUME", "steps": "OMNIRL_STEPS", "manifest": "OMNIRL_MANIFEST",
    "ranks_per_pod": "OMNIRL_RANKS_PER_POD", "replica_hosts": "OMNIRL_REPLICA_HOSTS",
}
RANK_FIELDS = ("rank", "world_size", "master_addr", "master_port")
# the RoleEnv fields a user may set in a pod's role container `env` (`roles.<role>.template`) over the
# operator's value: choices of the process alone, which nothing else in the pod or the job reads. Every
# other variable of `VARIABLES` (and REDIS_PASSWORD) the operator owns: `api/podtemplate.py` refuses it
USER_SETTABLE = ("device", "threads", "weight_sync_backend", "steps")
RESUME_MODES = ("0", "1", "auto")
# where a pod's compiled kernels live, relative to the run directory (`OMNIRL_OUT`): the operator sets
# torch's TORCHINDUCTOR_CACHE_DIR there for a `model.compile` job's rollout and actor pods, so a restarted
# or replaced pod reuses its predecessor's FX graphs, Triton kernels and tuning results instead of
# compiling for minutes again (a container's /tmp, torch's default, starts empty). `omnirl run` keeps
# torch's default: on one machine /tmp already outlives a role's restart, and stays warm across runs
COMPILE_CACHE = "cache/inductor"
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
# a protected Redis's password, from a Secret (operator); `from_environ` merges it into redis_url
REDIS_PASSWORD = "REDIS_PASSWORD"
# the ports a role serves (0 = none), with the operator's value as the example of a good one
SERVED_PORTS = {"metrics_port": 9090, "health_port": 8081}


def port_number(field: str, raw: str) -> int:
    """The TCP port in ``raw``, the text of the variable of ``field`` (a key of `SERVED_PORTS`);
    0 (serve nothing) for an empty text.

    Raises:
        ConfigError: not a whole number from 0 to 65535 (``abc``, ``-1``, ``70000``: grpc served -1
            and 70000 on some other port), naming the variable and a good value; a ConfigError, so a
            role exits `CONFIG_ERROR_EXIT` once instead of crashing into restarts.
    """
    name, text = VARIABLES[field], raw.strip()
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise ConfigError(f"{name}={raw!r}: must be a TCP port number from 1 to 65535, e.g. "
                          f"{name}={SERVED_PORTS[field]} (0 or unset: not served)")
    return int(text)


def port_errors(field: str, port: int, *kinds: type[BaseException], serves: str) -> AbstractContextManager[None]:
    """Around binding ``port`` of ``field`` (a key of `SERVED_PORTS`): an OSError or OverflowError
    (and ``kinds``) raised inside — the port taken by another process, out of range — becomes one
    `ConfigError` `"OMNIRL_X_PORT N: <error>; set OMNIRL_X_PORT to a free port (or unset it: no
    <serves>)"`: the same on every restart, so the role exits 4 once instead of crashing into them.

    Raises:
        ConfigError: chained to the original error.
    """
    name = VARIABLES[field]
    return config_errors(f"{name} {port}", OSError, OverflowError, *kinds,
                         fix=f"set {name} to a free port (or unset it: no {serves})")


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
        resume: OMNIRL_RESUME: "0" start fresh, "1" resume from the latest checkpoint (an error
            without one), "auto" resume when a complete checkpoint exists (pods, local restarts).
        steps: OMNIRL_STEPS: total training steps (overrides `spec.algorithm.steps`; None = the spec's).
        ranks_per_pod: OMNIRL_RANKS_PER_POD: ranks of a model role this pod holds, one per device (the operator's,
            for a pod of several devices): `RANK` is then the pod's index and the role starts one process per rank
            (`omnirl.launch.pod_ranks`); 1 = this process is one rank, `RANK` its own.
        replica_hosts: OMNIRL_REPLICA_HOSTS: `host:port` of each rollout replica's rendezvous (its first pod's,
            comma-separated, replica order; the operator's for a rollout replica of several ranks): where a pod's
            ranks meet the rest of their replica's. "" = `MASTER_ADDR:MASTER_PORT` as given.
        manifest: OMNIRL_MANIFEST: the job's manifest as the user wrote it, each judge the job runs a
            `reward[].server` (the `--job` file has the URL the launcher or operator wired in instead,
            `scorers/judges.py::wire`, which dies with the run): what the controller writes into exports
            (`controller/loop.py::written_manifest`). "" = the `--job` file.
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
    resume: str = "0"
    steps: int | None = None
    manifest: str = ""
    ranks_per_pod: int = 1
    replica_hosts: str = ""

    def __post_init__(self) -> None:
        if self.resume not in RESUME_MODES:
            raise ValueError(f"{VARIABLES['resume']}={self.resume!r}: expected 0, 1 or auto "
                             "(resume when a complete checkpoint exists)")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"{VARIABLES['steps']}={self.steps}: must be >= 1 (the total number of training steps)")

    def to_environ(self) -> dict[str, str]:
        """The variables that make `from_environ` return this RoleEnv (round trip).

        Left out: empty values (`report_status`, `weight_sync_backend` = ""; `steps` = None), whose
        default is the same, and the actor ranks' rendezvous (RANK … MASTER_PORT) with one rank.
        """
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["weight_sync_addr"] = f"{values.pop('weight_sync_host')}:{values.pop('weight_sync_port')}"
        values["export"] = "1" if self.export else "0"
        if self.world_size == 1:
            for name in RANK_FIELDS:
                values.pop(name)
        if self.ranks_per_pod == 1:
            values.pop("ranks_per_pod")
        return {VARIABLES[k]: str(v) for k, v in values.items() if v is not None and v != ""}

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> RoleEnv:
        """Read the OMNIRL_* variables (and REDIS_PASSWORD, merged into `redis_url`).

        Raises:
            KeyError: a required variable is missing (the message names it and who sets it).
            ValueError: a port, thread count, rank or step count is not an integer, a bad
                OMNIRL_WEIGHT_SYNC_ADDR or OMNIRL_RESUME (each names the variable); a `ConfigError`
                (a ValueError) for OMNIRL_METRICS_PORT or OMNIRL_HEALTH_PORT that is no port number.
        """
        env = os.environ if environ is None else environ
        v = VARIABLES

        def need(field: str) -> str:
            if not env.get(v[field]):
                raise KeyError(f"{v[field]} is not set: the launcher (`omnirl run`) or the operator sets it")
            return env[v[field]]

        def integer(field: str, default: int) -> int:
            raw = env.get(v[field], "")
            try:
                return int(raw) if raw else default
            except ValueError:
                raise ValueError(f"{v[field]}={raw!r}: must be an integer") from None

        def served_port(field: str) -> int:
            return port_number(field, env.get(v[field], ""))

        addr = env.get(v["weight_sync_addr"], "127.0.0.1:29500")
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{v['weight_sync_addr']}={addr!r} must be host:port")
        steps = env.get(v["steps"], "")
        return cls(
            job_name=need("job_name"),
            redis_url=with_redis_password(need("redis_url"), env.get(REDIS_PASSWORD)),
            weight_sync_host=host,
            weight_sync_port=int(port),
            worker_id=env.get(v["worker_id"]) or f"{os.uname().nodename}-{os.getpid()}",
            out_dir=env.get(v["out_dir"], "."),
            metrics_port=served_port("metrics_port"),
            health_port=served_port("health_port"),
            report_status=env.get(v["report_status"], ""),
            namespace=env.get(v["namespace"], "default"),
            device=env.get(v["device"], "cpu"),
            weight_sync_backend=env.get(v["weight_sync_backend"], ""),
            threads=integer("threads", 0),
            rank=integer("rank", 0),
            world_size=integer("world_size", 1),
            master_addr=env.get(v["master_addr"], "127.0.0.1"),
            master_port=integer("master_port", 29400),
            export=env.get(v["export"], "1") != "0",
            resume=(env.get(v["resume"]) or "0").strip().lower(),
            steps=integer("steps", 0) if steps else None,
            manifest=env.get(v["manifest"], ""),
            ranks_per_pod=integer("ranks_per_pod", 1),
            replica_hosts=env.get(v["replica_hosts"], ""),
        )


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity set (`taskset -c 0,1 omnirl run …` → 2), else
    `os.cpu_count()`. A run pinned to 2 cores of a 16-core machine then places its roles as on a 2-core one
    (its threads spinning over cores it cannot use would slow it: `cpu_role_threads`)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS has no affinity call
        return os.cpu_count() or 1


def cpu_role_threads(role: str, mode: str, cores: int) -> int:
    """torch threads of a role of an all-CPU job (`omnirl run`'s placement; `omnirl eval` samples with the
    rollout's, so its forwards round as the run's validation did). In `sync`/`async-reward` the rollout and the
    actor take turns, so each may use every core; in `fully-async` they run at once and split the cores
    (threads beyond the cores spin against each other: 4× slower steps measured on 2 cores)."""
    if role in ("reward", "controller"):
        return 1
    return max(1, cores // 2) if mode == "fully-async" else max(1, cores)


def fixed_local_threads() -> int | None:
    """`OMNIRL_LOCAL_THREADS`: one torch thread count for every local role (benchmarks on shared machines), and
    for `omnirl eval`; None when unset. Raises ValueError naming the variable when it is not a positive integer."""
    fixed = os.environ.get("OMNIRL_LOCAL_THREADS")
    if not fixed:
        return None
    if not fixed.isdigit() or int(fixed) < 1:
        raise ValueError(f"OMNIRL_LOCAL_THREADS={fixed!r} must be a positive integer")
    return int(fixed)


def with_redis_password(url: str, password: str | None) -> str:
    """``url`` with ``password`` in it (percent-encoded), unless the URL already carries one.

    Pods get the password of a protected Redis as ``REDIS_PASSWORD`` (from the Secret named by
    ``spec.transferQueue.passwordSecret``) next to a password-less ``OMNIRL_REDIS_URL``.
    """
    parts = urlsplit(url)
    if not password or parts.password is not None:
        return url
    user = quote(parts.username, safe="") if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{parts.netloc.rpartition('@')[2]}"))


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
