"""RLJob status: computed from what the reconcile observed, compared, then written once.

:func:`compute_status` is pure. It never emits the progress fields the controller pod reports
(``step``, ``rewardMean``, ``policyVersion``, ``lastCheckpoint``): the result is a merge patch,
so leaving them out keeps them exactly as the controller last wrote them, even when its patch
lands between our read and our write.

:func:`decide_failure` is the failure policy (``spec.failurePolicy``) as a pure decision, the one
``omnirl run``'s supervisor makes too (``omnirl.api.failure_policy``: restarts counted per scope); the
handler carries it out (restart the job, or fail it) and reports it back via ``Observed``.
:func:`permanent_failure` comes first: a role pod that exited with a permanent code (a
configuration error, or the controller failing the job) fails the job whatever the policy says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from omnirl.api.exits import CONFIG_ERROR_EXIT, JOB_FAILED_EXIT, PERMANENT_EXITS, STORAGE_ERROR_EXIT
from omnirl.api.failure_policy import FailureAction, decide
from omnirl.api.spec import FailurePolicySpec
from omnirl.api.status import (
    FAILED,
    READY,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL_PHASES,
    Condition,
    RLJobStatus,
    RoleStatus,
    ready_roles_text,
    set_condition,
)

PROGRESS_FIELDS = ("step", "rewardMean", "policyVersion", "lastCheckpoint")
ControllerState = Literal["absent", "active", "succeeded", "failed"]
REASON_INVALID_SPEC = "InvalidSpec"
# a permanent exit code (`omnirl.api.exits.PERMANENT_EXITS`) → the Failed condition's reason, and what it means
PERMANENT_REASONS = {
    CONFIG_ERROR_EXIT: ("ConfigurationError", "a configuration error"),
    JOB_FAILED_EXIT: ("JobFailed", "the job failed"),
    STORAGE_ERROR_EXIT: ("StorageError", "a file or the run volume cannot be read or written"),
}


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw of the children, and what it decided.

    Attributes:
        roles: per role ``(desired, ready)`` pod counts (rollout, reward, actor, controller).
        controller: state of the controller Job.
        controller_message: the Job's failure/completion message, if any.
        suspended: ``spec.suspend``.
        invalid_spec: the problem lines of an invalid spec (empty: valid).
        failed: ``(reason, message)`` when the failure policy failed the job in this reconcile.
        restarted: ``(reason, message)`` when the job was restarted in this reconcile.
        restarts: restarts so far, including one made in this reconcile.
        restart_counts: restarts per scope (``omnirl.api.failure_policy``: ``job``, or the role restarted alone),
            including one made in this reconcile; merged into ``status.restartsPerScope``.
        waiting: ``(reason, text)`` of pods that wait for something (unschedulable, an image that
            does not pull, ...; :func:`omnirl_operator.podcheck.waiting_summary`), or None.
        blocked: ``(reason, text)`` when nothing was created because something outside the cluster must
            end first (another run of the job's name on its Redis: ``runowner.py``), or None.
    """

    roles: dict[str, tuple[int, int]] = field(default_factory=dict)
    controller: ControllerState = "absent"
    controller_message: str = ""
    suspended: bool = False
    invalid_spec: tuple[str, ...] = ()
    failed: tuple[str, str] | None = None
    restarted: tuple[str, str] | None = None
    restarts: int = 0
    restart_counts: dict[str, int] = field(default_factory=dict)
    waiting: tuple[str, str] | None = None
    blocked: tuple[str, str] | None = None


@dataclass(frozen=True)
class FailureDecision:
    """What to do about a failed child: ``none``, ``restart-role`` (roll that role's pods),
    ``restart-job`` (new controller Job, every role rolled) or ``fail``; ``role``: the role whose pod
    decided it, where one did (:func:`permanent_failure`); ``decided``: the failure policy's decision it
    carries out (:func:`decide_failure`), whose restart ``omnirl.api.failure_policy.count`` counts."""

    action: Literal["none", "restart-role", "restart-job", "fail"]
    reason: str = ""
    message: str = ""
    role: str = ""
    decided: FailureAction | None = None


def decide_failure(
    failure_policy: FailurePolicySpec, restarts: Mapping[str, int], failed_role: str | None, detail: str = ""
) -> FailureDecision:
    """The failure policy (``spec.failurePolicy``) applied to one failed role: ``omnirl.api.failure_policy.decide``
    with the role as the unit ``restart-role`` restarts (its pods roll together).

    Args:
        failure_policy: ``spec.failurePolicy``.
        restarts: ``status.restartsPerScope`` so far (``job``, and each role restarted alone).
        failed_role: the role whose workload failed (``None``: nothing failed).
        detail: the failure's own message (the Job's or Deployment's condition message).

    Returns:
        ``fail`` for ``fail-job``, once the scope's restarts reached ``maxRestarts``, and for a failed controller
        Job under ``restart-role`` (its in-place restarts, ``backoffLimit: maxRestarts``, are then used up);
        otherwise the role's action; ``none`` when ``failed_role`` is ``None``.
    """
    if failed_role is None:
        return FailureDecision("none")
    max_restarts = failure_policy.maxRestarts
    decided = decide(failure_policy, failed_role, failed_role, restarts,
                     used_up_in_place=failed_role == "controller" and failure_policy.controller == "restart-role")
    what = f"{failed_role} failed" + (f": {detail}" if detail else "")
    if decided.cause == "fail-job":
        return FailureDecision("fail", f"{failed_role.capitalize()}Failed",
                               f"{what} (failurePolicy.{failed_role}: fail-job)", decided=decided)
    if decided.cause == "exhausted":
        return FailureDecision(
            "fail", "RestartsExhausted", f"{what}; failurePolicy.maxRestarts={max_restarts} restarts used",
            decided=decided)
    scope = "the job" if decided.action == "restart-job" else f"role {failed_role}"
    return FailureDecision(decided.action, f"{failed_role.capitalize()}Failed",
                           f"{what}; restarting {scope} ({decided.used + 1}/{max_restarts})", decided=decided)


def permanent_failure(pods: list[dict[str, Any]], role_label: str) -> FailureDecision | None:
    """``fail`` when a container of ``pods`` last exited with a permanent code (``PERMANENT_EXITS``:
    restarting cannot help), else None.

    Looks at each container's current and previous termination (``state`` / ``lastState``: a
    Deployment's pod is restarted in place by the kubelet before the operator sees it). The
    message is the role (``role_label`` of the pod), the code and the last line of the container's
    termination message (its log tail, ``terminationMessagePolicy: FallbackToLogsOnError``: the
    role's one-line reason); reason ``ConfigurationError``, ``JobFailed`` or ``StorageError`` (a
    write to the run volume failed for want of space or a writable mount, or a file could not be read
    or written for want of permission: every restart would fail the same way until it is fixed).
    """
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        role = ((pod["metadata"].get("labels") or {}).get(role_label)) or pod["metadata"]["name"]
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (container.get("state"), container.get("lastState")):
                ended = (state or {}).get("terminated") or {}
                code = ended.get("exitCode")
                if code not in PERMANENT_EXITS:
                    continue
                lines = [line.strip() for line in (ended.get("message") or "").splitlines() if line.strip()]
                why = lines[-1] if lines else f"see kubectl logs --previous {pod['metadata']['name']}"
                reason, kind = PERMANENT_REASONS[code]
                return FailureDecision("fail", reason, f"{role} exited {code} ({kind}; not restarted): {why}", role)
    return None


def crash_looping(pods: list[dict[str, Any]], role_label: str, max_restarts: int,
                  templates: dict[str, dict[str, str]], keys: tuple[str, ...]) -> dict[str, str]:
    """Roles with a pod of their current template whose container the kubelet restarted more than
    ``max_restarts`` times (``failurePolicy.maxRestarts``: a replica's own restarts), with a message.

    A Deployment or StatefulSet pod that keeps crashing (OOM, a transient error each time) is
    restarted in place forever, and its workload reports no failure once it has been available.

    Args:
        pods: the job's pods.
        role_label: the pod label naming the role.
        templates: per workload role (rollout, reward, actor), the annotations of its current pod template.
        keys: the template annotations that identify a pod generation (spec hash, restarted-at): pods
            of an older one are going away and are not counted again after a restart.
    """
    out: dict[str, str] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        meta = pod["metadata"]
        role = (meta.get("labels") or {}).get(role_label)
        if role not in templates or role in out or meta.get("deletionTimestamp"):
            continue
        annotations = meta.get("annotations") or {}
        if any(annotations.get(k) != templates[role].get(k) for k in keys):
            continue
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            count = int(container.get("restartCount") or 0)
            if count > max_restarts:
                ended = ((container.get("lastState") or {}).get("terminated") or {})
                why = f" (last exit {ended['exitCode']}: {ended.get('reason', '')})" if "exitCode" in ended else ""
                out[role] = (f"pod {meta['name']} restarted {count} times{why}, more than failurePolicy.maxRestarts "
                             f"({max_restarts})")
                break
    return out


def active_since(job_obj: dict[str, Any]) -> datetime | None:
    """When ``failurePolicy.activeDeadlineSeconds`` starts counting: the job's creation, or its last
    resume from ``spec.suspend`` (the ``Suspended`` condition's last flip to False, else
    ``metadata.creationTimestamp``); None when neither is known or the job is being resumed (this
    reconcile is the start).

    Pending time counts (pods waiting for nodes, images, judges loading), as a batch/v1 Job's
    deadline counts from its start, not its pods'; restarts and spec edits do not reset it.
    """
    # the condition is set by the first reconcile (never before the creation), and flips on resume
    cond = next((c for c in (job_obj.get("status") or {}).get("conditions") or [] if c.get("type") == SUSPENDED), {})
    if cond.get("status") == "True":  # being resumed by this reconcile
        return None
    stamp = cond.get("lastTransitionTime") or (job_obj.get("metadata") or {}).get("creationTimestamp")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def deadline_exceeded(job_obj: dict[str, Any], deadline_s: int | None, controller: dict[str, Any] | None,
                      now: datetime) -> FailureDecision | None:
    """``fail`` (reason ``DeadlineExceeded``) once the job has been active ``failurePolicy.activeDeadlineSeconds``
    (:func:`active_since`: creation or last resume, Pending included), else None.

    Also when the controller Job reports it itself (its own ``activeDeadlineSeconds``: a Failed
    condition with reason ``DeadlineExceeded``), which the failure policy must not restart. A job
    that never ran says what it was waiting for (its last ``status.message``).
    """
    if deadline_s is None:
        return None
    start = active_since(job_obj)
    elapsed = (now - start).total_seconds() if start else 0.0
    job_says = any(c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") == "DeadlineExceeded"
                   for c in ((controller or {}).get("status") or {}).get("conditions") or [])
    if elapsed < deadline_s and not job_says:
        return None
    status = job_obj.get("status") or {}
    ran = f"has been active {int(elapsed)} s (since its creation or resume)" if start else "ran"
    pending = f"; it never ran: {status['message']}" if status.get("phase") == "Pending" and status.get("message") \
        else ""
    return FailureDecision("fail", "DeadlineExceeded",
                           f"the job {ran}, failurePolicy.activeDeadlineSeconds is {deadline_s} s; not restarted{pending}")


def _cond(type_: str, status: bool, reason: str, message: str, generation: int | None) -> Condition:
    return Condition(type=type_, status="True" if status else "False", reason=reason, message=message,
                     observedGeneration=generation)


def _finished(previous: RLJobStatus) -> bool:
    """Whether the job had finished (Succeeded, or Failed for a reason other than an invalid spec,
    which an edit may fix): its status is a record that no later reconcile changes."""
    prev_failed = next((c for c in previous.conditions if c.type == FAILED and c.status == "True"), None)
    return previous.phase in TERMINAL_PHASES and not (prev_failed and prev_failed.reason == REASON_INVALID_SPEC)


def _live(previous: RLJobStatus) -> bool:
    """Whether the job runs (or waits for pods) under a spec an earlier reconcile applied."""
    return previous.phase in ("Pending", "Running", "Suspended") and previous.observedGeneration is not None


def _phase(previous: RLJobStatus, obs: Observed, all_ready: bool) -> tuple[str, str, str]:
    """(phase, reason, message) from the previous status and the observation."""
    if _finished(previous):
        done = next((c for c in previous.conditions if c.type == previous.phase and c.status == "True"), None)
        # the condition keeps the message the job finished with (status.message may carry a note)
        return previous.phase, done.reason if done else previous.phase, done.message if done else previous.message
    if obs.invalid_spec:
        problems = "; ".join(obs.invalid_spec)
        if _live(previous):  # an invalid edit: nothing was applied, the pods go on with the last valid spec
            return (previous.phase, REASON_INVALID_SPEC, f"the edited spec is invalid and was not applied; the job "
                    f"goes on with generation {previous.observedGeneration}: {problems}")
        return "Failed", REASON_INVALID_SPEC, "invalid spec: " + problems
    if obs.failed is not None:
        return "Failed", obs.failed[0], obs.failed[1]
    if obs.controller == "succeeded":
        return "Succeeded", "ControllerSucceeded", obs.controller_message or "the controller finished the job"
    if obs.suspended and obs.blocked is not None:  # it keeps no claim of its name while another run holds it
        return "Suspended", obs.blocked[0], f"spec.suspend is true: no pods run; {obs.blocked[1]}"
    if obs.suspended:
        return "Suspended", "Suspended", "spec.suspend is true: no pods run"
    if obs.blocked is not None:  # not failed: it starts once the other run ended
        return ("Running" if previous.startTime is not None else "Pending"), obs.blocked[0], obs.blocked[1]
    if obs.restarted is not None:  # a restarted job that had run counts as running, as KubeRay does
        return ("Running" if previous.startTime is not None else "Pending"), obs.restarted[0], obs.restarted[1]
    if all_ready:
        return "Running", "AllRolesReady", "every role has all its pods ready"
    waiting = sorted(r for r, (d, ready) in obs.roles.items() if ready < d)
    reason = "Restarting" if previous.startTime is not None else "WaitingForPods"
    message = "waiting for pods of: " + ", ".join(waiting)
    if obs.waiting is not None:  # what the pods wait for: the scheduler's or the kubelet's reason
        reason, message = obs.waiting[0], f"{message}; {obs.waiting[1]}"
    return ("Running" if previous.startTime is not None else "Pending"), reason, message


def compute_status(job_obj: dict[str, Any], observed: Observed, progress: dict[str, Any], now: datetime
                   ) -> dict[str, Any]:
    """The new ``status`` of an RLJob as a JSON merge patch (progress fields left out).

    Args:
        job_obj: the RLJob as the API server returned it (``metadata.generation``, ``status``).
        observed: what the reconcile saw and did (see :class:`Observed`).
        progress: the controller's reported fields (``step``, ``rewardMean`` …); only used for
            the human-readable message, never written back.
        now: current time, timezone-aware (condition transition times, start/completion time).

    Returns:
        A dict valid against :class:`omnirl.api.status.RLJobStatus` (datetimes as RFC 3339 text)
        holding ``phase``, ``conditions``, ``observedGeneration``, ``roles``, ``readyRoles``,
        ``restarts``, ``message``, ``startTime``, ``completionTime``.

    Raises:
        pydantic.ValidationError: the stored status is not a valid RLJobStatus (the CRD schema
            should have prevented it).
    """
    stored = {k: v for k, v in (job_obj.get("status") or {}).items() if k in RLJobStatus.model_fields}
    previous = RLJobStatus.model_validate(stored)
    generation = job_obj.get("metadata", {}).get("generation")
    roles = {role: RoleStatus(desired=d, ready=min(r, d) if d else r) for role, (d, r) in observed.roles.items()}
    all_ready = bool(roles) and all(r.desired > 0 and r.ready >= r.desired for r in roles.values())
    phase, reason, message = _phase(previous, observed, all_ready)
    note = ""
    if observed.invalid_spec:  # nothing was observed: the pods are as last seen (Ready stays False: see the edit)
        roles = dict(previous.roles)
    if observed.invalid_spec and not _finished(previous) and _live(previous):
        generation = previous.observedGeneration  # the generation the pods still run
    if _finished(previous) and previous.observedGeneration is not None:
        # a finished job is not run again: an edit of its spec is not observed, and status.message says so
        if generation is not None and generation > previous.observedGeneration:
            note = (f" (spec generation {generation} not applied: the job finished at generation "
                    f"{previous.observedGeneration}; delete the RLJob and apply it again)")
        generation = previous.observedGeneration
    if phase == "Running" and progress.get("step") is not None:
        reward = progress.get("rewardMean")
        message += f"; {progress['step']} steps done" + (f", reward mean {reward:.4g}" if reward is not None else "")

    conditions = list(previous.conditions)
    terminal = phase in TERMINAL_PHASES
    for type_, status, why, text in (
        (READY, phase == "Running" and all_ready, reason, message),
        (SUSPENDED, phase == "Suspended", reason if phase == "Suspended" else "NotSuspended",
         message if phase == "Suspended" else ""),
        (SUCCEEDED, phase == "Succeeded", reason if phase == "Succeeded" else "NotSucceeded",
         message if phase == "Succeeded" else ""),
        (FAILED, phase == "Failed", reason if phase == "Failed" else "NotFailed", message if phase == "Failed" else ""),
    ):
        conditions = set_condition(conditions, _cond(type_, status, why, text, generation), now)

    start = previous.startTime or (now if phase == "Running" else None)
    status = RLJobStatus(
        phase=phase,
        conditions=conditions,
        observedGeneration=generation,
        roles=roles,
        readyRoles=ready_roles_text(roles),
        restarts=max(previous.restarts, observed.restarts),
        restartsPerScope={scope: max(previous.restartsPerScope.get(scope, 0), observed.restart_counts.get(scope, 0))
                          for scope in sorted({*previous.restartsPerScope, *observed.restart_counts})},
        message=message + note,
        startTime=start,
        completionTime=previous.completionTime or (now if terminal else None),
    )
    return status.model_dump(mode="json", exclude=set(PROGRESS_FIELDS))


def transition(job_obj: dict[str, Any], new_status: dict[str, Any]) -> tuple[str | None, str] | None:
    """``(old phase, new phase)`` when the phase changes (old is ``None`` on the first status), else
    ``None``: the reconcile posts an event per transition."""
    old = (job_obj.get("status") or {}).get("phase")
    new = new_status["phase"]
    return (old, new) if old != new else None


def status_differs(job_obj: dict[str, Any], new_status: dict[str, Any]) -> bool:
    """Whether writing ``new_status`` would change the stored status (skip no-op patches)."""
    stored = job_obj.get("status") or {}
    return any(stored.get(k) != v for k, v in new_status.items())
