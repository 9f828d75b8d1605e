"""Reward workers follow the samples backlog (`spec.roles.reward.autoscale`).

Each reconcile (the resync timer, every ``OMNIRL_RESYNC_SECONDS``) reads the backlog of the
samples stream — entries not yet delivered to the ``reward`` consumer group plus those delivered
and not yet acknowledged — and :func:`decide_replicas` (pure) picks the reward Deployment's
replica count. When the count changes the Deployment gets the annotation
``omnirl.dev/scaled-at`` (the cool-down clock, kept on the object so an operator restart
remembers it), the count goes to ``status.roles.reward.desired``, and to the job's Redis key
``kv:reward_replicas``, which the controller reports as ``scorer_replicas`` (else `roles.reward.replicas`) in metrics.jsonl and
``omnirl_reward_replicas`` in Prometheus. When Redis cannot be read the count is held (and the
reconcile says so in its log); it is never guessed.

Through the torch-free parts of ``omnirl.transfer`` (``pending.reward_backlog``, ``records.JobRecords``), not
``TransferQueue``: that module imports torch, and the operator must not (import-linter contract).
"""

from __future__ import annotations

import asyncio
import base64
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from omnirl.api.spec import RewardAutoscaleSpec, RLJob
from omnirl.transfer.client import RedisClient, RedisError, plain_client
from omnirl.transfer.pending import reward_backlog
from omnirl.transfer.records import JobRecords
from omnirl_operator.kube import KubeApi
from omnirl_operator.meta import child_name
from omnirl_operator.pods import redis_url
from omnirl_operator.settings import OperatorSettings

ANNOTATION_SCALED_AT = "omnirl.dev/scaled-at"


@dataclass(frozen=True)
class ScaleDecision:
    """The reward Deployment's replica count, and why (``scale-up``, ``scale-down``, ``bounds``,
    ``cool-down``, ``steady``)."""

    replicas: int
    reason: str

    def changed(self, current: int) -> bool:
        """Whether this decision scales (``replicas != current``)."""
        return self.replicas != current


def decide_replicas(current: int, backlog: int, policy: RewardAutoscaleSpec, now: float,
                    last_scaled: float | None) -> ScaleDecision:
    """The reward workers to run.

    With ``c = targetBacklogPerReplica`` and ``clamp`` to ``[minReplicas, maxReplicas]``:

    - a count outside the bounds (the bounds changed) is clamped at once (``bounds``);
    - up to ``clamp(ceil(backlog / c))`` when that is more than ``current``, unless the last
      scaling was less than ``scaleUpCooldownSeconds`` ago;
    - down to ``clamp(ceil(backlog / (c · scaleDownRatio)))`` when that is fewer, unless the last
      scaling was less than ``scaleDownCooldownSeconds`` ago. Between the two targets the count
      holds: with ratio ½ a backlog must fall to half the smaller count's capacity before
      workers go, so a backlog near a boundary does not flap.

    Args:
        current: the Deployment's replicas now.
        backlog: samples not yet scored (undelivered + unacknowledged), ≥ 0.
        policy: ``roles.reward.autoscale``.
        now: current time, seconds (any clock shared with ``last_scaled``).
        last_scaled: when the count last changed (None: never).
    Raises:
        ValueError: a negative backlog or current count.
    """
    if backlog < 0 or current < 0:
        raise ValueError(f"backlog {backlog} and current replicas {current} must be >= 0")
    lo, hi = policy.minReplicas, policy.maxReplicas
    if not lo <= current <= hi:
        return ScaleDecision(min(max(current, lo), hi), "bounds")
    cap = policy.targetBacklogPerReplica
    since = math.inf if last_scaled is None else now - last_scaled
    up = min(max(math.ceil(backlog / cap), lo), hi)
    if up > current:
        if since < policy.scaleUpCooldownSeconds:
            return ScaleDecision(current, "cool-down")
        return ScaleDecision(up, "scale-up")
    down = min(max(math.ceil(backlog / (cap * policy.scaleDownRatio)), lo), hi)
    if down < current:
        if since < policy.scaleDownCooldownSeconds:
            return ScaleDecision(current, "cool-down")
        return ScaleDecision(down, "scale-down")
    return ScaleDecision(current, "steady")


async def _password(kube: KubeApi, job: RLJob, ns: str, settings: OperatorSettings) -> str | None:
    secret_name = job.spec.transferQueue.passwordSecret
    if not secret_name:
        return settings.default_redis_password
    secret = await asyncio.to_thread(kube.get, "v1", "Secret", ns, secret_name)
    data = (secret or {}).get("data") or {}
    if "password" not in data:
        raise ValueError(f"spec.transferQueue.passwordSecret: Secret {secret_name!r} has no key 'password'")
    return base64.b64decode(data["password"]).decode()


def _client(url: str, password: str | None) -> RedisClient:
    return plain_client(url, password=password, socket_timeout=5, socket_connect_timeout=5)


async def autoscale_reward(kube: KubeApi, job: RLJob, ns: str, children: list[dict[str, Any]],
                           stored: dict[str, Any] | None, settings: OperatorSettings, now: datetime
                           ) -> tuple[int | None, list[str]]:
    """Set the replicas of the reward Deployment in ``children`` (in place) from the backlog.

    Args:
        stored: the reward Deployment as the reconcile read it (None: not created yet).

    Returns ``(replicas, actions)``; ``(None, [])`` without ``roles.reward.autoscale``.
    """
    policy = job.spec.roles.reward.autoscale
    name = child_name(job.metadata.name, "reward")
    child = next((c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == name), None)
    if policy is None or child is None or child["spec"]["replicas"] == 0:  # fixed, or not running
        return None, []
    if stored is None:  # first reconcile: start at roles.reward.replicas
        return child["spec"]["replicas"], []
    current = int(stored["spec"].get("replicas") or 0)
    annotations = stored["metadata"].get("annotations") or {}
    stamp = annotations.get(ANNOTATION_SCALED_AT)
    last = datetime.fromisoformat(stamp).timestamp() if stamp else None
    child["spec"]["replicas"] = current
    try:
        client = _client(redis_url(job, settings), await _password(kube, job, ns, settings))
        try:
            backlog = await asyncio.to_thread(reward_backlog, client, job.metadata.name)
            decision = decide_replicas(current, backlog, policy, now.timestamp(), last)
            await asyncio.to_thread(JobRecords(client, job.metadata.name).set_reward_replicas, decision.replicas)
        finally:
            client.close()
    except (RedisError, ValueError) as exc:
        return current, [f"autoscale: holding {name} at {current} replicas: cannot read the backlog: {exc}"]
    child["spec"]["replicas"] = decision.replicas
    if not decision.changed(current):
        return current, []
    child["metadata"].setdefault("annotations", {})[ANNOTATION_SCALED_AT] = now.isoformat()
    return decision.replicas, [f"autoscale: {name} {current} -> {decision.replicas} replicas "
                               f"({decision.reason}, backlog {backlog})"]
