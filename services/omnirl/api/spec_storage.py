"""`spec.storage`: the PersistentVolumeClaim that holds a job's run directory on Kubernetes.

The run directory (checkpoints, `metrics.jsonl`, samples, the exported model) is mounted by the
controller and by every actor rank. Either name an existing claim (`claimName`) or let the
operator create `<job>-run` from `size`, `storageClassName` and `accessModes`; `whenDeleted`
(`Retain`, the default, or `Delete`) says whether that claim outlives the RLJob, as a
StatefulSet's `persistentVolumeClaimRetentionPolicy.whenDeleted` does. Locally the run directory
is `omnirl run --out` and this section is not used.

Access modes: a `ReadWriteOnce` volume is attached to one node at a time, so the operator pins
the controller and the actor ranks to one node (a required pod affinity); several actor ranks
with `ReadWriteOnce` therefore need `singleNode: true` (all ranks fit one node), otherwise
`ReadWriteMany` (NFS, CephFS, EFS, Filestore...). `ReadWriteOncePod` (one pod) and
`ReadOnlyMany` cannot hold a run that two pods write.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from omnirl.api._base import SpecModel
from omnirl.api.errors import FieldProblem

AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod", "ReadOnlyMany"]
# A Kubernetes resource quantity of bytes: digits, an optional fraction, an optional suffix.
QUANTITY = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_FACTORS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


# Names of Secrets, StorageClasses, claims: the API server refuses an object (a pod template's
# secretKeyRef, a claim's storageClassName) naming anything else, after `omnirl validate` said ok.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def check_object_name(path: str, value: str, what: str) -> None:
    """Refuse `value` unless it can name a Kubernetes object (a DNS-1123 subdomain).

    Args:
        path: the field, relative to the validating model (`passwordSecret`).
        value: the name.
        what: the kind of object named (`Secret`), for the message.
    Raises:
        FieldProblem: naming `path`, the rule and an example.
    """
    if len(value) > 253 or DNS1123_SUBDOMAIN.fullmatch(value) is None:
        # the value made valid, as the example: `storageClassName: Fast_SSD` was told "e.g. team-runs"
        example = re.sub(r"[^a-z0-9.-]+", "-", value.lower())[:253].strip("-.") or "team-runs"
        raise FieldProblem(path, value, f"must name a {what}: at most 253 characters, lowercase letters, digits, "
                           f"'-' and '.', starting and ending with a letter or digit (e.g. {example})")


def quantity_bytes(text: str) -> float:
    """Bytes of a Kubernetes quantity (`50Gi` → 53687091200). Raises ValueError for anything else."""
    m = QUANTITY.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a quantity like 50Gi")
    return float(m["num"]) * _FACTORS[m["unit"]]


class StorageSpec(SpecModel):
    """Where the run directory lives on Kubernetes (a PersistentVolumeClaim)."""

    claimName: str | None = Field(
        # the CRD keeps the pattern (admission refuses it too); validation says the rule in words (_check)
        None, min_length=1, max_length=253, json_schema_extra={"pattern": DNS1123_SUBDOMAIN.pattern},
        description="An existing PersistentVolumeClaim in the job's namespace (never deleted by the operator). "
        "Leave unset to have the operator create `<job>-run` from size.")
    size: str | None = Field(
        None, description="Size of the claim the operator creates, a Kubernetes quantity (e.g. 50Gi): room for "
        "checkpoint.keep + 1 checkpoints (about 3x the trained weights each with AdamW), the exports, the samples.")
    storageClassName: str | None = Field(
        None, description="StorageClass of the created claim; unset = the cluster's default class "
        "(`kubectl get storageclass`); \"\" = no class (bind a pre-created PersistentVolume).")
    accessModes: list[AccessMode] = Field(
        default_factory=lambda: ["ReadWriteOnce"], min_length=1,
        description="Access modes of the claim (of the existing one, with claimName). ReadWriteOnce pins the "
        "controller and the actor ranks to one node; ReadWriteMany lets them spread over nodes.")
    whenDeleted: Literal["Retain", "Delete"] = Field(
        "Retain", description="Retain: the created claim outlives the RLJob (no ownerReference); Delete: it is "
        "garbage-collected with the RLJob (controller ownerReference).")
    singleNode: bool = Field(
        False, description="Run the controller and every actor rank on one node (a required pod affinity on "
        "kubernetes.io/hostname). Needed for several actor ranks on a ReadWriteOnce volume.")

    @model_validator(mode="after")
    def _check(self) -> StorageSpec:
        if self.storageClassName:  # "" is meaningful: no class, bind a pre-made PersistentVolume
            check_object_name("storageClassName", self.storageClassName, "StorageClass")
        if self.claimName is not None:
            check_object_name("claimName", self.claimName, "PersistentVolumeClaim")
            if self.size is not None:
                raise FieldProblem("size", self.size, "must not be set together with claimName (an existing claim "
                                   "has its own size); remove size, or claimName to have the operator create one")
            # values, not fields set: the manifest the operator hands its pods spells out every default
            for name, default in (("storageClassName", None), ("whenDeleted", "Retain")):
                if getattr(self, name) != default:
                    raise FieldProblem(name, getattr(self, name), "applies only to a claim the operator creates "
                                       "(an existing claim is never deleted); remove it, or claimName")
        elif self.size is None:
            raise FieldProblem("size", None, "required when claimName is not set (the size of the claim the "
                               "operator creates, e.g. 50Gi); or name an existing claim with claimName")
        else:
            try:
                ok = quantity_bytes(self.size) > 0
            except ValueError:
                ok = False
            if not ok:
                raise FieldProblem("size", self.size, "must be a positive Kubernetes quantity such as 50Gi or 500M")
        modes = set(self.accessModes)
        if "ReadWriteOncePod" in modes:
            raise FieldProblem("accessModes", self.accessModes, "must not hold ReadWriteOncePod: the controller and "
                               "the actor both mount the run volume; use ReadWriteOnce or ReadWriteMany")
        if not modes & {"ReadWriteOnce", "ReadWriteMany"}:
            raise FieldProblem("accessModes", self.accessModes, "must hold ReadWriteOnce or ReadWriteMany (the job "
                               "writes its run directory)")
        return self

    @property
    def pinned(self) -> bool:
        """True when the controller and the actor ranks must share one node (no ReadWriteMany, or singleNode)."""
        return self.singleNode or "ReadWriteMany" not in self.accessModes


def check_storage(storage: StorageSpec | None, actor_pods: int) -> None:
    """Cross-check `spec.storage` against the actor's pods (`spec.roles.actor`: replicas × parallel.ulysses
    ranks, accelerator.count per pod; paths relative to `spec`).

    Raises:
        FieldProblem: several actor pods on a ReadWriteOnce-only claim without `singleNode`.
    """
    if storage is None or actor_pods <= 1 or "ReadWriteMany" in storage.accessModes or storage.singleNode:
        return
    raise FieldProblem(
        "storage.accessModes", storage.accessModes,
        f"must hold ReadWriteMany for an actor of {actor_pods} pods (roles.actor.replicas × parallel.ulysses ranks "
        "over accelerator.count per pod): every pod mounts the run volume (each rank reads the checkpoint on resume) "
        "and a ReadWriteOnce volume attaches to one node; or set storage.singleNode: true if all pods fit one node")
