"""What an RLJob's pods say when the job does not get going, beyond the roles' own exit codes.

- :func:`judge_failure`: a judge server (``spec.reward[i].server``) whose container the kubelet
  restarted more than ``failurePolicy.maxRestarts`` times fails the job (reason ``JudgeFailed``):
  the controller starts only once every judge is Ready, so a judge that crash-loops keeps the job
  Pending for ever. The message names ``spec.reward[i]``, the pod, its last exit and what to fix.
- :func:`judge_stalls`: a judge Deployment past its ``progressDeadlineSeconds`` (reason
  ``ProgressDeadlineExceeded``), reported first among the waiting reasons below, naming
  ``spec.reward[i]`` and the fix (a judge is not under ``failurePolicy``: nothing is restarted).
- :func:`waiting_problems`, :func:`workload_problems`: pods that wait for something (unschedulable,
  an image that does not pull, a container the kubelet cannot create, a crash loop still within the
  budget) or that a Deployment cannot create (a quota, Pod Security admission) as
  ``(reason, text)`` for the status and a Warning event. They never fail the job by themselves:
  an unschedulable GPU pod may be waiting for the cluster autoscaler and an image pull may be a
  registry hiccup; ``failurePolicy.activeDeadlineSeconds`` (counted from the job's creation or
  resume, Pending included) bounds the wait.

Pure functions on the pods as the API server returns them (dicts).
"""

from __future__ import annotations

from typing import Any

from omnirl.api.spec import RLJob
from omnirl.scorers.judges import dns_name
from omnirl_operator.judges import LABEL_JUDGE_OF, LABEL_REWARD, judge_name
from omnirl_operator.status import FailureDecision

REASON_JUDGE_FAILED = "JudgeFailed"
# container waiting reasons worth a line in the status (ContainerCreating, PodInitializing: normal start)
WAITING_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                   "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")
MAX_TEXT = 240  # of one kubelet/scheduler message quoted in the status


def _short(text: str) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _last_exit(container: dict[str, Any]) -> str:
    ended = (container.get("lastState") or {}).get("terminated") or {}
    if "exitCode" not in ended:
        return ""
    return f"last exit {ended['exitCode']}" + (f": {ended['reason']}" if ended.get("reason") else "")


def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])


def judge_failure(pods: list[dict[str, Any]], job: RLJob, max_restarts: int) -> FailureDecision | None:
    """``fail`` (reason ``JudgeFailed``) when a container of a judge pod restarted more than
    ``max_restarts`` times (``failurePolicy.maxRestarts``), else None.

    Args:
        pods: the job's judge pods (label ``omnirl.dev/judge-of: <job>``).
        job: the RLJob (``spec.reward[i]`` is found by the pod's ``omnirl.dev/reward`` label).
        max_restarts: ``failurePolicy.maxRestarts``.
    """
    where = {dns_name(r): (i, r) for i, r in enumerate(job.spec.reward) if r.server is not None}
    ns = job.metadata.namespace or "default"
    for pod in _live(pods):
        hit = where.get((pod["metadata"].get("labels") or {}).get(LABEL_REWARD))
        if hit is None:
            continue
        i, reward = hit
        name = pod["metadata"]["name"]
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            count = int(container.get("restartCount") or 0)
            if count <= max_restarts:
                continue
            last = _last_exit(container)
            now = ((container.get("state") or {}).get("waiting") or {}).get("reason")
            detail = "; ".join(x for x in (last, f"now {now}" if now and now != "CrashLoopBackOff" else "") if x)
            if "OOMKilled" in last:
                fix = (f"it ran out of memory: raise the judge container's memory limit in "
                       f"spec.reward[{i}].server.template (or use a smaller model)")
            else:
                fix = (f"see kubectl logs -n {ns} {name} --previous, and fix spec.reward[{i}].server "
                       "(image, command, args, model)")
            return FailureDecision(
                "fail", REASON_JUDGE_FAILED,
                f"spec.reward[{i}] ({reward.name}): judge pod {name} restarted {count} times"
                + (f" ({detail})" if detail else "")
                + f", more than failurePolicy.maxRestarts ({max_restarts}); the controller starts only once every "
                f"judge is Ready. {fix[0].upper() + fix[1:]}; then delete the RLJob and apply it again")
    return None


def waiting_problems(pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(reason, text)`` per pod that waits for something, in pod-name order: the scheduler's
    ``PodScheduled=False`` (reason ``Unschedulable``, its message: which resource is short) or a
    container waiting with a reason of :data:`WAITING_REASONS` (with the kubelet's message, and for a
    crash loop the restart count and last exit)."""
    out = []
    for pod in _live(pods):
        name, status = pod["metadata"]["name"], pod.get("status") or {}
        unscheduled = next((c for c in status.get("conditions") or []
                            if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
        if unscheduled is not None:
            reason = unscheduled.get("reason") or "Unschedulable"
            out.append((reason, f"pod {name} {reason.lower()}: {_short(unscheduled.get('message', ''))}".rstrip(": ")))
            continue
        for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason not in WAITING_REASONS:
                continue
            text = f"pod {name}: {reason}"
            if reason == "CrashLoopBackOff":
                last = _last_exit(container)
                text += f" (restarted {int(container.get('restartCount') or 0)} times" + (f", {last})" if last else ")")
            elif waiting.get("message"):
                text += f": {_short(waiting['message'])}"
            out.append((reason, text))
            break
    return out


def workload_problems(stored: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """``(reason, text)`` per Deployment whose ReplicaSet cannot create pods (condition
    ``ReplicaFailure``: a ResourceQuota, a LimitRange, Pod Security admission refusing the pod), so
    there is no pod to look at. ``stored``: the applied children by ``Kind/name``."""
    out = []
    for key in sorted(stored):
        obj = stored[key] or {}
        if obj.get("kind") != "Deployment":
            continue
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                reason = cond.get("reason") or "FailedCreate"
                out.append((reason, f"{key} {reason}: {_short(cond.get('message', ''))}".rstrip(": ")))
    return out


def judge_stalls(stored: dict[str, dict[str, Any]], job: RLJob) -> list[tuple[str, str]]:
    """``("ProgressDeadlineExceeded", text)`` per judge Deployment (``spec.reward[i].server``) past its
    ``progressDeadlineSeconds`` (condition ``Progressing=False``): no Ready pod for that long, so the
    controller has not started. The text names ``spec.reward[i]``, the Deployment, the condition's
    message and the fix; the pods' own reasons follow it in the status (:func:`waiting_problems`).
    ``stored``: the applied children by ``Kind/name``."""
    ns = job.metadata.namespace or "default"
    out = []
    for i, reward in enumerate(job.spec.reward):
        if reward.server is None:
            continue
        name = judge_name(job.metadata.name, reward)
        obj = stored.get(f"Deployment/{name}") or {}
        deadline = (obj.get("spec") or {}).get("progressDeadlineSeconds")
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if (cond.get("type"), cond.get("status"), cond.get("reason")) != \
                    ("Progressing", "False", "ProgressDeadlineExceeded"):
                continue
            said = _short(cond.get("message", "")).rstrip(".")
            out.append(("ProgressDeadlineExceeded", (
                f"spec.reward[{i}] ({reward.name}): judge Deployment {name} made no progress within its "
                f"progressDeadlineSeconds ({deadline} s)" + (f": {said}" if said else "")
                + f"; the controller starts only once every judge is Ready. See kubectl describe pods -n {ns} -l "
                f"{LABEL_JUDGE_OF}={job.metadata.name},{LABEL_REWARD}={dns_name(reward)} and fix "
                f"spec.reward[{i}].server (image, command, accelerator, template)")))
    return out


def waiting_summary(problems: list[tuple[str, str]], shown: int = 2) -> tuple[str, str] | None:
    """``(reason of the first, the first ``shown`` texts and how many more)`` or None."""
    if not problems:
        return None
    texts = [t for _, t in problems[:shown]]
    more = len(problems) - shown
    return problems[0][0], "; ".join(texts) + (f"; and {more} more" if more > 0 else "")
