"""`spec.storage`: validation naming the field, the claim and mounts the builders write (checked with
`kubernetes-validate --strict`), and the operator creating, keeping and deleting the claim per
`whenDeleted` against kmock's emulator (which has no garbage collector: the test plays it)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from omnirl.api.loader import job_from_dict
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RLJob
from omnirl.api.spec_storage import quantity_bytes
from omnirl_operator.builders import build_children
from omnirl_operator.meta import PLACEHOLDER_UID, adopt, child_labels
from omnirl_operator.reconcile import reconcile
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster, EmulatedCluster, rljob_body

NS = "team"
SETTINGS = OperatorSettings(default_redis_url="redis://redis:6379/0")
K8S_VERSIONS = ("1.31", kubernetes_validate.utils.latest_version())
PVC = ("v1", "PersistentVolumeClaim")


def manifest(name: str = "demo", storage: dict | None = None, actor: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"data": {"trainPrompts": "/data/train.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
                            "roles": {"actor": {"replicas": actor}}}
    if storage is not None:
        spec["storage"] = storage
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def problems(storage: dict, actor: int = 1) -> list[str]:
    with pytest.raises(ValidationError) as info:
        RLJob.model_validate(manifest(storage=storage, actor=actor))
    return [text for _, text in problem_lines(RLJob, info.value)]


@pytest.mark.parametrize(("storage", "actor", "expected"), [
    ({"claimName": "runs", "size": "10Gi"}, 1, "spec.storage.size: \"10Gi\" is invalid: must not be set together "
     "with claimName"),
    ({"storageClassName": "fast"}, 1, "spec.storage.size: null is invalid: required when claimName is not set"),
    ({"size": "ten gigs"}, 1, "spec.storage.size: \"ten gigs\" is invalid: must be a positive Kubernetes quantity"),
    ({"size": "0Gi"}, 1, "spec.storage.size: \"0Gi\" is invalid: must be a positive Kubernetes quantity"),
    ({"claimName": "runs", "whenDeleted": "Delete"}, 1, "spec.storage.whenDeleted: \"Delete\" is invalid: applies "
     "only to a claim the operator creates"),
    ({"claimName": "runs", "storageClassName": "fast"}, 1, "spec.storage.storageClassName: \"fast\" is invalid"),
    ({"size": "1Gi", "accessModes": ["ReadWriteOncePod"]}, 1, "spec.storage.accessModes: [\"ReadWriteOncePod\"] is "
     "invalid: must not hold ReadWriteOncePod"),
    ({"size": "1Gi", "accessModes": ["ReadOnlyMany"]}, 1, "spec.storage.accessModes: [\"ReadOnlyMany\"] is invalid: "
     "must hold ReadWriteOnce or ReadWriteMany"),
    ({"size": "1Gi"}, 2, "spec.storage.accessModes: [\"ReadWriteOnce\"] is invalid: must hold ReadWriteMany for "
     "an actor of 2 pods"),
    ({"claimName": "runs", "accessModes": ["ReadWriteOnce"]}, 4, "spec.storage.accessModes: [\"ReadWriteOnce\"] is "
     "invalid: must hold ReadWriteMany for an actor of 4 pods"),
])
def test_impossible_storage_is_rejected_naming_the_field(storage, actor, expected):
    lines = problems(storage, actor)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


@pytest.mark.parametrize(("storage", "actor"), [
    ({"size": "50Gi"}, 1),
    ({"size": "1.5Ti", "accessModes": ["ReadWriteMany"]}, 8),
    ({"size": "500M", "singleNode": True}, 4),  # ReadWriteOnce with every rank on one node
    ({"claimName": "team-runs", "accessModes": ["ReadWriteMany"]}, 2),
])
def test_possible_storage_is_accepted(storage, actor):
    RLJob.model_validate(manifest(storage=storage, actor=actor))


def test_quantities():
    assert quantity_bytes("50Gi") == 50 * 2**30 and quantity_bytes("500M") == 5e8 and quantity_bytes("1.5Ki") == 1536
    with pytest.raises(ValueError, match="not a quantity"):
        quantity_bytes("5 GB")


def kids(storage: dict | None, actor: int = 1) -> dict[str, dict]:
    job = job_from_dict(manifest(storage=storage, actor=actor))
    built = adopt(build_children(job, SETTINGS), "demo", NS, PLACEHOLDER_UID)
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in built}


def volumes(obj: dict) -> tuple[dict, list]:
    pod = obj["spec"]["template"]["spec"]
    return {v["name"]: v for v in pod["volumes"]}["run"], pod["containers"][0]["volumeMounts"]


def test_created_claim_is_mounted_by_the_controller_and_every_actor_rank_and_validates_strictly():
    children = kids({"size": "20Gi", "storageClassName": "fast-rwx", "accessModes": ["ReadWriteMany"],
                     "whenDeleted": "Delete"}, actor=2)
    claim = children["PersistentVolumeClaim/demo-run"]
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "20Gi"}},
                             "storageClassName": "fast-rwx"}
    assert claim["metadata"]["annotations"] == {"omnirl.dev/when-deleted": "Delete"}
    assert [r["kind"] for r in claim["metadata"]["ownerReferences"]] == ["RLJob"]  # garbage-collected with the job
    for name in ("StatefulSet/demo-actor", "Job/demo-controller"):
        volume, mounts = volumes(children[name])
        assert volume == {"name": "run", "persistentVolumeClaim": {"claimName": "demo-run"}}
        assert {"name": "run", "mountPath": "/var/lib/omnirl"} in mounts
        assert "affinity" not in children[name]["spec"]["template"]["spec"]  # ReadWriteMany: ranks spread
        env = {e["name"]: e.get("value") for e in children[name]["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["OMNIRL_EXPORT"] == "1"
    for name in ("Deployment/demo-rollout", "Deployment/demo-reward"):  # their ledgers outlive their pods
        volume, mounts = volumes(children[name])
        assert volume == {"name": "run", "persistentVolumeClaim": {"claimName": "demo-run"}}
        assert {"name": "run", "mountPath": "/var/lib/omnirl"} in mounts
        assert "affinity" not in children[name]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in children[name]["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["OMNIRL_OUT"] == "/var/lib/omnirl"  # ledger/{role}-<pod name>.jsonl there
    for version in K8S_VERSIONS:
        for obj in children.values():
            kubernetes_validate.validate(obj, version, strict=True)


def test_retained_claim_has_no_owner_and_read_write_once_pins_to_one_node():
    children = kids({"size": "1Gi"})
    for name in ("Deployment/demo-rollout", "Deployment/demo-reward"):  # a one-node volume: not theirs
        assert volumes(children[name])[0] == {"name": "run", "emptyDir": {}}
    claim = children["PersistentVolumeClaim/demo-run"]
    assert "ownerReferences" not in claim["metadata"]  # outlives the RLJob, whatever happens to the operator
    assert claim["metadata"]["annotations"] == {"omnirl.dev/when-deleted": "Retain"}
    assert "storageClassName" not in claim["spec"]  # the cluster's default class
    term = {"labelSelector": {"matchLabels": {"omnirl.dev/job": "demo"}, "matchExpressions": [
        {"key": "omnirl.dev/role", "operator": "In", "values": ["controller", "actor"]}]},
        "topologyKey": "kubernetes.io/hostname"}
    for name in ("StatefulSet/demo-actor", "Job/demo-controller"):
        pod = children[name]["spec"]["template"]["spec"]
        assert pod["affinity"] == {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        # the term selects the pod itself, so the first of them may go anywhere (the scheduler's rule)
        labels = children[name]["spec"]["template"]["metadata"]["labels"]
        assert labels["omnirl.dev/job"] == "demo" and labels["omnirl.dev/role"] in ("controller", "actor")
    assert "affinity" not in children["Deployment/demo-rollout"]["spec"]["template"]["spec"]
    for version in K8S_VERSIONS:
        for obj in children.values():
            kubernetes_validate.validate(obj, version, strict=True)


def test_existing_claim_is_mounted_not_created_and_no_storage_keeps_the_empty_dir():
    children = kids({"claimName": "team-runs", "accessModes": ["ReadWriteMany"]}, actor=2)
    assert not [k for k in children if k.startswith("PersistentVolumeClaim/")]
    assert volumes(children["StatefulSet/demo-actor"])[0]["persistentVolumeClaim"] == {"claimName": "team-runs"}
    plain = kids(None)
    assert not [k for k in plain if k.startswith("PersistentVolumeClaim/")]
    volume, _ = volumes(plain["Job/demo-controller"])
    assert volume == {"name": "run", "emptyDir": {}}
    env = {e["name"]: e.get("value") for e in plain["Job/demo-controller"]["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    assert env["OMNIRL_EXPORT"] == "0"  # the controller cannot see the actor's checkpoints


def test_claim_settings_the_pods_never_see_do_not_roll_them():
    def digests(storage):
        return {k: v["spec"]["template"]["metadata"]["annotations"]["omnirl.dev/spec-hash"]
                for k, v in kids(storage).items() if "template" in v.get("spec", {})}

    base = digests({"size": "1Gi"})
    assert digests({"size": "2Gi", "whenDeleted": "Delete"}) == base
    assert not set(digests({"size": "1Gi", "accessModes": ["ReadWriteMany"]}).values()) & set(base.values())
    assert not set(digests(None).values()) & set(base.values())


def test_render_shows_the_claim_and_its_mounts(tmp_path, capsys):
    from omnirl.cli import main

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(storage={"size": "5Gi"})))
    assert main(["render", str(path)]) == 0
    docs = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(capsys.readouterr().out)}
    assert docs["PersistentVolumeClaim/demo-run"]["spec"]["resources"]["requests"]["storage"] == "5Gi"
    for name in ("StatefulSet/demo-actor", "Job/demo-controller"):
        assert volumes(docs[name])[0]["persistentVolumeClaim"] == {"claimName": "demo-run"}


# ---------------------------------------------------------------- the operator, in the emulator


@pytest.fixture(scope="module")
def bg(redis_url):
    with BackgroundCluster(OperatorSettings(default_redis_url=redis_url), resync_seconds=1.0) as cluster:
        yield cluster


async def _claim(cluster: EmulatedCluster, name: str, owned: bool) -> dict:
    async def check():
        obj = await cluster.get(*PVC, NS, f"{name}-run")
        return obj if obj is not None and bool(obj["metadata"].get("ownerReferences")) == owned else None

    return await cluster.wait_for(check, what=f"claim {name}-run {'owned' if owned else 'not owned'}")


async def _collect_garbage(cluster: EmulatedCluster, uids: set[str]) -> None:
    """What the garbage collector does once the RLJobs are gone: delete claims they controlled."""
    for name in ("keep", "drop", "switch"):
        obj = await cluster.get(*PVC, NS, f"{name}-run")
        if obj and any(r["uid"] in uids and r.get("controller") for r in obj["metadata"].get("ownerReferences", [])):
            await cluster.delete(*PVC, NS, f"{name}-run")


def test_operator_creates_keeps_and_deletes_the_claim_per_when_deleted(bg):
    bodies = {
        "keep": rljob_body(manifest("keep", {"size": "1Gi"})),
        "drop": rljob_body(manifest("drop", {"size": "2Gi", "whenDeleted": "Delete"})),
        "switch": rljob_body(manifest("switch", {"size": "3Gi", "whenDeleted": "Delete"})),
        "existing": rljob_body(manifest("existing", {"claimName": "shared-runs"})),
    }
    uids = {b["metadata"]["uid"] for b in bodies.values()}

    async def scenario(cluster: EmulatedCluster) -> dict:
        for body in bodies.values():
            await cluster.create(body)
        keep = await _claim(cluster, "keep", owned=False)
        drop = await _claim(cluster, "drop", owned=True)
        await _claim(cluster, "switch", owned=True)
        assert drop["metadata"]["ownerReferences"][0]["uid"] == bodies["drop"]["metadata"]["uid"]
        assert (keep["spec"]["resources"]["requests"]["storage"], drop["spec"]["resources"]["requests"]["storage"]) \
            == ("1Gi", "2Gi")

        async def actor(name: str):
            return await cluster.get("apps/v1", "StatefulSet", NS, f"{name}-actor")

        sts = await cluster.wait_for(lambda: actor("existing"), what="StatefulSet existing-actor")
        run = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}["run"]
        assert run["persistentVolumeClaim"] == {"claimName": "shared-runs"}
        assert await cluster.get(*PVC, NS, "existing-run") is None and await cluster.get(*PVC, NS, "shared-runs") is None
        # the policy may change while the job lives (as a StatefulSet's): Delete → Retain drops the owner
        await cluster.patch(*("omnirl.dev/v1alpha1", "RLJob"), NS, "switch", {"spec": {"storage": {
            "whenDeleted": "Retain"}}})
        switched = await _claim(cluster, "switch", owned=False)
        assert switched["metadata"]["annotations"]["omnirl.dev/when-deleted"] == "Retain"
        # a claim's spec is never patched: a new size is for a new claim (or `kubectl edit pvc`)
        await cluster.patch("omnirl.dev/v1alpha1", "RLJob", NS, "keep", {"spec": {"storage": {"size": "9Gi"}}})

        async def reconciled():
            cm = await cluster.get("v1", "ConfigMap", NS, "keep-spec")
            return "9Gi" in cm["data"]["job.yaml"]

        await cluster.wait_for(reconciled, what="the new size reconciled")
        assert (await cluster.get(*PVC, NS, "keep-run"))["spec"]["resources"]["requests"]["storage"] == "1Gi"
        for name in bodies:
            await cluster.delete("omnirl.dev/v1alpha1", "RLJob", NS, name)

        async def all_gone():
            return all([await cluster.rljob(NS, name) is None for name in bodies])

        await cluster.wait_for(all_gone, what="RLJobs released by the finalizer")
        await _collect_garbage(cluster, uids)
        return {name: await cluster.get(*PVC, NS, f"{name}-run") for name in ("keep", "drop", "switch")}

    left = bg.run(scenario)
    assert left["drop"] is None
    assert left["keep"]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert left["switch"] is not None


def test_an_edit_the_claim_cannot_follow_is_refused_and_undoing_it_recovers():
    """accessModes ReadWriteOnce → ReadWriteMany on a live claim: the claim keeps RWO (its modes are
    immutable) while the pods would lose their one-node affinity and hang attaching it elsewhere."""
    rljob = ("omnirl.dev/v1alpha1", "RLJob")
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    async def step(cluster: EmulatedCluster):
        out = await reconcile(await cluster.rljob(NS, "modes"), cluster.api, SETTINGS, now, logging.getLogger("t"))
        await cluster.patch(*rljob, NS, "modes", {"status": out.status}, sub="status")
        return out

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(rljob_body(manifest("modes", {"size": "1Gi", "storageClassName": "standard"})))
            assert (await step(cluster)).status["phase"] == "Pending"
            actor = await cluster.get("apps/v1", "StatefulSet", NS, "modes-actor")
            await cluster.patch(*rljob, NS, "modes", {"spec": {"storage": {"accessModes": ["ReadWriteMany"]}}})
            out = await step(cluster)
            ready = next(c for c in out.status["conditions"] if c["type"] == "Ready")
            # the job goes on with the claim and pods it has: not Failed, the edit is what is refused
            assert (out.status["phase"], ready["reason"], out.actions) == ("Pending", "InvalidSpec", [])
            assert out.status["observedGeneration"] == 1 and ready["message"] == out.status["message"] == (
                "the edited spec is invalid and was not applied; the job goes on with generation 1: "
                "spec.storage.accessModes: ['ReadWriteMany'] differs from ['ReadWriteOnce'] of the claim modes-run it "
                "created, whose access modes cannot change: restore it, or delete the RLJob and "
                "PersistentVolumeClaim modes-run (its data goes with it) and apply again")
            # nothing was applied: the actor keeps its one-node affinity
            assert (await cluster.get("apps/v1", "StatefulSet", NS, "modes-actor"))["spec"] == actor["spec"]
            await cluster.patch(*rljob, NS, "modes", {"spec": {"storage": {"storageClassName": "fast"}}})
            assert "spec.storage.accessModes" in (await step(cluster)).status["message"]
            await cluster.patch(*rljob, NS, "modes", {"spec": {"storage": {"accessModes": ["ReadWriteOnce"]}}})
            assert "spec.storage.storageClassName: 'fast' differs from 'standard'" in \
                (await step(cluster)).status["message"]
            await cluster.patch(*rljob, NS, "modes", {"spec": {"storage": {"storageClassName": "standard"}}})
            undone = (await step(cluster)).status
            assert (undone["phase"], undone["observedGeneration"]) == ("Pending", 5)  # undone: the edits apply

    asyncio.run(main())


def test_a_claim_of_that_name_that_is_not_the_jobs_is_never_adopted():
    """Adopting it with whenDeleted: Delete would let garbage collection delete someone's data: the
    job fails (NameConflict) naming the claim and both fixes, and the claim is left as it was."""
    foreign = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "other-run", "namespace": NS},
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "7Gi"}}}}

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            await cluster.create(foreign)
            body = await cluster.create(rljob_body(manifest("other", {"size": "1Gi", "whenDeleted": "Delete"})))
            out = await reconcile(body, cluster.api, SETTINGS, datetime.now(timezone.utc), logging.getLogger("t"))
            assert (out.status["phase"], out.actions) == ("Failed", [])
            assert ("PersistentVolumeClaim/other-run exists and is not this job's: it has no label "
                    "omnirl.dev/job=other; rename the RLJob (or mount it with spec.storage.claimName)") \
                in out.status["message"]
            stored = await cluster.get(*PVC, NS, "other-run")
            assert "ownerReferences" not in stored["metadata"]
            assert stored["spec"]["resources"]["requests"]["storage"] == "7Gi"
            assert await cluster.get("apps/v1", "StatefulSet", NS, "other-actor") is None  # nothing created

    asyncio.run(main())


@pytest.mark.parametrize("storage,fix", [
    ({"size": "1Gi"}, "The run volume is PersistentVolumeClaim full-run (spec.storage.size 1Gi): expand it (kubectl "
     "edit pvc -n team-a full-run, where its StorageClass allows volume expansion) or lower spec.checkpoint.keep (2), "
     "then delete the RLJob and apply it again: the claim stays (whenDeleted: Retain) and the actor resumes from its "
     "latest checkpoint."),
    ({"claimName": "shared"}, "The run volume is PersistentVolumeClaim shared (spec.storage.claimName): free space on "
     "it or expand it (kubectl edit pvc -n team-a shared), then delete the RLJob and apply it again: the actor resumes "
     "from its latest checkpoint."),
])
def test_an_actor_that_fills_the_claim_fails_the_job_naming_the_claim_and_stops_its_pods(storage, fix):
    """The actor's checkpoint write got ENOSPC (exit 5, its line naming a path inside the pod and
    "free space there"): the RLJob fails StorageError with that line plus the claim to expand and
    what a new RLJob resumes from; its workloads go to 0 and its running controller Job is deleted
    (before, the controller Job ran on, waiting for an actor that never came back)."""
    line = ("omnirl role actor: cannot write /var/lib/omnirl/checkpoints/.tmp-step-000040-7/policy.safetensors "
            "([Errno 28] No space left on device); free space there")
    assert _storage_failure(storage, line) == \
        f"actor exited 5 (a file or the run volume cannot be read or written; not restarted): {line}. {fix}"


@pytest.mark.parametrize("line", [
    "omnirl role actor: cannot read /models/sd3/transformer/config.json ([Errno 13] Permission denied); make it "
    "readable by uid 1000 (its owner or mode; in a pod, uid 1000: give the volume an fsGroup or chown it)",
    "omnirl role actor: cannot write /var/lib/omnirl/checkpoints/.tmp-step-000040-7 ([Errno 13] Permission denied); "
    "make it writable by uid 1000 (its owner or mode; in a pod, uid 1000: give the volume an fsGroup or chown it)",
])
def test_a_permission_fault_fails_the_job_with_its_own_fix_not_the_full_volumes(line):
    """Exit 5 for want of permission (a model file the pod's uid may not read, a claim it may not
    write): the RLJob's message is the role's line, which names its fix; "expand the claim" was
    appended to it as for a full volume, and growing the claim cannot help."""
    message = _storage_failure({"size": "10Gi", "whenDeleted": "Retain"}, line)
    assert message == f"actor exited 5 (a file or the run volume cannot be read or written; not restarted): {line}"


def _storage_failure(storage: dict, line: str) -> str:
    """The Failed condition's message of a job `full` whose actor pod exited 5 with `line` last; asserts
    the reason StorageError, the controller Job deleted and the actor scaled to 0."""
    found = {}
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ns = "team-a"

    async def main() -> None:
        async with EmulatedCluster() as cluster:
            body = rljob_body(manifest("full", storage))
            body["metadata"]["namespace"] = ns
            body = await cluster.create(body)
            await reconcile(body, cluster.api, SETTINGS, now, logging.getLogger("test"))
            await cluster.set_status("batch/v1", "Job", ns, "full-controller", {"active": 1})
            await cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "full-actor-0", "namespace": ns, "labels": child_labels("full", "actor")},  # its template's
                "spec": {"containers": [{"name": "actor", "image": "trainer"}]},
                "status": {"containerStatuses": [{"name": "actor", "restartCount": 1, "lastState": {"terminated": {
                    "exitCode": 5, "reason": "Error", "message": f"12:00:00 actor INFO step 40\n{line}\n"}}}]}})
            out = await reconcile(await cluster.rljob(ns, "full"), cluster.api, SETTINGS, now,
                                  logging.getLogger("test"))
            failed = next(c for c in out.status["conditions"] if c["type"] == "Failed")
            assert (out.status["phase"], failed["reason"]) == ("Failed", "StorageError")
            found["message"] = failed["message"]
            assert await cluster.get("batch/v1", "Job", ns, "full-controller") is None
            assert (await cluster.get("apps/v1", "StatefulSet", ns, "full-actor"))["spec"]["replicas"] == 0

    asyncio.run(main())
    return found["message"]
