"""The actor role: batches in, updated weights out to every rollout worker.

Start-up: load the model (and the latest checkpoint when resuming), host the weight-sync store,
wait for the job's rollout workers to register, broadcast the starting weights (so a zero-module
bind fails the job before any rollout), then publish `actor_ready`.

Per `TrainRequest`: load the samples' tensors → one algorithm step → broadcast the new policy to
every rollout worker (they verify and acknowledge) → checkpoint if asked → `TrainDone` with the
metrics → delete the batch's tensors. A request seen twice (redelivery) is trained once and its
`TrainDone` published again (a successor controller may be waiting for it). A batch whose samples'
tensors are gone (expired after `spec.transferQueue.tensorTtlSeconds` while it waited: a slow, stopped
or restarted actor) is not trained: `TrainLost` names them and the controller regenerates their groups
and hands the step again (it was `MissingTensors`, a crash every restart met again). It never names none: a
rank's failed read of a key the leader then finds makes every rank read the batch again (an empty `TrainLost`
left the controller waiting forever). The leader measures the batch's oldest tensor's age when it reads it and,
at a checkpoint, that of the batches the checkpoint covers (`batch_tensor_age_seconds`,
`replay_tensor_age_seconds`: the controller warns near `tensorTtlSeconds`).

Durability: the actor's state is the authority on progress. It trains step n only right after
n - 1 (a redelivered or replayed request of a trained step is skipped), and after every step
sets `kv:actor_state` = {step, policy_version, data_position}, which a (re)started controller
continues from. A batch's tensors and its `TrainRequest` (hash `kv:trainreqs`, written by the
controller before it hands the batch over) are kept until a checkpoint covers the step; an actor
that starts from checkpoint c (`OMNIRL_RESUME`) first replays the stored requests c+1, c+2, … —
the same samples and advantages, so the same updates — before it broadcasts its weights, and then
publishes their `TrainDone` again for a controller that outlived the old actor. SIGTERM:
the step in hand finishes without a broadcast (the rollout workers may be stopping too; a stop of
the whole job used to leave the actor waiting for them until it was killed, its checkpoint
unwritten), a checkpoint of the last trained step is written, `run` returns.

Several actor ranks (RANK / WORLD_SIZE, FSDP2): every rank reads every `TrainRequest` through
its own consumer group, loads the whole batch and trains its share of the micro-batches
(`omnirl.actor.ranks`); the gathers for weight sync and checkpoints are collectives. Rank 0, the
leader, alone hosts the weight-sync store, broadcasts, writes checkpoints and the ledger, and
publishes `TrainDone`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch
from safetensors import SafetensorError

from omnirl.actor.batch import TrainSample
from omnirl.actor.ranks import Ranks
from omnirl.actor.trainer import Trainer
from omnirl.api.errors import ConfigError, config_errors
from omnirl.api.messages import RoleFailure, TrainDone, TrainItem, TrainLost, TrainRequest
from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.models.attention import select_attention
from omnirl.models.compile import while_compiling
from omnirl.models.policy_io import LATEST, step_order
from omnirl.models.registry import adapter_options, load_adapter
from omnirl.system.disk import append_lines
from omnirl.telemetry.cpu import cpu_wait_seconds
from omnirl.transfer import MissingTensors, TransferQueue
from omnirl.transfer.heartbeat import Heartbeat
from omnirl.transfer.records import ActorReady, ActorState
from omnirl.weight_sync import SyncAborted, WeightSender

log = logging.getLogger("omnirl.actor")
GROUP = "actor"


class BatchLost(Exception):
    """Tensors of a `TrainRequest`'s samples are gone (every rank raises it): the step is not trained."""

    def __init__(self, lost: TrainLost) -> None:
        super().__init__(lost.reason)
        self.lost = lost


def nothing_to_resume(latest: Path) -> str:
    """The one line of `OMNIRL_RESUME=1` without a checkpoint at `latest` (a dangling link named):
    what is missing and the fix. It was a FileNotFoundError traceback after the model had loaded, exit 1."""
    gone = f" (it names {os.readlink(latest)}, which is gone)" if latest.is_symlink() else ""
    return (f"OMNIRL_RESUME=1 but there is no checkpoint to resume from: {latest} does not exist{gone}; set "
            f"OMNIRL_RESUME=auto (resume when a checkpoint exists, else start fresh) or 0 (start fresh), or point "
            f"OMNIRL_OUT (omnirl role --out) at the run directory that holds spec.checkpoint.dir")


class ActorService:
    """One actor rank (the leader, rank 0, or a follower)."""

    def __init__(self, job: RLJob, env: RoleEnv, *, resume: bool = False) -> None:
        spec = job.spec
        self.spec, self.env = spec, env
        self.queue = TransferQueue.for_job(env.job_name, spec.transferQueue, env.redis_url)
        self.device = torch.device(env.device)
        layout = spec.roles.actor.parallel
        self.ranks = Ranks.init(env.rank, env.world_size, env.master_addr, env.master_port, str(self.device),
                                ulysses=layout.ulysses)
        self.ckpt_root = Path(env.out_dir) / spec.checkpoint.dir
        # the leader's view decides (a follower without the checkpoint volume then fails loudly, not hangs)
        resuming = resume and self.ranks.max(float(self.ranks.leader and (self.ckpt_root / LATEST).exists())) > 0
        if resume and not resuming:  # before the model loads: the same on every restart
            raise ConfigError(nothing_to_resume(self.ckpt_root / LATEST))
        with config_errors("spec.model.path"):  # the model's own files: wrong on every restart
            adapter = load_adapter(spec.model.family, spec.model.path, device=self.device, dtype=spec.model.dtype,
                                   **adapter_options(spec))
        select_attention(adapter, spec.model, self.device)
        if layout.encoderTensor > 1:  # each Ulysses group encodes its own micro-batches: split inside it
            from omnirl.models.parallel.encoder_tp import shard_adapter_encoders

            with config_errors("spec.roles.actor.parallel.encoderTensor"):
                shard_adapter_encoders(adapter, layout.encoderTensor, self.device.type)
        self.trainer = Trainer(adapter, spec, self.device, ranks=self.ranks)
        self.version = 0
        self.trained_step = -1  # the last step whose update is in the weights
        self.checkpointed_step = -1
        self.data_position: list = [0, 0]
        if resuming:
            with config_errors(f"checkpoint {self.ckpt_root / LATEST}", OSError, ValueError, KeyError, SafetensorError,
                               fix="restore it, or start a fresh run in another --out (the same file fails "
                               "every restart)"):
                state = self.trainer.load(self.ckpt_root / LATEST)
            self.version = int(state["policy_version"])
            self.trained_step = self.checkpointed_step = int(state["step"])
            self.data_position = list(state.get("data_position", [0, 0]))
            log.info("resumed from %s at step %d, policy_version %d", self.ckpt_root / LATEST, self.trained_step,
                     self.version)
        self.records = self.queue.records  # kv:actor_state, kv:trainreqs, kv:trained … (transfer/records.py)
        self._check_reach()
        self.heartbeat = Heartbeat(self.queue.redis, env.job_name, "actor", env.worker_id,
                                   ttl_s=2 * job.spec.failurePolicy.progressDeadlineSeconds)
        self.terminated = False
        self._run_id = f"{env.worker_id}-{os.getpid()}-{int(time.time() * 1000)}"
        self._base_step = self.trained_step
        leader = self.ranks.leader
        self.sender = WeightSender(env.weight_sync_host, env.weight_sync_port, device=str(self.device),
                                   backend=env.weight_sync_backend or None, abort=lambda: self.terminated) \
            if leader else None
        if self.sender is not None:
            log.info("actor rank 0 on %s: weight sync over %s", self.device, self.sender.backend)
        self._rollout: dict[str, torch.Tensor] = {}  # the leader's gathered rollout tensors
        # seconds of tensorTtlSeconds the last batch's oldest tensor had lived when read, and the oldest tensor a
        # replay needed until the last checkpoint (`_forget_through`): metrics, the controller warns near the TTL
        self._batch_age, self._replay_age = 0.0, None
        self._ledger = None
        if leader:
            path = Path(env.out_dir) / "ledger" / f"actor-{env.worker_id}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._ledger = append_lines(path)  # a line a full disk cut is dropped (system/disk.py)
            self._ckpt_ledger = append_lines(path.parent / f"checkpoints-{env.worker_id}.jsonl")
        # model.compile compiles at the first step (train, no-grad and reference graphs) and on a new shape
        bound = spec.failurePolicy.startupDeadlineSeconds
        self._uncompiling = while_compiling(lambda: self.heartbeat.start_covering(bound, startup=True))

    def terminate(self) -> None:
        """SIGTERM: finish the step in hand, checkpoint the last trained step, return from `run`."""
        self.terminated = True

    def run(self) -> None:
        """Serve until the `stop` flag is set. Errors are published as `RoleFailure`, then raised."""
        try:
            if self.ranks.leader:  # until this actor is ready, a new controller must not read the old one's state
                self.records.clear_actor_ready()
            self._replay()
            self._start()
            self._announce()
            control = self.queue.streams.control
            group = GROUP if self.ranks.leader else f"{GROUP}-rank{self.ranks.rank}"  # followers see every request
            self.queue.ensure_group(control, group)
            while not self.records.stop_requested():
                if self.ranks.max(float(self.terminated)) > 0:
                    self._checkpoint_on_terminate()
                    return
                self.heartbeat.beat()
                if self.sender is not None:
                    self.sender.serve_new_members(self._rollout, self.version)
                for msg in self._next_control(control, group):
                    if msg.meta.get("type") == "train":
                        try:
                            self._train(TrainRequest.model_validate(msg.meta))
                        except BatchLost as lost:
                            self._report_lost(lost.lost)
                    self.queue.ack(control, group, [msg.id])
        except SyncAborted:  # SIGTERM while a sync waited for rollout workers that are stopping too
            self._checkpoint_on_terminate()
        except Exception as err:
            self._fail(f"{type(err).__name__}: {err}")
            raise

    def _next_control(self, control: str, group: str) -> list:
        """The next control entry (or none), the same one on every rank.

        Each rank reads its own group of the one control stream, so the ranks see the same entries
        in the same order; but a 200 ms read can end just before an entry arrives on one rank and
        just after on another, and the rank that got it would start the step's collectives while
        the others called the loop's (a gloo size mismatch: the job aborts). The ranks agree
        whether one arrived; a rank that missed it reads it, as it is in the stream already.
        """
        msgs = self.queue.consume(control, group, self.env.worker_id, count=1, block_ms=200)
        if self.ranks.max(float(bool(msgs))) == 0 or msgs:  # every rank calls max (world 1: no collective)
            return msgs
        while not msgs:
            self.heartbeat.beat()
            msgs = self.queue.consume(control, group, self.env.worker_id, count=1, block_ms=1000)
        return msgs

    def _check_reach(self) -> None:
        """At start-up: the checkpoint this rank starts from plus the stored batches after it must reach
        the step the job's actor had trained (`kv:actor_state`), or `_replay` cannot rebuild it.

        Raises:
            ConfigError: naming the checkpoint path, what is missing and the fix. The state cannot
                come back by restarting (it was a RuntimeError in `_replay`: the launcher restarted
                the job until `maxRestarts`). An older `step-*` checkpoint cannot stand in: the
                batches after it were deleted when the newer one was written (`_save`).
        """
        before = self.records.actor_state()
        if before is None or before.step <= self.trained_step:
            return
        wanted = range(self.trained_step + 1, before.step + 1)
        reach = next((step - 1 for step in wanted if not self.records.has_batch(step)), wanted[-1])
        if reach == wanted[-1]:
            return
        latest = self.ckpt_root / LATEST
        if self.trained_step >= 0:
            start = f"it holds step {self.trained_step}"
        elif latest.is_symlink() and not latest.exists():  # the step directory it named was deleted
            start = f"it names {os.readlink(latest)}, which is gone"
        elif latest.exists():
            start = "it is not a complete checkpoint"
        else:
            start = "there is none"
        batches = "no stored batch follows it" if reach == self.trained_step else \
            f"the stored batches after it reach step {reach} only"
        older = sorted((p.name for p in self.ckpt_root.glob("step-*") if p.resolve() != latest.resolve()),
                       key=lambda name: step_order(name) or (-1, 0))
        older = f" (the older {', '.join(older)} cannot stand in: the batches after it were deleted)" if older else ""
        stopped = self.records.stopped_run()
        if stopped is not None:  # e.g. an RLJob started on the Redis where an omnirl run of its name was stopped
            raise ConfigError(
                f"checkpoint {latest}: the job's actor had trained step {before.step}, but {start}: the keys of "
                f"job {self.env.job_name!r} on this Redis hold the pending work of an omnirl run that was stopped "
                f"before it finished ({stopped.get('host')}:{stopped.get('out')}); continue that run with omnirl run "
                f"JOB --out {stopped.get('out')} --resume, or give this job another metadata.name (restarting cannot "
                "help)")
        raise ConfigError(
            f"checkpoint {latest}: the job's actor had trained step {before.step}, but {start}, and {batches}"
            f"{older}: the checkpoint directory was lost or belongs to another run; restore it (on Kubernetes: "
            "spec.storage, a persistent volume), or start a fresh run in another --out (restarting cannot help)")

    def _replay(self) -> None:
        """Train the stored requests after the checkpoint this rank started from (see the module doc).

        Raises:
            RuntimeError: a predecessor trained further than this checkpoint plus the stored
                batches reach (`_check_reach` refuses that at start-up already: a guard).
        """
        while True:
            batch = self.records.handed_batch(self.trained_step + 1)
            if self.ranks.max(float(batch is not None)) == 0:  # the ranks share one Redis: they agree
                before = self.records.actor_state()
                if before is not None and before.step > self.trained_step:
                    raise RuntimeError(
                        f"the job's actor had trained step {before.step}, but {self.ckpt_root} and the stored "
                        f"batches reach step {self.trained_step} only: the checkpoint directory was lost "
                        "(mount it from a persistent volume) or belongs to another run")
                return
            req = batch.request
            # -1: no checkpoint saved yet (the step replays from the model's weights), not a step
            after = "no checkpoint yet" if self.checkpointed_step < 0 else f"after checkpoint step {self.checkpointed_step}"
            log.info("replaying step %d from its stored request (%s)", req.step, after)
            try:
                self._train(req, replay=True)
            except BatchLost as lost:
                before = self.records.actor_state()
                if before is not None and before.step >= req.step:  # its update cannot be rebuilt
                    raise ConfigError(
                        f"spec.transferQueue.tensorTtlSeconds: the job's actor had trained step {before.step}, "
                        f"but step {req.step}'s batch, which checkpoint {self.ckpt_root / LATEST} does not cover, "
                        f"cannot be replayed: {lost.lost.reason}; raise tensorTtlSeconds above the time between two "
                        "checkpoints (spec.checkpoint.everySteps) and start a fresh run in another --out "
                        "(restarting cannot help)") from None
                self._report_lost(lost.lost)  # handed over, never trained: the controller regenerates it
                return

    def _announce(self) -> None:
        """Publish again every `TrainDone` whose metrics line no controller has written (`kv:trained`:
        replayed steps, a step trained after SIGTERM), once the rollout workers hold these weights:
        a controller that outlived the old actor may be waiting for one (a new one skips them)."""
        if self.ranks.leader:
            for step in self.records.kept_result_steps():
                self._publish_kept(step)

    def _republish(self, req: TrainRequest) -> None:
        """Publish a trained step's `TrainDone` again: from `kv:trained` while the controller has not
        written its line, else rebuilt from the request (without metrics: the line exists)."""
        if not self._publish_kept(req.step):
            self._publish_done(TrainDone(step=req.step, policy_version=req.policy_version + 1, metrics={}))

    def _publish_kept(self, step: int) -> bool:
        """Publish `step`'s `TrainDone` as kept in `kv:trained`; False when it is gone (the controller
        has written the step's metrics line and dropped it)."""
        done = self.records.kept_result(step)
        if done is not None:
            self._publish_done(done)
        return done is not None

    def _publish_done(self, done: TrainDone) -> None:
        self.queue.publish(self.queue.streams.control, done.model_dump())

    def _checkpoint_on_terminate(self) -> None:
        if self.trained_step > self.checkpointed_step:
            self._save(self.trained_step, self.data_position)
            log.info("SIGTERM: checkpoint of step %d written", self.trained_step)

    def _start(self) -> None:
        self._gather_rollout()
        if self.sender is None:
            return
        want = self.spec.roles.rollout.replicas
        limit = self.spec.failurePolicy.startup_limit_s  # a worker registers once it has loaded its model
        deadline = time.monotonic() + limit
        while len(self.sender.members()) < want:
            if self.records.stop_requested() or self.terminated:
                return
            self.heartbeat.beat()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.sender.members())} of {want} rollout workers registered in "
                                   f"{limit:g} s (failurePolicy.startupDeadlineSeconds + progressDeadlineSeconds)")
            time.sleep(0.1)
        report = self.sender.broadcast(self._rollout, self.version)
        log.info("initial weights v%d to %s in %.3f s", self.version, report.receivers, report.seconds)
        self._publish_state()
        self.records.set_actor_ready(ActorReady(self.version, self.trained_step))

    def _publish_state(self) -> None:
        self.records.set_actor_state(ActorState(self.trained_step, self.version, self.data_position))

    def _train(self, req: TrainRequest, replay: bool = False) -> None:
        done = req.step <= self.trained_step
        if self.ranks.agree(req.step, len(req.items), done):  # the leader decides; all ranks on one request
            log.warning("step %d already trained (redelivered request) — skipped, its result published again",
                        req.step)
            if self.ranks.leader:  # the sender may be a successor controller waiting for it
                self._republish(req)
            return
        if req.step != self.trained_step + 1:
            raise RuntimeError(f"train request for step {req.step} after step {self.trained_step}: a step is "
                               "missing (its stored request expired?)")
        t0 = time.perf_counter()
        samples = self._load_batch(req)
        t_load, wait0 = time.perf_counter(), cpu_wait_seconds()
        metrics = self.trainer.train_step(samples, req.step)
        t_train, wait1 = time.perf_counter(), cpu_wait_seconds()
        self.version = req.policy_version + 1
        self.trained_step = req.step
        self.data_position = list(req.controller_state.get("data_position", self.data_position))
        self.heartbeat.beat(progressed=True)
        if self._ledger is not None:
            for item in req.items:
                self._ledger.write(json.dumps({"sample_id": item.sample_id, "step": req.step, "run": self._run_id,
                                               "base": self._base_step}) + "\n")
        metrics.update(load_seconds=t_load - t0, train_seconds=t_train - t_load, batch_tensor_age_seconds=self._batch_age)
        if wait0 is not None and wait1 is not None:  # contention, not work: other processes held the cores
            metrics["train_cpu_wait_seconds"] = wait1 - wait0
        if not replay and self.ranks.max(float(self.terminated)) > 0:
            self._trained_at_stop(req, metrics)  # the rollout workers may be gone already: no broadcast
            return
        if self.ranks.leader:  # before the checkpoint: a successor resuming from it republishes these metrics
            self._note_trained(self._result(req, metrics))
        if replay:
            if req.checkpoint:
                self._save(req.step, self.data_position)
            return
        self._gather_rollout()
        ckpt = None
        if req.checkpoint:
            path = self._save(req.step, self.data_position, gathered=True)
            ckpt = None if path is None else str(path)
        if self.sender is None:  # a follower: the leader reports, syncs and cleans up
            return
        t_sync = time.perf_counter()
        try:
            report = self.sender.broadcast(self._rollout, self.version)
        except SyncAborted:
            self._trained_at_stop(req, metrics)
            return
        metrics.update(sync_seconds=time.perf_counter() - t_sync, sync_bytes=float(report.bytes))
        if req.checkpoint and self._replay_age is not None:
            metrics["replay_tensor_age_seconds"] = self._replay_age
        self._publish_state()
        done = self._result(req, metrics, checkpoint=ckpt)
        self._note_trained(done)
        self._publish_done(done)

    def _trained_at_stop(self, req: TrainRequest, metrics: dict) -> None:
        """SIGTERM mid-step: the step is trained but not broadcast. Its state and result are kept for
        the successor (which broadcasts these weights, then announces the result); the run loop
        writes the checkpoint next."""
        self._publish_state()
        if self.ranks.leader:
            self._note_trained(self._result(req, metrics))
        log.info("SIGTERM: step %d trained, not broadcast (its checkpoint follows)", req.step)

    def _result(self, req: TrainRequest, metrics: dict, checkpoint: str | None = None) -> TrainDone:
        """The `TrainDone` of `req`, just trained: this actor's new version, the metrics as floats."""
        return TrainDone(step=req.step, policy_version=self.version, checkpoint=checkpoint,
                         metrics={k: float(v) for k, v in metrics.items()})

    def _note_trained(self, done: TrainDone) -> None:
        """`kv:trained` keeps each step's result until the controller has written its metrics line. Noted as
        soon as the step is trained (again with the sync's numbers after the broadcast): an actor killed after
        the step's checkpoint resumes past the step and can only republish what is kept here."""
        self.records.note_result(done)

    def _save(self, step: int, data_position: list, gathered: bool = False) -> Path | None:
        """Checkpoint `step` (a collective with several ranks); then the batches it covers are
        no longer needed for a replay: their stored requests and tensors are deleted."""
        if not gathered:
            self._gather_rollout()
        state = {"step": step, "policy_version": self.version, "data_position": data_position,
                 "job": self.env.job_name, "family": self.spec.model.family}  # `omnirl export` checks them
        path = self.trainer.save(self.ckpt_root, step, state, policy=self._rollout)
        self.checkpointed_step = step
        if self.ranks.leader:
            self._ckpt_ledger.write(json.dumps({"checkpoint": step, "run": self._run_id}) + "\n")
            self._forget_through(step)
        return path

    def _forget_through(self, step: int) -> None:
        """Delete the stored batches (requests and tensors) of the steps through `step`, which a checkpoint
        covers now; `_replay_age` = the oldest of their tensors' age (`tensorTtlSeconds` when one had expired):
        how long a replay needed them to live."""
        ages = []
        for stored, batch in self.records.handed_batches().items():
            if stored <= step:
                keys = [item.tensor_key for item in batch.request.items]
                ages += [self.queue.tensor_ttl_s if a is None else a for a in self.queue.ages(keys)]
                self.queue.delete_tensors(keys)
                self.records.drop_batch(stored)
        self._replay_age = max(ages, default=None)

    def _gather_rollout(self) -> None:
        """The rollout policy's full tensors (a collective with several ranks); the leader keeps them."""
        self._rollout = self.trainer.rollout_tensors(keep=self.ranks.leader)

    def _load_batch(self, req: TrainRequest) -> list[TrainSample]:
        """Every sample of `req` with its tensors, in order.

        A rank that could not read a key the leader then finds in Redis (none absent) reads the batch again, once:
        a `TrainLost` naming no sample gave the controller nothing to regenerate, and it waited for the step
        forever (the actor had acked the request).

        Raises:
            BatchLost: on every rank when any rank found a sample's tensors gone; the leader's names every
                sample whose key is absent by now (a key can expire between two ranks' reads), never none.
            RuntimeError: a rank failed to read keys that Redis holds twice in a row (a role failure: the
                failure policy restarts the actor, which gets the request again).
        """
        keys = {item.tensor_key: item.sample_id for item in req.items}
        for attempt in range(2):
            samples, gone = [], 0
            for item in req.items:
                try:
                    samples.append(self._load(item))
                except MissingTensors:
                    gone += 1
            if self.ranks.max(float(gone)) == 0:
                if self.ranks.leader:  # how near the batch came to tensorTtlSeconds (the controller warns)
                    self._batch_age = max((a for a in self.queue.ages(list(keys)) if a is not None), default=0.0)
                return samples
            absent = self.queue.absent(list(keys)) if self.ranks.leader else []
            if self.ranks.max(float(len(absent))) > 0:  # every rank calls it; the leader's count decides
                ttl_s = self.queue.tensor_ttl_s
                reason = (f"{len(absent)} of {len(req.items)} tensor keys were gone when the actor read step "
                          f"{req.step}'s batch (e.g. {absent[0] if absent else '?'}): expired after spec."
                          f"transferQueue.tensorTtlSeconds ({ttl_s:g} s), or deleted")
                raise BatchLost(TrainLost(step=req.step, samples=[keys[k] for k in absent], reason=reason))
            if attempt == 0:
                log.warning("step %d: a rank could not read tensor keys of the batch that Redis holds (none is "
                            "absent now): reading the batch again", req.step)
        raise RuntimeError(f"step {req.step}: a rank could not read tensor keys of its batch twice although Redis "
                           "holds every one of them (do all actor ranks use the same spec.transferQueue.redisUrl?)")

    def _report_lost(self, lost: TrainLost) -> None:
        """The leader tells the controller which samples of the step it could not train (one warning line
        naming the TTL field and the fix); the step stays untrained, its request acknowledged."""
        if not self.ranks.leader:
            return
        log.warning("step %d not trained: %s; the controller regenerates their groups and hands the step again. "
                    "Raise spec.transferQueue.tensorTtlSeconds above the longest a sample waits to be trained (a "
                    "slow, stopped or restarted actor; fully-async steps generated ahead)", lost.step, lost.reason)
        self.queue.publish(self.queue.streams.control, lost.model_dump())

    def _load(self, item: TrainItem) -> TrainSample:
        t = self.queue.load_tensors(item.tensor_key)
        return TrainSample(
            sample_id=item.sample_id, group_id=item.group_id, prompt_ids=item.prompt_ids, advantage=item.advantage,
            x0=t["x0"], latents=t["latents"], log_probs=t["log_probs"], sigmas=t["sigmas"],
            noise_level=item.noise_level, sde_type=item.sde_type,
        )

    def _fail(self, reason: str) -> None:
        try:
            msg = RoleFailure(role="actor", worker=self.env.worker_id, reason=reason)
            self.queue.publish(self.queue.streams.control, msg.model_dump())
        except Exception as err:  # the original error is re-raised by run(); this one is logged
            log.error("could not publish the actor failure (%s): %s", reason, err)

    def close(self) -> None:
        """Close the weight-sync store, the ledger, the Redis client and the ranks' process group."""
        self._uncompiling()
        if self.sender is not None:
            self.sender.close()
        if self._ledger is not None:
            self._ledger.close()
            self._ckpt_ledger.close()
        self.queue.close()
        self.ranks.close()

