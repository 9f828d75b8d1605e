"""A rollout replica of two pods through the operator and the stand-in kubelet (CPU, gloo; docs/parallel.md, "On
Kubernetes"): the tiny Wan LoRA job of `e2e/test_parallel_job.py` with `roles.rollout.parallel: {ulysses: 2,
podsPerReplica: 2}` is applied to kmock's emulator; the operator writes the rollout as a StatefulSet of 2 pods (one
Kueue pod group) with the headless Service `<job>-rollout-ranks`; the kubelet runs both pods as processes, pod 0
the replica's leader and pod 1 its follower meeting at pod 0 (`OMNIRL_REPLICA_HOSTS`, routed as cluster DNS
would); both bind every weight sync, the job trains its 2 steps and the RLJob ends Succeeded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from e2e.kubelet import Kubelet
from e2e.test_kubernetes_job import NS, kubectl, run_until_succeeded, secret
from e2e.test_parallel_job import manifest as local_manifest
from tests.video_models import save_tiny

from omnirl_operator.kube import KubeApi
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster

NAME = "k8s-tiny"  # run_until_succeeded watches this RLJob


@pytest.mark.slow
@pytest.mark.omni
@pytest.mark.timeout(900)
def test_a_two_pod_rollout_replica_runs_as_one_gang(tmp_path, protected_redis):
    redis_url, password = protected_redis
    model = save_tiny("wan", tmp_path / "wan")
    doc = yaml.safe_load(local_manifest(tmp_path, model, NAME, {
        "rollout": {"parallel": {"ulysses": 2, "podsPerReplica": 2}}}).read_text())
    doc["metadata"]["namespace"] = NS
    doc["spec"]["transferQueue"] = {"redisUrl": redis_url, "passwordSecret": "e2e-redis"}
    doc["spec"]["storage"] = {"size": "1Gi", "accessModes": ["ReadWriteMany"]}
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(doc))
    home = tmp_path / "kubectl"
    home.mkdir()
    with BackgroundCluster(OperatorSettings(), resync_seconds=1.0) as bg:
        server = bg.cluster.url
        kube = KubeApi.for_server(server)
        kubelet = Kubelet(kube, server, NS, NAME, tmp_path / "pods", Path(sys.executable).parent)
        try:
            kubectl(server, home, "apply", "--validate=false", "-f", str(secret(tmp_path, password)))
            import time

            start = time.monotonic()
            kubectl(server, home, "apply", "--validate=false", "-f", str(job_path))
            job, transitions = run_until_succeeded(kube, kubelet, start, timeout_s=600.0)
        finally:
            kubelet.stop()
        assert [phase for _, _, phase in transitions] == ["Pending", "Running", "Succeeded"], kubelet.tails()
        assert job["status"]["step"] == 2
        rollout = kube.get("apps/v1", "StatefulSet", NS, f"{NAME}-rollout")
        assert rollout["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == f"{NAME}-rollout"
        assert kube.get("v1", "Service", NS, f"{NAME}-rollout-ranks")["spec"]["clusterIP"] == "None"
        pods = {p.name: p for p in kubelet.deleted}
        leader, follower = pods[f"{NAME}-rollout-0"], pods[f"{NAME}-rollout-1"]
        assert leader.exits in ([], [0]) and follower.exits in ([], [0]), kubelet.tails()
        log = follower.log.read_text()
        assert f"replica follower {NAME}-rollout-1.r1: rank 1 of 2" in log and "stopped by the leader" in log, log
        assert "bound weights v2" in leader.log.read_text()
