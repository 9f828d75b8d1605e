"""Redis key names of one job's TransferQueue (docs/architecture.md §2).

Every key of a job starts with ``omnirl:{job}:`` so that the operator's finalizer can remove the
whole job with one ``SCAN MATCH omnirl:{job}:*`` (:func:`job_pattern`):

==============================  ===============================================================
``omnirl:{job}:requests``       stream: controller → rollout (one entry per prompt group)
``omnirl:{job}:samples``        stream: rollout → reward (one entry per finished sample)
``omnirl:{job}:scores``         stream: reward → controller
``omnirl:{job}:control``        stream: TrainRequest (controller → actor), TrainDone / RoleFailure (back)
``omnirl:{job}:tensors:{id}``   string: safetensors bytes of one sample's trajectory, with a TTL
``omnirl:{job}:images:{id}``    string: safetensors bytes of its decoded image alone, same TTL
``omnirl:{job}:staged:{t}:{p}`` string: a publish's payload until its script renames it (tensor TTL)
``omnirl:{job}:done:{kind}:{id}``  string: idempotency marker, with a TTL
``omnirl:{job}:kv:{name}``      small values two roles exchange: each one's name, type, writer and
                                reader are defined once, in `records.py` (`JobRecords`)
==============================  ===============================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "omnirl"

# DNS-1123 subdomain (the rule Kubernetes applies to object names, so an RLJob's name always
# passes): lowercase letters, digits, '-' and '.', starting and ending with a letter or digit.
_JOB_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_MAX_JOB_LEN = 253


def validate_job(job: str) -> str:
    """Return ``job`` unchanged if it is a valid job name, else raise.

    Raises:
        ValueError: when ``job`` is not a DNS-1123 name (it would break key parsing or make the
            cleanup pattern match another job's keys: ':', spaces, '*', '?', '[' are all refused).
    """
    if not isinstance(job, str):
        raise ValueError(f"job name must be a str, got {type(job).__name__}")
    if len(job) > _MAX_JOB_LEN or not _JOB_RE.match(job):
        raise ValueError(
            f"invalid job name {job!r}: use 1-{_MAX_JOB_LEN} lowercase letters, digits, '-' or '.', "
            "starting and ending with a letter or digit (a Kubernetes object name, e.g. 'demo-ocr')"
        )
    return job


def _validate_part(what: str, value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty str, got {value!r}")
    if any(c.isspace() for c in value):
        raise ValueError(f"{what} {value!r} contains whitespace; use e.g. '{{step}}:{{prompt}}:{{index}}'")
    return value


def job_prefix(job: str) -> str:
    """``omnirl:{job}:`` — the prefix of every key of ``job``."""
    return f"{PREFIX}:{validate_job(job)}:"


def job_pattern(job: str) -> str:
    """``omnirl:{job}:*`` — the SCAN pattern matching every key of ``job`` and no other job's."""
    return job_prefix(job) + "*"


def tensor_key(job: str, sample_id: str) -> str:
    """``omnirl:{job}:tensors:{sample_id}`` — where a sample's safetensors bytes are stored."""
    return f"{job_prefix(job)}tensors:{_validate_part('sample_id', sample_id)}"


def image_key(tensor_key: str) -> str:
    """``omnirl:{job}:images:{id}`` — where the image of the sample at ``omnirl:{job}:tensors:{id}`` is.

    The image lives apart from the trajectory so that a scorer reads the image alone (a few KB)
    and not the latents and log-probs it does not need.

    Raises:
        ValueError: ``tensor_key`` is not ``omnirl:{job}:tensors:{id}``.
    """
    head, sep, sample_id = tensor_key.partition(":tensors:") if isinstance(tensor_key, str) else ("", "", "")
    if not sep or not head.startswith(f"{PREFIX}:") or ":" in head.removeprefix(f"{PREFIX}:"):
        raise ValueError(f"{tensor_key!r} is not a tensor key 'omnirl:{{job}}:tensors:{{id}}' (see tensor_key)")
    return f"{head}:images:{sample_id}"


def staged_key(job: str, token: str, part: str) -> str:
    """``omnirl:{job}:staged:{token}:{part}`` — a publish's payload (``t`` trajectory, ``i`` image) before its
    script moves it under its tensor or image key (`TransferQueue.publish`); it carries the tensor TTL."""
    return f"{job_prefix(job)}staged:{_validate_part('token', token)}:{_validate_part('part', part)}"


def done_key(job: str, kind: str, sample_id: str) -> str:
    """``omnirl:{job}:done:{kind}:{sample_id}`` — the idempotency marker of one effect."""
    return f"{job_prefix(job)}done:{_validate_part('kind', kind)}:{_validate_part('sample_id', sample_id)}"


def kv_key(job: str, name: str) -> str:
    """``omnirl:{job}:kv:{name}`` — a small JSON value (e.g. ``stop``, ``actor_state``)."""
    return f"{job_prefix(job)}kv:{_validate_part('name', name)}"


@dataclass(frozen=True)
class StreamNames:
    """The four stream keys of one job.

    Example: ``StreamNames("demo").samples == "omnirl:demo:samples"``.

    Raises:
        ValueError: for an invalid job name (see :func:`validate_job`).
    """

    job: str

    def __post_init__(self) -> None:
        validate_job(self.job)

    @property
    def requests(self) -> str:
        """controller → rollout: one entry per prompt group (`GenerateRequest`: G sample ids and seeds), or per
        held-out cohort of a validation round (`HeldOutCohort`)."""
        return f"{job_prefix(self.job)}requests"

    @property
    def samples(self) -> str:
        """rollout → reward: one entry per finished sample; its trajectory and image under two keys."""
        return f"{job_prefix(self.job)}samples"

    @property
    def scores(self) -> str:
        """reward → controller: one entry per scored sample."""
        return f"{job_prefix(self.job)}scores"

    @property
    def control(self) -> str:
        """controller ↔ actor: `TrainRequest` one way; `TrainDone` (the actor's new policy_version) and
        `RoleFailure` back."""
        return f"{job_prefix(self.job)}control"

    def all(self) -> tuple[str, str, str, str]:
        """The four stream keys, in pipeline order."""
        return (self.requests, self.samples, self.scores, self.control)
