"""The small records roles exchange through Redis: one definition each (name, type, writer, reader).

Every record lives under ``omnirl:{job}:kv:{name}`` (`keys.kv_key`). No other module spells a record's
name or reads it raw: a role reads and writes them through `JobRecords` (`TransferQueue.records`, or
`JobRecords(client, job)` on any client: `omnirl role` before torch is imported, the launcher's pre-flight
client, the operator). The streams, tensor keys and idempotency markers are `queue.py`'s; the run-owner
record is `owner.py`'s (`RUN_OWNER`); the heartbeats are `heartbeat.py`'s (`kv:heartbeat:{worker}`).

| record (kv:) | type | written by | read by |
| --- | --- | --- | --- |
| `stop` (`STOP`) | JSON `true` | controller at the end (`request_stop`); `omnirl role` controller finding the finish record; the launcher, for a run that did not finish (`owner.stop_local`) | every role's loop, the launcher's supervisor and pre-flight (`stop_requested`) |
| `finished` (`FINISHED`) | JSON object: the `finish` record of `metrics.jsonl` | controller right after that line; `omnirl role` controller that finds only the line | `omnirl role` at start-up, the operator (`finish_record`) |
| `stopped_run` (`STOPPED_RUN`) | JSON `{"host", "out", "time"}` | the launcher that stopped a run before it finished (`owner.stop_local`) | pre-flight, the actor (`stopped_run`) |
| `actor_ready` (`ACTOR_READY`) | JSON `ActorReady` | actor leader after its first broadcast; deleted by it at start | controller waits for it |
| `actor_state` (`ACTOR_STATE`) | JSON `ActorState` | actor after every step | controller (continues from it), actor (reach, replay), supervisor |
| `expected:{step}` | JSON int | controller once a step's requests are out | reward (`sync`), controller (was it published) |
| `generated:{step}` | INCR int | rollout, in the atomic publish (`generated_key`) | reward (`sync`) |
| `trainreqs` (`HANDED`) | hash step → JSON `HandedBatch` | controller before it hands a batch over | actor (replay, reach), controller (a successor's hand-over, `_regenerate`); deleted by the actor's checkpoint |
| `trained` (`TRAINED`) | hash step → JSON `TrainDone` | actor leader as soon as a step is trained | actor (republish), controller (missing lines); deleted by the controller after the step's line |
| `stepstats` (`STEP_STATS`) | hash step → JSON object | controller at the hand-over | a successor controller (missing lines); deleted after the line |
| `controller_runs` (`CONTROLLER_RUNS`) | INCR int | controller at start | itself: its incarnation (validation ids) |
| `reward_replicas` (`REWARD_REPLICAS`) | JSON int | the operator's autoscaler | controller (`scorer_replicas`) |

Torch-free (plain redis-py, json, the pydantic messages): the operator and `omnirl role`'s start-up import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from omnirl.api.messages import TrainDone, TrainRequest
from omnirl.transfer.keys import kv_key

STOP = "stop"
FINISHED = "finished"
"""The job's `finish` record (`controller/report.py::Reporter.finished`), written by the controller right after that
line of `metrics.jsonl`: a role process that starts once it is there (a pod restarted in place, a Job's new pod, a
whole-job restart after the controller died past its `finish`) has nothing to do and exits 0 at once
(`launch/roles.py::finished_record`)."""
STOPPED_RUN = "stopped_run"
"""Where a launcher that stopped a run before it finished leaves `{"host", "out", "time"}` (`owner.stop_local`,
`launch/preflight.py::mark_stopped`): the job's keys on a shared Redis are that run's pending work, which its
`--resume` needs; the actor names it when it cannot continue that work."""
ACTOR_READY = "actor_ready"
ACTOR_STATE = "actor_state"
EXPECTED = "expected"
GENERATED = "generated"
HANDED = "trainreqs"
TRAINED = "trained"
STEP_STATS = "stepstats"
CONTROLLER_RUNS = "controller_runs"
REWARD_REPLICAS = "reward_replicas"
START_FLAGS = (STOP, ACTOR_READY, STOPPED_RUN, FINISHED)
"""Dropped before the roles start again (`--resume`, `restart-job`: `clear_start_flags`)."""


@dataclass(frozen=True)
class ActorState:
    """The job's progress as the actor owns it (`kv:actor_state`).

    Attributes:
        step: the last trained step (0-based; -1: none).
        policy_version: the actor's version after that step.
        data_position: the controller's prompt position `[epoch, index]` handed with that step.
    """

    step: int
    policy_version: int
    data_position: list

    def to_json(self) -> dict[str, Any]:
        """The stored object `{"step", "policy_version", "data_position"}`."""
        return {"step": self.step, "policy_version": self.policy_version, "data_position": self.data_position}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ActorState:
        """Parse the stored object. Raises KeyError for a missing field."""
        return cls(int(doc["step"]), int(doc["policy_version"]), list(doc["data_position"]))


NO_PROGRESS = ActorState(-1, 0, [0, 0])
"""The state of a job whose actor has trained nothing."""


@dataclass(frozen=True)
class ActorReady:
    """The actor's `kv:actor_ready`: it broadcast its starting weights (`policy_version`, after `step`)."""

    policy_version: int
    step: int


@dataclass(frozen=True)
class HandedBatch:
    """One step's batch as the controller stored it before handing it to the actor (`kv:trainreqs`).

    Attributes:
        request: the `TrainRequest` handed over.
        stats: the step's numbers measured by the controller (its `metrics.jsonl` line's timing and rewards).
        book: the step's `StepBook.to_json()` (groups, scores, tensor keys), for `_regenerate`; None in a batch
            an omnirl before books were stored wrote.
    """

    request: TrainRequest
    stats: dict
    book: dict | None

    def to_json(self) -> str:
        """The stored value: `{"request", "stats", "book"}`."""
        return json.dumps({"request": self.request.model_dump(), "stats": self.stats, "book": self.book})

    @classmethod
    def from_json(cls, raw: bytes | str) -> HandedBatch:
        """Parse a stored value. Raises `json.JSONDecodeError`, KeyError or pydantic's `ValidationError`."""
        doc = json.loads(raw)
        return cls(TrainRequest.model_validate(doc["request"]), doc.get("stats"), doc.get("book"))


class JobRecords:
    """The records of job `job` through `client` (a bytes or str redis-py client; see the module table).

    Args:
        client: a ``redis.Redis`` (the TransferQueue's, which rides out a restart, or a plain one).
        job: the job name (DNS-1123).

    Every method raises ``redis.RedisError`` when Redis does not answer (after the client's retries).
    """

    def __init__(self, client: redis.Redis, job: str) -> None:
        self.client, self.job = client, job

    def _key(self, name: str) -> str:
        return kv_key(self.job, name)

    def _get_json(self, name: str) -> Any | None:
        raw = self.client.get(self._key(name))
        return None if raw is None else json.loads(raw)

    def _set_json(self, name: str, value: Any) -> None:
        self.client.set(self._key(name), json.dumps(value, allow_nan=False, separators=(",", ":")).encode())

    # ------------------------------------------------------------------ stop, finish, start flags
    def stop_requested(self) -> bool:
        """Whether the `stop` flag is set: every role loop exits."""
        return self.client.get(self._key(STOP)) is not None

    def request_stop(self) -> None:
        """Set the `stop` flag."""
        self._set_json(STOP, True)

    def finish_record(self) -> dict | None:
        """The job's `finish` record, or None. Raises `json.JSONDecodeError` for a value that is not JSON."""
        return self._get_json(FINISHED)

    def set_finish_record(self, record: dict) -> None:
        """Store the `finish` record (after its `metrics.jsonl` line)."""
        self._set_json(FINISHED, record)

    def stopped_run(self) -> dict | None:
        """The place `{"host", "out", "time"}` of the stopped, unfinished run whose work the keys hold, or None."""
        return self._get_json(STOPPED_RUN)

    def clear_start_flags(self) -> None:
        """Delete `START_FLAGS` (one DEL)."""
        self.client.delete(*(self._key(name) for name in START_FLAGS))

    # ------------------------------------------------------------------ the actor's progress
    def actor_state(self) -> ActorState | None:
        """The actor's `ActorState`, or None before its first step."""
        doc = self._get_json(ACTOR_STATE)
        return None if doc is None else ActorState.from_json(doc)

    def set_actor_state(self, state: ActorState) -> None:
        """Store the actor's state (after every step)."""
        self._set_json(ACTOR_STATE, state.to_json())

    def actor_ready(self) -> ActorReady | None:
        """The actor's `ActorReady`, or None while no actor of this start broadcast its weights."""
        doc = self._get_json(ACTOR_READY)
        return None if doc is None else ActorReady(int(doc["policy_version"]), int(doc["step"]))

    def set_actor_ready(self, ready: ActorReady) -> None:
        """Announce the actor ready."""
        self._set_json(ACTOR_READY, {"policy_version": ready.policy_version, "step": ready.step})

    def clear_actor_ready(self) -> None:
        """Drop `actor_ready` (a new actor starting: the controller must not read the old one's)."""
        self.client.delete(self._key(ACTOR_READY))

    # ------------------------------------------------------------------ a step's requests (sync mode)
    def expected(self, step: int) -> int | None:
        """How many training samples step `step` publishes, once its requests are all out; else None."""
        value = self._get_json(f"{EXPECTED}:{step}")
        return None if value is None else int(value)

    def set_expected(self, step: int, count: int) -> None:
        """Note that step `step`'s requests (`count` samples) are all out."""
        self._set_json(f"{EXPECTED}:{step}", count)

    def generated_key(self, step: int) -> str:
        """The key the rollout role's publish INCRs per training sample of `step` (`TransferQueue.publish(count_key=)`)."""
        return self._key(f"{GENERATED}:{step}")

    def generated(self, step: int) -> int | None:
        """How many training samples of `step` were published, or None before the first."""
        raw = self.client.get(self.generated_key(step))
        return None if raw is None else int(raw)

    # ------------------------------------------------------------------ handed-over batches
    def store_batch(self, step: int, batch: HandedBatch) -> None:
        """Keep step `step`'s batch until a checkpoint covers it."""
        self.client.hset(self._key(HANDED), str(step), batch.to_json())

    def handed_batch(self, step: int) -> HandedBatch | None:
        """Step `step`'s stored batch, or None."""
        raw = self.client.hget(self._key(HANDED), str(step))
        return None if raw is None else HandedBatch.from_json(raw)

    def has_batch(self, step: int) -> bool:
        """Whether step `step`'s batch is stored."""
        return bool(self.client.hexists(self._key(HANDED), str(step)))

    def handed_batches(self) -> dict[int, HandedBatch]:
        """Every stored batch by step (one HGETALL)."""
        return {int(field): HandedBatch.from_json(raw) for field, raw in self.client.hgetall(self._key(HANDED)).items()}

    def drop_batch(self, step: int) -> None:
        """Forget step `step`'s stored batch (its checkpoint covers it)."""
        self.client.hdel(self._key(HANDED), str(step))

    # ------------------------------------------------------------------ results the controller has not written yet
    def note_result(self, done: TrainDone) -> None:
        """Keep a step's result until the controller has written its `metrics.jsonl` line."""
        self.client.hset(self._key(TRAINED), str(done.step), json.dumps(done.model_dump()))

    def kept_result(self, step: int) -> TrainDone | None:
        """Step `step`'s kept result, or None (its line is written, or it was never trained)."""
        raw = self.client.hget(self._key(TRAINED), str(step))
        return None if raw is None else TrainDone.model_validate(json.loads(raw))

    def kept_result_steps(self) -> list[int]:
        """The steps with a kept result, ascending."""
        return sorted(int(step) for step in self.client.hkeys(self._key(TRAINED)))

    def kept_results(self) -> dict[int, TrainDone]:
        """Every kept result by step, ascending (one HGETALL)."""
        kept = self.client.hgetall(self._key(TRAINED))
        return {int(step): TrainDone.model_validate(json.loads(raw))
                for step, raw in sorted(kept.items(), key=lambda kv: int(kv[0]))}

    def store_step_stats(self, step: int, stats: dict) -> None:
        """Keep the controller's numbers of step `step` for a successor that must write its line."""
        self.client.hset(self._key(STEP_STATS), str(step), json.dumps(stats))

    def step_stats(self, step: int) -> dict | None:
        """Step `step`'s kept numbers, or None."""
        raw = self.client.hget(self._key(STEP_STATS), str(step))
        return None if raw is None else json.loads(raw)

    def forget_step(self, step: int) -> None:
        """Drop step `step`'s kept numbers and result: its line is written."""
        self.client.hdel(self._key(STEP_STATS), str(step))
        self.client.hdel(self._key(TRAINED), str(step))

    # ------------------------------------------------------------------ counters
    def next_controller_run(self) -> int:
        """This controller's incarnation: how many controllers started before it (INCR)."""
        return int(self.client.incr(self._key(CONTROLLER_RUNS))) - 1

    def reward_replicas(self) -> int | None:
        """The reward workers the operator's autoscaler asks for, or None (no autoscaler)."""
        value = self._get_json(REWARD_REPLICAS)
        return None if value is None else int(value)

    def set_reward_replicas(self, replicas: int) -> None:
        """Note the reward workers the autoscaler asks for."""
        self.client.set(self._key(REWARD_REPLICAS), json.dumps(replicas))
