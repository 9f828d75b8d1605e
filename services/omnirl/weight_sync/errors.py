"""Errors of the actor → rollout weight broadcast (docs/architecture.md §3 "Weight sync": never silently continue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omnirl.weight_sync.binding import BindReport
    from omnirl.weight_sync.sender import SyncReport


class WeightSyncError(RuntimeError):
    """A weight sync could not complete (store unreachable, no sync announced in time, ...)."""


class BindingError(WeightSyncError):
    """Received weights did not bind exactly (zero tensors, missing/unexpected names, checksum mismatch).

    Raised on the receiver (after it wrote a failure ack) and on the sender (after it read the acks).
    This is a job failure: a rollout worker must never keep sampling a policy it did not fully load.

    Attributes:
        failures: worker id → short reason naming the offending modules/tensors (sender side; empty
            when raised by `apply_to_module` outside a sync).
        report: the receiver's `BindReport` (receiver side), else None.
        mismatch: a receiver's module does not fit the sent names or shapes (`BindReport.mismatch`):
            a configuration mismatch no restart fixes (`omnirl role` exits `CONFIG_ERROR_EXIT`).
    """

    def __init__(self, message: str, failures: dict[str, str] | None = None,
                 report: BindReport | None = None, *, mismatch: bool = False) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})
        self.report = report
        self.mismatch = mismatch


class ReceiverLost(WeightSyncError):
    """One or more registered receivers did not complete a sync within the timeout.

    Rule (documented in the package docstring): the sender completes the sync with the receivers
    that did answer, **deregisters** the lost ones (a lost receiver that is in fact alive notices
    the eviction and registers again, so `serve_new_members` serves it later) and then raises this
    error. Left uncaught in the actor role it fails the actor (the pod restarts and every receiver
    rejoins); an actor that wants to keep training catches it, logs `lost` loudly, counts it and
    uses `report` — a deliberate decision in the actor's code, never a silent default.

    Attributes:
        lost: worker ids that did not answer (sorted).
        report: the `SyncReport` of the receivers that did acknowledge (its `receivers` may be
            empty), or None when no data was sent.
    """

    def __init__(self, message: str, lost: list[str], report: SyncReport | None = None) -> None:
        super().__init__(message)
        self.lost = sorted(lost)
        self.report = report


class SyncAborted(WeightSyncError):
    """The sender's `abort` callback said stop (the actor got SIGTERM) while a sync waited for its
    receivers (ready, a bucket's collective, acks); nothing was bound on the sender's side, and
    receivers still waiting for this generation time out or see the next one. The caller decides
    what the unfinished sync means. Also a receiver's `abort` while it waited for the actor's store
    (the rollout role got SIGTERM): nothing was registered."""
