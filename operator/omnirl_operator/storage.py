"""The run volume of a job: an emptyDir, or the PersistentVolumeClaim of ``spec.storage``.

- :func:`build_claim`: the claim ``<job>-run`` the operator creates from ``size``,
  ``storageClassName`` and ``accessModes`` (none for an existing ``claimName``).
- :func:`run_volume`: the ``run`` volume of a role's pod; the controller and the actor ranks
  mount the claim. Rollout and reward write only their sample ledgers (``ledger/{role}-<pod>.jsonl``,
  :mod:`omnirl.api.ledger`: one file per pod, so writers never share one): they mount a
  ``ReadWriteMany`` claim too, so every role's ledger outlives its pod and a cluster job can be
  accounted like ``make chaos`` does; a ``ReadWriteOnce`` volume attaches to one node (the actor's),
  where the rollout and reward pods need not run, so they keep an emptyDir then.
- :func:`pod_affinity`: with a claim that is not ReadWriteMany (or ``singleNode``), the
  controller and the actor ranks must share one node: a required pod affinity on
  ``kubernetes.io/hostname`` towards each other (the first of them may go anywhere).
- :func:`claim_conflict`: an edited spec the stored claim cannot serve (access modes, class).
- :func:`full_volume_fix`: what frees the run volume of a role that exited ``STORAGE_ERROR_EXIT``
  for want of space (the claim to expand, or the emptyDir's node; :func:`names_full_volume`),
  appended to the RLJob's ``StorageError`` message: the role's own line says only "free space
  there" about a path inside the pod. A permission fault's line names its own fix.
- :func:`ensure_claim`: create the claim once, never patch its spec (a claim's spec is immutable
  but for a size increase), and keep its ownerReference in line with ``whenDeleted``.

Retention is the Kubernetes way, as a StatefulSet's ``persistentVolumeClaimRetentionPolicy``:
``Delete`` gives the claim the RLJob's controller ownerReference, so garbage collection removes
it with the RLJob; ``Retain`` gives it none, so it outlives the RLJob even if the operator is
gone (nothing has to run at deletion time). The claim carries the annotation
``omnirl.dev/when-deleted`` saying which, and :func:`omnirl_operator.meta.adopt` honours it.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Any

from omnirl.api.spec import RLJob
from omnirl_operator.meta import ANNOTATION_WHEN_DELETED, LABEL_JOB, LABEL_ROLE, child_name, object_meta

if TYPE_CHECKING:  # kube imports the builders, which import this module
    from omnirl_operator.kube import KubeApi

CLAIM_ROLES = ("controller", "actor")
HOSTNAME = "kubernetes.io/hostname"


def claim_name(job: RLJob) -> str | None:
    """The claim the run directory lives on: ``spec.storage.claimName``, ``<job>-run``, or None (emptyDir)."""
    storage = job.spec.storage
    if storage is None:
        return None
    return storage.claimName or child_name(job.metadata.name, suffix="run")


def build_claim(job: RLJob) -> dict[str, Any] | None:
    """PersistentVolumeClaim ``<job>-run`` when the operator creates one, else None."""
    storage = job.spec.storage
    if storage is None or storage.claimName is not None:
        return None
    name = job.metadata.name
    meta = object_meta(name, child_name(name, suffix="run"))
    meta["annotations"] = {ANNOTATION_WHEN_DELETED: storage.whenDeleted}
    spec: dict[str, Any] = {"accessModes": list(storage.accessModes),
                            "resources": {"requests": {"storage": storage.size}}}
    if storage.storageClassName is not None:
        spec["storageClassName"] = storage.storageClassName
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def shares_claim(job: RLJob, role: str) -> bool:
    """Whether ``role``'s pods mount the run claim: the controller and the actor whenever there is one,
    rollout and reward when it is ``ReadWriteMany`` (their ledgers, from any node)."""
    storage = job.spec.storage
    if storage is None:
        return False
    return role in CLAIM_ROLES or "ReadWriteMany" in storage.accessModes


def run_volume(job: RLJob, role: str) -> dict[str, Any]:
    """The ``run`` volume of ``role``'s pods: the claim (:func:`shares_claim`), else an emptyDir."""
    claim = claim_name(job)
    if claim is None or not shares_claim(job, role):
        return {"name": "run", "emptyDir": {}}
    return {"name": "run", "persistentVolumeClaim": {"claimName": claim}}


def pod_affinity(job: RLJob, role: str) -> dict[str, Any]:
    """``{"affinity": ...}`` pinning the claim's pods to one node when the claim needs it, else ``{}``."""
    storage = job.spec.storage
    if storage is None or role not in CLAIM_ROLES or not storage.pinned:
        return {}
    selector = {"matchLabels": {LABEL_JOB: job.metadata.name},
                "matchExpressions": [{"key": LABEL_ROLE, "operator": "In", "values": list(CLAIM_ROLES)}]}
    term = {"labelSelector": selector, "topologyKey": HOSTNAME}
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


FULL_VOLUME_TEXTS = tuple(os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG))


def names_full_volume(line: str) -> bool:
    """``line`` (a role's exit-5 line: ``omnirl role actor: cannot write PATH ([Errno 28] No space left on
    device); free space there``) says the volume is full: ENOSPC, EDQUOT or EFBIG. A permission or
    read-only fault (EACCES, EPERM, EROFS; ``cannot read`` a model file too) carries its own fix, and
    growing the claim would not help: :func:`full_volume_fix` is for the full ones only."""
    return any(text in line for text in FULL_VOLUME_TEXTS)


def full_volume_fix(job: RLJob, role: str) -> str:
    """The fix for ``role``'s run volume refusing writes (no space, a quota): one or two sentences
    naming the claim and how to grow it, or the emptyDir and ``spec.storage``.

    Args:
        job: the RLJob (``spec.storage``, ``spec.checkpoint.keep``).
        role: the role whose pod exited ``STORAGE_ERROR_EXIT`` (rollout, reward, actor, controller).
    """
    storage, name = job.spec.storage, claim_name(job)
    again = "then delete the RLJob and apply it again"
    if name is None or not shares_claim(job, role):
        why = "no spec.storage" if storage is None else f"{role} pods do not mount the ReadWriteOnce claim {name}"
        return (f"The {role} pod's run volume is an emptyDir on its node ({why}): free space on the node, or give "
                f"the job a claim (spec.storage.size) large enough for the run directory and "
                f"spec.checkpoint.keep ({job.spec.checkpoint.keep}) + 1 checkpoints; {again}.")
    ns = job.metadata.namespace or "default"
    if storage.claimName is not None:
        return (f"The run volume is PersistentVolumeClaim {name} (spec.storage.claimName): free space on it or "
                f"expand it (kubectl edit pvc -n {ns} {name}), {again}: the actor resumes from its latest checkpoint.")
    kept = ("the claim stays (whenDeleted: Retain) and the actor resumes from its latest checkpoint"
            if storage.whenDeleted == "Retain" else
            "with whenDeleted: Delete the claim and its checkpoints go with the RLJob")
    return (f"The run volume is PersistentVolumeClaim {name} (spec.storage.size {storage.size}): expand it "
            f"(kubectl edit pvc -n {ns} {name}, where its StorageClass allows volume expansion) or lower "
            f"spec.checkpoint.keep ({job.spec.checkpoint.keep}), {again}: {kept}.")


def claim_conflict(stored: dict[str, Any] | None, wanted: dict[str, Any]) -> str | None:
    """Why the stored claim cannot serve the spec, naming the field, or None.

    A claim's access modes and storage class cannot change, and the operator never patches them:
    an edited ``spec.storage.accessModes`` would otherwise unpin the pods from the volume's one node
    (ReadWriteOnce → ReadWriteMany) while the volume still attaches to one. An unset
    ``storageClassName`` matches whatever class the cluster gave the claim; the size is left to
    ``kubectl edit pvc``.
    """
    if stored is None:
        return None
    name = wanted["metadata"]["name"]
    have, want = stored.get("spec") or {}, wanted["spec"]
    fix = f"restore it, or delete the RLJob and PersistentVolumeClaim {name} (its data goes with it) and apply again"
    if sorted(have.get("accessModes") or []) != sorted(want["accessModes"]):
        return (f"spec.storage.accessModes: {want['accessModes']} differs from {have.get('accessModes')} of the claim "
                f"{name} it created, whose access modes cannot change: {fix}")
    if "storageClassName" in want and have.get("storageClassName") != want["storageClassName"]:
        return (f"spec.storage.storageClassName: {want['storageClassName']!r} differs from "
                f"{have.get('storageClassName')!r} of the claim {name}, whose class cannot change: {fix}")
    return None


def ensure_claim(kube: KubeApi, claim: dict[str, Any], stored: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """Create the adopted claim when absent (``stored`` is None); otherwise only bring its
    ownerReferences in line.

    ``stored`` must be this job's claim (the reconcile checks every child's owner first,
    :func:`omnirl_operator.meta.foreign_owner`: a claim of that name that is not the job's is never
    adopted, so never garbage-collected).

    Returns:
        ``("created" | "patched" | "unchanged", the stored claim)``.
    Raises:
        KubeError: an API call failed.
    """
    meta = claim["metadata"]
    if stored is None:
        return "created", kube.create(claim)
    job = meta["labels"][LABEL_JOB]
    want = meta.get("ownerReferences", [])
    have = stored["metadata"].get("ownerReferences", [])
    kept = [r for r in have if not (r.get("kind") == "RLJob" and r.get("name") == job)]
    refs = kept + want
    if {r.get("uid") for r in have} == {r.get("uid") for r in refs}:
        return "unchanged", stored
    patch = {"metadata": {"ownerReferences": refs,
                          "annotations": {ANNOTATION_WHEN_DELETED: meta["annotations"][ANNOTATION_WHEN_DELETED]}}}
    return "patched", kube.patch("v1", "PersistentVolumeClaim", meta["namespace"], meta["name"], patch)
