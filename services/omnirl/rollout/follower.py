"""A rollout replica's rank other than 0 (`omnirl role rollout` with `RANK` > 0; docs/parallel.md).

It loads the same adapter as its leader, joins the replica's ranks, splits its models the same way, registers with
the actor's weight sync under its own worker id (`rollout.replica.follower_id`), and then makes every call its leader
sends (`rollout.replica.follow`) until `stop`: it reads no request and publishes nothing (the leader does). Its
heartbeat is beaten from a thread while the process lives (a follower waits on its leader, which beats for the
replica's work; a hung collective ends with the group's timeout, and the process with it).
"""

from __future__ import annotations

import logging
import threading

import torch

from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.rollout.replica import follow, follower_id
from omnirl.rollout.service import join_replica_ranks, load_rollout_adapter
from omnirl.transfer import TransferQueue
from omnirl.transfer.heartbeat import Heartbeat
from omnirl.weight_sync import WeightReceiver

log = logging.getLogger("omnirl.rollout")
BEAT_S = 5.0


class RolloutFollower:
    """Rank `env.rank` > 0 of a rollout replica. `run()` returns when the leader sends `stop`."""

    def __init__(self, job: RLJob, env: RoleEnv) -> None:
        spec = job.spec
        self.env = env
        self.device = torch.device(env.device)
        self.worker_id = follower_id(env.worker_id, env.rank)
        policy = spec.failurePolicy
        self.queue = TransferQueue.for_job(env.job_name, spec.transferQueue, env.redis_url)
        self.heartbeat = Heartbeat(self.queue.redis, env.job_name, "rollout", self.worker_id,
                                   ttl_s=2 * policy.progressDeadlineSeconds)
        self.adapter = load_rollout_adapter(spec, self.device)
        self.channel = join_replica_ranks(spec, env, self.adapter, self.device)
        self.terminated = False
        self._stop = threading.Event()
        self._beats = threading.Thread(target=self._beat, daemon=True, name="follower-heartbeat")
        self._beats.start()
        self.receiver = WeightReceiver(env.weight_sync_host, env.weight_sync_port, self.worker_id,
                                       device=str(self.device), connect_timeout_s=policy.startup_limit_s,
                                       connect_limit="failurePolicy.startupDeadlineSeconds + progressDeadlineSeconds",
                                       abort=lambda: self.terminated)
        log.info("replica follower %s: rank %d of %d", self.worker_id, env.rank, env.world_size)

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            self.heartbeat.beat()

    def terminate(self) -> None:
        """SIGTERM: noted; the follower leaves with its leader (its calls are collectives it cannot leave alone)."""
        self.terminated = True

    def run(self) -> None:
        """Make the leader's calls until `stop`."""
        calls = follow(self.adapter, self.channel, sync=lambda: self.receiver.receive(self.adapter.module))
        log.info("replica follower %s: %d calls, stopped by the leader", self.worker_id, calls)

    def close(self) -> None:
        """Stop beating, release the weight-sync connection and the Redis client."""
        self._stop.set()
        self.receiver.close(leave=False)
        self.queue.close()
