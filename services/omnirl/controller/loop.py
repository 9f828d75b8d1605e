"""The single controller: draws prompts, dispatches, groups, computes advantages, hands batches
to the actor, bumps the policy version, validates and reports (docs/architecture.md §2).

Pipelining (`spec.pipeline.mode`):
- `sync`: reward workers start a step's scoring only after all its rollouts exist (baseline).
- `async-reward`: each sample is scored as soon as it appears; still on-policy.
- `fully-async`: step n+1's requests go out as soon as step n's batch is handed to the actor,
  so rollout overlaps training; every sample carries its policy_version and a group staler than
  `maxStaleness` is refilled (`drop`), or requests are never published ahead (`wait`).

Restarts (docs/reliability.md): the controller keeps no state of its own
that Redis (AOF) and the actor do not hold. It starts at the step after the actor's last trained
one (`kv:actor_state`: step, policy version, data position — the checkpoint's after an actor
restart); it redraws that step's prompts from the same data position, so group and sample ids and
seeds are the predecessor's; requests already published (`kv:expected:{step}`) are not published
again; the predecessor's scores stay pending in the `controller` group until their step is handed
to the actor and are taken over at start, so generated and scored groups are reused, not
regenerated. Before a batch is handed over, its `TrainRequest` (and the step's numbers) is stored
in `kv:trainreqs`; the actor drops it once a checkpoint covers the step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from omnirl.algorithms import group_advantages
from omnirl.algorithms.plan import planner_for
from omnirl.api.errors import config_errors
from omnirl.api.ids import parse_group_id
from omnirl.api.loader import load_rljob
from omnirl.api.messages import GenerateRequest, SampleSeed, ScoreMeta, TrainDone, TrainItem, TrainLost, TrainRequest
from omnirl.api.runtime import VARIABLES, RoleEnv
from omnirl.api.seeds import derive, group_seeds
from omnirl.api.spec import GROUP_ATTEMPTS, RLJob
from omnirl.controller.data import PromptSource, read_prompts
from omnirl.controller.group_scoring import GroupScoring
from omnirl.controller.groups import StepBook, refill_request
from omnirl.controller.normalize import combine_step, component_stats, raw_totals
from omnirl.controller.report import REWARD_LATENCIES, Reporter
from omnirl.controller.stall import ScoreWait
from omnirl.controller.ttl import TtlWatch
from omnirl.controller.validation import SampleUnscored, Validator
from omnirl.models.registry import load_tokenizer
from omnirl.scorers.judges import check_written
from omnirl.transfer import Message, TransferQueue
from omnirl.transfer.heartbeat import Heartbeat, read_heartbeats, stalled_text
from omnirl.transfer.records import NO_PROGRESS, HandedBatch

log = logging.getLogger("omnirl.controller")
GROUP = "controller"
# a step's batch is handed again at most this often after a `TrainLost` naming no sample while Redis holds its keys
REASK_LIMIT = 3
# rounds of one validation: a round whose every sample was missing (tensors gone) is run once more
VALIDATION_ATTEMPTS = 2


class JobFailed(RuntimeError):
    """The job cannot go on (every group of a step failed, a validation sample failed...)."""


class RoleFailed(JobFailed):
    """A role reported its failure: the failure policy decides (a restart may help)."""


class Terminated(Exception):
    """SIGTERM arrived; `run` returns early (the role exits 143, the work stays in Redis)."""


def written_manifest(job: RLJob, env: RoleEnv) -> RLJob:
    """The manifest the exports carry: `OMNIRL_MANIFEST`'s, the job as the user wrote it (each judge the
    job runs a `reward[].server`), else `job`. `job` (the `--job` file) has the URL the launcher or the
    operator wired in instead (`scorers/judges.py::wire`): it dies with the run, and `omnirl eval` of an
    export's job.yaml failed on it (exit 2, "the scorer at http://127.0.0.1:PORT/v1/score does not answer").

    Raises:
        ConfigError: naming OMNIRL_MANIFEST: the file is missing or invalid, or is not `job` as written
            (`check_written`).
    """
    if not env.manifest:
        return job
    var = VARIABLES["manifest"]
    with config_errors(f"{var}={env.manifest}", fix=f"{var} is the job's manifest as written, next to the --job "
                       "file; the launcher (omnirl run) or the operator sets it"):
        written = load_rljob(env.manifest)
        check_written(written, job)
    return written


class Controller:
    """Runs the training loop of one RLJob. `run()` returns the final validation summary."""

    def __init__(self, job: RLJob, env: RoleEnv, *, resume: bool = False, steps: int | None = None) -> None:
        self.job, self.spec, self.env = job, job.spec, env
        spec = self.spec
        self.queue = TransferQueue.for_job(env.job_name, spec.transferQueue, env.redis_url)
        self.total_steps = steps if steps is not None else spec.algorithm.steps
        with config_errors("spec.model.path"):  # the model's own files: wrong on every restart
            tokenize = load_tokenizer(spec.model.family, spec.model.path)
        self.out = Path(env.out_dir)
        self.written = written_manifest(job, env)  # what exports carry: judges as the user wrote them
        self.start_step, self.version = 0, 0  # set from the actor's state in run()
        self.next_unpublished = 0  # the first step without a book: its scores wait in the inbox
        with config_errors("spec.data"):  # a missing prompt file or an untokenizable prompt: permanent
            self.data = PromptSource(read_prompts(spec.data.trainPrompts, "spec.data.trainPrompts"), tokenize,
                                     seed=spec.seed, shuffle=spec.data.shuffle)
        self.records = self.queue.records  # kv:actor_state, kv:trainreqs, kv:trained … (transfer/records.py)
        self.incarnation = self.records.next_controller_run()
        with config_errors("spec.data"):
            self.validator = Validator(self.queue, spec, tokenize, self.out, nonce=self.incarnation) \
                if spec.data.validationPrompts else None
        self.reporter = Reporter(self.out, env, job)
        if not env.export:
            log.info("no exports (OMNIRL_EXPORT=0: the actor's checkpoints are not on a volume shared with the "
                     "controller; on Kubernetes set spec.storage)")
        self.books: dict[int, StepBook] = {}
        self.inbox: dict[int, list[Message]] = {}  # scores of steps whose book does not exist yet
        self.trained: dict[int, TrainDone] = {}
        self.lost: dict[int, TrainLost] = {}  # the actor's latest `TrainLost` per step
        self._reasked: dict[int, int] = {}  # per step: batches handed again after a `TrainLost` naming no sample
        self.group_scoring = GroupScoring(spec.reward, self.queue)
        self.ttl_watch = TtlWatch(spec)  # measured waits near tensorTtlSeconds: one warning per kind
        self.score_wait = ScoreWait(self.queue, spec)  # a wait for scores that gets none: a line, repeated
        self.heartbeat = Heartbeat(self.queue.redis, env.job_name, "controller", env.worker_id,
                                   ttl_s=2 * job.spec.failurePolicy.progressDeadlineSeconds)
        self.terminated = False
        self._stalled, self._beats_read = "", 0.0

    def terminate(self) -> None:
        """SIGTERM: leave at the next wait; everything needed to continue is in Redis already."""
        self.terminated = True

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict | None:
        """Train `total_steps` steps; returns the run's `finish` record (`Reporter.finished`), or None after
        SIGTERM. Raises JobFailed."""
        try:
            return self._run()
        except Terminated:
            return None

    def _run(self) -> dict:
        q, streams = self.queue, self.queue.streams
        q.ensure_group(streams.scores, GROUP)
        q.ensure_group(streams.control, GROUP)
        self._wait_actor_ready()
        self._continue_from_actor()
        self.reporter.started(self.total_steps, self.start_step)  # first: the lines below count [k/N] against it
        self._report_missing()
        for m in q.take_over(streams.scores, GROUP, self.env.worker_id):  # a dead predecessor's scores
            self._file_score(m)
        q.take_over(streams.control, GROUP, self.env.worker_id)  # its control messages are history
        if self.validator and not self.reporter.has_validation(self.start_step) and (
                self.start_step == 0 or self._validation_due(self.start_step - 1)):
            self._validate(self.start_step)  # step 0, or a round the predecessor did not finish
        if self.env.export and 0 < self.start_step < self.total_steps:
            self._export_missed(self.start_step - 1)  # after that round, as the predecessor would have
        mode = self.spec.pipeline
        ahead = mode.mode == "fully-async" and mode.staleAction == "drop" and mode.maxStaleness >= 1
        for step in range(self.start_step, self.total_steps):
            while True:
                req, stats, t0 = self._hand_over(step)
                t_handed = time.time()
                if ahead and step + 1 < self.total_steps and step + 1 not in self.books:
                    self._publish_step(step + 1)
                done = self._wait_trained(step, req)
                while isinstance(done, TrainLost) and not done.samples:  # named none: look at the keys here
                    done = self._name_lost(done, req) or self._wait_trained(step, req)
                if isinstance(done, TrainDone):
                    break
                self._regenerate(done)  # the actor found tensors gone: refill their groups, hand the step again
            # a predecessor's scores of this step, kept for `_regenerate` until the step is trained
            self.queue.ack(streams.scores, GROUP, [m.id for m in self.inbox.pop(step, [])])
            self.version = done.policy_version
            stats.update(step_seconds=time.time() - t0, handoff_to_trained_seconds=time.time() - t_handed)
            self._report(step, stats, done)
            self.ttl_watch.trained(step, done.metrics)
            self._record_queues()
            if self.validator and self._validation_due(step):
                self._validate(step + 1)
            if done.checkpoint and self.env.export:  # after the validation of these weights, which it includes
                self._export(done.checkpoint)
        if self.validator and not self._validation_due(self.total_steps - 1):
            self._validate(self.total_steps)
        if self.start_step >= self.total_steps and self.env.export:
            self._export_latest()
        if self.env.export:  # the checkpoints are on our mount: the record names the run's last one
            self._note_latest_checkpoint()
        record = self.reporter.finished()
        # after the line: a role (this one included) starting from now on finds it and exits 0 at once
        self.records.set_finish_record(record)
        return record

    def _hand_over(self, step: int) -> tuple[TrainRequest, dict, float]:
        """Hand step `step`'s batch to the actor: the one a predecessor stored (`kv:trainreqs`) and the actor
        has not trained, else one collected now (its book — groups, scores, tensor keys — stored with it, for
        `_regenerate`). Returns the request, the step's numbers and when its requests were published."""
        streams = self.queue.streams
        stored = None if step in self.books else self.records.handed_batch(step)
        if stored is not None:  # handed over by the predecessor, not yet trained: hand it again
            req, stats, t0 = stored.request, stored.stats, time.time()
            self.data.seek(tuple(req.controller_state["data_position"]))
            self.next_unpublished = step + 1
            self.queue.publish(streams.control, req.model_dump())
            return req, stats, t0
        if step not in self.books:
            self._publish_step(step)
        book = self.books[step]
        t0, entry_ids = book.t_published, book.entry_ids
        items, stats = self._collect(step)
        checkpoint = self._checkpoint_due(step)
        req = TrainRequest(step=step, policy_version=self.version, items=items, checkpoint=checkpoint,
                           controller_state={"data_position": list(self.data.position)})
        self.records.store_batch(step, HandedBatch(req, stats, book.to_json()))
        self.records.store_step_stats(step, stats)
        self.queue.publish(streams.control, req.model_dump())
        self.queue.ack(streams.scores, GROUP, entry_ids)  # the batch is durable in kv:trainreqs now
        return req, stats, t0

    def _regenerate(self, lost: TrainLost) -> None:
        """The actor did not train `lost.step`: some samples' tensors were gone (expired after
        `spec.transferQueue.tensorTtlSeconds`, or deleted). Its book comes back from `kv:trainreqs` (this
        controller's or a predecessor's hand-over), the lost samples' scores are marked failed and
        `_collect`'s `_settle` refills their groups — the path of a sample the reward role found gone — while
        the other groups and their tensors are kept; the step is handed over again once they are complete.
        `kv:trainreqs` keeps the old batch until the new one replaces it: a successor meets the same loss.

        Raises:
            JobFailed: the stored batch holds no book (stored by an omnirl before this one).
        """
        step = lost.step
        stored = self.records.handed_batch(step)
        if stored is None or stored.book is None:
            raise JobFailed(f"step {step}: the actor found the tensors of {len(lost.samples)} sample(s) gone "
                            f"({lost.reason}) and the stored batch names no groups to regenerate; raise spec."
                            "transferQueue.tensorTtlSeconds and start the run again")
        book = StepBook.from_json(stored.book)
        self.books[step] = book
        self.next_unpublished = max(self.next_unpublished, step + 1)
        for m in self.inbox.pop(step, []):  # a predecessor's scores of refills it published already
            self._file_score(m)
        groups = book.fail_lost(lost.samples, lost.reason)
        log.warning("step %d: the actor found the tensors of %d sample(s) gone, not trained: regenerating %d "
                    "group(s) (%s)", step, len(lost.samples), len(groups), ", ".join(groups[:4]))

    def _name_lost(self, lost: TrainLost, req: TrainRequest) -> TrainLost | None:
        """A `TrainLost` of `req` naming no sample (an actor rank failed to read a key the leader then found, or an
        actor before 2026-12-03's) gave nothing to regenerate, and the step waited forever: the controller looks at
        the batch's tensor keys itself.

        Returns:
            A `TrainLost` naming the samples whose keys are gone (regenerated as usual), or None when Redis holds
            every key: then the same batch is handed again (the actor trains it, or answers again); None, and
            nothing handed, when the actor has trained the step meanwhile (the answer was an earlier copy's: its
            checkpoint deletes the batch's keys and stored request, which are no loss then).
        Raises:
            JobFailed: the actor answered so `REASK_LIMIT` times for this step (it cannot read its batch).
        """
        state = self.records.actor_state()
        if (state is not None and state.step >= lost.step) or not self.records.has_batch(lost.step):
            return None  # its TrainDone follows
        by_key = {item.tensor_key: item.sample_id for item in req.items}
        gone = self.queue.absent(list(by_key))
        if gone:
            reason = (f"{len(gone)} of {len(by_key)} tensor keys of step {lost.step}'s batch were gone (e.g. {gone[0]}): "
                      f"expired after spec.transferQueue.tensorTtlSeconds ({self.queue.tensor_ttl_s:g} s), or deleted")
            return TrainLost(step=lost.step, samples=[by_key[k] for k in gone], reason=reason)
        asked = self._reasked[lost.step] = self._reasked.get(lost.step, 0) + 1
        if asked > REASK_LIMIT:
            raise JobFailed(f"step {lost.step}: the actor reported its batch lost {asked} times naming no sample, but "
                            f"Redis holds every tensor key of it ({lost.reason}): an actor rank cannot read what the "
                            "leader reads; check that every actor rank reaches spec.transferQueue.redisUrl, then omnirl "
                            "run --resume")
        log.warning("step %d: the actor reported its batch lost naming no sample, but Redis holds every tensor key of "
                    "it: handing the same batch again (%d of %d)", lost.step, asked, REASK_LIMIT)
        self.queue.publish(self.queue.streams.control, req.model_dump())
        return None

    def _report(self, step: int, stats: dict, done: TrainDone) -> None:
        """Write the step's line, then forget the step's numbers kept for a successor. A result the
        actor rebuilt (no metrics: `kv:trained` was gone) means a predecessor wrote the line."""
        if done.metrics or not self.reporter.has_step(step):
            self.reporter.step(step, done.policy_version, stats, done)
        self.records.forget_step(step)

    def _report_missing(self) -> None:
        """Lines for steps trained before this controller started that its predecessor did not
        write (it died between the actor's result and the line); their wall-clock numbers are
        the predecessor's, measured up to its hand-off, and a step it never timed has none (not 0 s:
        that made 6.4e10 img/s on the console and the images-per-second gauge)."""
        for step, done in self.records.kept_results().items():
            stats = self.records.step_stats(step)
            if step >= self.start_step or self.reporter.has_step(step) or stats is None:
                continue
            self._report(step, stats, done)

    def _continue_from_actor(self) -> None:
        """Start at the step after the actor's last trained one, from its data position and version."""
        state = self.records.actor_state() or NO_PROGRESS
        self.start_step = self.next_unpublished = state.step + 1
        self.version = state.policy_version
        self.data.seek(tuple(state.data_position))
        if self.start_step:
            log.info("continuing at step %d (policy_version %d) from the actor's state", self.start_step,
                     self.version)
    def _record_queues(self) -> None:
        """Depth (entries held) and lag (not yet delivered to the consumer group) of each data stream,
        for the pipeline dashboard's queue panels; a group its consumer has not created yet is skipped."""
        s = self.queue.streams
        for name, stream, group in (("requests", s.requests, "rollout"), ("samples", s.samples, "reward"),
                                    ("scores", s.scores, GROUP)):
            try:
                lag = self.queue.lag(stream, group)
            except ValueError:
                continue
            self.reporter.meters.record_queue(name, self.queue.stream_length(stream), lag)

    # ------------------------------------------------------------------ dispatch
    def _publish_step(self, step: int) -> None:
        """Draw the step's prompts and publish its requests — unless a predecessor published them
        (`expected:{step}` exists): then only the book is rebuilt (same ids, same seeds)."""
        algo = self.spec.algorithm
        prompts = self.data.draw(algo.promptsPerStep)
        published = self.records.expected(step) is not None
        book = StepBook(step, t_published=time.time())
        self.next_unpublished = step + 1
        plan = planner_for(algo.name).rollout(algo, window_seed=derive(self.spec.seed, "window", step=step))
        expected = 0
        sizes = self.spec.model.resolutions
        for p in prompts:
            key = f"{step}:{p.index}"
            # model.resolutions in turn: counted over the groups kept, so a repeated prompt skips no size
            size = self.spec.model.resolution_for(step + len(book.groups)) if sizes else None
            seeds = [SampleSeed(sample_id=f"{key}:{i}", seed=seed)
                     for i, seed in enumerate(self._seeds(step, p.index, 0))]
            req = GenerateRequest(kind="train", step=step, group_id=key, prompt=p.text, prompt_ids=p.ids,
                                  samples=seeds, num_steps=algo.sampling.numSteps, window=list(plan.window),
                                  noise_level=plan.noise_level, sde_type=plan.sde_type, shift=algo.sampling.shift,
                                  guidance_scale=algo.sampling.guidanceScale,
                                  resolution=None if size is None else list(size))
            if key in book.groups:  # the same prompt twice in one step (tiny prompt files)
                continue
            book.add(key, req)
            expected += len(seeds)
        self.books[step] = book
        if not published:
            for group in book.groups.values():
                self.queue.publish(self.queue.streams.requests, group.request.model_dump())
            self.records.set_expected(step, expected)  # last: the requests are all out
        for m in self.inbox.pop(step, []):
            self._file_score(m)

    def _seeds(self, step: int, prompt: int, attempt: int) -> list[int]:
        """The noise seeds of a group's samples (api/seeds.py)."""
        return group_seeds(self.spec.seed, step, prompt, attempt, self.spec.algorithm.groupSize)

    # ------------------------------------------------------------------ collection
    def _collect(self, step: int) -> tuple[list[TrainItem], dict]:
        book = self.books[step]
        self.score_wait.begin(f"step {step}")
        while True:
            self._check_terminated()
            self._pump()
            self._settle(book)
            if book.complete:
                break
            groups = book.groups.values()
            self.score_wait.check(sum(len(g.expected & set(g.scores)) for g in groups),
                                  sum(len(g.expected) for g in groups))
        if not book.groups:
            raise JobFailed(f"step {step}: every group failed: {book.failures[:3]}")
        return self._advantages(book)

    def _pump(self, block_ms: int = 200) -> None:
        """Read scores and control messages into the books."""
        q, streams = self.queue, self.queue.streams
        self.heartbeat.beat()
        self._watch_roles()
        msgs = q.consume(streams.scores, GROUP, self.env.worker_id, count=256, block_ms=block_ms)
        for m in msgs:
            self._file_score(m)
        ctl = q.consume(streams.control, GROUP, self.env.worker_id, count=16, block_ms=0)
        for m in ctl:
            kind = m.meta.get("type")
            if kind == "trained":
                done = TrainDone.model_validate(m.meta)
                self.trained[done.step] = done
            elif kind == "lost":
                lost = TrainLost.model_validate(m.meta)
                self.lost[lost.step] = lost
            elif kind == "failure":
                q.ack(streams.control, GROUP, [m.id])
                raise RoleFailed(f"{m.meta['role']} {m.meta['worker']} failed: {m.meta['reason']}")
        if ctl:
            q.ack(streams.control, GROUP, [m.id for m in ctl])

    def _file_score(self, m: Message) -> None:
        """File one score entry. A training score stays pending in the `controller` group until its
        step is handed to the actor (so a successor can take it over); everything else is acked."""
        score = ScoreMeta.model_validate(m.meta)
        scores = self.queue.streams.scores
        self.score_wait.arrived()
        if score.kind == "val":
            if self.validator:
                self.validator.record(score, m.tensor_key)
            self.queue.ack(scores, GROUP, [m.id])
            return
        if score.step >= self.next_unpublished:
            self.inbox.setdefault(score.step, []).append(m)  # the predecessor ran ahead (fully-async)
            return
        book = self.books.get(score.step)
        if book is None:  # a step already trained: a redelivered score (its tensors belong to the batch)
            self.queue.ack(scores, GROUP, [m.id])
            return
        book.entry_ids.append(m.id)
        if book.record(score, m.tensor_key, self._refill_for) is None and m.tensor_key:
            self.queue.delete_tensors([m.tensor_key])  # a leftover of a refilled/dropped attempt
        if book.leftover_keys:
            self.queue.delete_tensors(book.leftover_keys)
            book.leftover_keys.clear()

    def _refill_for(self, book: StepBook, key: str, attempt: int) -> GenerateRequest:
        """The request of attempt `attempt` of group `key` (deterministic: what the predecessor sent)."""
        return refill_request(book.groups[key].request, attempt,
                              self._seeds(book.step, parse_group_id(key).prompt, attempt))

    def _settle(self, book: StepBook) -> None:
        """Refill or drop complete groups that failed or are too stale."""
        limit = self.spec.pipeline.maxStaleness
        for key, group in list(book.groups.items()):
            if not group.complete:
                continue
            reasons = group.failed_reasons or self.group_scoring.apply(group)
            stale = [s.sample_id for s in group.scores.values() if self.version - s.policy_version > limit]
            if stale and self.spec.pipeline.mode == "fully-async":
                reasons = reasons + [f"{len(stale)} samples staler than maxStaleness={limit}"]
            if not reasons:
                continue
            self.queue.delete_tensors(list(group.tensor_keys.values()))
            if group.attempt + 1 >= GROUP_ATTEMPTS:
                book.drop(key, f"group {key}: {reasons[0]}")
                log.warning("dropped group %s after %d attempts: %s", key, GROUP_ATTEMPTS, reasons[0])
                continue
            group.attempt += 1
            group.request = refill_request(group.request, group.attempt,
                                           self._seeds(book.step, parse_group_id(key).prompt, group.attempt))
            group.scores.clear()
            group.tensor_keys.clear()
            book.refills += 1
            self.queue.publish(self.queue.streams.requests, group.request.model_dump())

    def _advantages(self, book: StepBook) -> tuple[list[TrainItem], dict]:
        scores = [(key, s) for key, g in book.groups.items() for s in g.scores.values()]
        gids = {key: i for i, key in enumerate(book.groups)}
        # the totals are the controller's, from each sample's components and this manifest's weights and
        # normalisation: a resume may change those (api/resume.py::REWARD_FREE), and a step scored partly
        # before it then mixed the reward role's old totals with new ones (weight 1 → 0.5: reward_mean 0.383,
        # not 0.233); for `none` the sum is the reward role's own, bit for bit
        rewards = torch.from_numpy(combine_step(self.spec.reward, [s.rewards for _, s in scores],
                                                [gids[k] for k, _ in scores]))
        adv = group_advantages(rewards, torch.tensor([gids[k] for k, _ in scores]),
                               std_mode=self.spec.algorithm.advantage.stdMode,
                               eps=self.spec.algorithm.advantage.eps, clip=self.spec.algorithm.advantage.clip)
        items = []
        for (key, s), a in zip(scores, adv.advantages.tolist(), strict=True):
            g = book.groups[key]
            items.append(TrainItem(sample_id=s.sample_id, group_id=key, prompt_ids=g.request.prompt_ids, advantage=a,
                                   tensor_key=g.tensor_keys[s.sample_id],
                                   noise_level=g.request.noise_level, sde_type=g.request.sde_type))
        t_pub = book.t_published
        versions = [s.policy_version for _, s in scores]
        stats = {
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(unbiased=False)),
            "samples": len(scores), "groups": len(book.groups), "zero_std_groups": adv.zero_std_groups,
            "dropped_groups": len(book.dropped), "refills": book.refills,
            # ≥ 0: a successor controller's book is younger than the samples it reuses
            "rollout_seconds": max(0.0, max(s.generated_at for _, s in scores) - t_pub),
            "reward_seconds": max(0.0, max(s.scored_at for _, s in scores) - t_pub),
            "reward_latency_seconds": sum(s.scored_at - s.generated_at for _, s in scores) / len(scores),
            # each trained sample's, for the histogram (its p95 is a sample's; the Reporter keeps it out of metrics.jsonl)
            REWARD_LATENCIES: [round(s.scored_at - s.generated_at, 4) for _, s in scores],
            "staleness_mean": sum(self.version - v for v in versions) / len(versions),
            "staleness_max": max(self.version - v for v in versions),
        }
        stats.update(component_stats(self.spec.reward, [s.rewards for _, s in scores]))
        if any(spec.normalize != "none" for spec in self.spec.reward):
            # normalised rewards average the same every step (0.050 on a job's every console line): the raw
            # weighted sum is what a user compares with the held-out reward
            raw = raw_totals(self.spec.reward, [s.rewards for _, s in scores])
            # and its spread: the trained rewards' (reward_std) is about 1 by construction for z-scores
            stats["raw_reward_mean"], stats["raw_reward_std"] = float(raw.mean()), float(raw.std())
        replicas = self.records.reward_replicas()  # written by the operator's autoscaler
        stats["scorer_replicas"] = replicas if replicas is not None else self.spec.roles.reward.replicas
        del self.books[book.step]
        return items, stats

    # ------------------------------------------------------------------ actor, validation
    def _wait_actor_ready(self) -> None:
        """Wait for the actor's `actor_ready` (beating); JobFailed after twice the start-up limit:
        the actor's own start-up, then its wait for the rollout workers (`startup_limit_s` each)."""
        timeout_s = 2 * self.spec.failurePolicy.startup_limit_s
        start = time.monotonic()
        while self.records.actor_ready() is None:
            self._check_terminated()
            self.heartbeat.beat()
            ctl = self.queue.consume(self.queue.streams.control, GROUP, self.env.worker_id, count=16, block_ms=100)
            failures = [m.meta for m in ctl if m.meta.get("type") == "failure"]
            if ctl:
                self.queue.ack(self.queue.streams.control, GROUP, [m.id for m in ctl])
            if failures:
                raise RoleFailed(f"{failures[0]['role']} {failures[0]['worker']} failed: {failures[0]['reason']}")
            if time.monotonic() - start > timeout_s:
                raise JobFailed(f"the actor was not ready after {timeout_s:.0f} s, twice failurePolicy."
                                "startupDeadlineSeconds + progressDeadlineSeconds (no rollout worker registered?)")

    def _wait_trained(self, step: int, req: TrainRequest) -> TrainDone | TrainLost:
        """The actor's answer to `req`: its `TrainDone`, or `TrainLost` naming samples of `req` whose tensors
        were gone, or naming none at all (`_name_lost`); one naming others answered an earlier batch of the step,
        already regenerated, and is skipped."""
        ids = {item.sample_id for item in req.items}
        while step not in self.trained:
            lost = self.lost.pop(step, None)
            if lost is not None and (not lost.samples or ids.intersection(lost.samples)):
                return lost
            self._check_terminated()
            self._pump(block_ms=100)
        for old in [s for s in self.trained if s < step]:  # results the actor published again
            del self.trained[old]
        return self.trained.pop(step)

    def _watch_roles(self, every_s: float = 10.0) -> None:
        """Name roles whose heartbeat is older than progressDeadlineSeconds (log and RLJob status);
        acting on them is the supervisor's or the kubelet's job (liveness probe)."""
        if time.monotonic() - self._beats_read < every_s:
            return
        self._beats_read = time.monotonic()
        policy = self.spec.failurePolicy
        text = stalled_text(read_heartbeats(self.queue.redis, self.env.job_name), policy.progressDeadlineSeconds,
                            policy.startupDeadlineSeconds, skip=self.env.worker_id)
        if text != self._stalled:
            self._stalled = text
            self.reporter.stalled(text)

    def _check_terminated(self) -> None:
        if self.terminated:
            raise Terminated("SIGTERM")

    def _checkpoint_due(self, step: int) -> bool:
        every = self.spec.checkpoint.everySteps
        return step == self.total_steps - 1 or (every > 0 and (step + 1) % every == 0)

    def _validation_due(self, step: int) -> bool:
        every = self.spec.validation.everySteps
        return (every > 0 and (step + 1) % every == 0) or step == self.total_steps - 1

    def _validate(self, at_step: int) -> None:
        """Run the validation round after `at_step` training steps and write its line. A round whose every
        sample was missing (tensors gone: a reward role or this controller stopped longer than the TTL) is run
        once more for the same policy version, prompts and noise, so the curve gets its point; that line's
        `attempts` says how many rounds ran (2), its `val_seconds` the time of both, and a second empty one is
        written with null means.

        Raises:
            JobFailed: a validation sample could not be scored (`SampleUnscored`).
        """
        for attempt in range(VALIDATION_ATTEMPTS):
            self.validator.publish(at_step, self.version, attempt)
            self.score_wait.begin(f"validation at step {at_step}")
            while not self.validator.complete:
                self._check_terminated()
                self._pump()
                self.score_wait.check(len(self.validator.scores), len(self.validator.prompts))
            try:
                summary = self.validator.finish()
            except SampleUnscored as err:
                raise JobFailed(f"validation at step {at_step}: {err}") from err
            self.ttl_watch.validated(summary)
            if summary["n"]:
                break
            if attempt + 1 < VALIDATION_ATTEMPTS:
                log.warning("validation at step %d: all %d samples missing: running the round again for policy v%d "
                            "(the same prompts and noise)", at_step, summary["missing"], self.version)
            else:
                log.warning("validation at step %d: all %d samples missing in %d rounds: its line has no reward (null); "
                            "raise spec.transferQueue.tensorTtlSeconds above the longest a validation round takes",
                            at_step, summary["missing"], VALIDATION_ATTEMPTS)
        if attempt:  # only on a round run again: the lines of every other round keep their fields
            summary["attempts"] = attempt + 1
        self.reporter.validation(summary)

    def _export(self, checkpoint: str) -> None:
        from omnirl.models.export import export_run_checkpoint

        # the checkpoint's name under our own mount of the run directory (the actor's path may differ)
        path = export_run_checkpoint(self.written, self.out, self.out / self.spec.checkpoint.dir / Path(checkpoint).name,
                                     keep=self.spec.checkpoint.keep)
        self.reporter.exported(path)

    def _export_missed(self, step: int) -> None:
        """Export the scheduled checkpoint of `step`, the last step trained before this controller started,
        when no export of that step exists: the predecessor died between the step's result and its export
        (after the line, during the validation round). Before, that export was never written (`exports/latest`
        lagged `checkpoints/latest` until the next checkpoint; with `checkpoint.keep` ≥ 2 the finished run
        lacked it). A checkpoint the actor wrote only because it was stopped (SIGTERM) is not scheduled and
        keeps having no export (docs/local.md, "The trained model")."""
        from omnirl.models.export import EXPORTS
        from omnirl.models.policy_io import COMPLETE, step_order

        ckpt = self.out / self.spec.checkpoint.dir / f"step-{step:06d}"
        exports = self.out / EXPORTS
        done = exports.is_dir() and any((step_order(p.name) or (-1, 0))[0] == step for p in exports.iterdir())
        if done or not self._checkpoint_due(step) or not (ckpt / COMPLETE).is_file():
            return
        log.info("exporting checkpoint step %d, which the previous controller did not export", step)
        self._export(str(ckpt))

    def _export_latest(self) -> None:
        """Every step was trained before this controller started (a stop after the last step, before
        its predecessor exported): export the checkpoint the actor wrote when it was stopped."""
        from omnirl.models.policy_io import LATEST, has_checkpoint

        root = self.out / self.spec.checkpoint.dir
        if not has_checkpoint(root):
            raise JobFailed(f"every step is trained but {root / LATEST} is not a complete checkpoint: nothing to "
                            "export; run omnirl export on an earlier checkpoint")
        self._export(str((root / LATEST).resolve()))

    def _note_latest_checkpoint(self) -> None:
        """The finish record's `last_checkpoint` is what `latest` names at the end, under our mount of the run
        directory, not only the last one this controller saw in a step's result: after a Ctrl-C during the last
        step and `--resume`, the actor's stop checkpoint (`step-000005`) is in no step line, and the summary
        named the scheduled `step-000003` while `latest` and the export were step 5 (issue 31)."""
        from omnirl.models.policy_io import LATEST, has_checkpoint

        root = self.out / self.spec.checkpoint.dir
        if has_checkpoint(root):
            self.reporter.last_checkpoint = str(root / (root / LATEST).resolve().name)

    def stop(self) -> None:
        """Tell every role to finish (sets the job's `stop` flag)."""
        self.records.request_stop()

    def close(self) -> None:
        """Close the reporter and the Redis client."""
        self.reporter.close()
        self.queue.close()
