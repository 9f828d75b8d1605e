"""One reconcile of an RLJob as an ordered list of steps: validate → build → adopt → apply →
observe → failure policy → status. Idempotent: running it twice creates nothing twice (409 on
create becomes a merge patch) and writes the same status.

Handlers (``handlers.py``) only wire kopf to :func:`reconcile`; everything that talks to the API
server goes through :class:`omnirl_operator.kube.KubeApi` in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from omnirl.api.loader import job_from_dict
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RLJob
from omnirl.api.status import TERMINAL_PHASES
from pydantic import ValidationError

from omnirl_operator.builders import build_children, desired_replicas, label_of
from omnirl_operator.kube import KubeApi, KubeError
from omnirl_operator.meta import ANNOTATION_RESTARTED_AT, ANNOTATION_SPEC_HASH, adopt, child_name
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.status import (
    PROGRESS_FIELDS,
    REASON_INVALID_SPEC,
    Observed,
    compute_status,
    decide_failure,
)

WORKLOADS = (("apps/v1", "Deployment", "rollout"), ("apps/v1", "Deployment", "reward"),
             ("apps/v1", "StatefulSet", "actor"))


@dataclass(frozen=True)
class Outcome:
    """What a reconcile did: the new status (a merge patch) and the child actions taken."""

    status: dict[str, Any]
    actions: list[str]


def validate(body: dict[str, Any], settings: OperatorSettings) -> tuple[RLJob | None, tuple[str, ...]]:
    """``(job, ())`` for a valid RLJob body, else ``(None, problem lines naming each field)``."""
    manifest = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    manifest["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k in ("name", "namespace")}
    try:
        job = job_from_dict(manifest)
    except ValidationError as exc:
        return None, tuple(text for _, text in problem_lines(RLJob, exc))
    try:
        build_children(job, settings)  # name length, Redis URL: the checks that need the settings
    except ValueError as exc:
        return None, (str(exc),)
    return job, ()


def _is_terminal(body: dict[str, Any]) -> bool:
    status = body.get("status") or {}
    if status.get("phase") not in TERMINAL_PHASES:
        return False
    failed = next((c for c in status.get("conditions", []) if c.get("type") == "Failed"), {})
    return not (failed.get("status") == "True" and failed.get("reason") == REASON_INVALID_SPEC)


def controller_state(job_obj: dict[str, Any] | None) -> tuple[str, str]:
    """``(absent | active | succeeded | failed, message)`` from a batch/v1 Job's status conditions."""
    if job_obj is None:
        return "absent", ""
    for cond in (job_obj.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "succeeded", cond.get("message", "")
        if cond.get("type") == "Failed":
            return "failed", f"{cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip(": ")
    return "active", ""


async def _apply_all(kube: KubeApi, children: list[dict[str, Any]], log: logging.Logger) -> list[str]:
    actions = []
    for child in children:
        if child["kind"] == "Job":
            continue
        verb, _ = await asyncio.to_thread(kube.apply, child)
        actions.append(f"{verb} {label_of(child)}")
    log.debug("applied %d children", len(actions))
    return actions


async def _sync_controller(kube: KubeApi, job: RLJob, ns: str, wanted: dict[str, Any] | None,
                           suspended: bool) -> tuple[str, str, list[str]]:
    """Create the controller Job if absent; recreate it when its template's spec hash changed;
    delete it when suspended. Returns (state, message, actions)."""
    name = child_name(job.metadata.name, "controller")
    current = await asyncio.to_thread(kube.get, "batch/v1", "Job", ns, name)
    state, message = controller_state(current)
    if suspended:
        if current is not None and await asyncio.to_thread(kube.delete, "batch/v1", "Job", ns, name):
            return "absent", "", [f"deleted Job/{name} (suspended)"]
        return "absent", "", []
    if wanted is None:  # terminal: leave the finished Job as the record it is
        return state, message, []
    if current is None:
        await asyncio.to_thread(kube.create, wanted)
        return "active", "", [f"created Job/{name}"]
    have = (current.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {})
    want = wanted["spec"]["template"]["metadata"]["annotations"]
    if state == "active" and have.get(ANNOTATION_SPEC_HASH) != want[ANNOTATION_SPEC_HASH]:
        # A Job's pod template is immutable: replace the Job; the next reconcile creates the new one.
        await asyncio.to_thread(kube.delete, "batch/v1", "Job", ns, name)
        return "absent", "", [f"deleted Job/{name} (spec changed; recreated next reconcile)"]
    return state, message, []


async def _observe_roles(kube: KubeApi, job: RLJob, ns: str, running: bool, controller: str
                         ) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Per role (desired, ready), and the roles whose workload reports a failure."""
    desired = desired_replicas(job, running=running)
    roles: dict[str, tuple[int, int]] = {}
    failures: dict[str, str] = {}
    for api_version, kind, role in WORKLOADS:
        obj = await asyncio.to_thread(kube.get, api_version, kind, ns, child_name(job.metadata.name, role))
        status = (obj or {}).get("status") or {}
        roles[role] = (desired[role], int(status.get("readyReplicas") or 0))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
                failures[role] = cond.get("message", "ProgressDeadlineExceeded")
    job_obj = await asyncio.to_thread(kube.get, "batch/v1", "Job", ns, child_name(job.metadata.name, "controller"))
    job_status = (job_obj or {}).get("status") or {}
    ready = int(job_status.get("ready") or 0) if controller == "active" else 0
    roles["controller"] = (desired["controller"] if controller != "succeeded" else 0, ready)
    return roles, failures


async def _restart_job(kube: KubeApi, job: RLJob, ns: str, now: datetime) -> list[str]:
    """Delete the controller Job and roll every workload's pods (``restarted-at`` annotation)."""
    name = job.metadata.name
    await asyncio.to_thread(kube.delete, "batch/v1", "Job", ns, child_name(name, "controller"))
    stamp = {"spec": {"template": {"metadata": {"annotations": {ANNOTATION_RESTARTED_AT: now.isoformat()}}}}}
    for api_version, kind, role in WORKLOADS:
        try:
            await asyncio.to_thread(kube.patch, api_version, kind, ns, child_name(name, role), stamp)
        except KubeError as exc:
            if exc.status != 404:
                raise
    return [f"restarted job {name}"]


async def reconcile(body: dict[str, Any], kube: KubeApi, settings: OperatorSettings, now: datetime,
                    log: logging.Logger) -> Outcome:
    """Bring the children of one RLJob to the state its spec and status ask for.

    Raises:
        KubeError: an API call failed (kopf retries the handler).
    """
    ns = body["metadata"]["namespace"]
    uid = body["metadata"]["uid"]
    progress = {k: (body.get("status") or {}).get(k) for k in PROGRESS_FIELDS}
    job, problems = validate(body, settings)
    if job is None:
        return Outcome(compute_status(body, Observed(invalid_spec=problems), progress, now), [])
    terminal = _is_terminal(body)
    suspended = job.spec.suspend and not terminal
    running = not suspended and not terminal
    children = adopt(build_children(job, settings, running=running), job.metadata.name, ns, uid)
    actions = await _apply_all(kube, children, log)
    wanted_job = next((c for c in children if c["kind"] == "Job"), None)
    state, message, more = await _sync_controller(kube, job, ns, wanted_job, suspended)
    actions += more
    roles, failures = await _observe_roles(kube, job, ns, running, state)
    observed = Observed(roles=roles, controller=state, controller_message=message, suspended=suspended,
                        restarts=int((body.get("status") or {}).get("restarts") or 0))
    failed_role = "controller" if state == "failed" else next(iter(sorted(failures)), None)
    if running and failed_role is not None:
        detail = message if failed_role == "controller" else failures[failed_role]
        policy = job.spec.failurePolicy.model_dump(mode="json")
        decision = decide_failure(policy, observed.restarts, failed_role, detail)
        if decision.action == "restart-job":
            actions += await _restart_job(kube, job, ns, now)
            observed = replace(observed, restarts=observed.restarts + 1, controller="absent",
                               restarted=(decision.reason, decision.message))
        elif decision.action == "fail":
            observed = replace(observed, failed=(decision.reason, decision.message))
            stopped = adopt(build_children(job, settings, running=False), job.metadata.name, ns, uid)
            actions += await _apply_all(kube, stopped, log)
            observed = replace(observed, roles={r: (0, ready) for r, (_, ready) in observed.roles.items()})
    if running and state == "succeeded":  # finished: free the accelerators now, not next reconcile
        stopped = adopt(build_children(job, settings, running=False), job.metadata.name, ns, uid)
        actions += await _apply_all(kube, stopped, log)
        observed = replace(observed, roles={r: (0, ready) for r, (_, ready) in observed.roles.items()})
    return Outcome(compute_status(body, observed, progress, now), actions)
