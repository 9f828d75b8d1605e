"""The rollout role: requests in, samples out, weights in between.

Loop: reclaim/read generate requests (with several replicas at most this one's share a poll,
`rollout/admission.py`) → expand each into its samples (a prompt's G, or a held-out
cohort's, `HeldOutCohort`) → feed the engine one
denoising step at a time → publish every finished sample at once (out of order) with its
trajectory and image, or a multi-modal sample's media (two keys) → acknowledge a request when all its samples are published. Between engine
steps it checks for an announced weight sync: it stops admitting, drains what is in flight (so
no sample mixes two weight versions), binds the new weights, verifies them, and goes on.

Exactly-once effect: samples are published with `done_kind="rollout"`, so a request redelivered
after a crash publishes only what was missing; seeds make the regenerated samples identical.
Exactly-once work: the worker renews its claim on the requests it holds between engine steps and,
from a thread, during each step (`omnirl.transfer.lease.holding`), so a step longer than
`claimIdleSeconds` (model.compile's first one) is not reclaimed and generated again by another
replica; the claim lapses when the process dies or stops beating (`progressDeadlineSeconds`).

Restarts: a worker reads no request before it has bound the actor's current weights (a restarted
worker must never sample with the base model), then first takes back its own pending requests
(a predecessor with the same worker id). SIGTERM: it stops at the next engine step and exits; its
unfinished requests stay pending (handed back): a successor with the same worker id takes them
at once, another replica after `claimIdleSeconds`. Samples already published are never redone.
"""

from __future__ import annotations

import logging
import time

import torch

from omnirl.api.errors import config_errors
from omnirl.api.ledger import Ledger
from omnirl.api.messages import SampleMeta
from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.models.attention import select_attention
from omnirl.models.compile import compile_adapter_module, while_compiling
from omnirl.models.lora import prepare_rollout_module
from omnirl.models.registry import adapter_options, load_adapter
from omnirl.rollout.admission import admit
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.replica import STOP, SYNC, ReplicaChannel
from omnirl.rollout.requests import entry_requests
from omnirl.rollout.types import SampleResult
from omnirl.transfer import TransferQueue
from omnirl.transfer.client import RedisError
from omnirl.transfer.heartbeat import Heartbeat, last_beats, read_heartbeats
from omnirl.transfer.lease import holding
from omnirl.weight_sync import SyncAborted, WeightReceiver

log = logging.getLogger("omnirl.rollout")
GROUP = "rollout"


def load_rollout_adapter(spec, device: torch.device):
    """The rollout's adapter as every rank of a replica builds it: loaded, its attention kernel chosen, LoRA
    adapters injected (to bind the actor's), compiled when asked."""
    with config_errors("spec.model.path"):  # the model's own files: wrong on every restart
        adapter = load_adapter(spec.model.family, spec.model.path, device=device, dtype=spec.model.dtype,
                               **adapter_options(spec))
    select_attention(adapter, spec.model, device)
    prepare_rollout_module(adapter, spec.model.lora)
    if spec.model.compile:
        compile_adapter_module(adapter)
    return adapter


def join_replica_ranks(spec, env: RoleEnv, adapter, device: torch.device) -> ReplicaChannel:
    """Join this replica's ranks (`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT` are the replica's) and split the
    adapter's models over them per `roles.rollout.parallel` (collectives: every rank, the same order)."""
    from omnirl.models.parallel.replica import join_replica, parallelize

    join_replica(env.rank, env.world_size, env.master_addr, env.master_port, device)
    with config_errors("spec.roles.rollout.parallel"):  # a degree the model cannot take: the same every restart
        parallelize(adapter, spec.roles.rollout.parallel, device)
    return ReplicaChannel(device)


def join_as_leader(spec, env: RoleEnv, adapter, device: torch.device):
    """(the leader's adapter, the replica's channel): rank 0 of a replica of several ranks."""
    from omnirl.rollout.replica import LeaderAdapter

    channel = join_replica_ranks(spec, env, adapter, device)
    log.info("replica leader: %d ranks (%s)", env.world_size, spec.roles.rollout.parallel)
    return LeaderAdapter(adapter, channel), channel


class RolloutService:
    """One rollout worker (a replica's leader when the replica has several ranks). `run()` returns when the
    controller sets the `stop` flag."""

    def __init__(self, job: RLJob, env: RoleEnv) -> None:
        spec = job.spec
        self.env = env
        self.queue = TransferQueue.for_job(env.job_name, spec.transferQueue, env.redis_url)
        self.device = torch.device(env.device)
        policy = job.spec.failurePolicy
        adapter = load_rollout_adapter(spec, self.device)
        self.replica: ReplicaChannel | None = None  # a replica of several ranks: this is its leader (rank 0)
        if env.world_size > 1:
            adapter, self.replica = join_as_leader(spec, env, adapter, self.device)
        role = spec.roles.rollout
        self.replicas = role.replicas  # several: each poll takes at most its share (rollout/admission.py)
        self.engine = RolloutEngine(adapter, max_batch_size=role.maxBatchSize, batching=role.batching,
                                    device=self.device)
        log.info("engine: batching %s, maxBatchSize %d", role.batching, role.maxBatchSize)
        self.receiver: WeightReceiver | None = None  # connected in `run`: the actor may still be loading
        self._startup_limit_s = policy.startup_limit_s
        self.pending: dict[str, dict] = {}  # request entry id → {"left": n, "started": t}
        self.progress_deadline_s = policy.progressDeadlineSeconds
        self._lease_every = self.queue.claim_idle_s / 3
        self._last_lease = time.monotonic()
        self.ledger = Ledger(env.out_dir, "rollout", env.worker_id)
        self.heartbeat = Heartbeat(self.queue.redis, env.job_name, "rollout", env.worker_id,
                                   ttl_s=2 * policy.progressDeadlineSeconds)
        self.terminated = False
        self.job_ended = False  # the controller's `stop`: the actor's weight-sync store goes away too
        self._bound = False
        # model.compile compiles at the first engine step and on a new shape: progress, up to the same bound
        self._uncompiling = while_compiling(lambda: self.heartbeat.start_covering(policy.startupDeadlineSeconds, startup=True))

    def terminate(self) -> None:
        """SIGTERM: stop at the next engine step, leave unfinished requests pending, return from `run`."""
        self.terminated = True

    def run(self) -> None:
        """Serve until the job's `stop` flag is set; raises on a weight-binding failure."""
        streams = self.queue.streams
        self.queue.ensure_group(streams.requests, GROUP)
        try:
            self._serve()
        except SyncAborted:  # SIGTERM while the actor's store did not answer: its requests stay pending
            return
        if not self.terminated:
            self.job_ended = True
            self._drain()  # every request in flight is finished, published and acknowledged

    def _serve(self) -> None:
        """Connect to the actor's store, then take requests until `stop` or SIGTERM (a wait for the
        store ends with `SyncAborted` at SIGTERM)."""
        streams = self.queue.streams
        # the actor hosts the store once it has loaded its model: up to its start-up limit, beating meanwhile
        with self.heartbeat.covering(self._startup_limit_s):
            self.receiver = WeightReceiver(
                self.env.weight_sync_host, self.env.weight_sync_port, self.env.worker_id, device=str(self.device),
                connect_timeout_s=self._startup_limit_s, connect_note=self._actor_seen,
                connect_limit="failurePolicy.startupDeadlineSeconds + progressDeadlineSeconds",
                abort=lambda: self.terminated)
        while not self.terminated and not self.queue.records.stop_requested():
            self.heartbeat.beat()
            if self.receiver.pending_version() is not None:
                self._drain()
                if self.replica is not None:  # every rank receives what it holds (rollout/replica.py)
                    self.replica.send(SYNC)
                report = self.receiver.receive(self.engine.adapter.module)
                self.engine.set_policy_version(report.version)
                log.info("bound weights v%d: %d modules, %d tensors", report.version, report.modules_updated,
                         report.tensors_updated)
                if not self._bound:  # a predecessor's requests (same worker id) come back first
                    self._bound = True
                    for msg in self.queue.recover(streams.requests, GROUP, self.env.worker_id):
                        self._submit(msg.id, msg.meta)
                continue
            if not self._bound:
                time.sleep(0.05)
                continue
            if len(self.engine.waiting) < self.engine.max_batch_size:
                block = 0 if self.engine.has_work() else 200
                for msg in admit(self.queue, GROUP, self.env.worker_id, replicas=self.replicas,
                                 held=len(self.pending), block_ms=block):
                    self._submit(msg.id, msg.meta)
            if self.engine.has_work():
                self._step()
            self._renew_leases()

    def _actor_seen(self) -> str:
        """What Redis says of the actor while its store does not answer (`last_beats`)."""
        try:
            return last_beats(read_heartbeats(self.queue.redis, self.env.job_name), "actor")
        except RedisError as err:  # only a note: the connect goes on
            return f"the actor's heartbeat not read ({err})"

    def _step(self) -> None:
        """One engine step, then publish what it finished. The requests in progress stay claimed while
        it runs (`holding`): one step can outlast `claimIdleSeconds` (model.compile's first step, tens
        of seconds to minutes; a loaded machine), and another replica reclaimed and generated them again."""
        with holding(self.queue, self.queue.streams.requests, GROUP, self.env.worker_id, list(self.pending),
                     alive=self._live):
            results = self.engine.step()
        self._publish(results)

    def _live(self) -> bool:
        """The health probe's test: the loop (or a compile's covering thread, for at most
        `startupDeadlineSeconds`) beat within `progressDeadlineSeconds`; a stuck step's claim lapses."""
        return self.heartbeat.age_s() <= self.progress_deadline_s

    def _renew_leases(self) -> None:
        """Keep the requests in progress ours across many short steps (`_step` covers a long one)."""
        if self.pending and time.monotonic() - self._last_lease > self._lease_every:
            self.queue.touch(self.queue.streams.requests, GROUP, self.env.worker_id, list(self.pending))
            self._last_lease = time.monotonic()

    def _drain(self) -> None:
        while self.engine.has_work():
            self._step()
            self._renew_leases()
            self.heartbeat.beat()

    def _submit(self, entry_id: str, entry: dict) -> None:
        """Hand a requests-stream entry's samples (a prompt group, or a held-out cohort) to the engine."""
        if entry_id in self.pending:  # redelivered to us while we still work on it
            return
        todo = entry_requests(entry, {"entry": entry_id}, skip=self._published_before)
        if not todo:
            self.queue.ack(self.queue.streams.requests, GROUP, [entry_id])
            return
        self.pending[entry_id] = {"left": len(todo), "started": time.time()}
        for sample in todo:
            self.engine.submit(sample)

    def _published_before(self, sample_id: str) -> bool:
        """True for a sample a predecessor published (not generated again); its ledger line is
        written here if that predecessor died before writing it."""
        if not self.queue.is_done("rollout", sample_id):
            return False
        self.ledger.record(sample_id, published=False)
        return True

    def _publish(self, results: list[SampleResult]) -> None:
        now = time.time()
        for r in results:
            m = r.request.meta
            meta = SampleMeta(
                sample_id=r.request.sample_id, kind=m["kind"], step=m["step"], group_id=m["group_id"],
                prompt=r.request.prompt, prompt_ids=list(r.request.prompt_ids), policy_version=r.policy_version,
                noise_level=r.request.noise_level, sde_type=r.request.sde_type, worker=self.env.worker_id,
                generated_at=now, rollout_seconds=now - self.pending[m["entry"]]["started"],
            ).model_dump()
            tensors = {"x0": r.x0, "latents": r.latents, "log_probs": r.log_probs, "sigmas": r.sigmas}
            # the sync-mode count is part of the atomic publish: a kill between two calls lost it for good
            count = self.queue.records.generated_key(m["step"]) if m["kind"] == "train" else None
            picture = {"image": r.image} if r.media is None else {"media": r.media}  # media: one blob, raw bytes
            published = self.queue.publish(self.queue.streams.samples, meta, tensors, **picture,
                                           done_kind="rollout", count_key=count)
            self.heartbeat.beat(progressed=True)
            if published is None:  # not a predecessor's (`_submit` skips those): two live workers generated it
                log.warning("sample %s was published already by another worker: generated twice",
                            r.request.sample_id)
            self.ledger.record(r.request.sample_id, published is not None, policy_version=r.policy_version,
                               latent=list(r.x0.shape))
            entry = self.pending[m["entry"]]
            entry["left"] -= 1
            if entry["left"] == 0:
                del self.pending[m["entry"]]
                self.queue.ack(self.queue.streams.requests, GROUP, [m["entry"]])

    def close(self) -> None:
        """Release the weight-sync connection and the Redis client (deregistering only when the job
        goes on without this worker: after the job's `stop` the actor's store is gone or going)."""
        self._uncompiling()
        if self.replica is not None:
            self.replica.send(STOP)
        if self.receiver is not None:
            self.receiver.close(leave=not self.job_ended)
        self.ledger.close()
        self.queue.close()
