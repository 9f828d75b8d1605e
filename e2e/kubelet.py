"""A stand-in kubelet for the Kubernetes e2e test: runs the pods of the workloads the operator
wrote into kmock's emulator as local processes, and plays the Deployment, StatefulSet and Job
controllers by writing those workloads' ``status`` back.

Everything a pod runs comes from the emulator: the container's ``command``, ``args`` and ``env``,
its volumes and ports, its probes. Nothing is rebuilt from the RLJob. What a node would provide is
substituted, and only this (each is a single function below):

1. **image** → this checkout's virtualenv: ``PATH`` starts with its ``bin/`` (where ``omnirl`` is);
   the base environment is ``PATH`` and ``HOME`` only (and the test's ``PYTHONPATH`` when set, so a
   checkout sharing another's virtualenv runs its own code), nothing else of the test's environment.
2. **volumes** (:func:`mount_volumes`) → a directory per volume under the pod's directory:
   ``configMap`` items are written from the emulator's ConfigMap (``job.yaml`` for
   ``/etc/omnirl``; Service addresses in them are routed as in 5, as cluster DNS would resolve
   them), ``emptyDir`` is a fresh directory. A ``persistentVolumeClaim`` is the
   directory ``<root>/claims/<claimName>``, one per claim, shared by every pod that mounts it and
   kept across pod restarts and deletions (a bound volume); the pod waits until the claim exists
   in the emulator, as it would stay Pending. Every command, argument or env value that starts
   with a ``mountPath`` is rewritten to the directory.
3. **downward API** (:func:`field_value`) → the pod's name, namespace and labels (a StatefulSet
   pod has ``statefulset.kubernetes.io/pod-name`` and ``apps.kubernetes.io/pod-index``);
   ``secretKeyRef`` → the Secret's value, read from the emulator.
4. **pod network** → every declared ``containerPort`` gets a free loopback port of its own (pods
   share loopback here, not a network namespace; a StatefulSet pod's incarnations keep theirs, as its
   stable DNS name would); env variables named ``*_PORT`` whose value is a
   declared containerPort, and the probes, use that port. ``$(VAR)`` in ``command``/``args`` is
   expanded from the container's env, as the kubelet does.
5. **Service DNS and kube-proxy** (:meth:`Kubelet.route`) → ``<svc>[.<ns>[.svc[.cluster.local]]]:<port>``
   in an env value becomes ``127.0.0.1:<loopback port of the Service's targetPort on the first pod
   its selector matches>``; a pod waits (as its connections would) until that pod exists. A headless
   Service's per-pod names ``<pod>.<svc>:<port>`` (a rollout replica's rendezvous, `OMNIRL_REPLICA_HOSTS`)
   become ``127.0.0.1:<that pod's loopback port>``; the multi-rank actor's ``MASTER_ADDR`` (a name without
   a port) is not routed.
6. **service-account token** → a pod with ``automountServiceAccountToken`` and a
   ``serviceAccountName`` gets ``KUBECONFIG`` pointing at the emulator (in a cluster the kubernetes
   client reads the mounted token; without ``KUBERNETES_SERVICE_HOST`` it falls back to KUBECONFIG).

Readiness is the real probe: gRPC ``grpc.health.v1`` Check, ``httpGet`` (status 200–399) or
``tcpSocket`` on the probe's port (startup probe, then readiness probe). Restarts follow ``restartPolicy`` (``Always``: after 10 s back-off, like
CrashLoopBackOff; a Job's failed pod up to ``backoffLimit``, none for a ``podFailurePolicy`` FailJob
exit code). Not modelled: images, resources,
scheduling, rolling-update pacing (pods of a changed template are replaced at once).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omnirl.transfer.redis_server import free_port
from omnirl_operator.kube import KubeApi, resource_path

JOB_LABEL = "omnirl.dev/job"
WORKLOADS = (("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("batch/v1", "Job"))
BACKOFF_S = 10.0  # the kubelet's first CrashLoopBackOff delay
MAX_GRACE_S = 10.0


@dataclass
class Pod:
    """One pod of a workload and its single container's process."""

    name: str
    owner: tuple[str, str]  # (kind, workload name)
    uid: str  # of the workload: a recreated workload gets new pods
    template_hash: str
    labels: dict[str, str]
    spec: dict[str, Any]
    root: Path
    ports: dict[int, int]  # containerPort → loopback port
    proc: subprocess.Popen | None = None
    exits: list[int] = field(default_factory=list)  # exit codes of runs that ended on their own
    restarts: int = 0
    next_start: float = 0.0
    ready: bool = False
    done: bool = False  # a run ended and restartPolicy keeps it down

    @property
    def container(self) -> dict[str, Any]:
        return self.spec["containers"][0]

    @property
    def log(self) -> Path:
        return self.root / "pod.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def field_value(pod: Pod, namespace: str, path: str) -> str:
    """A downward-API ``fieldRef.fieldPath`` of ``pod``.

    Raises:
        ValueError: a field path this stand-in does not know (name it here when a builder needs it).
    """
    if path == "metadata.name":
        return pod.name
    if path == "metadata.namespace":
        return namespace
    label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
    if label and label[1] in pod.labels:
        return pod.labels[label[1]]
    raise ValueError(f"pod {pod.name}: downward-API field {path!r} is not provided by the e2e kubelet")


def mount_volumes(kube: KubeApi, namespace: str, pod: Pod, claims: Path, route: Any = None) -> dict[str, Path]:
    """Create the pod's volumes under ``pod.root`` (claims under ``claims``); returns mountPath → host directory.

    ``route`` (text → text) rewrites Service addresses in ConfigMap files (cluster DNS).

    Raises:
        NotClaimed: a persistentVolumeClaim that does not exist (yet).
        ValueError: a volume kind other than configMap/emptyDir/persistentVolumeClaim, or a missing ConfigMap key.
    """
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in pod.container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        host = pod.root / "volumes" / mount["name"]
        if "persistentVolumeClaim" in volume:
            name = volume["persistentVolumeClaim"]["claimName"]
            if kube.get("v1", "PersistentVolumeClaim", namespace, name) is None:
                raise NotClaimed(name)
            host = claims / name
        host.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            cm = kube.get("v1", "ConfigMap", namespace, volume["configMap"]["name"]) or {}
            data = cm.get("data") or {}
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] not in data:
                    raise ValueError(f"pod {pod.name}: ConfigMap {volume['configMap']['name']} has no key "
                                     f"{item['key']!r}")
                text = data[item["key"]]
                (host / item["path"]).write_text(route(text) if route else text)
        elif "emptyDir" not in volume and "persistentVolumeClaim" not in volume:
            raise ValueError(f"pod {pod.name}: volume {mount['name']} ({sorted(volume)}) is not emulated")
        mounts[mount["mountPath"].rstrip("/")] = host
    return mounts


def remap_path(value: str, mounts: dict[str, Path]) -> str:
    """``value`` with a leading mountPath replaced by its host directory (longest mount first)."""
    for mount in sorted(mounts, key=len, reverse=True):
        if value == mount or value.startswith(mount + "/"):
            return str(mounts[mount]) + value[len(mount):]
    return value


class NotRoutable(Exception):
    """A Service named in a pod's environment selects no pod yet: start the pod later."""


class NotClaimed(Exception):
    """A PersistentVolumeClaim the pod mounts does not exist yet: start the pod later."""


class Kubelet:
    """Runs the pods of one RLJob's workloads (see the module docstring for every substitution).

    Args:
        kube: a client of the emulator.
        server: the emulator's URL (for the service-account KUBECONFIG).
        namespace: the RLJob's namespace.
        job: the RLJob's name (workloads are found by the ``omnirl.dev/job`` label).
        root: a directory for the pods' volumes and logs.
        bin_dir: the virtualenv's ``bin/`` (stands in for the image).
    """

    def __init__(self, kube: KubeApi, server: str, namespace: str, job: str, root: Path, bin_dir: Path) -> None:
        self.kube, self.server, self.namespace, self.job = kube, server, namespace, job
        self.root, self.bin_dir = root, bin_dir
        self.pods: dict[str, Pod] = {}
        self.deleted: list[Pod] = []
        self.events: list[tuple[float, str]] = []  # (time.time(), "pod X started" …): the pods' timeline
        self._written: dict[str, dict[str, Any]] = {}  # workload uid → the status last written
        self._given: set[int] = set()  # every loopback port a pod was given (see _loopback_port)
        # (StatefulSet pod name, containerPort) → its loopback port, kept by the pod's next incarnations: a
        # role started while the old actor-0 still ran was routed to it, and the new actor-0 listened elsewhere
        # (in a cluster the name `actor-0.<svc>` resolves to whichever pod holds it: CI hung on the stale port)
        self._stable: dict[tuple[str, int], int] = {}

    # ------------------------------------------------------------------ the emulator
    def _list(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        """This job's objects of a kind (kmock has no label selectors: filtered here)."""
        items = self.kube.request("GET", resource_path(api_version, kind, self.namespace)).get("items") or []
        return [o for o in items if (o["metadata"].get("labels") or {}).get(JOB_LABEL) == self.job]

    def sync(self) -> None:
        """One level-triggered pass: pods follow the workloads, processes follow the pods,
        probes decide readiness, and the workloads' status is written back."""
        workloads = {(obj["kind"], obj["metadata"]["name"]): obj
                     for api_version, kind in WORKLOADS for obj in self._list(api_version, kind)}
        for key in [k for k, p in self.pods.items() if p.owner not in workloads]:
            self._delete(key)
        for obj in workloads.values():
            self._scale(obj)
        services = self._list("v1", "Service")
        for pod in list(self.pods.values()):
            self._run(pod, workloads[pod.owner], services)
            ready = pod.running() and self._probe(pod)
            if ready != pod.ready:
                self._event(f"pod {pod.name} {'ready' if ready else 'not ready'}")
            pod.ready = ready
        for key, obj in workloads.items():
            self._write_status(key, obj)

    # ------------------------------------------------------------------ workload controllers
    def _scale(self, obj: dict[str, Any]) -> None:
        """Create or delete pods so the workload has the pods its spec asks for."""
        kind, name, uid = obj["kind"], obj["metadata"]["name"], obj["metadata"]["uid"]
        template = obj["spec"]["template"]
        digest = hashlib.sha256(yaml.safe_dump(template, sort_keys=True).encode()).hexdigest()[:10]
        if kind == "Job":  # one pod; a Job's template is immutable (the operator replaces the Job)
            wanted = [f"{name}-{uid[:5]}"]
        elif kind == "StatefulSet":
            wanted = [f"{name}-{i}" for i in range(int(obj["spec"].get("replicas", 1)))]
        else:
            wanted = [f"{name}-{digest}-{i}" for i in range(int(obj["spec"].get("replicas", 1)))]
        for key, pod in list(self.pods.items()):
            stale = pod.uid != uid or (pod.template_hash != digest and kind != "Job")
            if pod.owner == (kind, name) and (stale or key not in wanted):
                self._delete(key)
        for key in wanted:
            if key not in self.pods:
                self.pods[key] = self._new_pod(obj, key, digest)

    def _new_pod(self, obj: dict[str, Any], name: str, digest: str) -> Pod:
        template = obj["spec"]["template"]
        if len(template["spec"]["containers"]) != 1:
            raise ValueError(f"{obj['kind']}/{obj['metadata']['name']}: the e2e kubelet runs one container per pod")
        labels = dict(template["metadata"].get("labels") or {})
        if obj["kind"] == "StatefulSet":
            labels["statefulset.kubernetes.io/pod-name"] = name
            labels["apps.kubernetes.io/pod-index"] = name.rpartition("-")[2]
        declared = [p["containerPort"] for p in template["spec"]["containers"][0].get("ports", [])]
        if obj["kind"] == "StatefulSet":  # a stable network identity: pod `actor-0` is reached at one address
            ports = {c: self._stable.setdefault((name, c), self._loopback_port()) for c in declared}
        else:
            ports = {c: self._loopback_port() for c in declared}
        return Pod(name=name, owner=(obj["kind"], obj["metadata"]["name"]), uid=obj["metadata"]["uid"],
                   template_hash=digest, labels=labels, spec=template["spec"], root=self.root / name, ports=ports)

    def _loopback_port(self) -> int:
        """A free port no pod of this kubelet was ever given. A pod network gives every pod its own
        address; on one loopback, a port picked while a restarting pod is down (the actor's weight-sync
        port) went to a new pod's health server, and the actor could not bind it again (CI saw it)."""
        while True:
            port = free_port()
            if port not in self._given:
                self._given.add(port)
                return port

    def _write_status(self, key: tuple[str, str], obj: dict[str, Any]) -> None:
        """The status a Deployment/StatefulSet/Job controller would write, when it changed."""
        pods = [p for p in self.pods.values() if p.owner == key and p.uid == obj["metadata"]["uid"]]
        ready = sum(p.ready for p in pods)
        if key[0] == "Job":
            status = self._job_status(obj, pods, ready)
        else:
            status = {"observedGeneration": obj["metadata"].get("generation"), "replicas": len(pods),
                      "updatedReplicas": len(pods), "readyReplicas": ready, "availableReplicas": ready}
        uid = obj["metadata"]["uid"]
        if self._written.get(uid) != status:
            api_version = next(v for v, k in WORKLOADS if k == key[0])
            self.kube.patch(api_version, key[0], self.namespace, key[1], {"status": status}, sub="status")
            self._written[uid] = status

    def _job_status(self, obj: dict[str, Any], pods: list[Pod], ready: int) -> dict[str, Any]:
        previous = obj.get("status") or {}
        done = [p for p in pods if p.done]
        status = {"active": sum(p.running() for p in pods), "ready": ready,
                  "startTime": previous.get("startTime") or _now()}
        if any(p.exits and p.exits[-1] == 0 for p in done):
            status.update(active=0, succeeded=1, completionTime=previous.get("completionTime") or _now(),
                          conditions=[{"type": "SuccessCriteriaMet", "status": "True"},
                                      {"type": "Complete", "status": "True"}])
        elif done:
            code = done[0].exits[-1]
            reason = "PodFailurePolicy" if _fails_job(obj, code) else "BackoffLimitExceeded"
            status.update(active=0, failed=len(done[0].exits), conditions=[
                {"type": "Failed", "status": "True", "reason": reason,
                 "message": f"pod {done[0].name} exited {code}"}])
        return status

    # ------------------------------------------------------------------ the kubelet proper
    def _run(self, pod: Pod, workload: dict[str, Any], services: list[dict[str, Any]]) -> None:
        """Start the pod's process, notice its exit, and restart it as ``restartPolicy`` says."""
        if pod.proc is not None and pod.proc.poll() is not None:
            pod.exits.append(pod.proc.returncode)
            self._event(f"pod {pod.name} exited {pod.proc.returncode}")
            pod.proc = None
            policy = pod.spec.get("restartPolicy", "Always")
            limit = int(workload["spec"].get("backoffLimit", 6)) if workload["kind"] == "Job" else None
            # a Job retries a failed pod (in place for OnFailure, as a new pod for Never: here the same
            # process slot) up to backoffLimit, unless its podFailurePolicy fails the Job on that code
            again = policy == "Always" or (pod.exits[-1] != 0 and (limit is None or pod.restarts < limit)
                                           and not _fails_job(workload, pod.exits[-1]))
            pod.done = not again
            pod.next_start = time.monotonic() + BACKOFF_S * 2 ** min(pod.restarts, 5)
            pod.restarts += int(again)
        if pod.proc is not None or pod.done or time.monotonic() < pod.next_start:
            return
        try:
            cmd, env = self._container(pod, services)
        except (NotRoutable, NotClaimed):
            return
        with pod.log.open("a") as log:
            pod.proc = subprocess.Popen(cmd, env=env, cwd=pod.root, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._event(f"pod {pod.name} started: {' '.join([Path(cmd[0]).name, *cmd[1:]])}")

    def _container(self, pod: Pod, services: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of the pod's container, every substitution applied.

        Raises:
            NotRoutable: an env value names a Service that selects no pod yet.
            NotClaimed: a claim the pod mounts does not exist yet.
            ValueError: an env source or volume this stand-in does not emulate, or no executable.
        """
        c = pod.container
        pod.root.mkdir(parents=True, exist_ok=True)
        mounts = mount_volumes(self.kube, self.namespace, pod, self.root / "claims",
                               lambda text: self.route(text, services))
        env = {"PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(pod.root)}
        if os.environ.get("PYTHONPATH"):  # the checkout under test is the image's code (worktrees share a venv)
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        for var in c.get("env", []):
            value = var.get("value", "")
            source = var.get("valueFrom") or {}
            if "fieldRef" in source:
                value = field_value(pod, self.namespace, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = self.kube.get("v1", "Secret", self.namespace, ref["name"]) or {}
                value = base64.b64decode((secret.get("data") or {})[ref["key"]]).decode()
            elif source:
                raise ValueError(f"pod {pod.name}: env {var['name']} from {sorted(source)} is not emulated")
            value = self.route(remap_path(value, mounts), services)
            if var["name"].endswith("_PORT") and value.isdigit() and int(value) in pod.ports:
                value = str(pod.ports[int(value)])
            env[var["name"]] = value
        if pod.spec.get("automountServiceAccountToken") and pod.spec.get("serviceAccountName"):
            env["KUBECONFIG"] = str(self._kubeconfig(pod))
        argv = [remap_path(expand(a, env), mounts) for a in [*c.get("command", []), *c.get("args", [])]]
        exe = shutil.which(argv[0], path=env["PATH"])
        if exe is None:
            raise ValueError(f"pod {pod.name}: {argv[0]!r} is not on the image's PATH ({env['PATH']})")
        return [exe, *argv[1:]], env

    def route(self, value: str, services: list[dict[str, Any]]) -> str:
        """``<svc>[.<ns>[.svc[.cluster.local]]]:<port>`` → ``127.0.0.1:<port of the selected pod>``.

        Raises:
            NotRoutable: the Service selects no pod yet.
            ValueError: the Service has no such port (in a cluster the connection would hang).
        """
        for svc in services:
            name = svc["metadata"]["name"]
            domain = rf"(?:\.{re.escape(self.namespace)}(?:\.svc(?:\.cluster\.local)?)?)?"
            if svc["spec"].get("clusterIP") == "None":  # a headless Service's per-pod names: that pod's port
                value = self._route_pods(value, svc, domain)
            pattern = rf"(?<![\w.-]){re.escape(name)}{domain}:(\d+)\b"
            match = re.search(pattern, value)
            if not match:
                continue
            port = next((p for p in svc["spec"].get("ports", []) if p["port"] == int(match[1])), None)
            if port is None:
                raise ValueError(f"Service {name} has no port {match[1]} (named in {value!r})")
            selector = svc["spec"].get("selector") or {}
            backends = sorted((p for p in self.pods.values() if selector.items() <= p.labels.items()),
                              key=lambda p: p.name)
            if not backends:
                raise NotRoutable(name)
            target = port.get("targetPort", port["port"])
            if isinstance(target, str):
                target = next(p["containerPort"] for p in backends[0].container["ports"] if p.get("name") == target)
            value = value[:match.start()] + f"127.0.0.1:{backends[0].ports[target]}" + value[match.end():]
        return value

    def _route_pods(self, value: str, svc: dict[str, Any], domain: str) -> str:
        """Every ``<pod>.<headless svc>[domain]:<port>`` in ``value`` → ``127.0.0.1:<that pod's port>`` (a rollout
        replica's rendezvous at its first pod; cluster DNS resolves these names to the pod's own address).

        Raises:
            NotRoutable: a named pod does not exist yet.
        """
        name = svc["metadata"]["name"]

        def one(match: re.Match[str]) -> str:
            pod = self.pods.get(match[1])
            if pod is None:
                raise NotRoutable(f"{match[1]}.{name}")
            port = next((p for p in svc["spec"].get("ports", []) if p["port"] == int(match[2])), None)
            target = port.get("targetPort", port["port"]) if port else int(match[2])
            return f"127.0.0.1:{pod.ports[target]}"

        return re.sub(rf"(?<![\w.-])([a-z0-9][a-z0-9-]*)\.{re.escape(name)}{domain}:(\d+)\b", one, value)

    def _kubeconfig(self, pod: Pod) -> Path:
        path = pod.root / "kubeconfig"
        account = pod.spec["serviceAccountName"]
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "emulator", "cluster": {"server": self.server}}],
            "users": [{"name": account, "user": {"token": f"service-account-token-of-{account}"}}],
            "contexts": [{"name": "pod", "context": {"cluster": "emulator", "user": account,
                                                     "namespace": self.namespace}}],
        }))
        return path

    def _probe(self, pod: Pod) -> bool:
        """The container's startup/readiness probe: gRPC health, httpGet or tcpSocket (no probe:
        ready once running)."""
        c = pod.container
        probe = c.get("readinessProbe") or c.get("startupProbe")
        if not probe:
            return True
        if "httpGet" in probe or "tcpSocket" in probe:
            action = probe.get("httpGet") or probe["tcpSocket"]
            port = action["port"]
            if isinstance(port, str):
                port = next(p["containerPort"] for p in c.get("ports", []) if p.get("name") == port)
            port = pod.ports.get(port, port)
            try:
                if "tcpSocket" in probe:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    return True
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{action.get('path', '/')}", timeout=0.5) as r:
                    return 200 <= r.status < 400
            except OSError:
                return False
        port = pod.ports.get(probe["grpc"]["port"], probe["grpc"]["port"])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _delete(self, key: str) -> None:
        """Delete a pod: SIGTERM its process group, SIGKILL after the grace period."""
        pod = self.pods.pop(key)
        self._event(f"pod {pod.name} deleted")
        if pod.running():
            os.killpg(pod.proc.pid, signal.SIGTERM)
            try:
                pod.proc.wait(timeout=min(float(pod.spec.get("terminationGracePeriodSeconds", 30)), MAX_GRACE_S))
            except subprocess.TimeoutExpired:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
        self.deleted.append(pod)

    def stop(self) -> None:
        """Delete every pod."""
        for key in list(self.pods):
            self._delete(key)

    def _event(self, text: str) -> None:
        self.events.append((time.time(), text))

    def tails(self, lines: int = 25) -> str:
        """The last log lines of every pod, for a failure message."""
        out = []
        for pod in [*self.pods.values(), *self.deleted]:
            text = pod.log.read_text().splitlines()[-lines:] if pod.log.exists() else []
            out.append(f"--- {pod.name} (exits {pod.exits}) ---\n" + "\n".join(text))
        return "\n".join(out)


def _fails_job(workload: dict[str, Any], code: int) -> bool:
    """Whether a Job's ``podFailurePolicy`` has a FailJob rule for exit ``code`` (operator In)."""
    rules = (workload["spec"].get("podFailurePolicy") or {}).get("rules") or []
    return any(r.get("action") == "FailJob" and code in (r.get("onExitCodes") or {}).get("values", [])
               for r in rules if (r.get("onExitCodes") or {}).get("operator", "In") == "In")


def expand(value: str, env: dict[str, str]) -> str:
    """``$(VAR)`` → ``env[VAR]`` (left as is when unset), ``$$`` → ``$``: the kubelet's expansion
    of a container's command and args."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), value)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
