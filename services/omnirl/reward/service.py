"""The reward role: scores each sample as soon as it appears (sample-level streaming).

Several weighted rewards per job; the weighted sum is the sample's reward. A failure of a
`required` scorer marks the sample failed with the reason (its group is then refilled or dropped
by the controller) — never a reward of 0. A non-required scorer that fails contributes nothing
and its failure is recorded in the score's `reason`.

A scorer that does not answer (a judge restarting) fails nothing at once: its samples are held
and scored again until `failurePolicy.scorerOutageSeconds` has passed (`_score_holding`).

In `sync` pipeline mode a training sample of step n is scored only once every rollout of step n
exists (the baseline: reward starts after all rollouts).

A worker renews its claim on the samples it holds while it scores them (`omnirl.transfer.lease`),
so another replica reclaims them only once it dies (or stops beating), never during a long
outage. A restarted worker first scores its predecessor's pending samples (same worker id); SIGTERM lets
the batch in hand finish, then `run` returns. Scores are published with `done_kind="reward"`, so a
sample's score is published once however often it is delivered, and a redelivered sample whose score
is published already (its worker was killed between the publish and the ack) is acknowledged without
being scored again (`_not_scored_before`). A sample whose tensors are gone before it is read (expired after
`spec.transferQueue.tensorTtlSeconds`, or deleted) is published as a failed score, so its group is refilled,
never raised (`_load_images`).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from omnirl.api.errors import config_errors
from omnirl.api.ledger import Ledger
from omnirl.api.messages import SampleMeta, ScoreMeta
from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.reward.registry import check_judges
from omnirl.reward.scoring import RewardSet
from omnirl.transfer import Message, MissingTensors, TransferQueue
from omnirl.transfer.heartbeat import Heartbeat
from omnirl.transfer.lease import holding
from omnirl.transfer.media import poster, to_numpy

log = logging.getLogger("omnirl.reward")
GROUP = "reward"


class RewardService:
    """One reward worker. `run()` returns when the job's `stop` flag is set."""

    def __init__(self, job: RLJob, env: RoleEnv) -> None:
        spec = job.spec
        self.env = env
        self.sync_mode = spec.pipeline.mode == "sync"
        self.batch_size = spec.roles.reward.batchSize
        self.queue = TransferQueue.for_job(env.job_name, spec.transferQueue, env.redis_url)
        with config_errors("spec.reward"):  # a scorer that cannot be built (its params, its files): permanent
            self.rewards = RewardSet(spec.reward, threads=env.threads or 1)
            check_judges(spec.reward, strict=False)  # a pod gets no `omnirl run` pre-flight: a refused key, a wrong model
        self._ledger = Ledger(env.out_dir, "reward", env.worker_id)
        self.heartbeat = Heartbeat(self.queue.redis, env.job_name, "reward", env.worker_id,
                                   ttl_s=2 * job.spec.failurePolicy.progressDeadlineSeconds)
        self.hold_s = job.spec.failurePolicy.scorerOutageSeconds  # how long a scorer may be away
        self.progress_deadline_s = job.spec.failurePolicy.progressDeadlineSeconds
        self._warned: set[str] = set()  # non-required rewards whose first failure was logged
        self.terminated = False

    def terminate(self) -> None:
        """SIGTERM: finish the batch in hand, then return from `run`."""
        self.terminated = True

    def run(self) -> None:
        """Serve until the `stop` flag is set (or SIGTERM)."""
        samples = self.queue.streams.samples
        self.queue.ensure_group(samples, GROUP)
        backlog = self.queue.recover(samples, GROUP, self.env.worker_id)
        while not self.terminated and not self.queue.records.stop_requested():
            self.heartbeat.beat()
            msgs, backlog = backlog[: self.batch_size], backlog[self.batch_size:]
            if not msgs:
                msgs = self.queue.consume(samples, GROUP, self.env.worker_id, count=self.batch_size, block_ms=200)
            if msgs:
                self.score_batch(msgs)
                self.heartbeat.beat(progressed=True)

    def score_batch(self, msgs: list[Message]) -> None:
        """Score messages from the samples stream, publish their scores, acknowledge them.

        The samples stay claimed by this worker meanwhile (`holding`): a scorer away for longer than
        `claimIdleSeconds` (held up to `scorerOutageSeconds`) or a slow judge would otherwise let another
        replica reclaim and score them again."""
        samples = self.queue.streams.samples
        msgs = self._not_scored_before(msgs)
        if not msgs:
            return
        with holding(self.queue, samples, GROUP, self.env.worker_id, [m.id for m in msgs], alive=self._live):
            scored = self._score_and_publish(msgs)
        if scored:  # none when stopping while a scorer was away: unacknowledged, the samples go to the successor
            self.queue.ack(samples, GROUP, [m.id for m in msgs])

    def _not_scored_before(self, msgs: list[Message]) -> list[Message]:
        """The messages whose score no worker published yet; the others are acknowledged here.

        A worker killed after publishing a score and before acknowledging its sample leaves the sample
        pending: its successor (restarted, or another replica after `claimIdleSeconds`) gets it again.
        Scoring it again would be a paid judge call whose score `publish` refuses, and its image may be
        gone (trained and deleted). Its ledger line is written here if the predecessor died before it."""
        done = self.queue.are_done("reward", [m.meta["sample_id"] for m in msgs])
        scored = [m for m, d in zip(msgs, done, strict=True) if d]
        if not scored:
            return msgs
        for m in scored:
            self._ledger.record(m.meta["sample_id"], published=False)
        self.queue.ack(self.queue.streams.samples, GROUP, [m.id for m in scored])
        log.info("reward: %d redelivered samples were scored before (scores published, e.g. %s): acknowledged "
                 "without scoring them again", len(scored), scored[0].meta["sample_id"])
        return [m for m, d in zip(msgs, done, strict=True) if not d]

    def _live(self) -> bool:
        """The health probe's test: the main loop beat within `progressDeadlineSeconds`."""
        return self.heartbeat.age_s() <= self.progress_deadline_s

    def _score_and_publish(self, msgs: list[Message]) -> bool:
        """Score `msgs` and publish their scores; False (nothing published) when the job stops meanwhile."""
        metas = [SampleMeta.model_validate(m.meta) for m in msgs]
        if self.sync_mode:
            for step in sorted({m.step for m in metas if m.kind == "train"}):
                self._wait_all_rollouts(step)
        images, media, lost = self._load_images(msgs, metas)
        keep = sorted(images)
        scored = self._score_holding([images[i] for i in keep], [metas[i].prompt for i in keep],
                                     [metas[i].sample_id for i in keep],
                                     [media[i] for i in keep] if media else None) if keep else []
        if scored is None:
            return False
        results = {**dict(zip(keep, scored, strict=True)), **{i: (None, {}, why) for i, why in lost.items()}}
        now = time.time()
        for i, (msg, meta) in enumerate(zip(msgs, metas, strict=True)):
            reward, per_name, reason = results[i]
            self._log_first_failure(per_name, reason, failed=reward is None)
            score = ScoreMeta(
                sample_id=meta.sample_id, kind=meta.kind, step=meta.step, group_id=meta.group_id,
                policy_version=meta.policy_version, reward=reward, rewards=per_name, failed=reward is None,
                reason=reason, lost=i in lost, generated_at=meta.generated_at, scored_at=now,
            )
            published = self.queue.publish(self.queue.streams.scores, score.model_dump(), tensor_key=msg.tensor_key,
                                           done_kind="reward")
            self._ledger.record(meta.sample_id, published is not None, reward=reward,
                                **({"lost": True} if i in lost else {}))
        return True

    def _load_images(self, msgs: list[Message], metas: list[SampleMeta]
                     ) -> tuple[dict[int, np.ndarray], dict[int, dict[str, np.ndarray]], dict[int, str]]:
        """Each sample's image (`[H, W, C]` uint8), by position in `msgs`; when a scorer reads media
        (`RewardSet.needs_media`), each sample's media too (`TransferQueue.load_media`, the same one GET: the
        image is then its poster), else {}; and the reason of each whose tensors are gone, by position.

        A sample whose image key expired (`spec.transferQueue.tensorTtlSeconds` passed before it was
        scored: a reward role stopped or backed up) or was deleted can never be scored. It is reported
        as a failed score marked `lost`, the controller's path for a lost member: its group is refilled (or
        dropped after the last attempt), a validation round reports it missing (`val_missing`). Raising instead
        crashed the role, and its successor met the same sample first: restart after restart until
        `failurePolicy.maxRestarts`. One warning line per batch names the samples and the fix.

        Raises:
            ValueError: a message that names no tensor key (not a sample of `TransferQueue.publish`)."""
        images: dict[int, np.ndarray] = {}
        media: dict[int, dict[str, np.ndarray]] = {}
        lost: dict[int, str] = {}
        ttl_s = self.queue.tensor_ttl_s
        for i, (msg, meta) in enumerate(zip(msgs, metas, strict=True)):
            try:
                if self.rewards.needs_media:
                    sample = self.queue.load_media(msg)
                    media[i], images[i] = to_numpy(sample), poster(sample).numpy()
                else:
                    images[i] = self.queue.load_image(msg).numpy()
            except MissingTensors as err:
                age_s = time.time() - meta.generated_at  # the rollout's clock: a guess at why, not a check
                lost[i] = (f"{err.key} expired before it was read, {age_s:.0f} s after the sample was generated "
                           f"(spec.transferQueue.tensorTtlSeconds {ttl_s:g}); raise spec.transferQueue."
                           "tensorTtlSeconds above the longest a sample waits for its score" if age_s >= ttl_s else
                           f"{err.key} was deleted before it was read, {age_s:.0f} s after the sample was generated "
                           f"(within spec.transferQueue.tensorTtlSeconds {ttl_s:g})")
        if lost:
            ids = [metas[i].sample_id for i in lost]
            kinds = {metas[i].kind for i in lost}
            then = "; ".join(what for kind, what in (("train", "a training sample's group is refilled"),
                                                     ("val", "a validation sample is counted missing")) if kind in kinds)
            log.warning("reward: %d sample(s) lost, reported failed (%s): %s%s: %s", len(ids), then,
                        ", ".join(ids[:4]), " …" if len(ids) > 4 else "", next(iter(lost.values())))
        return images, media, lost

    def _log_first_failure(self, per_name: dict[str, float], reason: str, failed: bool) -> None:
        """Log the first failure of each reward: a non-required one is left out of the sample's sum
        (without the line it could fail on every sample with nothing on the console); a failed sample
        says why here at once (a judge slower than its timeout), before the controller drops groups."""
        for spec in self.rewards.specs:
            # a failed sample's sum stops at its first failed required reward: those after it are not in
            # per_name, failed or not; its reason has one "NAME: …" part per reward that failed (`combine`)
            blamed = reason.startswith(f"{spec.name}: ") or f"; {spec.name}: " in reason
            if spec.name in per_name or spec.name in self._warned or (failed and not blamed):
                continue
            self._warned.add(spec.name)
            if failed:
                log.error("reward %s failed a sample, which fails (its group is refilled or dropped): %s; further "
                          "failures are in the scores' reasons", spec.name, reason)
            else:
                log.warning("reward %s (required: false) failed, left out of the sample's reward: %s; further "
                            "failures are counted in metrics.jsonl as component_missing_%s", spec.name, reason,
                            spec.name)

    def _score_holding(self, images: list, prompts: list[str], ids: list[str], media: list | None = None
                       ) -> list[tuple[float | None, dict[str, float], str]] | None:
        """`RewardSet.score`, except that a sample failed only by a scorer that did not answer
        (unreachable, timing out, 5xx after its own retries: a judge restarting) is held and scored
        again, every 1, 2, 4 … 30 s, for up to `failurePolicy.scorerOutageSeconds`; past that it
        fails with the reason as any other. None when the job stops (or SIGTERM) meanwhile."""
        with self.heartbeat.covering(self.rewards.longest_s(images)):  # a slow judge's minutes are not a hang
            results, hold = self.rewards.score_or_hold(images, prompts, ids, media)
        deadline, delay = time.monotonic() + self.hold_s, 1.0
        while any(hold) and time.monotonic() < deadline:
            idx = [i for i, h in enumerate(hold) if h]
            log.warning("reward: %d samples held, a scorer does not answer (%s); scoring them again in %.0f s "
                        "(for up to %.0f s more, failurePolicy.scorerOutageSeconds)", len(idx), results[idx[0]][2],
                        delay, deadline - time.monotonic())
            until = min(time.monotonic() + delay, deadline)
            while time.monotonic() < until:
                if self.terminated or self.queue.records.stop_requested():
                    return None
                self.heartbeat.beat()  # alive, waiting: not stuck
                time.sleep(0.2)
            with self.heartbeat.covering(self.rewards.longest_s([images[i] for i in idx])):
                again, still = self.rewards.score_or_hold([images[i] for i in idx], [prompts[i] for i in idx],
                                                          [ids[i] for i in idx],
                                                          [media[i] for i in idx] if media else None)
            for k, i in enumerate(idx):
                results[i], hold[i] = again[k], still[k]
            delay = min(2 * delay, 30.0)
        return results

    def _wait_all_rollouts(self, step: int, timeout_s: float = 3600.0) -> None:
        start = time.monotonic()
        while True:
            expected, generated = self.queue.records.expected(step), self.queue.records.generated(step)
            if expected is not None and generated is not None and generated >= expected:
                return
            if self.queue.records.stop_requested() or self.terminated:
                return
            self.heartbeat.beat()
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"sync mode: rollouts of step {step} incomplete after {timeout_s} s")
            time.sleep(0.02)

    def close(self) -> None:
        """Close the Redis client and the ledger."""
        self._ledger.close()
        self.queue.close()
