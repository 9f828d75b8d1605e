"""Group bookkeeping for one training step.

A group is one prompt's G samples. It is complete when every member is scored. A group with a
failed member (scorer error, lost sample) or a member staler than allowed is never trained
partially (docs/concepts.md, "One job, four roles"): it is refilled whole — a new request with new sample ids
`{step}:{prompt}:{index}r{attempt}` — up to `max_attempts`, then dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from omnirl.api.ids import parse_group_id
from omnirl.api.messages import GenerateRequest, ScoreMeta


@dataclass
class Group:
    """One prompt's samples in one step."""

    request: GenerateRequest
    attempt: int = 0
    scores: dict[str, ScoreMeta] = field(default_factory=dict)
    tensor_keys: dict[str, str] = field(default_factory=dict)

    @property
    def expected(self) -> set[str]:
        """The sample ids of the current attempt."""
        return {s.sample_id for s in self.request.samples}

    @property
    def complete(self) -> bool:
        """Every member of the current attempt is scored."""
        return self.expected <= set(self.scores)

    @property
    def failed_reasons(self) -> list[str]:
        """Reasons of the failed members (empty when none failed)."""
        return [f"{s.sample_id}: {s.reason}" for s in self.scores.values() if s.failed]


@dataclass
class StepBook:
    """All groups of one training step, keyed by the group's first-attempt id `{step}:{prompt}`."""

    step: int
    t_published: float = 0.0
    groups: dict[str, Group] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    refills: int = 0
    failures: list[str] = field(default_factory=list)
    entry_ids: list[str] = field(default_factory=list)  # score entries to acknowledge at hand-off
    leftover_keys: list[str] = field(default_factory=list)  # tensors of superseded attempts, to delete

    def add(self, key: str, request: GenerateRequest) -> None:
        """Register a group's first request."""
        self.groups[key] = Group(request)

    def owner(self, group_id: str) -> str | None:
        """The group key a (possibly refilled) group id belongs to."""
        key = group_id.split("r", 1)[0] if "r" in group_id.split(":")[-1] else group_id
        return key if key in self.groups else None

    def record(self, score: ScoreMeta, tensor_key: str | None,
               refill: Callable[[StepBook, str, int], GenerateRequest] | None = None) -> Group | None:
        """File a score; returns its group, or None for a stale attempt's leftover.

        A score of a later attempt than the group's (a dead controller's refill, met by its
        successor) moves the group to that attempt first, with `refill(book, key, attempt)`'s
        request; earlier attempts' scores are then leftovers.
        """
        key = self.owner(score.group_id)
        if key is None:
            return None
        group = self.groups[key]
        attempt = attempt_of(score.group_id)
        if refill is not None and attempt > group.attempt:
            for stale in group.tensor_keys.values():
                self.leftover_keys.append(stale)
            group.attempt, group.request = attempt, refill(self, key, attempt)
            group.scores.clear()
            group.tensor_keys.clear()
            self.refills += 1
        if score.sample_id not in group.expected:
            return None  # a member of an attempt that was already refilled
        group.scores[score.sample_id] = score
        if tensor_key:
            group.tensor_keys[score.sample_id] = tensor_key
        return group

    @property
    def complete(self) -> bool:
        """Every remaining group is complete."""
        return all(g.complete for g in self.groups.values())

    def fail_lost(self, sample_ids: list[str], reason: str) -> list[str]:
        """Mark the scores of `sample_ids` failed with `reason` (their tensors are gone, the actor found):
        `_settle`'s refill path then regenerates their groups. Returns the keys of the groups marked; an id
        that is no member of its group's current attempt (the group moved on) is skipped."""
        wanted, marked = set(sample_ids), []
        for key, group in self.groups.items():
            hit = wanted & group.scores.keys()
            for sid in hit:
                group.scores[sid] = group.scores[sid].model_copy(update={"failed": True, "reward": None,
                                                                          "reason": reason})
            if hit:
                marked.append(key)
        return marked

    def to_json(self) -> dict:
        """The book as plain JSON values, stored with the step's `TrainRequest` (`kv:trainreqs`) so a
        controller can refill the step's groups after the actor found tensors gone (`from_json`)."""
        return {"step": self.step, "t_published": self.t_published, "dropped": self.dropped,
                "refills": self.refills, "failures": self.failures,
                "groups": {key: {"request": g.request.model_dump(), "attempt": g.attempt,
                                 "scores": {sid: s.model_dump() for sid, s in g.scores.items()},
                                 "tensor_keys": g.tensor_keys} for key, g in self.groups.items()}}

    @classmethod
    def from_json(cls, doc: dict) -> StepBook:
        """The book `to_json` stored (entry ids and leftovers are not kept: acknowledged, deleted)."""
        groups = {key: Group(GenerateRequest.model_validate(g["request"]), g["attempt"],
                             {sid: ScoreMeta.model_validate(s) for sid, s in g["scores"].items()}, dict(g["tensor_keys"]))
                  for key, g in doc["groups"].items()}
        return cls(doc["step"], doc["t_published"], groups, list(doc["dropped"]), doc["refills"], list(doc["failures"]))

    def drop(self, key: str, reason: str) -> Group:
        """Remove a group for good (after max attempts); returns it so its tensors can be deleted."""
        self.dropped.append(key)
        self.failures.append(reason)
        return self.groups.pop(key)


def attempt_of(group_id: str) -> int:
    """The attempt number in a group id: `{step}:{prompt}` → 0, `{step}:{prompt}r{n}` → n."""
    return parse_group_id(group_id).attempt


def refill_request(request: GenerateRequest, attempt: int, seeds: list[int]) -> GenerateRequest:
    """The request for attempt `attempt` of a group: same prompt and window, new ids and `seeds`
    (one per sample, in order).

    Raises:
        ValueError: `seeds` does not have one seed per sample.
    """
    if len(seeds) != len(request.samples):
        raise ValueError(f"refill of {request.group_id}: {len(seeds)} seeds for {len(request.samples)} samples")
    base_group = request.group_id.split("r", 1)[0] if attempt > 1 else request.group_id
    samples = [
        s.model_copy(update={"sample_id": f"{s.sample_id.split('r', 1)[0]}r{attempt}", "seed": seed})
        for s, seed in zip(request.samples, seeds, strict=True)
    ]
    return request.model_copy(update={"group_id": f"{base_group}r{attempt}", "samples": samples})
