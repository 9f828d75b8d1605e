"""One reconcile of an RLJob as an ordered list of steps: validate → build → adopt → read (one
LIST per kind, ``read.py``; a child's name taken by another owner's object fails the job, nothing
of that object written) → claim the job's name on its Redis (``runowner.py``; another live run of
that name: nothing created, checked again every resync) → reward autoscaler (``autoscale.py``) → apply
→ observe (workloads, and the pods'
exit codes) → failure policy → status. A job that fails stops its own pods (``stop.py``); a refused one
(a name taken, another run on its Redis, an invalid spec) writes nothing else, to the cluster or Redis, but
for a live job whose edit is refused, which renews its claim of its name (its pods go on with the last spec).
Idempotent: running it twice creates nothing twice (409 on create becomes a merge patch), writes the
same status, and the second run sends no write at all (a child is patched only when it differs from
its stored object, ``meta.py::up_to_date``).

Handlers (``handlers.py``) only wire kopf to :func:`reconcile`; everything that talks to the API
server goes through :class:`omnirl_operator.kube.KubeApi` in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import yaml
from pydantic import ValidationError

from omnirl.api.exits import STORAGE_ERROR_EXIT
from omnirl.api.failure_policy import count
from omnirl.api.loader import dump_rljob, job_from_dict
from omnirl.api.podtemplate import role_env_from_problems
from omnirl.api.problems import problem_lines
from omnirl.api.resume import resume_conflict, resume_notes
from omnirl.api.spec import ROLE_NAMES, RLJob
from omnirl.api.status import TERMINAL_PHASES
from omnirl_operator.autoscale import autoscale_reward
from omnirl_operator.builders import build_children, desired_replicas, label_of, rollout_kind, workloads
from omnirl_operator.finished import finish_record, finished_message
from omnirl_operator.judges import LABEL_JUDGE_OF, judge_roles, judges_ready, wired
from omnirl_operator.kube import KubeApi, KubeError
from omnirl_operator.meta import (
    ANNOTATION_RESTARTED_AT,
    ANNOTATION_SPEC_HASH,
    LABEL_JOB,
    LABEL_ROLE,
    adopt,
    child_name,
    foreign_owner,
    pod_labels,
    up_to_date,
    with_applied_hash,
)
from omnirl_operator.podcheck import judge_failure, judge_stalls, waiting_problems, waiting_summary, workload_problems
from omnirl_operator.pods import JOB_KEY, MANIFEST_KEY
from omnirl_operator.read import read_children
from omnirl_operator.runowner import (
    REASON_REDIS_NAME_IN_USE,
    keep_name_on_refused_edit,
    redis_name_conflict,
    release_redis_name,
)
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.status import (
    PERMANENT_REASONS,
    PROGRESS_FIELDS,
    REASON_INVALID_SPEC,
    FailureDecision,
    Observed,
    compute_status,
    crash_looping,
    deadline_exceeded,
    decide_failure,
    permanent_failure,
)
from omnirl_operator.stop import stop_owned
from omnirl_operator.storage import claim_conflict, ensure_claim, full_volume_fix, names_full_volume


@dataclass(frozen=True)
class Outcome:
    """What a reconcile did: the new status (a merge patch), the child actions taken, and the
    events to post besides the phase transitions (``(type, reason, message)``)."""

    status: dict[str, Any]
    actions: list[str]
    events: list[tuple[str, str, str]] = field(default_factory=list)


REASON_SPEC_CHANGED = "SpecChanged"


def spec_changed_message(job: RLJob, generation: int | None, trained: int | None = None,
                         note: str | None = None) -> str:
    """What an edit of a running job's spec does, for its status and event.

    Args:
        trained: the job's trained steps (`status.step`; None or 0: none yet). Without `spec.storage` the
            checkpoints are in the pods' emptyDir, which the new pods do not get back, while the job's
            progress stays in Redis (`kv:actor_state`): the new actor exits 4 ("the job's actor had trained
            step N, but there is none", measured with an actor started as the pod starts it) and the job
            fails with ConfigurationError. The message said "training starts again from step 0".
        note: what the edit changes in the pending work and is accepted (`api/resume.py::resume_notes`).
    """
    if job.spec.storage:
        where = "the actor resumes from the latest checkpoint on the run claim (spec.storage)"
    elif not trained:
        where = "without spec.storage the run directory is an emptyDir, and no step was trained yet: training starts at step 0"
    else:
        where = (f"without spec.storage the run directory is an emptyDir that the new pods do not get back, and with "
                 f"it the checkpoint of the {trained} trained step{'s' if trained != 1 else ''}: the new actor cannot "
                 "continue them and the job fails (ConfigurationError); to start over, delete the RLJob and apply it "
                 "again; to keep the progress across an edit, set spec.storage")
    return (f"spec changed (generation {generation}): the controller Job is replaced and every role's pods "
            f"restart with the new spec; {where}" + (f"; {note}" if note else ""))


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


def env_from_problems(job: RLJob, kube: KubeApi, namespace: str) -> tuple[str, ...]:
    """The role templates' `envFrom` sources whose ConfigMap or Secret holds a variable the operator owns
    (`api/podtemplate.py::role_env_from_problems`), one line each as `omnirl validate` writes them; read
    here because a manifest only names them. Absent or unreadable sources are not checked (the kubelet
    reports a missing one)."""
    def keys_of(kind: str, name: str) -> list[str] | None:
        try:
            obj = kube.get("v1", kind, namespace, name)
        except KubeError:
            return None
        return None if obj is None else [*(obj.get("data") or {}), *(obj.get("binaryData") or {}),
                                         *(obj.get("stringData") or {})]

    problems = []
    for role in ROLE_NAMES:
        template = getattr(job.spec.roles, role).template
        if template:
            problems += role_env_from_problems(template, role, f"roles.{role}.template", keys_of)
    return tuple(f"spec.{p}" for p in problems)


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


REASON_NAME_CONFLICT = "NameConflict"


def name_conflict_message(taken: list[str], stopped: list[str]) -> str:
    """The Failed message of a job whose children's names are taken (nothing of theirs was changed);
    ``stopped``: what of the job's own was stopped (:func:`omnirl_operator.stop.stop_owned`)."""
    return ("a child's name is taken, so nothing was created and the existing objects were left as they are: "
            + "; ".join(taken) + ". "
            + (f"This job's own pods were stopped ({', '.join(a.split()[1] for a in stopped)}). " if stopped else "")
            + "Apply the job again under another metadata.name (or delete the object if it is a leftover of yours)")


async def _apply_all(kube: KubeApi, children: list[dict[str, Any]], stored: dict[str, dict[str, Any] | None],
                     log: logging.Logger) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Create or patch every child but the Job that differs from its stored object; returns the
    actions and the objects as now stored by ``Kind/name`` (their ``status`` is what the reconcile
    observes). A child whose stored object already holds what it sets (:func:`omnirl_operator.meta.up_to_date`)
    is not written, so a steady resync sends no write; each written child carries
    ``omnirl.dev/applied-hash``.

    Args:
        stored: the children as read by :func:`omnirl_operator.read.read_children` (or as since written);
            only this job's are ever written.
    """
    job = children[0]["metadata"]["labels"][LABEL_JOB] if children else ""
    actions, now = [], {}
    for child in children:
        key = label_of(child)
        have = stored.get(key)
        if child["kind"] == "Job" or (have is not None and foreign_owner(have, job) is not None):
            continue
        if child["kind"] == "PersistentVolumeClaim":  # created once: a claim's spec is immutable
            verb, obj = await asyncio.to_thread(ensure_claim, kube, child, have)
        else:
            child = with_applied_hash(child)
            if have is not None and up_to_date(child, have):
                verb, obj = "unchanged", have
            else:
                verb, obj = await asyncio.to_thread(kube.apply, child, absent=have is None)
        if verb != "unchanged":  # said every resync, it would drown the changes in the log
            actions.append(f"{verb} {key}")
        now[key] = obj
    log.debug("applied %d children", len(actions))
    return actions, now


async def _sync_controller(kube: KubeApi, job: RLJob, ns: str, current: dict[str, Any] | None,
                           wanted: dict[str, Any] | None, suspended: bool
                           ) -> tuple[dict[str, Any] | None, list[str], bool]:
    """From the stored controller Job ``current`` (this job's: :func:`omnirl_operator.read.read_children` checked it):
    create the controller Job if absent; recreate it when its template's spec hash changed;
    delete it when suspended. Returns (the Job as it now stands or None, actions, whether it was
    deleted for a spec change)."""
    name = child_name(job.metadata.name, "controller")
    state, _ = controller_state(current)
    if suspended:
        if current is not None and await asyncio.to_thread(kube.delete, "batch/v1", "Job", ns, name):
            return None, [f"deleted Job/{name} (suspended)"], False
        return None, [], False
    if wanted is None:  # terminal: leave the finished Job as the record it is
        return current, [], False
    if current is None:
        return await asyncio.to_thread(kube.create, wanted), [f"created Job/{name}"], False
    have = (current.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {})
    want = wanted["spec"]["template"]["metadata"]["annotations"]
    if state == "active" and have.get(ANNOTATION_SPEC_HASH) != want[ANNOTATION_SPEC_HASH]:
        # A Job's pod template is immutable: replace the Job; the next reconcile creates the new one.
        await asyncio.to_thread(kube.delete, "batch/v1", "Job", ns, name)
        return None, [f"deleted Job/{name} (spec changed; recreated next reconcile)"], True
    return current, [], False


def observe_roles(job: RLJob, stored: dict[str, dict[str, Any]], controller: dict[str, Any] | None,
                  running: bool) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Per role (desired, ready) from the stored workloads' status, and the roles whose workload
    reports a failure (a Deployment past its progress deadline)."""
    desired = desired_replicas(job, running=running)
    roles: dict[str, tuple[int, int]] = {}
    failures: dict[str, str] = {}
    for _, kind, role in workloads(job):
        status = (stored.get(f"{kind}/{child_name(job.metadata.name, role)}") or {}).get("status") or {}
        roles[role] = (desired[role], int(status.get("readyReplicas") or 0))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
                failures[role] = cond.get("message", "ProgressDeadlineExceeded")
    state, _ = controller_state(controller)
    ready = int(((controller or {}).get("status") or {}).get("ready") or 0) if state == "active" else 0
    roles["controller"] = (desired["controller"] if state != "succeeded" else 0, ready)
    return roles, failures


def _templates(job: RLJob, stored: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per workload role, the annotations of its stored pod template."""
    out = {}
    for _, kind, role in workloads(job):
        obj = stored.get(f"{kind}/{child_name(job.metadata.name, role)}") or {}
        out[role] = ((obj.get("spec") or {}).get("template") or {}).get("metadata", {}).get("annotations") or {}
    return out


async def _restart(kube: KubeApi, job: RLJob, ns: str, now: datetime, role: str | None = None) -> list[str]:
    """Roll pods with a ``restarted-at`` template annotation (like ``kubectl rollout restart``):
    every workload plus a new controller Job when ``role`` is None, else that role's workload."""
    name = job.metadata.name
    if role is None:
        await asyncio.to_thread(kube.delete, "batch/v1", "Job", ns, child_name(name, "controller"))
    stamp = {"spec": {"template": {"metadata": {"annotations": {ANNOTATION_RESTARTED_AT: now.isoformat()}}}}}
    for api_version, kind, workload_role in workloads(job):
        if role is not None and workload_role != role:
            continue
        try:
            await asyncio.to_thread(kube.patch, api_version, kind, ns, child_name(name, workload_role), stamp)
        except KubeError as exc:
            if exc.status != 404:
                raise
    return [f"restarted {'job ' + name if role is None else 'role ' + role}"]


def _stored_manifest(stored_spec: dict[str, Any] | None, job: RLJob) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the manifest the job's pods run, `job` in the same form) from its ConfigMap, or None without one.

    The ConfigMap's `manifest.yaml` holds the judges as written (`reward[].server`), as `job` has them; one
    written before it had that key holds only `job.yaml`, each judge wired to its Service URL, so `job` is
    compared wired too (else every judge reward would read as a changed `url`)."""
    data = (stored_spec or {}).get("data") or {}
    if data.get(MANIFEST_KEY):
        return yaml.safe_load(data[MANIFEST_KEY]) or {}, dump_rljob(job)
    text = data.get(JOB_KEY)
    return ((yaml.safe_load(text) or {}), dump_rljob(wired(job))) if text else None


def resume_note_of(stored_spec: dict[str, Any] | None, job: RLJob) -> str | None:
    """The accepted changes of an edit to the pending work (new reward weights, a judge's timeout, another
    `model.dtype`: `api/resume.py::resume_notes`), against the job's ConfigMap; None without one or without such
    a change."""
    pair = _stored_manifest(stored_spec, job)
    return None if pair is None else resume_notes(*pair)


def resume_conflict_of(stored_spec: dict[str, Any] | None, job: RLJob) -> str | None:
    """Why the job's pods may not restart with `job`'s spec, or None: its ConfigMap (`stored_spec`, the
    manifest the pods run) differs in a field that shaped the steps already published and the
    checkpoints (`omnirl.api.resume.RESUME_FIXED`). Its pods would restart with `OMNIRL_RESUME=auto` and
    the controller would rebuild those steps with the new values (a larger `groupSize`: it waited for
    ever for samples never requested). A job that has no ConfigMap yet has nothing to keep."""
    pair = _stored_manifest(stored_spec, job)
    if pair is None:
        return None
    name = job.metadata.name
    return resume_conflict(*pair, where=f"RLJob {name}",
                           fix=f"put the earlier values back, or delete RLJob {name} (its queued work goes with it) "
                               "and create it again as a new run (model.path: one of its exports to continue from "
                               "its weights)")


async def _release_if_finished(kube: KubeApi, job: RLJob, ns: str, uid: str, terminal: bool, status: dict[str, Any],
                               settings: OperatorSettings, log: logging.Logger) -> None:
    """The reconcile in which the job finishes (Succeeded, or Failed for good) releases its claim of its name
    on its Redis (`runowner.py`): a rerun of that name may start there at once, not once the claim lapsed."""
    if not terminal and _is_terminal({"status": status}):
        await release_redis_name(kube, job, ns, uid, settings, log)


async def _refused_edit(kube: KubeApi, body: dict[str, Any], ns: str, uid: str, problems: tuple[str, ...],
                        progress: dict[str, Any], now: datetime, settings: OperatorSettings,
                        log: logging.Logger) -> Outcome:
    """The outcome of a reconcile that refuses the spec (`InvalidSpec`): the status says so, nothing is applied,
    and a live job keeps its name on its Redis (`runowner.keep_name_on_refused_edit`: its pods go on)."""
    await keep_name_on_refused_edit(kube, body, ns, uid, settings, log)
    return Outcome(compute_status(body, Observed(invalid_spec=problems), progress, now), [])


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
        return await _refused_edit(kube, body, ns, uid, problems, progress, now, settings, log)
    terminal = _is_terminal(body)
    if not terminal:  # a role's envFrom that sets the operator's variables: refused like such an env entry
        env_from = await asyncio.to_thread(env_from_problems, job, kube, ns)
        if env_from:
            return await _refused_edit(kube, body, ns, uid, env_from, progress, now, settings, log)
    suspended = job.spec.suspend and not terminal
    running = not suspended and not terminal
    children = adopt(build_children(job, settings, running=running), job.metadata.name, ns, uid)
    # the rollout workload of the other kind (a layout edit switched Deployment ↔ StatefulSet): read with the
    # listings the reconcile makes anyway, deleted below
    stale = {"apiVersion": "apps/v1", "kind": "Deployment" if rollout_kind(job) == "StatefulSet" else "StatefulSet",
             "metadata": {"name": child_name(job.metadata.name, "rollout")}}
    before, taken = await read_children(kube, job.metadata.name, ns, children,
                                        also=(("apps/v1", stale["kind"], stale["metadata"]["name"]),))
    claim = next((c for c in children if c["kind"] == "PersistentVolumeClaim"), None)
    if claim is not None and not terminal:  # an edit the claim cannot follow: an invalid spec, nothing applied
        conflict = claim_conflict(before[label_of(claim)], claim)
        if conflict is not None:
            return await _refused_edit(kube, body, ns, uid, (conflict,), progress, now, settings, log)
    stored_spec = before.get(f"ConfigMap/{child_name(job.metadata.name, suffix='spec')}")
    note = resume_note_of(stored_spec, job)  # read before the apply rewrites the ConfigMap
    if not terminal:  # an edit that reshapes the work in Redis and the checkpoints: refused, nothing applied
        conflict = resume_conflict_of(stored_spec, job)
        if conflict is not None:
            return await _refused_edit(kube, body, ns, uid, (conflict,), progress, now, settings, log)
    # A refused job changes nothing but stopping its own pods (and, failed, releasing its own claim): the name
    # checks come before the Redis claim and the autoscaler (which wrote `kv:reward_replicas` and said "scaled"
    # for a job it refused).
    if taken:  # never write another owner's object; fail, and stop what this job already runs
        stopped = await stop_owned(kube, ns, uid, before)
        failed = None if terminal else (REASON_NAME_CONFLICT, name_conflict_message(taken, stopped))
        observed = Observed(failed=failed, restarts=int((body.get("status") or {}).get("restarts") or 0))
        status = compute_status(body, observed, progress, now)
        await _release_if_finished(kube, job, ns, uid, terminal, status, settings, log)
        return Outcome(status, stopped)
    if not terminal:  # another run of this name on the job's Redis: nothing created, checked again every resync;
        # a suspended job renews its claim too: its pending work waits in Redis for its resume
        in_use = await redis_name_conflict(kube, job, ns, uid, before, settings, log)
        if in_use is not None:
            stopped = await stop_owned(kube, ns, uid, before)  # a job that ran: its pods must not share the keys
            observed = Observed(blocked=(REASON_REDIS_NAME_IN_USE, in_use), suspended=suspended,
                                restarts=int((body.get("status") or {}).get("restarts") or 0))
            said = (body.get("status") or {}).get("message") == in_use  # one event per change, not every resync
            return Outcome(compute_status(body, observed, progress, now), stopped,
                           [] if said else [("Warning", REASON_REDIS_NAME_IN_USE, in_use)])
    reward = before.get(f"Deployment/{child_name(job.metadata.name, 'reward')}")
    scaled, actions = await autoscale_reward(kube, job, ns, children, reward, settings, now)
    more, stored = await _apply_all(kube, children, before, log)
    actions += more
    if before.get(label_of(stale)) is not None and await asyncio.to_thread(
            kube.delete, "apps/v1", stale["kind"], ns, stale["metadata"]["name"]):
        actions.append(f"deleted {label_of(stale)} (roles.rollout.parallel changed the rollout's workload)")
    judges = judge_roles(job, stored, running)
    wanted_job = next((c for c in children if c["kind"] == "Job"), None)
    if not judges_ready(judges):  # the controller starts scoring only once every judge answers
        wanted_job = None
    current = before[f"Job/{child_name(job.metadata.name, 'controller')}"]
    controller, more, spec_changed = await _sync_controller(kube, job, ns, current, wanted_job, suspended)
    actions += more
    state, message = controller_state(controller)
    if running and state == "failed":  # died after writing the job's `finish` record: the job is done
        record = await finish_record(kube, job, ns, settings, log)
        if record is not None:
            state, message = "succeeded", finished_message(record, message or "Failed")
    roles, failures = observe_roles(job, stored, controller, running)
    roles.update(judges)
    if scaled is not None:  # status.roles.reward.desired: what the autoscaler asks for
        roles["reward"] = (scaled, roles["reward"][1])
    observed = Observed(roles=roles, controller=state, controller_message=message, suspended=suspended,
                        restarts=int((body.get("status") or {}).get("restarts") or 0))
    restart_counts = dict((body.get("status") or {}).get("restartsPerScope") or {})  # api/failure_policy.py
    events: list[tuple[str, str, str]] = []
    if spec_changed:
        text = spec_changed_message(job, body["metadata"].get("generation"), progress.get("step"), note)
        observed = replace(observed, restarted=(REASON_SPEC_CHANGED, text))
        events.append(("Normal", REASON_SPEC_CHANGED, text))
    failed_role = "controller" if state == "failed" else next(iter(sorted(failures)), None)
    decision = FailureDecision("none")
    permanent = None
    # a job whose controller finished is not failed by what its pods did since (a pod that died after the
    # `finish` record, restarted in place, has a restartCount that read as a crash loop)
    checked = running and state != "succeeded"
    if checked:  # a permanent exit code or the deadline fails the job before any restart is considered
        permanent = deadline_exceeded(body, job.spec.failurePolicy.activeDeadlineSeconds, controller, now)
    if checked and permanent is None:
        # one LIST for the role pods (omnirl.dev/job) and the judges' (omnirl.dev/judge-of): both carry pod_labels
        listed = await asyncio.to_thread(kube.list_by_labels, "v1", "Pod", ns, pod_labels(job.metadata.name))
        pods = [p for p in listed if (p["metadata"].get("labels") or {}).get(LABEL_JOB) == job.metadata.name]
        judge_pods = [p for p in listed if judges
                      and (p["metadata"].get("labels") or {}).get(LABEL_JUDGE_OF) == job.metadata.name]
        max_restarts = job.spec.failurePolicy.maxRestarts
        # the last step's result is reported (the controller's status.step): the actor has nothing left to do, and
        # its pod restarted in place (after a SIGKILL right after that result) is no failure of the job (`omnirl
        # run`'s supervisor does not restart it then, `launch/supervise.py::_no_longer_needed`)
        trained = int(progress.get("step") or 0) >= job.spec.algorithm.steps
        judged = [p for p in pods if not (trained and (p["metadata"].get("labels") or {}).get(LABEL_ROLE) == "actor")]
        permanent = permanent_failure(judged, LABEL_ROLE) or judge_failure(judge_pods, job, max_restarts)
        if (permanent is not None and permanent.reason == PERMANENT_REASONS[STORAGE_ERROR_EXIT][0]
                and names_full_volume(permanent.message)):  # not for a file it may not read or write
            permanent = replace(permanent, message=f"{permanent.message}. {full_volume_fix(job, permanent.role)}")
        problems = judge_stalls(stored, job) + workload_problems(stored) + waiting_problems(pods + judge_pods)
        observed = replace(observed, waiting=waiting_summary(problems))
        if failed_role is None:  # a replica the kubelet keeps restarting is a failed role
            looping = crash_looping(judged, LABEL_ROLE, max_restarts,
                                    _templates(job, stored), (ANNOTATION_SPEC_HASH, ANNOTATION_RESTARTED_AT))
            failed_role = next(iter(sorted(looping)), None)
            failures.update(looping)
    if permanent is not None:
        decision = permanent
    elif checked and failed_role is not None:
        detail = message if failed_role == "controller" else failures[failed_role]
        decision = decide_failure(job.spec.failurePolicy, restart_counts, failed_role, detail)
    if decision.action in ("restart-job", "restart-role"):
        whole = decision.action == "restart-job"
        actions += await _restart(kube, job, ns, now, None if whole else failed_role)
        observed = replace(observed, restarts=observed.restarts + 1, controller="absent" if whole else state,
                           restart_counts=count(restart_counts, decision.decided),
                           restarted=(decision.reason, decision.message))
    elif decision.action == "fail":
        observed = replace(observed, failed=(decision.reason, decision.message))
    if decision.action == "fail" or (running and state == "succeeded"):
        # finished: free the accelerators now rather than at the next reconcile
        stopped = adopt(build_children(job, settings, running=False), job.metadata.name, ns, uid)
        actions += (await _apply_all(kube, stopped, {**before, **stored}, log))[0]
        observed = replace(observed, roles={r: (0, ready) for r, (_, ready) in observed.roles.items()})
    if decision.action == "fail" or terminal:  # a failed job's controller Job stops too (a finished one stays)
        actions += await stop_owned(kube, ns, uid, {f"Job/{child_name(job.metadata.name, 'controller')}": controller})
    status = compute_status(body, observed, progress, now)
    await _release_if_finished(kube, job, ns, uid, terminal, status, settings, log)
    if observed.waiting is not None and status["message"] != (body.get("status") or {}).get("message") \
            and observed.waiting[1] in status["message"]:  # said once per change, not every resync
        events.append(("Warning", observed.waiting[0], status["message"]))
    return Outcome(status, actions, events)
