"""`spec.failurePolicy` as one decision: what a role's failure does, and how restarts are counted.

Both launchers carry it out: `omnirl run`'s supervisor (`launch/supervise.py::Supervisor._failed`) and the
operator (`omnirl_operator/status.py::decide_failure`). Before, each decided itself and they counted differently:
the supervisor per scope, the operator every restart of the job and of any role against one `status.restarts`.

Restarts are counted per scope, each scope against `maxRestarts` (as `FailurePolicySpec.maxRestarts` says): the
job's own restarts (`restart-job`: every role again, from the latest checkpoint) in scope `JOB`, and the restarts
of each unit a `restart-role` restarts in a scope of its own — locally one replica process (`rollout-0`), on
Kubernetes one role's pods (its Deployment rolls them together: `rollout`). A failure whose scope has used
`maxRestarts` fails the job; `fail-job` always does. Pure and torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from omnirl.api.spec import FailurePolicySpec

JOB = "job"
"""The scope of the job's own restarts (`restart-job`)."""


@dataclass(frozen=True)
class FailureAction:
    """What one failure does.

    Attributes:
        action: `restart-role` (restart the failed unit alone), `restart-job` (restart every role) or `fail`.
        scope: whose restarts it counts against: `JOB`, or the unit `restart-role` restarts.
        used: that scope's restarts before this failure.
        cause: why a `fail`: `fail-job` (the role's policy), `exhausted` (`maxRestarts` used, or the platform
            spent them in place); "" for a restart.
    """

    action: Literal["restart-role", "restart-job", "fail"]
    scope: str
    used: int
    cause: Literal["", "fail-job", "exhausted"] = ""

    @property
    def restarts(self) -> bool:
        """Whether the job goes on after a restart."""
        return self.action != "fail"


def decide(policy: FailurePolicySpec, role: str, unit: str, restarts: Mapping[str, int], *,
           used_up_in_place: bool = False) -> FailureAction:
    """The failure policy applied to one failure of `role`.

    Args:
        policy: `spec.failurePolicy`.
        role: the failed role (`rollout`, `reward`, `actor`, `controller`): its action is `policy.<role>`.
        unit: what `restart-role` restarts for this failure: a replica's process name locally, the role on
            Kubernetes (its pods roll together).
        restarts: restarts so far per scope (`count`); a scope not in it has none.
        used_up_in_place: the platform already restarted the unit in place as often as the policy allows (the
            operator's controller Job under `restart-role`: its `backoffLimit` is `maxRestarts`).
    Returns:
        `fail` for `fail-job`, or once the scope's restarts reached `maxRestarts`; else the role's action.
    Raises:
        AttributeError: `role` is not a role of `FailurePolicySpec`.
    """
    action = getattr(policy, role)
    scope = JOB if action == "restart-job" else unit
    used = int(restarts.get(scope, 0))
    if action == "fail-job":
        return FailureAction("fail", scope, used, "fail-job")
    if used >= policy.maxRestarts or used_up_in_place:
        return FailureAction("fail", scope, used, "exhausted")
    return FailureAction(action, scope, used)


def count(restarts: Mapping[str, int], decided: FailureAction) -> dict[str, int]:
    """`restarts` once `decided` is carried out: a restart adds one to its scope; a `fail` adds nothing."""
    out = dict(restarts)
    if decided.restarts:
        out[decided.scope] = decided.used + 1
    return out
