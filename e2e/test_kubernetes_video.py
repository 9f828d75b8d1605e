"""A video RLJob through the operator and the stand-in kubelet, as the image job of `e2e/test_kubernetes_job.py` runs:
the tiny `wan` job of `e2e/test_video_jobs.py` (FlowGRPO, LoRA, 2 steps x 2 prompts x 2 samples, 9 frames of 16x16,
CFG 2, the temporal-consistency and per-frame JPEG rewards, validation writing MP4s) is applied with `kubectl` to
kmock's emulator; the operator writes its Deployments, actor StatefulSet and controller Job; the kubelet runs every pod
as a process against a password-protected redis-server; the run directory is the job's ReadWriteMany claim. The RLJob
ends Succeeded, the ledgers on the claim show every training sample generated, scored and trained exactly once, and
the validation's MP4s are on the claim."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e.kubelet import Kubelet
from e2e.test_kubernetes_job import NAME, NS, kubectl, run_until_succeeded, secret
from e2e.test_video_jobs import check_video_run, video_job

from omnirl_operator.kube import KubeApi
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster

pytest.importorskip("diffusers")

STEPS = 2


def video_manifest(tmp: Path, redis_url: str) -> Path:
    """The local e2e's tiny wan job renamed NAME (what `run_until_succeeded` watches), in namespace NS, its Redis
    password in the Secret, its run directory on a ReadWriteMany claim every role mounts. JSON: see `manifest`."""
    doc = yaml.safe_load(video_job(tmp, "wan", redis_url, steps=STEPS).read_text())
    doc["metadata"] = {"name": NAME, "namespace": NS}
    doc["spec"]["transferQueue"]["passwordSecret"] = "e2e-redis"
    doc["spec"]["storage"] = {"size": "1Gi", "accessModes": ["ReadWriteMany"]}
    path = tmp / "video-job.json"
    path.write_text(json.dumps(doc))
    return path


class Finished:
    """`check_video_run`'s view of the finished job: the controller pod's exit code and log stand in for `omnirl run`'s."""

    def __init__(self, returncode: int, log: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, log, ""


@pytest.mark.slow
@pytest.mark.omni
@pytest.mark.timeout(900)
def test_a_video_rljob_runs_through_the_operator_and_writes_mp4s(tmp_path, protected_redis):
    redis_url, password = protected_redis
    home = tmp_path / "kubectl"
    home.mkdir()
    with BackgroundCluster(OperatorSettings(), resync_seconds=1.0) as bg:
        server = bg.cluster.url
        kube = KubeApi.for_server(server)
        kubelet = Kubelet(kube, server, NS, NAME, tmp_path / "pods", Path(sys.executable).parent)
        try:
            kubectl(server, home, "apply", "--validate=false", "-f", str(secret(tmp_path, password)))
            start = time.monotonic()
            applied = kubectl(server, home, "apply", "--validate=false", "-f", str(video_manifest(tmp_path, redis_url)))
            assert applied.strip() == f"rljob.omnirl.dev/{NAME} created"
            job, transitions = run_until_succeeded(kube, kubelet, start, timeout_s=780.0)
        finally:
            kubelet.stop()
        print(f"\nvideo RLJob Succeeded after {transitions[-1][0]:.1f} s: {transitions}")
        assert [phase for _, _, phase in transitions] == ["Pending", "Running", "Succeeded"], kubelet.tails()
        status = job["status"]
        assert (status["step"], status["policyVersion"]) == (STEPS, STEPS)
        pods = {pod.name: pod for pod in kubelet.deleted}
        assert all(pod.exits in ([], [0]) for pod in pods.values()), kubelet.tails()
        controller = next(pod for pod in pods.values() if pod.owner == ("Job", f"{NAME}-controller"))
        claim = tmp_path / "pods" / "claims" / f"{NAME}-run"  # the kubelet's stand-in for the bound volume
        # generated = scored = trained (each exactly once, 2 steps x 2 prompts x 2 samples), finite losses, the
        # policy version per step, and the validation's MP4s, all read from the claim
        check_video_run(claim, Finished(controller.exits[0], controller.log.read_text()), STEPS, "wan")
