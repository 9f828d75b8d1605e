"""Local launcher planning (pure parts)."""

from __future__ import annotations

from omnirl.api.loader import load_rljob
from omnirl.launch.local import role_env, role_plan, role_threads


def test_threads_split_the_cores_only_when_rollout_and_training_overlap():
    assert role_threads("rollout", "async-reward", 2) == 2 and role_threads("actor", "sync", 8) == 8
    assert role_threads("rollout", "fully-async", 2) == 1 and role_threads("actor", "fully-async", 8) == 4
    assert role_threads("reward", "fully-async", 8) == 1 and role_threads("controller", "sync", 1) == 1


def test_every_role_gets_the_process_contract(tmp_path):
    job = load_rljob("examples/ocr-nft.yaml")
    plan = role_plan(job)
    assert plan[-1] == ("controller", 0) and ("actor", 0) in plan and len(plan) == 4
    env = role_env(job, "rollout", 0, redis_url="redis://127.0.0.1:1/0", sync_port=29500, out=tmp_path,
                   resume=False, steps=3)
    assert env["OMNIRL_JOB_NAME"] == "ocr-nft" and env["OMNIRL_WEIGHT_SYNC_ADDR"] == "127.0.0.1:29500"
    assert env["OMNIRL_WORKER_ID"] == "rollout-0" and env["OMNIRL_STEPS"] == "3" and env["OMNIRL_RESUME"] == "0"
