"""What a failed RLJob stops: the pods of its own children, nothing of anyone else's.

A job fails while its pods run: a child's name taken by another owner mid-run (``NameConflict``),
a role exiting with a permanent code, the active deadline, a judge crash-looping after the
controller started. Its Deployments and StatefulSets go to 0 replicas and its controller Job, while
it still runs, is deleted (background propagation: garbage collection deletes its pods; a finished
Job is left as the record it is). Only objects whose controller ownerReference is this RLJob's uid
are touched (:func:`omnirl_operator.meta.owned_by`): an object holding a child's name or the job's
label for another owner is never written.
"""

from __future__ import annotations

import asyncio
from typing import Any

from omnirl_operator.kube import KubeApi
from omnirl_operator.meta import owned_by

API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1"}


def _running(job: dict[str, Any]) -> bool:
    """Whether a batch/v1 Job has not finished (no ``Complete`` or ``Failed`` condition True)."""
    return not any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in (job.get("status") or {}).get("conditions") or [])


async def stop_owned(kube: KubeApi, ns: str, uid: str, stored: dict[str, dict[str, Any] | None]) -> list[str]:
    """Scale to 0 each Deployment and StatefulSet of ``stored`` controlled by RLJob ``uid`` that asks
    for pods, and delete its Job (the controller) while it runs.

    Args:
        ns: the job's namespace.
        uid: the RLJob's ``metadata.uid``.
        stored: objects as read, by ``Kind/name`` (None: absent); other kinds are left alone.

    Returns:
        One action line per object changed (``scaled Deployment/x to 0``, ``deleted Job/x-controller``).
    Raises:
        KubeError: a PATCH or DELETE failed (a 404 on delete is no error: it was already gone).
    """
    actions = []
    for key, obj in sorted(stored.items()):
        kind, name = key.split("/", 1)
        if obj is None or not owned_by(obj, uid):
            continue
        if kind in API_VERSIONS and int((obj.get("spec") or {}).get("replicas") or 0) > 0:
            await asyncio.to_thread(kube.patch, API_VERSIONS[kind], kind, ns, name, {"spec": {"replicas": 0}})
            actions.append(f"scaled {key} to 0 (the job failed)")
        elif kind == "Job" and _running(obj) \
                and await asyncio.to_thread(kube.delete, "batch/v1", "Job", ns, name):
            actions.append(f"deleted {key} (the job failed: its pods stop)")
    return actions
