"""How near a sample's tensors come to `spec.transferQueue.tensorTtlSeconds`: measured waits against the TTL.

Past the TTL a training batch is not trained (its groups are generated again), a validation round misses
samples, and an actor restarted before the next checkpoint cannot replay a batch (exit 4). Nothing warned
before that happened. The actor measures its batches' ages with Redis's own clock (`TransferQueue.ages`,
metrics `batch_tensor_age_seconds` and, at a checkpoint, `replay_tensor_age_seconds`), `Validator.finish`
its round's (`val_tensor_age_seconds`); `TtlWatch` warns once per kind when one passes `WARN_FRACTION` of
the TTL, naming the field and the value that would leave room. `budget_line` is the static side: the step
time the manifest's TTL and checkpoint interval allow (`omnirl validate`).
"""

from __future__ import annotations

import logging
import math

from omnirl.api.spec import RLJobSpec

log = logging.getLogger("omnirl.controller")

WARN_FRACTION = 0.5  # a measured wait past this share of tensorTtlSeconds is warned about (once per kind)
ROOM = 4  # the suggested TTL holds this many times the measured wait


def suggested_ttl(age_s: float, ttl_s: float) -> float:
    """A `tensorTtlSeconds` leaving room for `age_s` (seconds): `ROOM` times it, rounded up to whole
    minutes, never below `ttl_s`."""
    return max(ttl_s, 60.0 * math.ceil(ROOM * age_s / 60.0))


def replay_window_steps(spec: RLJobSpec) -> int:
    """Training steps a batch's tensors must outlive for a replay: the checkpoint interval
    (`checkpoint.everySteps`; 0 = only at the end: the whole run), plus the step a `fully-async` job
    generates ahead."""
    every = spec.checkpoint.everySteps or spec.algorithm.steps
    pipe = spec.pipeline
    ahead = pipe.mode == "fully-async" and pipe.staleAction == "drop" and pipe.maxStaleness >= 1
    return every + int(ahead)


def budget_line(spec: RLJobSpec) -> str:
    """`omnirl validate`'s line: the longest a training step may take for the TTL to cover a replay.

    A manifest is not refused for it: the step time is the hardware's, not the manifest's."""
    ttl, steps = spec.transferQueue.tensorTtlSeconds, replay_window_steps(spec)
    every = spec.checkpoint.everySteps
    window = (f"checkpoint.everySteps ({every})" if every else f"the whole run (checkpoint.everySteps 0: "
              f"{spec.algorithm.steps} steps)") + (" + 1 step generated ahead (fully-async)"
                                                   if steps > (every or spec.algorithm.steps) else "")
    return (f"tensors: transferQueue.tensorTtlSeconds {ttl:g} s must outlive {window} for an actor restart to "
            f"replay a batch: keep a training step under {ttl / steps:.0f} s (the run warns past "
            f"{WARN_FRACTION:.0%} of the TTL)")


class TtlWatch:
    """Warns once per kind (`batch`, `replay`, `validation`) when a measured age passes `WARN_FRACTION` of
    the TTL. `warned` holds the kinds warned about."""

    def __init__(self, spec: RLJobSpec) -> None:
        self.spec, self.ttl = spec, spec.transferQueue.tensorTtlSeconds
        self.warned: set[str] = set()

    def _share(self, kind: str, age: float | None) -> int | None:
        if age is None or kind in self.warned or age <= WARN_FRACTION * self.ttl:
            return None
        self.warned.add(kind)
        return round(100 * age / self.ttl)

    def trained(self, step: int, metrics: dict[str, float]) -> None:
        """After step `step`'s `TrainDone`: its `batch_tensor_age_seconds` and `replay_tensor_age_seconds`."""
        field, ttl = "spec.transferQueue.tensorTtlSeconds", self.ttl
        age = metrics.get("batch_tensor_age_seconds")
        share = self._share("batch", age)
        if share is not None:
            log.warning("step %d: the batch's oldest sample had waited %.0f s when the actor read it, %d%% of %s "
                        "(%g s); past it the step is not trained and its groups are generated again: raise "
                        "tensorTtlSeconds (e.g. to %g)", step, age, share, field, ttl, suggested_ttl(age, ttl))
        age = metrics.get("replay_tensor_age_seconds")
        share = self._share("replay", age)
        if share is not None:
            every = self.spec.checkpoint.everySteps
            fewer = "" if every == 1 else f"lower spec.checkpoint.everySteps ({every}) or "  # 1: none fewer
            log.warning("step %d: the checkpoint covered a batch whose oldest sample was %.0f s old, %d%% of %s "
                        "(%g s); an actor restarted before a checkpoint that late cannot replay its batch (exit 4): "
                        "%sraise tensorTtlSeconds (e.g. to %g)", step, age, share, field, ttl, fewer,
                        suggested_ttl(age, ttl))

    def validated(self, summary: dict) -> None:
        """After a validation round: its `val_tensor_age_seconds`."""
        age = summary.get("val_tensor_age_seconds")
        share = self._share("validation", age)
        if share is not None:
            log.warning("validation at step %d: its oldest sample was %.0f s old when the round was summarised, %d%% "
                        "of spec.transferQueue.tensorTtlSeconds (%g s); past it samples are missing from the round: "
                        "raise tensorTtlSeconds (e.g. to %g) or lower spec.validation.maxPrompts (%d)",
                        summary["step"], age, share, self.ttl, suggested_ttl(age, self.ttl),
                        self.spec.validation.maxPrompts)
