"""The RLJob status (`.status`): what the operator observed plus the controller's training progress.

Shaped like Kubernetes' own objects: `phase` is a short word for printer columns; `conditions`
follow metav1.Condition (a list keyed by `type`, `lastTransitionTime` changed only when `status`
flips; see `set_condition`). The operator's deployment state (`roles`, `readyRoles`, `restarts`)
is kept apart from the job's progress (`step`, `rewardMean`, `policyVersion`, `lastCheckpoint`),
which the controller pod reports, as KubeRay's RayJob does. The CRD's status schema is generated
from `RLJobStatus`; a field kopf writes but the schema lacks would be pruned by the API server.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

Phase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = ("Pending", "Running", "Suspended", "Succeeded", "Failed")
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})

# Condition types the operator sets (other types are allowed: the list is keyed by type).
READY = "Ready"
PROGRESSING = "Progressing"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"

# metav1.Condition's validation patterns (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Condition(_Status):
    """One metav1.Condition-shaped condition."""

    type: str = Field(..., pattern=_TYPE_PATTERN, max_length=316, description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(
        ...,
        pattern=_REASON_PATTERN,
        min_length=1,
        max_length=1024,
        description="Machine-readable CamelCase reason for the last transition, e.g. AllRolesReady.",
    )
    message: str = Field("", max_length=32768, description="Human-readable details.")
    lastTransitionTime: AwareDatetime | None = Field(
        None, description="When status last changed (RFC 3339, UTC); set by set_condition."
    )
    observedGeneration: int | None = Field(
        None, ge=0, description="metadata.generation of the RLJob this condition was computed from."
    )


class RoleStatus(_Status):
    """Pod counts of one role."""

    desired: int = Field(0, ge=0, description="Pods the spec asks for (0 while suspended).")
    ready: int = Field(0, ge=0, description="Pods that are Ready.")


class RLJobStatus(_Status):
    """`status` of an RLJob, written once per reconcile by the operator."""

    phase: Phase = Field("Pending", description="Pending, Running, Suspended, Succeeded or Failed.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="metav1-style conditions, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observedGeneration: int | None = Field(None, ge=0, description="metadata.generation last reconciled.")
    roles: dict[str, RoleStatus] = Field(
        default_factory=dict, description="Pod counts per role (rollout, reward, actor, controller)."
    )
    readyRoles: str = Field("0/0", pattern=r"^\d+/\d+$", description="Roles with all pods ready / roles, e.g. 4/4.")
    step: int = Field(0, ge=0, description="Training steps completed (reported by the controller).")
    rewardMean: float | None = Field(None, description="Mean reward of the last training step's batch (the raw "
                                      "weighted sum in a job with reward[].normalize).")
    policyVersion: int = Field(0, ge=0, description="Policy version the rollout workers hold.")
    lastCheckpoint: str | None = Field(None, description="Path of the last saved checkpoint.")
    startTime: AwareDatetime | None = Field(None, description="When the job first ran (RFC 3339, UTC).")
    completionTime: AwareDatetime | None = Field(None, description="When the job finished (RFC 3339, UTC).")
    restarts: int = Field(0, ge=0, description="Job and role restarts so far, in all (each scope's own count, which "
                          "failurePolicy.maxRestarts bounds, is in restartsPerScope).")
    restartsPerScope: dict[str, int] = Field(
        default_factory=dict, description="Restarts per scope, each bounded by failurePolicy.maxRestarts on its own: "
        "`job` (restart-job: every role from the latest checkpoint) and each role restarted alone (restart-role).")
    message: str = Field("", description="Human-readable summary of the current phase.")
    stalled: str = Field(
        "", description="Roles whose heartbeat is older than failurePolicy.progressDeadlineSeconds, with its age, as "
        "the controller last saw them (e.g. `reward-7f9c: no heartbeat for 640 s`); empty when every role beats."
    )


def utc_now() -> datetime:
    """The current time in UTC, truncated to whole seconds (metav1.Time's precision)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


def get_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of the given type, or None."""
    return next((c for c in conditions if c.type == type_), None)


def set_condition(conditions: list[Condition], new: Condition, now: datetime) -> list[Condition]:
    """Set one condition with metav1 semantics (apimachinery's `meta.SetStatusCondition`).

    A condition of `new.type` that already exists keeps its position and its lastTransitionTime when
    its status is unchanged (reason, message and observedGeneration are updated); when the status
    flips, or the type is new (appended), lastTransitionTime becomes `now`. The input list is not
    modified.

    Args:
        conditions: the current conditions (at most one per type).
        new: the condition to set; its lastTransitionTime is ignored.
        now: the current time; must be timezone-aware. Microseconds are dropped.
    Returns:
        A new list of conditions.
    Raises:
        ValueError: `now` is naive (no tzinfo).
    """
    if now.tzinfo is None:
        raise ValueError("set_condition: `now` must be timezone-aware (use omnirl.api.status.utc_now())")
    now = now.astimezone(timezone.utc).replace(microsecond=0)
    out: list[Condition] = []
    found = False
    for old in conditions:
        if old.type != new.type:
            out.append(old)
            continue
        found = True
        changed = old.status != new.status or old.lastTransitionTime is None
        out.append(new.model_copy(update={"lastTransitionTime": now if changed else old.lastTransitionTime}))
    if not found:
        out.append(new.model_copy(update={"lastTransitionTime": now}))
    return out


def ready_roles_text(roles: dict[str, RoleStatus]) -> str:
    """The `readyRoles` printer-column text: roles with ready >= desired > 0, over all roles ("3/4").

    A role with desired 0 (suspended) counts as not ready.
    """
    ready = sum(1 for r in roles.values() if r.desired > 0 and r.ready >= r.desired)
    return f"{ready}/{len(roles)}"
