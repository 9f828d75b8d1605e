"""The single controller: draws prompts, dispatches, groups, computes advantages, hands batches
to the actor, bumps the policy version, validates and reports (DESIGN.md §2).

Pipelining (`spec.pipeline.mode`):
- `sync`: reward workers start a step's scoring only after all its rollouts exist (baseline).
- `async-reward`: each sample is scored as soon as it appears; still on-policy.
- `fully-async`: step n+1's requests go out as soon as step n's batch is handed to the actor,
  so rollout overlaps training; every sample carries its policy_version and a group staler than
  `maxStaleness` is refilled (`drop`), or requests are never published ahead (`wait`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from omnirl.algorithms import group_advantages, select_window
from omnirl.api.messages import GenerateRequest, SampleSeed, ScoreMeta, TrainDone, TrainItem, TrainRequest
from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.controller.data import PromptSource, read_prompts
from omnirl.controller.groups import StepBook, refill_request
from omnirl.controller.report import Reporter
from omnirl.controller.validation import Validator
from omnirl.models.registry import load_tokenizer
from omnirl.transfer import Message, TransferQueue

log = logging.getLogger("omnirl.controller")
GROUP = "controller"
MAX_ATTEMPTS = 3


class JobFailed(RuntimeError):
    """The job cannot go on (a role failed, every group of a step failed...)."""


class Controller:
    """Runs the training loop of one RLJob. `run()` returns the final validation summary."""

    def __init__(self, job: RLJob, env: RoleEnv, *, resume: bool = False, steps: int | None = None) -> None:
        self.job, self.spec, self.env = job, job.spec, env
        spec = self.spec
        self.queue = TransferQueue.from_url(
            env.redis_url, env.job_name, max_stream_length=spec.transferQueue.maxStreamLength,
            tensor_ttl_s=spec.transferQueue.tensorTtlSeconds, claim_idle_s=spec.transferQueue.claimIdleSeconds,
        )
        self.total_steps = steps if steps is not None else spec.algorithm.steps
        tokenize = load_tokenizer(spec.model.family, spec.model.path)
        self.out = Path(env.out_dir)
        state = self._resume_state() if resume else {}
        self.start_step = int(state.get("step", -1)) + 1
        self.version = int(state.get("policy_version", 0))
        self.data = PromptSource(read_prompts(spec.data.trainPrompts), tokenize, seed=spec.seed,
                                 shuffle=spec.data.shuffle, position=tuple(state.get("data_position", (0, 0))))
        self.validator = Validator(self.queue, spec, tokenize, self.out) if spec.data.validationPrompts else None
        self.reporter = Reporter(self.out, env, job)
        self.books: dict[int, StepBook] = {}
        self.inbox: list[tuple[ScoreMeta, str | None]] = []
        self.trained: dict[int, TrainDone] = {}

    def _resume_state(self) -> dict:
        path = self.out / self.spec.checkpoint.dir / "latest" / "state.json"
        if not path.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {path.parent} (run without --resume to start fresh)")
        return json.loads(path.read_text())

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict:
        """Train `total_steps` steps; returns {'validation': [...], 'steps': n}. Raises JobFailed."""
        q, streams = self.queue, self.queue.streams
        q.ensure_group(streams.scores, GROUP)
        q.ensure_group(streams.control, GROUP)
        self._wait_actor_ready()
        self.reporter.started(self.total_steps, self.start_step)
        if self.validator and self.start_step == 0:
            self._validate(0)
        mode = self.spec.pipeline
        ahead = mode.mode == "fully-async" and mode.staleAction == "drop" and mode.maxStaleness >= 1
        for step in range(self.start_step, self.total_steps):
            if step not in self.books:
                self._publish_step(step)
            t0 = self.books[step].t_published
            items, stats = self._collect(step)
            checkpoint = self._checkpoint_due(step)
            req = TrainRequest(step=step, policy_version=self.version, items=items, checkpoint=checkpoint,
                               controller_state={"data_position": list(self.data.position)})
            self.queue.publish(streams.control, req.model_dump())
            t_handed = time.time()
            if ahead and step + 1 < self.total_steps:
                self._publish_step(step + 1)
            done = self._wait_trained(step)
            self.version = done.policy_version
            stats.update(step_seconds=time.time() - t0, handoff_to_trained_seconds=time.time() - t_handed)
            self.reporter.step(step, self.version, stats, done)
            if self.validator and self._validation_due(step):
                self._validate(step + 1)
        if self.validator and not self._validation_due(self.total_steps - 1):
            self._validate(self.total_steps)
        return self.reporter.finished()

    # ------------------------------------------------------------------ dispatch
    def _publish_step(self, step: int) -> None:
        algo = self.spec.algorithm
        prompts = self.data.draw(algo.promptsPerStep)
        book = StepBook(step, t_published=time.time())
        if algo.name == "flow-grpo":
            g = algo.flowGrpo
            window = select_window(self.spec.seed * 100_003 + step, algo.sampling.numSteps, g.window.size,
                                   tuple(g.window.range))
            noise, sde_type = g.noiseLevel, g.sdeType
        else:  # DiffusionNFT and AWM sample with the deterministic solver (they train on x0 alone)
            window, noise, sde_type = [], 0.0, "sde"
        expected = 0
        for p in prompts:
            key = f"{step}:{p.index}"
            seeds = [SampleSeed(sample_id=f"{key}:{i}", seed=self._seed(step, p.index, i, 0))
                     for i in range(algo.groupSize)]
            req = GenerateRequest(kind="train", step=step, group_id=key, prompt=p.text, prompt_ids=p.ids,
                                  samples=seeds, num_steps=algo.sampling.numSteps, window=list(window),
                                  noise_level=noise, sde_type=sde_type, shift=algo.sampling.shift,
                                  guidance_scale=algo.sampling.guidanceScale)
            if key in book.groups:  # the same prompt twice in one step (tiny prompt files)
                continue
            book.add(key, req)
            expected += len(seeds)
        self.queue.set_json(f"expected:{step}", expected)
        for group in book.groups.values():
            self.queue.publish(self.queue.streams.requests, group.request.model_dump())
        self.books[step] = book

    def _seed(self, step: int, prompt: int, index: int, attempt: int) -> int:
        return (self.spec.seed * 1_000_003 + step * 10_007 + prompt * 101 + index + attempt * 7) % (2**62)

    # ------------------------------------------------------------------ collection
    def _collect(self, step: int) -> tuple[list[TrainItem], dict]:
        book = self.books[step]
        while True:
            self._pump()
            self._settle(book)
            if book.complete:
                break
        if not book.groups:
            raise JobFailed(f"step {step}: every group failed: {book.failures[:3]}")
        return self._advantages(book)

    def _pump(self, block_ms: int = 200) -> None:
        """Read scores and control messages into the books."""
        q, streams = self.queue, self.queue.streams
        msgs = q.consume(streams.scores, GROUP, self.env.worker_id, count=256, block_ms=block_ms)
        for m in msgs:
            self._file_score(m)
        if msgs:
            q.ack(streams.scores, GROUP, [m.id for m in msgs])
        ctl = q.consume(streams.control, GROUP, self.env.worker_id, count=16, block_ms=0)
        for m in ctl:
            kind = m.meta.get("type")
            if kind == "trained":
                done = TrainDone.model_validate(m.meta)
                self.trained[done.step] = done
            elif kind == "failure":
                q.ack(streams.control, GROUP, [m.id])
                raise JobFailed(f"{m.meta['role']} {m.meta['worker']} failed: {m.meta['reason']}")
        if ctl:
            q.ack(streams.control, GROUP, [m.id for m in ctl])

    def _file_score(self, m: Message) -> None:
        score = ScoreMeta.model_validate(m.meta)
        if score.kind == "val":
            if self.validator:
                self.validator.record(score, m.tensor_key)
            return
        book = self.books.get(score.step)
        if book is None or book.record(score, m.tensor_key) is None:
            if m.tensor_key:  # a leftover of a refilled/dropped attempt
                self.queue.delete_tensors([m.tensor_key])

    def _settle(self, book: StepBook) -> None:
        """Refill or drop complete groups that failed or are too stale."""
        limit = self.spec.pipeline.maxStaleness
        for key, group in list(book.groups.items()):
            if not group.complete:
                continue
            reasons = group.failed_reasons
            stale = [s.sample_id for s in group.scores.values() if self.version - s.policy_version > limit]
            if stale and self.spec.pipeline.mode == "fully-async":
                reasons = reasons + [f"{len(stale)} samples staler than maxStaleness={limit}"]
            if not reasons:
                continue
            self.queue.delete_tensors(list(group.tensor_keys.values()))
            if group.attempt + 1 >= MAX_ATTEMPTS:
                book.drop(key, f"group {key}: {reasons[0]}")
                log.warning("dropped group %s after %d attempts: %s", key, MAX_ATTEMPTS, reasons[0])
                continue
            group.attempt += 1
            group.request = refill_request(group.request, group.attempt,
                                           self._seed(book.step, int(key.split(":")[1]), 0, group.attempt))
            group.scores.clear()
            group.tensor_keys.clear()
            book.refills += 1
            self.queue.publish(self.queue.streams.requests, group.request.model_dump())

    def _advantages(self, book: StepBook) -> tuple[list[TrainItem], dict]:
        scores = [(key, s) for key, g in book.groups.items() for s in g.scores.values()]
        gids = {key: i for i, key in enumerate(book.groups)}
        rewards = torch.tensor([s.reward for _, s in scores], dtype=torch.float32)
        adv = group_advantages(rewards, torch.tensor([gids[k] for k, _ in scores]),
                               std_mode=self.spec.algorithm.advantage.stdMode,
                               eps=self.spec.algorithm.advantage.eps, clip=self.spec.algorithm.advantage.clip)
        items = []
        for (key, s), a in zip(scores, adv.advantages.tolist(), strict=True):
            g = book.groups[key]
            items.append(TrainItem(sample_id=s.sample_id, group_id=key, prompt_ids=g.request.prompt_ids, advantage=a,
                                   tensor_key=g.tensor_keys[s.sample_id], policy_version=s.policy_version,
                                   noise_level=g.request.noise_level, sde_type=g.request.sde_type))
        t_pub = book.t_published
        versions = [s.policy_version for _, s in scores]
        stats = {
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(unbiased=False)),
            "samples": len(scores), "groups": len(book.groups), "zero_std_groups": adv.zero_std_groups,
            "dropped_groups": len(book.dropped), "refills": book.refills,
            "rollout_seconds": max(s.generated_at for _, s in scores) - t_pub,
            "reward_seconds": max(s.scored_at for _, s in scores) - t_pub,
            "reward_latency_seconds": sum(s.scored_at - s.generated_at for _, s in scores) / len(scores),
            "staleness_mean": sum(self.version - v for v in versions) / len(versions),
            "staleness_max": max(self.version - v for v in versions),
        }
        for name in scores[0][1].rewards:
            stats[f"reward_{name}"] = sum(s.rewards.get(name, 0.0) for _, s in scores) / len(scores)
        del self.books[book.step]
        return items, stats

    # ------------------------------------------------------------------ actor, validation
    def _wait_actor_ready(self, timeout_s: float = 900.0) -> None:
        start = time.monotonic()
        while self.queue.get_json("actor_ready") is None:
            self._pump(block_ms=100)
            if time.monotonic() - start > timeout_s:
                raise JobFailed(f"the actor was not ready after {timeout_s:.0f} s (no rollout worker registered?)")

    def _wait_trained(self, step: int) -> TrainDone:
        while step not in self.trained:
            self._pump(block_ms=100)
        return self.trained.pop(step)

    def _checkpoint_due(self, step: int) -> bool:
        every = self.spec.checkpoint.everySteps
        return step == self.total_steps - 1 or (every > 0 and (step + 1) % every == 0)

    def _validation_due(self, step: int) -> bool:
        every = self.spec.validation.everySteps
        return (every > 0 and (step + 1) % every == 0) or step == self.total_steps - 1

    def _validate(self, at_step: int) -> None:
        self.validator.publish(at_step, self.version)
        while not self.validator.complete:
            self._pump()
        self.reporter.validation(self.validator.finish())

    def stop(self) -> None:
        """Tell every role to finish (sets the job's `stop` flag)."""
        self.queue.set_json("stop", True)

    def close(self) -> None:
        """Close the reporter and the Redis client."""
        self.reporter.close()
        self.queue.close()
