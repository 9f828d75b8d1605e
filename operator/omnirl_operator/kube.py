"""A small, generic client for the few kinds the operator manages (over the `kubernetes` client).

The handlers call it through ``asyncio.to_thread`` (the `kubernetes` client is synchronous). It
knows only REST paths and JSON: create, get, list by labels, JSON merge patch, delete, and
create-or-patch (whether a patch is needed at all is the caller's call: ``meta.py::up_to_date``).
Builders never import this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from omnirl_operator.builders import label_of

# (apiVersion, kind) → plural of every kind the operator reads or writes.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Pod"): "pods",  # read only (list): permanent exit codes
    ("apps/v1", "Deployment"): "deployments",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("batch/v1", "Job"): "jobs",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("omnirl.dev/v1alpha1", "RLJob"): "rljobs",
}
MERGE_PATCH = "application/merge-patch+json"


class KubeError(RuntimeError):
    """A failed API call: ``status`` is the HTTP code, ``reason`` the API server's message."""

    def __init__(self, status: int, what: str, reason: str):
        self.status = status
        self.reason = reason
        super().__init__(f"{what}: HTTP {status}: {reason}")


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    """``/api/v1/namespaces/NS/PLURAL[/NAME[/SUB]]`` or the ``/apis/GROUP/VERSION/...`` form.

    Raises:
        ValueError: for a kind not in :data:`PLURALS`.
    """
    plural = PLURALS.get((api_version, kind))
    if plural is None:
        raise ValueError(f"the operator does not manage {api_version} {kind}; known: {sorted(PLURALS)}")
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{root}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


@dataclass
class KubeApi:
    """Generic JSON calls on namespaced objects.

    Args:
        api_client: a configured ``kubernetes.client.ApiClient`` (see :meth:`from_environment`).
        timeout_s: per-request timeout, seconds.
    """

    api_client: ApiClient
    timeout_s: float = 30.0

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In-cluster service-account config, else the local kubeconfig (``$KUBECONFIG``).

        Raises:
            kubernetes.config.ConfigException: when neither is available.
        """
        from kubernetes import config

        cfg = Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
        return cls(ApiClient(cfg))

    @classmethod
    def for_server(cls, url: str) -> KubeApi:
        """A client for an unauthenticated server at ``url`` (tests: the kmock emulator)."""
        cfg = Configuration(host=url.rstrip("/"))
        cfg.verify_ssl = False
        return cls(ApiClient(cfg))

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
                content_type: str = "application/json", what: str = "") -> dict[str, Any]:
        """One call; returns the decoded JSON body (``{}`` when empty).

        Raises:
            KubeError: for any non-2xx answer, with the server's message.
        """
        api = self.api_client
        settings = list(api.configuration.auth_settings().keys())
        method, url, headers, body, post = api.param_serialize(
            method=method, resource_path=path, query_params=list((query or {}).items()) or None,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=settings,
        )
        try:
            resp = api.call_api(method, url, header_params=headers, body=body, post_params=post,
                                _request_timeout=self.timeout_s)
            resp.read()
        except ApiException as exc:
            raise KubeError(exc.status or 0, what or f"{method} {path}", str(exc.reason)) from exc
        if not 200 <= resp.status <= 299:
            text = resp.data.decode(errors="replace") if resp.data else ""
            try:
                reason = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                reason = text
            raise KubeError(resp.status, what or f"{method} {path}", reason[:500])
        return json.loads(resp.data) if resp.data else {}

    # ------------------------------------------------------------------ verbs
    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or ``None`` when it does not exist."""
        try:
            return self.request("GET", resource_path(api_version, kind, namespace, name),
                                what=f"get {kind}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_by_labels(self, api_version: str, kind: str, namespace: str, labels: dict[str, str]
                       ) -> list[dict[str, Any]]:
        """The objects of ``kind`` in ``namespace`` carrying every label of ``labels`` (asked of the
        server as a ``labelSelector`` and checked again here: a stand-in server may ignore it)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        items = self.request("GET", resource_path(api_version, kind, namespace), query={"labelSelector": selector},
                             what=f"list {kind} {selector}").get("items") or []
        return [o for o in items if labels.items() <= ((o.get("metadata") or {}).get("labels") or {}).items()]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """POST ``obj`` (its namespace from ``metadata.namespace``)."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        return self.request("POST", path, obj, what=f"create {label_of(obj)}")

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any],
              *, sub: str | None = None) -> dict[str, Any]:
        """JSON merge patch (RFC 7386) of an object or its ``sub``resource (e.g. ``status``)."""
        path = resource_path(api_version, kind, namespace, name, sub)
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH, what=f"patch {kind}/{name}")

    def delete(self, api_version: str, kind: str, namespace: str, name: str,
               propagation: str = "Background") -> bool:
        """Delete an object (dependents per ``propagation``); ``False`` when it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        try:
            self.request("DELETE", resource_path(api_version, kind, namespace, name), body,
                         what=f"delete {kind}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def apply(self, obj: dict[str, Any], *, absent: bool = False) -> tuple[str, dict[str, Any]]:
        """Create-or-patch: merge-patch ``obj`` over the stored object, or create it when absent.

        Patch first, unless ``absent`` (the caller read the name and found nothing): then create
        first. A 404 on the patch creates it, and a 409 on a create (a concurrent creator won)
        patches. One request either way when the caller's read was right. Merge patch replaces lists
        whole, so containers, env and ports end up exactly as built.

        Returns:
            ``("created" | "patched", the object as stored)``.
        """
        meta = obj["metadata"]
        args = (obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if not absent:
            try:
                return "patched", self.patch(*args, obj)
            except KubeError as exc:
                if exc.status != 404:
                    raise
        try:
            return "created", self.create(obj)
        except KubeError as exc:
            if exc.status != 409:
                raise
        return "patched", self.patch(*args, obj)
