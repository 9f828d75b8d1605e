"""Parallel replicas on Kubernetes (docs/parallel.md, "On Kubernetes"): what the operator builds (and `omnirl render`
prints) for a rollout replica of several pods and an actor of multi-GPU pods, and how a pod's process turns the
pod's index into the ranks it holds (`omnirl.launch.pod_ranks`)."""

from __future__ import annotations

import argparse
import io

import kubernetes_validate
import yaml
from tests.operator.test_builders import K8S_VERSIONS, children, container, job

from omnirl.api.runtime import RoleEnv
from omnirl.launch.pod_ranks import pod_rank_envs
from omnirl_operator import render

FLUX = {"family": "flux", "path": "/models/flux", "dtype": "bfloat16"}
ROLES = {"rollout": {"replicas": 2, "accelerator": {"type": "nvidia", "count": 2},
                     "parallel": {"ulysses": 4, "podsPerReplica": 2}},
         "actor": {"replicas": 2, "accelerator": {"type": "nvidia", "count": 4}, "parallel": {"ulysses": 2}}}


def _env(obj: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(obj)["env"]}


def test_a_gang_of_pods_per_replica_is_one_kueue_pod_group_with_its_rendezvous():
    j = job(model=FLUX, roles=ROLES, storage={"size": "1Gi", "accessModes": ["ReadWriteMany"]})
    j.metadata.__pydantic_extra__["labels"] = {"kueue.x-k8s.io/queue-name": "team-gpus"}
    kids = children(j)
    sts = kids["StatefulSet/demo-rollout"]
    assert "Deployment/demo-rollout" not in kids
    spec = sts["spec"]
    assert (spec["replicas"], spec["serviceName"], spec["podManagementPolicy"]) == (4, "demo-rollout-ranks", "Parallel")
    meta = spec["template"]["metadata"]
    assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == "demo-rollout"
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpus"
    assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "4"  # both replicas' gangs, whole or none
    assert container(sts)["resources"]["limits"] == {"nvidia.com/gpu": 2}
    env = _env(sts)
    assert env["OMNIRL_RANKS_PER_POD"] == "2" and env["WORLD_SIZE"] == "4"
    assert env["RANK"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    assert env["OMNIRL_REPLICA_HOSTS"] == ("demo-rollout-0.demo-rollout-ranks:29400,"
                                           "demo-rollout-2.demo-rollout-ranks:29400")
    assert {"name": "dist", "containerPort": 29400, "protocol": "TCP"} in container(sts)["ports"]
    ranks = kids["Service/demo-rollout-ranks"]["spec"]
    assert ranks["clusterIP"] == "None" and ranks["publishNotReadyAddresses"]
    actor = kids["StatefulSet/demo-actor"]
    assert actor["spec"]["replicas"] == 1 and container(actor)["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert _env(actor)["OMNIRL_RANKS_PER_POD"] == "4" and _env(actor)["WORLD_SIZE"] == "4"


def test_one_pod_per_replica_meets_on_its_own_loopback_and_needs_no_gang():
    kids = children(job(model=FLUX, roles={"rollout": {"replicas": 3, "accelerator": {"type": "nvidia", "count": 2},
                                                        "parallel": {"ulysses": 2}}}))
    sts = kids["StatefulSet/demo-rollout"]
    assert sts["spec"]["replicas"] == 3 and "Service/demo-rollout-ranks" not in kids
    assert "kueue.x-k8s.io/pod-group-name" not in sts["spec"]["template"]["metadata"]["labels"]
    assert _env(sts)["OMNIRL_REPLICA_HOSTS"] == ",".join(["127.0.0.1:29400"] * 3)
    plain = children(job(model=FLUX))  # a replica of one device: the Deployment as before
    assert "Deployment/demo-rollout" in plain and "StatefulSet/demo-rollout" not in plain


def test_omnirl_render_shows_the_gang(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIRL_DEFAULT_REDIS_URL", "redis://omnirl-redis.omnirl-system:6379/0")
    doc = {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "gang"},
           "spec": {"model": FLUX, "data": {"trainPrompts": "t.txt"}, "reward": [{"name": "o", "kind": "ocr"}],
                    "roles": ROLES, "storage": {"size": "1Gi", "accessModes": ["ReadWriteMany"]}}}
    path = tmp_path / "gang.yaml"
    path.write_text(yaml.safe_dump(doc))
    out, err = io.StringIO(), io.StringIO()
    assert render.main(argparse.Namespace(job=str(path), namespace="team"), out, err) == 0, err.getvalue()
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.getvalue())}
    assert docs[("StatefulSet", "gang-rollout")]["spec"]["replicas"] == 4 and ("Service", "gang-rollout-ranks") in docs
    for doc in docs.values():
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def _pod(rank: int, **kw) -> RoleEnv:
    return RoleEnv(job_name="demo", redis_url="redis://r", weight_sync_host="demo-actor", weight_sync_port=29500,
                   worker_id=f"demo-rollout-{rank}", out_dir="/run", device="cuda", rank=rank, **kw)


def test_a_pods_index_becomes_the_ranks_it_holds():
    spec = job(model=FLUX, roles=ROLES).spec
    hosts = "demo-rollout-0.demo-rollout-ranks:29400,demo-rollout-2.demo-rollout-ranks:29400"
    envs = pod_rank_envs("rollout", spec, _pod(3, world_size=4, ranks_per_pod=2, replica_hosts=hosts))
    # pod 3 = the second pod of replica 1: ranks 2 and 3 of 4, meeting at that replica's first pod
    assert [(e.rank, e.world_size, e.master_addr, e.master_port) for e in envs] == [
        (2, 4, "demo-rollout-2.demo-rollout-ranks", 29400), (3, 4, "demo-rollout-2.demo-rollout-ranks", 29400)]
    assert all(e.ranks_per_pod == 1 and e.replica_hosts == "" for e in envs)  # its processes are one rank each
    actor = pod_rank_envs("actor", spec, _pod(1, world_size=8, ranks_per_pod=4))
    assert [e.rank for e in actor] == [4, 5, 6, 7] and {e.world_size for e in actor} == {8}
    assert pod_rank_envs("actor", spec, _pod(1, world_size=2)) is None  # a pod of one device is one rank
