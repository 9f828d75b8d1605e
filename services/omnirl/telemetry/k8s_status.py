"""Training progress → the RLJob's status, from the controller pod (``OMNIRL_REPORT_STATUS=kubernetes``).

The controller merge-patches only its own fields of ``status`` (``step``, ``rewardMean``,
``policyVersion``, ``lastCheckpoint``) through the ``rljobs/status`` subresource; the operator
writes every other status field and never writes these (docs/architecture.md §5), so neither overwrites the
other. The pod's ServiceAccount may get and patch the status of this one RLJob only (a Role the
operator creates with ``resourceNames: [<job>]``).

A failed patch is not fatal to training: the reason is logged, :attr:`StatusReporter.failures`
counts it, and the unsent values ride along with the next :meth:`StatusReporter.report`.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from omnirl.api.spec import API_GROUP, API_VERSION

log = logging.getLogger(__name__)
PLURAL = "rljobs"
MERGE_PATCH = "application/merge-patch+json"
REWARD_DECIMALS = 4  # rewardMean as `kubectl get rlj` shows it; metrics.jsonl keeps full precision


def _load_api_client() -> Any:
    """An ApiClient from the pod's service account, else the local kubeconfig.

    Raises:
        kubernetes.config.ConfigException: neither is available (not in a pod, no kubeconfig).
    """
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    return client.ApiClient(cfg)


class StatusReporter:
    """Merge-patch progress fields of one RLJob's status.

    Args:
        namespace: the RLJob's namespace (``OMNIRL_NAMESPACE`` in pods).
        name: the RLJob's name (``OMNIRL_JOB_NAME``).
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.
        timeout_s: per-request timeout, seconds.

    Raises:
        ValueError: empty namespace or name.
        kubernetes.config.ConfigException: no ``api_client`` given and no config found.
    """

    def __init__(self, namespace: str, name: str, api_client: Any = None, timeout_s: float = 10.0) -> None:
        if not namespace or not name:
            raise ValueError(f"StatusReporter needs a namespace and a name, got {namespace!r}/{name!r} "
                             "(set OMNIRL_NAMESPACE and OMNIRL_JOB_NAME)")
        from kubernetes import client

        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s
        self._api = client.CustomObjectsApi(api_client if api_client is not None else _load_api_client())
        self._pending: dict[str, Any] = {}
        self.failures = 0
        self.reports = 0
        self.last_error: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StatusReporter:
        """From ``OMNIRL_NAMESPACE`` and ``OMNIRL_JOB_NAME`` (the pod's environment).

        Raises:
            ValueError: a variable is unset.
        """
        env = dict(os.environ) if env is None else env
        return cls(env.get("OMNIRL_NAMESPACE", ""), env.get("OMNIRL_JOB_NAME", ""))

    def report(self, step: int | None = None, reward_mean: float | None = None,
               policy_version: int | None = None, last_checkpoint: str | None = None,
               stalled: str | None = None) -> bool:
        """Send the given fields (plus any left over from a failed report); ``None`` means unchanged.

        Args:
            step: training steps completed (>= 0).
            reward_mean: mean reward of the last step's batch (finite; sent rounded to 4 decimals).
            policy_version: policy version the rollout workers hold (>= 0).
            last_checkpoint: path of the last saved checkpoint.
            stalled: the roles without a recent heartbeat and why ("" once all beat again).

        Returns:
            True when the API server accepted the patch; False when it failed (logged, counted in
            :attr:`failures`, and retried with the next call).

        Raises:
            ValueError: a negative step/version or a non-finite reward (a caller bug, not a
                transient failure).
        """
        fields = {"step": step, "rewardMean": reward_mean, "policyVersion": policy_version,
                  "lastCheckpoint": last_checkpoint, "stalled": stalled}
        for key in ("step", "policyVersion"):
            if fields[key] is not None and (not isinstance(fields[key], int) or fields[key] < 0):
                raise ValueError(f"{key} must be an int >= 0, got {fields[key]!r}")
        if reward_mean is not None and not math.isfinite(reward_mean):
            raise ValueError(f"rewardMean must be finite, got {reward_mean!r} (a JSON number cannot be NaN/inf)")
        self._pending.update({k: (round(float(v), REWARD_DECIMALS) if k == "rewardMean" else v)
                              for k, v in fields.items() if v is not None})
        if not self._pending:
            return True
        body = {"status": dict(self._pending)}
        try:
            self._api.patch_namespaced_custom_object_status(
                API_GROUP, API_VERSION, self.namespace, PLURAL, self.name, body,
                _content_type=MERGE_PATCH, _request_timeout=self.timeout_s,
            )
        except Exception as exc:  # ApiException, urllib3 errors, timeouts: all transient for us
            self.failures += 1
            status = getattr(exc, "status", None)
            reason = getattr(exc, "reason", None) or str(exc)
            self.last_error = f"HTTP {status}: {reason}" if status else reason
            log.warning("status report %d for RLJob %s/%s failed (%s); will retry with the next report",
                        self.failures, self.namespace, self.name, self.last_error)
            return False
        self._pending.clear()
        self.reports += 1
        return True
