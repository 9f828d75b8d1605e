"""An RLJob through the operator and the manifests it writes, run for real.

`kubectl apply` (the PyPI binary) of a tiny RLJob → the operator (kopf) creates the children in
kmock's emulator → :class:`e2e.kubelet.Kubelet` runs every pod of the Deployments, the actor
StatefulSet and the controller Job as local processes, from the container command, args and env
stored in the emulator, and writes their status back as the workload controllers would → the
roles train 3 steps through a real, password-protected redis-server (the Secret path of the
chart's bundled Redis) → the controller patches the RLJob's status → the operator takes the job
Pending → Running → Succeeded and scales the workloads to zero → deleting the RLJob runs the
finalizer, which empties the job's Redis keys.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis
import yaml
from e2e.kubelet import Kubelet
from e2e.test_local_job import tiny_job

from omnirl_operator.kube import KubeApi
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster

ROOT = Path(__file__).resolve().parents[1]
KUBECTL = ROOT / ".venv" / "bin" / "kubectl"
NS = "e2e"
NAME = "k8s-tiny"
SECRET = "e2e-redis"
RLJOB = ("omnirl.dev/v1alpha1", "RLJob")
TIMEOUT_S = 240.0

if not KUBECTL.exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{KUBECTL} is missing in CI: `make k8s-tools` (a step of `make install`) installs it")
    pytest.skip(f"{KUBECTL} not installed; run `make k8s-tools` (tools/fetch_k8s_tools.sh)", allow_module_level=True)


def kubectl(server: str, home: Path, *args: str) -> str:
    """Run kubectl against the emulator; returns stdout (raises with stderr on failure)."""
    cmd = [str(KUBECTL), f"--server={server}", f"--cache-dir={home / 'cache'}", f"--namespace={NS}", *args]
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(home / "none")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def manifest(tmp: Path, redis_url: str) -> Path:
    """The local e2e's tiny job (3 steps × 2 prompts × group 3, 4 sampling steps, validation every
    2 steps on 4 prompts) in namespace NS, its Redis password in Secret SECRET."""
    path = tiny_job(tmp, NAME, redis_url)
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = NS
    doc["spec"]["transferQueue"]["passwordSecret"] = SECRET
    path.write_text(yaml.safe_dump(doc))
    return path


def secret(tmp: Path, password: str) -> Path:
    """Secret SECRET holding the Redis password under key ``password`` (what the chart creates)."""
    path = tmp / "secret.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                    "metadata": {"name": SECRET, "namespace": NS},
                                    "data": {"password": base64.b64encode(password.encode()).decode()}}))
    return path


def wait_children(kube: KubeApi, timeout_s: float = 30.0) -> None:
    """Until every child the operator builds exists."""
    children = [("v1", "ConfigMap", f"{NAME}-spec"), ("v1", "Service", f"{NAME}-actor"),
                ("v1", "Service", f"{NAME}-ranks"), ("v1", "Service", f"{NAME}-metrics"),
                ("v1", "ServiceAccount", f"{NAME}-controller"),
                ("rbac.authorization.k8s.io/v1", "Role", f"{NAME}-controller"),
                ("rbac.authorization.k8s.io/v1", "RoleBinding", f"{NAME}-controller"),
                ("apps/v1", "Deployment", f"{NAME}-rollout"), ("apps/v1", "Deployment", f"{NAME}-reward"),
                ("apps/v1", "StatefulSet", f"{NAME}-actor"), ("batch/v1", "Job", f"{NAME}-controller")]
    deadline = time.monotonic() + timeout_s
    while missing := [f"{kind}/{name}" for v, kind, name in children if kube.get(v, kind, NS, name) is None]:
        assert time.monotonic() < deadline, f"the operator did not create {missing}"
        time.sleep(0.1)


def run_until_succeeded(kube: KubeApi, kubelet: Kubelet, start: float) -> tuple[dict, list[tuple[float, str, str]]]:
    """Drive the kubelet until the RLJob is Succeeded and its pods are gone; returns the last
    RLJob and the phase transitions as (seconds since apply, UTC time, phase)."""
    transitions: list[tuple[float, str, str]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        kubelet.sync()
        job = kube.get(*RLJOB, NS, NAME)
        phase = (job.get("status") or {}).get("phase")
        if phase and (not transitions or transitions[-1][2] != phase):
            stamp = datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
            transitions.append((time.monotonic() - start, stamp, phase))
        if phase in ("Succeeded", "Failed") and not kubelet.pods:  # scaled to zero, pods deleted
            return job, transitions
        assert time.monotonic() < deadline, f"phase {phase} after {TIMEOUT_S} s\n{kubelet.tails()}"
        time.sleep(0.25)


def test_rljob_manifests_run_and_report_to_the_rljob(tmp_path, protected_redis):
    redis_url, password = protected_redis
    home = tmp_path / "kubectl"
    home.mkdir()
    with BackgroundCluster(OperatorSettings(), resync_seconds=0.5) as bg:
        server = bg.cluster.url
        kube = KubeApi.for_server(server)
        kubelet = Kubelet(kube, server, NS, NAME, tmp_path / "pods", Path(sys.executable).parent)
        try:
            # `kubectl create secret` posts protobuf, which kmock cannot read: apply the Secret as JSON
            kubectl(server, home, "apply", "--validate=false", "-f", str(secret(tmp_path, password)))
            start = time.monotonic()
            applied = kubectl(server, home, "apply", "--validate=false", "-f", str(manifest(tmp_path, redis_url)))
            assert applied.strip() == f"rljob.omnirl.dev/{NAME} created"
            wait_children(kube)
            job, transitions = run_until_succeeded(kube, kubelet, start)
        finally:
            kubelet.stop()
        table = kubectl(server, home, "get", "rljobs")
        workloads = kubectl(server, home, "get", "deployments,statefulsets,jobs")
        print("\nphase transitions (s since kubectl apply, UTC, phase):")
        for seconds, stamp, phase in transitions:
            print(f"  {seconds:6.1f} s  {stamp}  {phase}")
        print(f"\n$ kubectl get rljobs -n {NS}\n{table}\n$ kubectl get deployments,statefulsets,jobs -n {NS}\n"
              f"{workloads}")

        assert [phase for _, _, phase in transitions] == ["Pending", "Running", "Succeeded"], kubelet.tails()
        status = job["status"]
        assert (status["step"], status["policyVersion"]) == (3, 3)
        assert isinstance(status["rewardMean"], float) and 0.0 <= status["rewardMean"] <= 1.0
        assert status["lastCheckpoint"].startswith(str(tmp_path / "pods" / f"{NAME}-actor-0" / "volumes" / "run"))
        assert status["readyRoles"] == "0/0" and status["startTime"] and status["completionTime"]
        header, row = table.splitlines()[:2]
        assert header.split() == ["NAME", "PHASE", "STEP", "REWARD", "READY", "AGE"]
        assert row.split()[:3] == [NAME, "Succeeded", "3"]
        # every pod ran what the operator wrote and ended cleanly (exit 0, or stopped at scale-down)
        by_name = {pod.name: pod for pod in kubelet.deleted}
        assert len(by_name) == 4 and all(pod.exits in ([], [0]) for pod in by_name.values()), kubelet.tails()
        controller = next(pod for pod in by_name.values() if pod.owner == ("Job", f"{NAME}-controller"))
        assert controller.exits == [0]
        metrics = controller.root / "volumes" / "run" / "metrics.jsonl"
        steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["event"] == "step"]
        assert [(r["step"], r["policy_version"]) for r in steps] == [(0, 1), (1, 2), (2, 3)]

        # deleting the RLJob runs the finalizer: the job's Redis keys go (with the Secret's password)
        client = redis.Redis.from_url(redis_url, password=password)
        try:
            assert client.keys(f"omnirl:{NAME}:*")
            kubectl(server, home, "delete", "rljob", NAME, "--wait=false")
            deadline = time.monotonic() + 30
            while kube.get(*RLJOB, NS, NAME) is not None:
                assert time.monotonic() < deadline, "the finalizer did not release the RLJob"
                time.sleep(0.2)
            assert client.keys(f"omnirl:{NAME}:*") == []
        finally:
            client.close()
