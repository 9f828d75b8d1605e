"""An RLJob through the operator and the manifests it writes, run for real.

`kubectl apply` (the PyPI binary) of a tiny RLJob → the operator (kopf) creates the children in
kmock's emulator → :class:`e2e.kubelet.Kubelet` runs every pod of the Deployments, the actor
StatefulSet and the controller Job as local processes, from the container command, args and env
stored in the emulator, and writes their status back as the workload controllers would → the
roles train 3 steps through a real, password-protected redis-server (the Secret path of the
chart's bundled Redis) → the controller patches the RLJob's status → the operator takes the job
Pending → Running → Succeeded and scales the workloads to zero → deleting the RLJob runs the
finalizer, which empties the job's Redis keys. The job's second reward is a judge server the RLJob
deploys itself (`reward[].server`: the HTTP scorer `omnirl scorer serve` as Deployment and
Service `k8s-tiny-judge-judge`); the controller Job appears only once the judge pod is Ready.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis
import yaml
from e2e.kubelet import Kubelet, NotClaimed, field_value, mount_volumes, remap_path
from e2e.test_local_job import tiny_job

from omnirl.api.runtime import with_redis_password
from omnirl.evaluation.ledger import account, check_ledger
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
JUDGE = {"command": ["omnirl", "scorer", "serve", "--reward", "jpeg", "--protocol", "http", "--port", "{port}"],
         "urlPath": "/v1/score", "healthPath": "/healthz"}
# kmock serves no Table for built-in kinds, so kubectl would print only NAME and AGE
COLUMNS = ("KIND:.kind,NAME:.metadata.name,REPLICAS:.spec.replicas,READY:.status.readyReplicas,"
           "SUCCEEDED:.status.succeeded,COMPLETE:.status.conditions[?(@.type=='Complete')].status")

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
    2 steps on 4 prompts) in namespace NS, its Redis password in Secret SECRET, its run directory
    on a ReadWriteMany claim the operator creates (``<job>-run``, kept when the RLJob goes), which
    every role mounts."""
    path = tiny_job(tmp, NAME, redis_url)
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = NS
    doc["spec"]["transferQueue"]["passwordSecret"] = SECRET
    # ReadWriteMany: the rollout and reward pods mount it too, so every role's ledger is on it
    doc["spec"]["storage"] = {"size": "1Gi", "accessModes": ["ReadWriteMany"]}
    doc["spec"]["reward"].append({"name": "judge", "kind": "http", "weight": 0.5, "server": JUDGE})
    # JSON, not YAML: PyYAML writes the alphabet 0123456789 unquoted and kubectl (YAML 1.1) reads an int
    path.write_text(json.dumps(doc))
    return path


def secret(tmp: Path, password: str) -> Path:
    """Secret SECRET holding the Redis password under key ``password`` (what the chart creates)."""
    path = tmp / "secret.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                    "metadata": {"name": SECRET, "namespace": NS},
                                    "data": {"password": base64.b64encode(password.encode()).decode()}}))
    return path


def wait_children(kube: KubeApi, timeout_s: float = 30.0) -> None:
    """Until every child the operator builds at once exists (the controller Job comes later)."""
    children = [("v1", "ConfigMap", f"{NAME}-spec"), ("v1", "Service", f"{NAME}-actor"),
                ("v1", "Service", f"{NAME}-ranks"), ("v1", "Service", f"{NAME}-metrics"),
                ("v1", "ServiceAccount", f"{NAME}-controller"),
                ("rbac.authorization.k8s.io/v1", "Role", f"{NAME}-controller"),
                ("rbac.authorization.k8s.io/v1", "RoleBinding", f"{NAME}-controller"),
                ("apps/v1", "Deployment", f"{NAME}-rollout"), ("apps/v1", "Deployment", f"{NAME}-reward"),
                ("apps/v1", "StatefulSet", f"{NAME}-actor"), ("v1", "PersistentVolumeClaim", f"{NAME}-run"),
                ("apps/v1", "Deployment", f"{NAME}-judge-judge"),
                ("v1", "Service", f"{NAME}-judge-judge")]  # the controller Job waits for the judge pod
    deadline = time.monotonic() + timeout_s
    while missing := [f"{kind}/{name}" for v, kind, name in children if kube.get(v, kind, NS, name) is None]:
        assert time.monotonic() < deadline, f"the operator did not create {missing}"
        time.sleep(0.1)


def run_until_succeeded(kube: KubeApi, kubelet: Kubelet, start: float, timeout_s: float = TIMEOUT_S,
                        on_sync=None) -> tuple[dict, list[tuple[float, str, str]]]:
    """Drive the kubelet until the RLJob is finished and no pod runs any more (the workloads
    scaled to zero; the controller Job's pod completed); returns the last RLJob and the phase
    transitions as (seconds since apply, UTC time, phase). `on_sync(job)` runs after each pass."""
    transitions: list[tuple[float, str, str]] = []
    deadline = time.monotonic() + timeout_s
    while True:
        kubelet.sync()
        job = kube.get(*RLJOB, NS, NAME)
        phase = (job.get("status") or {}).get("phase")
        if phase and (not transitions or transitions[-1][2] != phase):
            stamp = datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
            transitions.append((time.monotonic() - start, stamp, phase))
        if on_sync is not None:
            on_sync(job)
        left = kubelet.pods.values()
        if phase in ("Succeeded", "Failed") and all(p.owner[0] == "Job" and not p.running() for p in left):
            return job, transitions
        assert time.monotonic() < deadline, f"phase {phase} after {timeout_s} s\n{kubelet.tails()}"
        time.sleep(0.25)


def print_record(transitions: list[tuple[float, str, str]], kubelet: Kubelet, table: str, workloads: str) -> None:
    """What the closing note quotes: phase transitions, the pods' timeline, `kubectl get` output."""
    print("\nphase transitions (s since kubectl apply, UTC, phase):")
    for seconds, stamp, phase in transitions:
        print(f"  {seconds:6.1f} s  {stamp}  {phase}")
    print("kubelet events (UTC):")
    for stamp, text in kubelet.events:
        print(f"  {datetime.fromtimestamp(stamp, timezone.utc).strftime('%H:%M:%S.%f')[:-3]}  {text}")
    print(f"\n$ kubectl get rljobs -n {NS}\n{table}\n$ kubectl get deployments,statefulsets,jobs -n {NS} "
          f"-o custom-columns=...\n{workloads}")


def test_rljob_manifests_run_and_report_to_the_rljob(tmp_path, protected_redis):
    """The whole path of the module docstring; prints the record (run with ``-s`` to see it)."""
    redis_url, password = protected_redis
    home = tmp_path / "kubectl"
    home.mkdir()
    with BackgroundCluster(OperatorSettings(), resync_seconds=1.0) as bg:
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
        workloads = kubectl(server, home, "get", "deployments,statefulsets,jobs", f"-o=custom-columns={COLUMNS}")
        print_record(transitions, kubelet, table, workloads)

        assert [phase for _, _, phase in transitions] == ["Pending", "Running", "Succeeded"], kubelet.tails()
        status = job["status"]
        assert (status["step"], status["policyVersion"]) == (3, 3)
        claim = tmp_path / "pods" / "claims" / f"{NAME}-run"  # the kubelet's stand-in for the bound volume
        assert status["lastCheckpoint"] == str(claim / "checkpoints" / "step-000002")
        assert status["startTime"] and status["completionTime"]
        for api_version, kind, role in (("apps/v1", "Deployment", "rollout"), ("apps/v1", "Deployment", "reward"),
                                        ("apps/v1", "StatefulSet", "actor"),
                                        ("apps/v1", "Deployment", "judge-judge")):  # accelerators freed
            assert kube.get(api_version, kind, NS, f"{NAME}-{role}")["spec"]["replicas"] == 0
        header, row = table.splitlines()[:2]
        assert header.split() == ["NAME", "PHASE", "STEPS", "REWARD", "READY", "REASON", "AGE"]
        assert row.split()[:4] == [NAME, "Succeeded", "3", str(status["rewardMean"])]
        assert "ControllerSucceeded" in row.split()
        # every pod ran what the operator wrote and ended cleanly (exit 0, or stopped at scale-down)
        by_name = {pod.name: pod for pod in kubelet.deleted}
        assert len(by_name) == 5 and all(pod.exits in ([], [0]) for pod in by_name.values()), kubelet.tails()
        # the controller started only once the judge pod was ready
        judge_ready = next(t for t, text in kubelet.events if text.startswith(f"pod {NAME}-judge-judge") and
                           text.endswith(" ready"))
        controller_start = next(t for t, text in kubelet.events if text.startswith(f"pod {NAME}-controller") and
                                " started: " in text)
        assert judge_ready <= controller_start, kubelet.events
        controller = next(pod for pod in by_name.values() if pod.owner == ("Job", f"{NAME}-controller"))
        assert controller.exits == [0]
        records = [json.loads(line) for line in (claim / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if r["event"] == "step"]
        assert [(r["step"], r["policy_version"]) for r in steps] == [(0, 1), (1, 2), (2, 3)]
        assert all(r["reward_judge"] < 0 and r["component_missing_judge"] == 0 for r in steps)  # −JPEG kB
        assert status["rewardMean"] == round(steps[-1]["reward_mean"], 4)  # the controller's own number
        # every role's ledger is on the claim, one file per pod: `omnirl ledger` accounts the cluster job as a local
        # run, its steps from the claim's metrics.jsonl, groupSize and promptsPerStep from the export's job.yaml
        assert {f.name.split(f"-{NAME}-")[0] for f in (claim / "ledger").glob("*.jsonl")} == {
            "rollout", "reward", "actor", "checkpoints"}
        accounted = account(claim)
        assert (accounted.counted_steps, accounted.finished, accounted.sources) == (3, True, {
            "steps": str(claim / "metrics.jsonl"), "group_size": str(claim / "exports" / "latest" / "job.yaml"),
            "prompts_per_step": str(claim / "exports" / "latest" / "job.yaml")})
        counts = accounted.counts
        assert (counts.trained, counts.lost, counts.duplicated) == (18, 0, 0), (counts.line(), counts.problems)
        assert counts.generated >= 18 and counts.scored >= 18
        # the result on the claim: the controller exported the actor's last checkpoint, and the built-in
        # model's export scores what the run's last validation reported
        export = claim / "exports" / "latest"
        assert json.loads((export / "export.json").read_text())["policy_version"] == 3
        last = [r for r in records if r["event"] == "validation"][-1]
        assert json.loads((export / "validation.json").read_text())["validation"] == last
        assert export_reward(export) == pytest.approx(last["val_reward_ocr"], abs=1e-6)  # OCR: the first reward
        # its manifest is the one written (the ConfigMap's manifest.yaml, OMNIRL_MANIFEST): the judge as `server`,
        # not the Service URL the pods read (http://k8s-tiny-judge-judge:8000/v1/score), gone with the RLJob
        judge = yaml.safe_load((export / "job.yaml").read_text())["spec"]["reward"][1]
        assert judge["url"] is None and judge["server"]["command"] == JUDGE["command"], judge

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


def export_reward(export: Path) -> float:
    """Held-out OCR reward of an export of the built-in model, sampled as the run's validation was
    (the judge server, the second reward, went with the job)."""
    from omnirl.api.loader import load_rljob
    from omnirl.controller.data import read_prompts
    from omnirl.evaluation.evaluate import evaluate
    from omnirl.models.digits.adapter import load_digits_adapter
    from omnirl.reward.scoring import RewardSet

    spec = load_rljob(export / "job.yaml").spec
    prompts = read_prompts(spec.data.validationPrompts)[: spec.validation.maxPrompts]
    return evaluate(load_digits_adapter(export), spec, prompts, rewards=RewardSet(spec.reward[:1])).mean_reward


@pytest.mark.slow
def test_rljob_survives_a_killed_controller_pod_and_a_replaced_rollout_pod(tmp_path, protected_redis):
    """After the first step: the controller pod is SIGKILLed (its Job fails; the operator's
    `restart-job` makes a new controller Job and rolls every role; the actor pod of the same name
    finds its checkpoint directory and resumes with `OMNIRL_RESUME=auto`) and a rollout pod is deleted
    after a SIGKILL and replaced, as a ReplicaSet would. The RLJob still reaches Succeeded with every
    step trained once."""
    redis_url, password = protected_redis
    home = tmp_path / "kubectl"
    home.mkdir()
    killed: list[str] = []

    def chaos(job: dict) -> None:
        if killed or int((job.get("status") or {}).get("step") or 0) < 1:
            return
        for key, pod in list(kubelet.pods.items()):
            if pod.running() and pod.owner in (("Job", f"{NAME}-controller"), ("Deployment", f"{NAME}-rollout")):
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
                killed.append(pod.name)
                if pod.owner[0] == "Deployment":
                    kubelet._delete(key)  # the ReplicaSet replaces a deleted pod at the next sync

    with BackgroundCluster(OperatorSettings(), resync_seconds=1.0) as bg:
        server = bg.cluster.url
        kube = KubeApi.for_server(server)
        kubelet = Kubelet(kube, server, NS, NAME, tmp_path / "pods", Path(sys.executable).parent)
        try:
            kubectl(server, home, "apply", "--validate=false", "-f", str(secret(tmp_path, password)))
            start = time.monotonic()
            kubectl(server, home, "apply", "--validate=false", "-f", str(manifest(tmp_path, redis_url)))
            wait_children(kube)
            job, transitions = run_until_succeeded(kube, kubelet, start, timeout_s=3 * TIMEOUT_S, on_sync=chaos)
        finally:
            kubelet.stop()
        print_record(transitions, kubelet, "", "")
        assert len(killed) == 2, f"{killed}\n{kubelet.tails()}"
        assert transitions[-1][2] == "Succeeded", kubelet.tails()
        status = job["status"]
        assert status["step"] == 3 and status["policyVersion"] == 3 and status["restarts"] >= 1
        actor = tmp_path / "pods" / "claims" / f"{NAME}-run"  # the job's run directory, on its claim
        trained = [json.loads(line) for line in (actor / "ledger" / f"actor-{NAME}-actor-0.jsonl").read_text()
                   .splitlines()]
        assert sorted({r["step"] for r in trained}) == [0, 1, 2]
        state = json.loads((actor / "checkpoints" / "latest" / "state.json").read_text())
        assert (state["step"], state["policy_version"]) == (2, 3)
        # the killed rollout pod's ledger outlived it (was: its emptyDir went with it), and the accounting
        # over every pod's ledger finds nothing lost or doubled
        assert len(list((actor / "ledger").glob(f"rollout-{NAME}-rollout-*.jsonl"))) >= 2
        counts = check_ledger(actor, total_steps=3, group_size=3, prompts_per_step=2)
        assert (counts.lost, counts.duplicated) == (0, 0), (counts.line(), counts.problems)


def test_kubelet_substitutions_are_the_documented_ones(tmp_path):
    """Service DNS → the selected pod's loopback port; downward API; mount paths (no processes)."""
    kubelet = Kubelet(KubeApi.for_server("http://127.0.0.1:9"), "http://127.0.0.1:9", NS, NAME, tmp_path, tmp_path)
    actor = {"kind": "StatefulSet", "metadata": {"name": f"{NAME}-actor", "uid": "u1"}, "spec": {"template": {
        "metadata": {"labels": {"omnirl.dev/role": "actor"}},
        "spec": {"containers": [{"name": "actor", "ports": [{"name": "weight-sync", "containerPort": 29500}]}]}}}}
    pod = kubelet._new_pod(actor, f"{NAME}-actor-0", "digest")
    kubelet.pods[pod.name] = pod
    services = [{"metadata": {"name": f"{NAME}-actor"}, "spec": {
        "selector": {"statefulset.kubernetes.io/pod-name": f"{NAME}-actor-0"},
        "ports": [{"port": 29500, "targetPort": "weight-sync"}]}}]
    loopback = f"127.0.0.1:{pod.ports[29500]}"
    assert kubelet.route(f"{NAME}-actor:29500", services) == loopback
    assert kubelet.route(f"{NAME}-actor.{NS}.svc.cluster.local:29500", services) == loopback
    assert kubelet.route(f"{NAME}-actor-0.{NAME}-ranks:29400", services) == f"{NAME}-actor-0.{NAME}-ranks:29400"
    with pytest.raises(ValueError, match="has no port 1234"):
        kubelet.route(f"{NAME}-actor:1234", services)
    assert field_value(pod, NS, "metadata.labels['apps.kubernetes.io/pod-index']") == "0"
    assert field_value(pod, NS, "metadata.namespace") == NS
    with pytest.raises(ValueError, match="status.hostIP"):
        field_value(pod, NS, "status.hostIP")
    mounts = {"/etc/omnirl": tmp_path / "cfg", "/etc": tmp_path / "etc"}
    assert remap_path("/etc/omnirl/job.yaml", mounts) == f"{tmp_path}/cfg/job.yaml"
    assert remap_path("/etc/omnirlx", mounts) == f"{tmp_path}/etc/omnirlx"
    assert remap_path("/var/lib/omnirl", mounts) == "/var/lib/omnirl"


def test_kubelet_maps_a_claim_to_one_directory_that_outlives_its_pods(tmp_path):
    """Every pod mounting a claim sees one directory, kept when a pod is replaced; a pod whose claim
    does not exist yet is not started (it would stay Pending)."""
    with BackgroundCluster(OperatorSettings(), resync_seconds=60.0) as bg:
        kube = KubeApi.for_server(bg.cluster.url)
        kubelet = Kubelet(kube, bg.cluster.url, NS, NAME, tmp_path, tmp_path)
        template = {"metadata": {"labels": {}}, "spec": {
            "volumes": [{"name": "run", "persistentVolumeClaim": {"claimName": "results"}}],
            "containers": [{"name": "c", "volumeMounts": [{"name": "run", "mountPath": "/var/lib/omnirl"}]}]}}
        workload = {"kind": "StatefulSet", "metadata": {"name": "w", "uid": "u1"}, "spec": {"template": template}}
        first, second = (kubelet._new_pod(workload, name, "d") for name in ("w-0", "w-1"))
        with pytest.raises(NotClaimed):
            mount_volumes(kube, NS, first, tmp_path / "claims")
        kube.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "results",
                     "namespace": NS}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                "resources": {"requests": {"storage": "1Gi"}}}})
        mounted = mount_volumes(kube, NS, first, tmp_path / "claims")["/var/lib/omnirl"]
        (mounted / "checkpoint").write_text("step 7")
        replaced = kubelet._new_pod(workload, "w-0", "d2")  # the same pod, recreated
        for pod in (second, replaced):
            assert (mount_volumes(kube, NS, pod, tmp_path / "claims")["/var/lib/omnirl"] / "checkpoint").read_text() \
                == "step 7"


def test_role_folds_the_secret_password_into_the_redis_url():
    """Pods get REDIS_PASSWORD from the Secret next to a password-less OMNIRL_REDIS_URL."""
    assert with_redis_password("redis://r:6379/0", "p@ss/w:rd") == "redis://:p%40ss%2Fw%3Ard@r:6379/0"
    assert redis.connection.parse_url(with_redis_password("redis://r:6379/0", "p@ss/w:rd"))["password"] == "p@ss/w:rd"
    assert with_redis_password("redis://:own@r:6379/0", "other") == "redis://:own@r:6379/0"
    assert with_redis_password("redis://r:6379/0", None) == "redis://r:6379/0"
