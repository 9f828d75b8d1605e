"""Run the operator against an in-process API-server stand-in (kmock's ``KubernetesEmulator``).

For tests and the e2e harness (``kmock`` is a dev dependency, imported only here). The emulator
stores objects and streams watch events, but has no schema validation, no garbage collection, no
controllers (Deployments never get pods, Jobs never finish) and no label selectors: tests play
the kubelet by patching children's ``status`` (:meth:`EmulatedCluster.set_status`).

``emulator.served`` counts the requests it served by ``(action, resource plural)`` (``("list",
"deployments")``, ``("fetch", "persistentvolumeclaims")``): what a reconcile asks of the API server.

Three emulator gaps are filled here: it does not bump ``resourceVersion`` or ``generation`` on
writes (a thin subclass does, as kopf relies on it), it does not name an object created with
``generateName`` (kopf's events; the subclass does, else a namespace kept only its first event),
and it does not assign ``uid``, so :func:`rljob_body` fills it in.

Example::

    async with EmulatedCluster() as cluster:
        await cluster.start_operator(OperatorSettings(default_redis_url=url), resync_seconds=0.5)
        await cluster.create(rljob_body(manifest))
        await cluster.wait_for(lambda: cluster.get("apps/v1", "StatefulSet", "ns", "demo-actor"))
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import copy
import itertools
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import kopf

from omnirl_operator import handlers
from omnirl_operator.kube import KubeApi
from omnirl_operator.settings import OperatorSettings

RLJOB_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
_versions = itertools.count(1000)
_KEEP_REQUESTS = 64


def _jsonpath(obj: Any, path: str) -> Any:
    """The value at a ``.a.b.c`` JSONPath with ``[?(@.key=="value")]`` filters on lists (what CRD
    printer columns use), or None."""
    for part in re.findall(r'\[\?\(@\.\w+=="[^"]*"\)\]|[^.\[]+', path):
        test = re.fullmatch(r'\[\?\(@\.(\w+)=="([^"]*)"\)\]', part)
        if test:
            obj = next((x for x in obj if isinstance(x, dict) and x.get(test[1]) == test[2]), None) \
                if isinstance(obj, list) else None
        else:
            obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _age(stamp: str | None) -> str:
    """``kubectl``'s short age (``42s``, ``5m``, ``3h``, ``2d``) of an RFC 3339 timestamp."""
    if not stamp:
        return "<unknown>"
    seconds = int((datetime.now(timezone.utc) - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _table(items: list[dict[str, Any]], columns: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of ``items`` with a Name column plus the CRD's printer columns."""
    defs = [{"name": "Name", "type": "string", "format": "name", "priority": 0, "description": "Name"}]
    defs += [{"name": c["name"], "type": c["type"], "format": c.get("format", ""), "priority": c.get("priority", 0),
              "description": c.get("description", "")} for c in columns]
    rows = []
    for item in items:
        cells: list[Any] = [item["metadata"]["name"]]
        for c in columns:
            value = _jsonpath(item, c["jsonPath"])
            cells.append(_age(value) if c["type"] == "date" else value)
        rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                                "metadata": item["metadata"]}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "columnDefinitions": defs, "rows": rows}


def _versioned_emulator_class(printer_columns: dict[str, list[dict[str, Any]]]) -> type:
    """kmock's emulator plus what kopf relies on from a real API server: every write bumps
    ``metadata.resourceVersion`` (kopf ignores events older than its own last patch, judged by
    resourceVersion; without bumps it re-runs finished handlers), a write that changes ``spec``
    bumps ``metadata.generation``, and a failed resourceVersion ``test`` of a JSON patch is a 422.
    The request history is trimmed so a long test does not slow down quadratically."""
    import kmock
    from kmock._internal import enums
    from kmock._internal.dicts import patch_dict

    class VersionedEmulator(kmock.KubernetesEmulator):
        # requests served, by (action, resource plural): tests count what a reconcile asks for
        served: collections.Counter = collections.Counter()

        async def _handle(self, request: Any) -> Any:
            if request.resource is not None:
                self.served[(str(request.action.name if request.action else request.method).lower(),
                             request.resource.plural)] += 1
            data = request.data
            rv = str(next(_versions))
            if request.resource is not None and request.action == enums.action.CREATE and isinstance(data, dict):
                stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                given = data.get("metadata", {})
                if "name" not in given and given.get("generateName"):  # kopf's events: else one per namespace
                    given = {**given, "name": given["generateName"] + uuid.uuid4().hex[:5]}
                data = {**data, "metadata": {"generation": 1, "uid": str(uuid.uuid4()), "creationTimestamp": stamp,
                                             **given, "resourceVersion": rv}}
            elif request.resource is not None and request.action == enums.action.UPDATE and request.name:
                key = (request.resource, request.namespace, request.name)
                if isinstance(data, list):  # JSON patch (kopf's finalizers): append our op last
                    self._check_version_test(key, data)
                    data = [*data, {"op": "replace", "path": "/metadata/resourceVersion", "value": rv}]
                elif isinstance(data, dict):
                    meta: dict[str, Any] = {**(data.get("metadata") or {}), "resourceVersion": rv}
                    if "spec" in data and not request.subresource and key in self.objects:
                        current = self.objects[key]
                        if not current.deleted and patch_dict(current.raw, data).get("spec") != current.raw.get("spec"):
                            meta["generation"] = int(current.get("metadata", {}).get("generation") or 0) + 1
                    data = {**data, "metadata": meta}
            if data is not request.data:
                object.__setattr__(request, "data", data)  # the parsed body kmock applies
            # kmock matches each request by scanning its whole request history (O(history) per
            # request, quadratic over a test run): keep only the recent requests (this one last).
            del self._requests[:-_KEEP_REQUESTS]
            return await super()._handle(request)

        async def _serve_list(self, request: Any) -> Any:
            """Lists carry ``kind``/``apiVersion`` (kubectl needs them); ``as=Table`` requests for a
            resource with printer columns get a server-side Table, as ``kubectl get`` asks for."""
            payload = await super()._serve_list(request)
            res = request.resource
            info = self.resources[res]
            group_version = f"{res.group}/{res.version}" if res.group else res.version
            payload = {"apiVersion": group_version, "kind": f"{info.kind or 'Object'}List", **payload}
            columns = printer_columns.get(f"{group_version}/{res.plural}")
            if columns and "as=Table" in request.headers.get("Accept", ""):
                return _table(payload["items"], columns)
            return payload

        async def _serve_version(self, request: Any) -> Any:
            """kmock names the core group's version ``/v1``; kubectl's discovery needs ``v1`` to map
            core kinds (``kubectl apply`` of a Secret or ConfigMap fails without it)."""
            payload = await super()._serve_version(request)
            return {**payload, "groupVersion": payload["groupVersion"].lstrip("/")}

        def _check_version_test(self, key: Any, ops: list) -> None:
            """A failed ``test`` of resourceVersion is 422 on a real server (kopf retries later)."""
            if key not in self.objects or self.objects[key].deleted:
                return
            have = self.objects[key].get("metadata", {}).get("resourceVersion")
            for op in ops:
                if op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion" and op["value"] != have:
                    raise kmock.KubernetesError(status=422, reason="Invalid",
                                                message=f"resourceVersion is {have}, not {op['value']}")

    return VersionedEmulator


def rljob_body(manifest: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """A copy of ``manifest`` with the metadata a real API server would add (uid, resourceVersion,
    generation, namespace ``default`` when missing)."""
    body = copy.deepcopy(manifest)
    meta = body.setdefault("metadata", {})
    meta.setdefault("namespace", "default")
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("resourceVersion", "1")
    meta.setdefault("generation", generation)
    return body


def _rljob_printer_columns() -> list[dict[str, Any]]:
    """The RLJob CRD's ``additionalPrinterColumns`` (generated from the spec by omnirl.api.crd)."""
    from omnirl.api.crd import build_crd

    return build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]


class EmulatedCluster:
    """kmock's emulator on a local port, plus (optionally) the operator as an asyncio task.

    Attributes:
        url: ``http://127.0.0.1:PORT`` of the emulator (kubectl can use it: ``--server=URL``).
        api: a :class:`KubeApi` for that URL (what the operator uses too).
        emulator: the ``kmock.KubernetesEmulator`` (``emulator.objects`` for assertions).
    """

    def __init__(self) -> None:
        import kmock

        self._kmock = kmock
        self.emulator = _versioned_emulator_class({"omnirl.dev/v1alpha1/rljobs": _rljob_printer_columns()})()
        self.emulator.resources.load_bundled()
        self.emulator.resources["omnirl.dev/v1alpha1/rljobs"] = kmock.ResourceInfo(
            kind="RLJob", singular="rljob", namespaced=True, subresources={"status"},
            verbs=set(RLJOB_VERBS), shortnames={"rlj"}, categories={"all"},
        )
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self.url = ""
        self.api: KubeApi | None = None

    async def __aenter__(self) -> EmulatedCluster:
        await self.emulator.__aenter__()
        self._server = self._kmock.Server(self.emulator)
        await self._server.__aenter__()
        self.url = str(self._server.url).rstrip("/")
        self.api = KubeApi.for_server(self.url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_operator()
        await self._server.__aexit__(None, None, None)
        await self.emulator.__aexit__(None, None, None)

    async def start_operator(self, settings: OperatorSettings, resync_seconds: float = 0.5) -> None:
        """Run the operator (every handler of ``handlers.register``) cluster-wide, standalone."""
        registry = handlers.register(kopf.OperatorRegistry(), resync_seconds=resync_seconds)
        url = self.url

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=url, insecure=True)

        kopf_settings = kopf.OperatorSettings()
        kopf_settings.background.instant_exit_timeout = 0.5
        self._stop = asyncio.Event()
        memo = kopf.Memo(kube=self.api, settings=settings)
        self._task = asyncio.create_task(kopf.operator(
            registry=registry, settings=kopf_settings, memo=memo, clusterwide=True, standalone=True,
            stop_flag=self._stop,
        ))

    async def stop_operator(self) -> None:
        """Ask the operator to stop and wait for it (at most 15 s)."""
        if self._task is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(self._task, 15)
        finally:
            self._task = None

    # ------------------------------------------------------------------ object helpers
    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """POST ``obj`` through the API (so watchers see an ADDED event)."""
        return await asyncio.to_thread(self.api.create, obj)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object, or ``None``."""
        return await asyncio.to_thread(self.api.get, api_version, kind, namespace, name)

    async def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any],
                    sub: str | None = None) -> dict[str, Any]:
        """Merge-patch an object (or its ``sub``resource)."""
        return await asyncio.to_thread(self.api.patch, api_version, kind, namespace, name, patch, sub=sub)

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """DELETE an object (with finalizers, the emulator only marks it, as a real server does)."""
        return await asyncio.to_thread(self.api.delete, api_version, kind, namespace, name)

    async def set_status(self, api_version: str, kind: str, namespace: str, name: str,
                         status: dict[str, Any]) -> None:
        """Play a Kubernetes controller: write ``status`` of a child (e.g. ``readyReplicas``)."""
        await self.patch(api_version, kind, namespace, name, {"status": status}, sub="status")

    async def rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The RLJob as stored."""
        return await self.get("omnirl.dev/v1alpha1", "RLJob", namespace, name)

    @staticmethod
    async def wait_for(check: Callable[[], Awaitable[Any]], timeout_s: float = 20.0, what: str = "condition"
                       ) -> Any:
        """Poll ``check`` every 50 ms until it returns a truthy value; return it.

        Raises:
            TimeoutError: naming ``what`` after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            value = await check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not reached within {timeout_s} s")
            await asyncio.sleep(0.05)


class BackgroundCluster:
    """An :class:`EmulatedCluster` with the operator running in its own thread and event loop, so
    one emulator and operator serve many synchronous tests (start-up is paid once).

    Example::

        with BackgroundCluster(OperatorSettings(default_redis_url=url)) as bg:
            bg.run(scenario)  # scenario: async def scenario(cluster: EmulatedCluster) -> T
    """

    def __init__(self, settings: OperatorSettings, resync_seconds: float = 0.5) -> None:
        self.settings = settings
        self.resync_seconds = resync_seconds
        self.cluster: EmulatedCluster | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="emulated-cluster", daemon=True)
        self._exit: asyncio.Event | None = None
        self._main: concurrent.futures.Future | None = None

    def __enter__(self) -> BackgroundCluster:
        self._thread.start()
        ready: concurrent.futures.Future = concurrent.futures.Future()

        async def main() -> None:
            self._exit = asyncio.Event()
            try:
                async with EmulatedCluster() as cluster:
                    await cluster.start_operator(self.settings, self.resync_seconds)
                    self.cluster = cluster
                    ready.set_result(cluster)
                    await self._exit.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        self._main = asyncio.run_coroutine_threadsafe(main(), self._loop)
        ready.result(timeout=60)
        return self

    def run(self, scenario: Callable[[EmulatedCluster], Awaitable[Any]], timeout_s: float = 60.0) -> Any:
        """Run ``scenario(cluster)`` in the cluster's loop; return its result or raise its error."""
        return asyncio.run_coroutine_threadsafe(scenario(self.cluster), self._loop).result(timeout=timeout_s)

    def __exit__(self, *exc: object) -> None:
        try:
            if self._exit is not None:
                self._loop.call_soon_threadsafe(self._exit.set)
            if self._main is not None:
                self._main.result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
