"""A pod that holds several ranks of a model role (docs/parallel.md, "On Kubernetes").

A rollout replica of R = ulysses × tensor ranks is `podsPerReplica` = P pods of k = R / P devices; the actor's ranks
are pods of `accelerator.count` = k devices. The operator gives such a pod its index as `RANK` (the StatefulSet
ordinal), `OMNIRL_RANKS_PER_POD` = k and, for the rollout, `OMNIRL_REPLICA_HOSTS` (each replica's rendezvous, its
first pod). `pod_rank_envs` turns that into the RoleEnv of each rank the pod holds: pod i of the rollout is ranks
(i mod P)·k … (i mod P)·k + k − 1 of replica ⌊i / P⌋, meeting at that replica's host; pod i of the actor is ranks
i·k … i·k + k − 1 of the actor's `WORLD_SIZE`. `run_pod_ranks` starts one `omnirl role` process per rank (device
`LOCAL_RANK`), forwards SIGTERM to them, and exits with the first failure's code (stopping the others: a rank alone
only waits in its collectives) or 0.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

from omnirl.api.exits import DONE
from omnirl.api.runtime import RoleEnv


def pod_rank_envs(role: str, spec, env: RoleEnv) -> list[RoleEnv] | None:
    """The RoleEnv of each rank this pod holds, or None when this process is one rank as it stands (a local run,
    a role of one device, a process `run_pod_ranks` started).

    Raises:
        ValueError: `OMNIRL_REPLICA_HOSTS` names fewer replicas than the pod's index reaches.
    """
    if "LOCAL_RANK" in os.environ:
        return None
    k = env.ranks_per_pod
    if role == "rollout" and env.replica_hosts:
        layout = spec.roles.rollout.parallel
        pods = layout.podsPerReplica
        hosts = env.replica_hosts.split(",")
        replica, first = env.rank // pods, (env.rank % pods) * k
        if replica >= len(hosts):
            raise ValueError(f"OMNIRL_REPLICA_HOSTS has {len(hosts)} replicas; pod index {env.rank} is in replica "
                             f"{replica} (podsPerReplica {pods})")
        host, _, port = hosts[replica].rpartition(":")
        return [dataclasses.replace(env, rank=first + i, world_size=layout.ranks, master_addr=host,
                                    master_port=int(port), ranks_per_pod=1, replica_hosts="") for i in range(k)]
    if role == "actor" and k > 1:
        return [dataclasses.replace(env, rank=env.rank * k + i, ranks_per_pod=1) for i in range(k)]
    return None


def run_pod_ranks(role: str, job_path: str, envs: list[RoleEnv], *, poll_s: float = 0.5) -> int:
    """Run one `omnirl role ROLE --job JOB` process per rank of `envs` (the i-th on device `LOCAL_RANK` i) until
    they exit; returns 0 when every one did, else the first failure's code (the others are stopped)."""
    children = []
    for i, rank_env in enumerate(envs):
        environ = {**os.environ, **rank_env.to_environ(), "LOCAL_RANK": str(i)}
        children.append(subprocess.Popen([sys.executable, "-m", "omnirl.cli", "role", role, "--job", job_path],
                                          env=environ))
    old = signal.signal(signal.SIGTERM, lambda signum, frame: [c.send_signal(signal.SIGTERM) for c in children])
    try:
        while True:
            codes = [c.poll() for c in children]
            failed = next((c for c in codes if c not in (None, DONE)), None)
            if failed is not None:
                for child in children:
                    if child.poll() is None:
                        child.terminate()
                for child in children:
                    child.wait()
                return failed
            if all(c == DONE for c in codes):
                return DONE
            time.sleep(poll_s)
    finally:
        signal.signal(signal.SIGTERM, old)
