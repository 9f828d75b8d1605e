"""The load test's processes: the real roles' TransferQueue traffic, without their models.

Each function is the body of one forked process. They talk only through Redis (the real
`TransferQueue`) and report to the parent through a multiprocessing queue at exit:

- ``controller``: publishes requests (one `GenerateRequest`-sized entry per group of ``group``
  samples) while fewer than ``in_flight`` samples are requested and not scored, consumes ``scores`` (group ``controller``), acknowledges them and hands the
  scored tensor keys to the actors as train entries on ``control`` (``train_batch`` keys each).
- ``rollout`` (the N producers): consume a request, renew its claim once (``touch``), publish
  ``group`` samples with ``done_kind="rollout"`` and a ``count_key`` (the Lua publish: trajectory,
  image key, marker, INCR, XADD in one script), acknowledge the request.
- ``reward`` (the M consumers): consume ``batch`` samples (XAUTOCLAIM of entries idle past
  ``claim_idle_s``, then XREADGROUP), hold the claim while working (`lease.holding`: ``touch`` every
  ``claim_idle_s`` / 3 from a thread, as the reward role does), skip redeliveries already scored
  (``are_done``), read each image alone (``load_image``), publish a score with
  ``done_kind="reward"`` naming the sample's tensor key, acknowledge (XACK + the trim script).
  Every ``abandon_every``-th batch is dropped unacknowledged, as a worker killed mid-batch leaves
  it (every other time after its scores were published, the crash the ``done:reward`` markers make
  harmless): another worker reclaims it after ``claim_idle_s``.
- ``actor``: consume train entries, read every trajectory (``load_tensors``), delete the keys
  (``delete_tensors``), acknowledge (the claim held as the reward's is).

The sample's ``generated_at`` is stamped just before its publish starts, so the reward's
``consume_time - generated_at`` is the publish-to-consume latency (one clock: one machine).
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.transfer_load_payloads import KINDS, make_sample
from omnirl.transfer import TransferQueue
from omnirl.transfer.keys import kv_key
from omnirl.transfer.lease import holding

JOB = "bench-load"
GROUPS = {"requests": "rollout", "samples": "reward", "scores": "controller", "control": "actor"}
"""stream name (`StreamNames` attribute) → the consumer group that reads it, as in the real job."""
PROMPT_IDS = list(range(63))
"""An SD3 prompt's 63 token ids (`benchmarks.transfer_overhead.PROMPT_IDS` has the layout)."""


@dataclass(frozen=True)
class LoadConfig:
    """One load-test run's settings (shared by every process of the run).

    Attributes:
        url: the Redis URL.
        kind: a `KINDS` name.
        window: SDE window W.
        group: samples per request (the prompt group).
        batch: samples a reward worker consumes at once (`roles.reward.batchSize`).
        train_batch: scored samples per train entry (an actor's share of a step).
        claim_idle_s: `claimIdleSeconds`: an abandoned batch is reclaimed after this.
        abandon_every: drop every k-th reward batch unacknowledged (0: never).
        max_stream_length: `maxStreamLength` (back-pressure on every stream; the spec's default).
        in_flight: samples requested and not yet scored that the controller allows (as a step bounds
            them in the real job): it publishes a request only below this.
    """

    url: str
    kind: str
    window: int = 3
    group: int = 8
    batch: int = 16
    train_batch: int = 64
    claim_idle_s: float = 5.0
    abandon_every: int = 0
    max_stream_length: int = 10_000
    in_flight: int = 64

    def queue(self) -> TransferQueue:
        """A TransferQueue of the run's job on its Redis (one per process)."""
        return TransferQueue.from_url(self.url, JOB, max_stream_length=self.max_stream_length,
                                      tensor_ttl_s=3600, claim_idle_s=self.claim_idle_s)


def ensure_groups(queue: TransferQueue) -> None:
    """Create every consumer group before any process consumes (groups start at id 0)."""
    for stream, group in GROUPS.items():
        queue.ensure_group(getattr(queue.streams, stream), group)


def _report(out: Any, role: str, index: int, body: Any, **fields: Any) -> None:
    """Run `body()` and put ``{"role", "index", **its result}`` on `out`; an exception is reported as
    ``{"error": traceback}`` (the parent fails the run naming it)."""
    try:
        torch.set_num_threads(1)
        result = body()
    except BaseException:  # noqa: BLE001 - relayed to the parent, which raises it
        result = {"error": traceback.format_exc()}
    out.put({"role": role, "index": index, **fields, **result})


def controller(cfg: LoadConfig, stop: Any, done: Any, expected: Any, scored: Any, out: Any) -> None:
    """The controller process: requests out, scores in, train entries out (see the module docstring)."""
    def body() -> dict:
        q = cfg.queue()
        s = q.streams
        ids: list[str] = []
        pending: list[str] = []
        n_req = n_train = 0
        while not done.is_set():
            if not stop.is_set() and n_req * cfg.group - len(ids) < cfg.in_flight:
                q.publish(s.requests, {"group_id": f"g{n_req}", "prompt_ids": PROMPT_IDS, "samples": cfg.group,
                                       "step": 0, "kind": "train"})
                n_req += 1
                continue
            msgs = q.consume(s.scores, GROUPS["scores"], "controller-0", count=256, block_ms=20)
            for m in msgs:
                ids.append(m.meta["sample_id"])
                pending.append(m.tensor_key)
            q.ack(s.scores, GROUPS["scores"], [m.id for m in msgs])
            with scored.get_lock():
                scored.value = len(ids)
            flush = 0 < expected.value <= len(ids)  # the producers stopped and every sample is scored
            while len(pending) >= cfg.train_batch or (pending and flush):
                part, pending = pending[:cfg.train_batch], pending[cfg.train_batch:]
                q.publish(s.control, {"kind": "train", "step": n_train, "keys": part})
                n_train += 1
        q.close()
        return {"scored": ids, "requests": n_req, "train_entries": n_train}
    _report(out, "controller", 0, body)


def rollout(cfg: LoadConfig, index: int, go: Any, stop: Any, out: Any) -> None:
    """One producer: requests in, `group` samples out per request (see the module docstring)."""
    def body() -> dict:
        q = cfg.queue()
        s = q.streams
        trajectory, media = make_sample(KINDS[cfg.kind], cfg.window, seed=index)
        name = f"rollout-{index}"
        published: list[str] = []
        publish_s: list[float] = []
        count_key = kv_key(JOB, "generated:0")
        go.wait()
        while not stop.is_set():
            for req in q.consume(s.requests, GROUPS["requests"], name, count=1, block_ms=100):
                for i in range(cfg.group):
                    sample_id = f"{req.meta['group_id']}:{i}"
                    t0 = time.time()
                    meta = {"sample_id": sample_id, "group_id": req.meta["group_id"], "kind": "train", "step": 0,
                            "prompt_ids": PROMPT_IDS, "policy_version": 0, "worker": name, "generated_at": t0,
                            "rollout_seconds": 0.0}
                    if q.publish(s.samples, meta, trajectory, image=media, done_kind="rollout",
                                 count_key=count_key) is not None:
                        published.append(sample_id)
                        publish_s.append(time.time() - t0)
                    if i == cfg.group // 2:
                        q.touch(s.requests, GROUPS["requests"], name, [req.id])  # the engine's renewal
                q.ack(s.requests, GROUPS["requests"], [req.id])
        q.close()
        return {"published": published, "publish_s": publish_s}
    _report(out, "rollout", index, body)


def reward(cfg: LoadConfig, index: int, go: Any, done: Any, out: Any) -> None:
    """One consumer: samples in, one image read and one score out per sample (see the module docstring)."""
    def body() -> dict:
        q = cfg.queue()
        s = q.streams
        group, name = GROUPS["samples"], f"reward-{index}"
        seen: list[tuple[str, float, float, int]] = []  # (sample id, consumed at, latency s, delivery count)
        scored: list[str] = []
        abandoned: list[str] = []
        batches = 0

        def score(msgs: list) -> None:
            again = [m for m in msgs if m.delivery_count > 1]
            done_before = dict(zip([m.id for m in again], q.are_done("reward", [m.sample_id for m in again]),
                                   strict=True))
            for m in msgs:
                if done_before.get(m.id):
                    continue  # its worker died between the score's publish and the ack
                q.load_image(m)
                if q.publish(s.scores, {"sample_id": m.sample_id, "reward": 0.5, "failed": False,
                                        "policy_version": 0, "worker": name},
                             tensor_key=m.tensor_key, done_kind="reward") is not None:
                    scored.append(m.sample_id)

        go.wait()
        while not done.is_set():
            msgs = q.consume(s.samples, group, name, count=cfg.batch, block_ms=100)
            if not msgs:
                continue
            now = time.time()
            seen += [(m.sample_id, now, now - m.meta["generated_at"], m.delivery_count) for m in msgs]
            batches += 1
            if cfg.abandon_every and batches % cfg.abandon_every == 0 and all(m.delivery_count == 1 for m in msgs):
                # a worker killed mid-batch: every other time after its scores were published, before the ack
                if batches // cfg.abandon_every % 2:
                    score(msgs)
                abandoned += [m.sample_id for m in msgs]
                continue
            ids = [m.id for m in msgs]
            with holding(q, s.samples, group, name, ids):  # the reward role's claim renewal
                score(msgs)
            q.ack(s.samples, group, ids)
        q.close()
        return {"seen": seen, "scored": scored, "abandoned": abandoned}
    _report(out, "reward", index, body)


def actor(cfg: LoadConfig, index: int, go: Any, done: Any, trained: Any, out: Any) -> None:
    """One actor rank: train entries in, every trajectory read and deleted (see the module docstring)."""
    def body() -> dict:
        q = cfg.queue()
        s = q.streams
        name = f"actor-{index}"
        keys_done: list[str] = []
        go.wait()
        while not done.is_set():
            for m in q.consume(s.control, GROUPS["control"], name, count=1, block_ms=100):
                keys = m.meta["keys"]
                with holding(q, s.control, GROUPS["control"], name, [m.id]):
                    for key in keys:
                        q.load_tensors(key)
                    q.delete_tensors(keys)
                q.ack(s.control, GROUPS["control"], [m.id])
                keys_done += keys
                with trained.get_lock():
                    trained.value += len(keys)
        q.close()
        prefix = f"omnirl:{JOB}:tensors:"
        return {"trained": [k[len(prefix):] for k in keys_done]}
    _report(out, "actor", index, body)
