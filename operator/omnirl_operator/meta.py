"""Names, labels, owner references and the pod-template merge shared by every builder.

Pure functions on plain dicts; nothing here talks to a cluster.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from omnirl.api.spec import API_GROUP, API_VERSION, KIND

LABEL_JOB = f"{API_GROUP}/job"
LABEL_ROLE = f"{API_GROUP}/role"
LABEL_METRICS = f"{API_GROUP}/metrics"
ANNOTATION_SPEC_HASH = f"{API_GROUP}/spec-hash"
ANNOTATION_RESTARTED_AT = f"{API_GROUP}/restarted-at"
# "Retain" on a child (the run claim) means: no ownerReference, garbage collection leaves it alone.
ANNOTATION_WHEN_DELETED = f"{API_GROUP}/when-deleted"
# On every child the reconcile writes: a hash of the object as last built (see `up_to_date`).
ANNOTATION_APPLIED = f"{API_GROUP}/applied-hash"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "omnirl-operator"
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"

def child_name(job: str, role: str | None = None, suffix: str | None = None) -> str:
    """``<job>``, ``<job>-<role>`` or ``<job>-<suffix>``: every child's name."""
    part = suffix if suffix is not None else role
    return f"{job}-{part}" if part else job


def selector_labels(job: str, role: str | None = None) -> dict[str, str]:
    """The stable labels a Service or workload selects on (never change them: selectors are immutable)."""
    labels = {LABEL_JOB: job}
    if role is not None:
        labels[LABEL_ROLE] = role
    return labels


def pod_labels(job: str) -> dict[str, str]:
    """The labels every pod of RLJob ``job`` carries, its role pods' and its judge servers' alike (the
    judges' have no ``omnirl.dev/job``: the metrics Service selects on it): one LIST of pods by them
    reads both. The templates set them after the user's template is merged, so they cannot be overridden."""
    return {LABEL_INSTANCE: job, LABEL_MANAGED_BY: MANAGED_BY}


def child_labels(job: str, role: str | None = None) -> dict[str, str]:
    """Every label a child carries: the recommended ``app.kubernetes.io/*`` set plus our selectors."""
    labels = {
        "app.kubernetes.io/name": "omnirl",
        LABEL_INSTANCE: job,
        LABEL_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/part-of": "omnirl",
    }
    if role is not None:
        labels["app.kubernetes.io/component"] = role
    labels.update(selector_labels(job, role))
    return labels


def object_meta(job: str, name: str, role: str | None = None) -> dict[str, Any]:
    """``metadata`` of a child: name and labels (namespace and owner are set by :func:`adopt`)."""
    return {"name": name, "labels": child_labels(job, role)}


def owner_reference(job: str, uid: str) -> dict[str, Any]:
    """The controller ownerReference pointing at the RLJob, so garbage collection removes children."""
    if not uid:
        raise ValueError(f"RLJob {job!r} has no metadata.uid; the API server assigns one on create")
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": job,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def adopt(children: Iterable[dict[str, Any]], job: str, namespace: str, uid: str) -> list[dict[str, Any]]:
    """Copies of ``children`` with the RLJob's namespace and its controller ownerReference.

    An existing ownerReference to another controller is an error: a child has one controller.
    A child annotated ``omnirl.dev/when-deleted: Retain`` gets no ownerReference (it outlives the RLJob).

    Raises:
        ValueError: when ``uid`` is empty, or a child is already controlled by another object.
    """
    ref = owner_reference(job, uid)
    adopted = []
    for child in children:
        child = copy.deepcopy(child)
        meta = child.setdefault("metadata", {})
        meta["namespace"] = namespace
        if (meta.get("annotations") or {}).get(ANNOTATION_WHEN_DELETED) == "Retain":
            adopted.append(child)
            continue
        refs = [r for r in meta.get("ownerReferences", []) if r.get("uid") != uid]
        others = [r for r in refs if r.get("controller")]
        if others:
            raise ValueError(
                f"{child.get('kind')} {meta.get('name')!r} is already controlled by {others[0].get('kind')} "
                f"{others[0].get('name')!r}; rename the RLJob or delete that object"
            )
        meta["ownerReferences"] = refs + [ref]
        adopted.append(child)
    return adopted


def with_applied_hash(child: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``child`` annotated ``omnirl.dev/applied-hash``: the first 16 hex digits of the SHA-256 of
    its canonical JSON (sorted keys), the annotation left out."""
    out = copy.deepcopy(child)
    annotations = out.setdefault("metadata", {}).setdefault("annotations", {})
    annotations.pop(ANNOTATION_APPLIED, None)
    digest = hashlib.sha256(json.dumps(out, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    annotations[ANNOTATION_APPLIED] = digest
    return out


def _unset(value: Any) -> bool:
    # what the API server leaves out of an object it returns (Go's omitempty) or a merge patch deletes (null)
    return value is None or value is False or value == 0 or value in ("", [], {})


def _covers(live: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(live, dict) and all(
            (_unset(v) and _unset(live.get(k))) if k not in live or v is None else _covers(live[k], v)
            for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(map(_covers, live, want))
    if isinstance(want, bool) or isinstance(live, bool):  # True == 1 in Python, not in JSON
        return live is want
    return live == want


def up_to_date(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether a JSON merge patch of ``desired`` over the stored ``live`` object would change nothing the
    operator sets, so the reconcile sends none (a steady resync of a running job writes nothing).

    ``desired`` should carry :func:`with_applied_hash`'s annotation: a field the operator stopped setting
    (which a merge patch removes from a list item, e.g. a container's ``resources.limits``) then still
    counts as a change, since the hash differs. Otherwise every field of ``desired`` must be in ``live``
    with the same value, recursively: keys only ``live`` has (the server's defaults, ``status``, a
    ``restarted-at`` annotation) are not compared; lists must have the same length, item by item; a
    ``None``, ``False``, ``0``, empty string, list or map matches an absent key (the API server drops such
    fields). A hand edit of a field the operator sets (``kubectl scale``) is a change: it is patched back.

    Args:
        desired: the child as built (JSON types).
        live: the object as the API server returned it.
    """
    return _covers(live, desired)


def owned_by(stored: dict[str, Any], uid: str) -> bool:
    """Whether ``stored``'s controller ownerReference is the object of ``uid`` (what a failed RLJob
    may stop: its own children, never an object it only shares a name or a label with)."""
    refs = (stored.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(r.get("controller") and r.get("uid") == uid for r in refs)


def foreign_owner(stored: dict[str, Any], job: str) -> str | None:
    """Who an existing object of a child's name belongs to when it is not RLJob ``job``'s, else None.

    Ours: labelled ``omnirl.dev/job=<job>`` and controlled by nothing or by an RLJob named ``job``
    (an earlier RLJob of that name whose children garbage collection has not removed yet, or a
    ``Retain`` claim it left, are adopted). Anything else (a user's object, a Helm release's,
    another RLJob's, one controlled by another kind) is never written: a merge patch would give it
    this job's ownerReference, and garbage collection would delete it with the job.
    """
    meta = stored.get("metadata") or {}
    labels = meta.get("labels") or {}
    ref = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    if ref is not None and not (ref.get("kind") == KIND and ref.get("name") == job):
        return f"it is controlled by {ref.get('kind')} {ref.get('name')}"
    if labels.get(LABEL_JOB) != job:
        other = labels.get(LABEL_JOB)
        if other:
            return f"it belongs to RLJob {other} (label {LABEL_JOB}={other})"
        managed = labels.get("app.kubernetes.io/managed-by")
        return f"it has no label {LABEL_JOB}={job}" + (f"; managed by {managed}" if managed else "")
    return None


# ---------------------------------------------------------------- template merge

# Lists of named items merged item by item (key field); any other list is replaced whole.
_MERGE_BY_KEY_RECURSIVE = {"containers": "name", "initContainers": "name"}
# Items of these lists are replaced whole when the user names the same key: their members are
# one-of choices (a volume source, an env value or valueFrom) that must not be mixed.
_MERGE_BY_KEY_REPLACE = {
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "tolerations": "key",
    "imagePullSecrets": "name",
}


def _merge_list(key: str, base: list[Any], override: list[Any]) -> list[Any]:
    field = _MERGE_BY_KEY_RECURSIVE.get(key) or _MERGE_BY_KEY_REPLACE.get(key)
    if field is None or not all(isinstance(x, dict) and field in x for x in base + override):
        return copy.deepcopy(override)
    merged = [copy.deepcopy(x) for x in base]
    index = {x[field]: i for i, x in enumerate(merged)}
    for item in override:
        i = index.get(item[field])
        if i is None:
            index[item[field]] = len(merged)
            merged.append(copy.deepcopy(item))
        elif key in _MERGE_BY_KEY_RECURSIVE:
            merged[i] = deep_merge(merged[i], item)
        else:
            merged[i] = copy.deepcopy(item)
    return merged


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged over ``base`` (user fields win); neither input is modified.

    Dicts merge recursively; ``containers``/``initContainers`` merge by ``name`` (recursively), and
    ``volumes``, ``env``, ``ports``, ``volumeMounts``, ``tolerations`` merge by their key with the
    user's item replacing ours whole; any other list is replaced. A ``None`` value deletes the key.
    """
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _merge_list(key, out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
