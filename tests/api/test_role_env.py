"""RoleEnv is the one role-process contract: to_environ → from_environ round-trips, and the local
launcher and the operator both write it."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from tests.operator.test_builders import children, container, job

from omnirl.api.errors import ConfigError, FieldProblem
from omnirl.api.loader import load_rljob
from omnirl.api.podtemplate import OPERATOR_OWNED, OPERATOR_PORTS, check_pod_template
from omnirl.api.runtime import USER_SETTABLE, VARIABLES, RoleEnv
from omnirl.launch.local import role_env
from omnirl.launch.placement import place
from omnirl.launch.procs import _Child

FULL = RoleEnv(job_name="j", redis_url="redis://r:6379/1", weight_sync_host="j-actor", weight_sync_port=29511,
               worker_id="actor-2", out_dir="/runs/j", metrics_port=9090, health_port=8081,
               report_status="kubernetes", namespace="team", device="cuda:1", weight_sync_backend="gloo",
               threads=3, rank=2, world_size=4, master_addr="j-actor-0.j-ranks", master_port=29401, export=False,
               resume="auto", steps=7, manifest="/etc/omnirl/manifest.yaml", ranks_per_pod=2,
               replica_hosts="j-rollout-0.j-rollout-ranks:29400,j-rollout-2.j-rollout-ranks:29400")


def test_every_field_round_trips():
    env = FULL.to_environ()
    assert RoleEnv.from_environ(env) == FULL
    assert env["OMNIRL_RESUME"] == "auto" and env["OMNIRL_STEPS"] == "7" and env["OMNIRL_EXPORT"] == "0"
    assert env["OMNIRL_WEIGHT_SYNC_ADDR"] == "j-actor:29511" and env["RANK"] == "2"
    # every variable of the table is written (and read back) by the one contract
    assert set(env) == set(VARIABLES.values())
    assert {f.name for f in dataclasses.fields(RoleEnv)} - {"weight_sync_host", "weight_sync_port"} \
        == set(VARIABLES) - {"weight_sync_addr"}


def test_defaults_and_empty_values_are_left_out():
    one = dataclasses.replace(FULL, rank=0, world_size=1, steps=None, report_status="", weight_sync_backend="",
                              resume="0", export=True, ranks_per_pod=1, replica_hosts="")
    env = one.to_environ()
    assert RoleEnv.from_environ(env) == dataclasses.replace(one, master_addr="127.0.0.1", master_port=29400)
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMNIRL_STEPS", "OMNIRL_REPORT_STATUS",
                "OMNIRL_WEIGHT_SYNC_BACKEND", "OMNIRL_RANKS_PER_POD", "OMNIRL_REPLICA_HOSTS"} & set(env)


@pytest.mark.parametrize(("var", "value", "match"), [
    ("OMNIRL_RESUME", "yes", r"OMNIRL_RESUME='yes': expected 0, 1 or auto"),
    ("OMNIRL_STEPS", "0", r"OMNIRL_STEPS=0: must be >= 1"),
    ("OMNIRL_STEPS", "ten", r"OMNIRL_STEPS='ten': must be an integer"),
    ("OMNIRL_THREADS", "2.5", r"OMNIRL_THREADS='2.5': must be an integer"),
    ("OMNIRL_WEIGHT_SYNC_ADDR", "host", r"OMNIRL_WEIGHT_SYNC_ADDR='host' must be host:port"),
])
def test_bad_values_name_the_variable(var, value, match):
    with pytest.raises(ValueError, match=match):
        RoleEnv.from_environ({**FULL.to_environ(), var: value})


@pytest.mark.parametrize(("var", "value", "example"), [
    ("OMNIRL_METRICS_PORT", "abc", 9090), ("OMNIRL_HEALTH_PORT", "70000", 8081), ("OMNIRL_HEALTH_PORT", "-1", 8081),
    ("OMNIRL_METRICS_PORT", "\u00b2", 9090),
])
def test_a_port_that_is_no_port_is_a_configuration_error(var, value, example):
    """`abc` was a ValueError (a traceback, exit 1, restarts); 70000 and -1 were taken, and grpc served the
    health service on some other port. A ConfigError: `omnirl role` exits 4 once, naming a good value."""
    with pytest.raises(ConfigError) as info:
        RoleEnv.from_environ({**FULL.to_environ(), var: value})
    assert str(info.value) == (f"{var}={value!r}: must be a TCP port number from 1 to 65535, e.g. {var}={example} "
                               "(0 or unset: not served)")
    field = {"OMNIRL_METRICS_PORT": "metrics_port", "OMNIRL_HEALTH_PORT": "health_port"}[var]
    assert getattr(RoleEnv.from_environ({**FULL.to_environ(), var: ""}), field) == 0  # empty: not served


def test_redis_password_is_merged_into_the_url():
    env = {**FULL.to_environ(), "REDIS_PASSWORD": "p@ss"}
    assert RoleEnv.from_environ(env).redis_url == "redis://:p%40ss@r:6379/1"


def test_the_local_launcher_writes_the_contract(tmp_path):
    job_ = load_rljob("examples/ocr-nft.yaml")
    actor = next(p for p in place(job_, cores=2) if p.role == "actor")
    env = role_env(job_, actor, redis_url="redis://127.0.0.1:1/0", sync_port=29555, out=tmp_path, resume="auto",
                   steps=5, sync_backend="gloo")
    got = RoleEnv.from_environ(env)
    assert (got.job_name, got.worker_id, got.weight_sync_port, got.out_dir) == ("ocr-nft", "actor-0", 29555, str(tmp_path))
    assert (got.resume, got.steps, got.threads, got.device, got.weight_sync_backend) == ("auto", 5, 2, "cpu", "gloo")
    assert env["OMP_NUM_THREADS"] == "2" and env["PYTHONUNBUFFERED"] == "1"


def test_the_operator_writes_the_contract():
    """A pod's env, with the downward API's values filled in as the kubelet would, reads back."""
    kids = children(job(roles={"actor": {"replicas": 2}}))
    pod = {"metadata.name": "demo-actor-1", "metadata.namespace": "team",
           "metadata.labels['apps.kubernetes.io/pod-index']": "1"}
    entries = container(kids["StatefulSet/demo-actor"])["env"]
    env = {e["name"]: e["value"] if "value" in e else pod[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in entries}
    got = RoleEnv.from_environ(env)
    assert (got.worker_id, got.namespace, got.rank, got.world_size) == ("demo-actor-1", "team", 1, 2)
    assert (got.resume, got.out_dir, got.weight_sync_host, got.master_addr) == \
        ("auto", "/var/lib/omnirl", "demo-actor", "demo-actor-0.demo-ranks")
    assert (got.metrics_port, got.health_port, got.export, got.steps) == (9090, 8081, False, None)


def test_locally_only_the_controller_gets_the_shells_metrics_port(tmp_path, monkeypatch):
    """`OMNIRL_METRICS_PORT=N omnirl run` gives the controller /metrics on N; no other OMNIRL_* of
    the shell reaches a role (the process gets exactly the launcher's contract)."""
    monkeypatch.setenv("OMNIRL_METRICS_PORT", "9555")
    monkeypatch.setenv("OMNIRL_STEPS", "99")
    job_ = load_rljob("examples/ocr-nft.yaml")
    by_role = {p.role: p for p in place(job_, cores=2)}
    envs = {r: role_env(job_, p, redis_url="redis://127.0.0.1:1/0", sync_port=1, out=tmp_path, resume="0", steps=None)
            for r, p in by_role.items()}
    assert {r: RoleEnv.from_environ(e).metrics_port for r, e in envs.items()} == \
        {"rollout": 0, "reward": 0, "actor": 0, "controller": 9555}
    child = _Child([sys.executable, "-c", "import os; print(os.environ.get('OMNIRL_STEPS'))"], envs["actor"],
                   str(tmp_path / "child.log"))
    assert child.proc.wait(timeout=60) == 0
    child._reader.join(timeout=60)
    assert "".join(child.take()).strip() == "None"  # the shell's OMNIRL_STEPS did not leak in
    child.kill()


def test_every_variable_the_operator_sets_for_a_role_is_refused_in_its_template():
    """A role template's env entry replaced the operator's value (rendered: the rollout's
    OMNIRL_WEIGHT_SYNC_ADDR became 10.0.0.9:29500, OMNIRL_RESUME 0): every variable the builders
    write, but `runtime.USER_SETTABLE`'s, is refused by the check that reads the same list."""
    kids = children(job(roles={"actor": {"replicas": 2}, "rollout": {"parallel": {"ulysses": 2}}},
                        model={"family": "flux", "path": "/models/flux"}, transferQueue={"passwordSecret": "team-redis"}))
    written = {e["name"] for name, obj in kids.items() if name.split("/")[0] in ("StatefulSet", "Deployment", "Job")
               for e in container(obj).get("env", [])}
    user = {VARIABLES[f] for f in USER_SETTABLE} | {"PYTHONUNBUFFERED"}
    assert written - user == set(OPERATOR_OWNED) | set(OPERATOR_PORTS)
    for name in sorted(written - user):
        template = {"spec": {"containers": [{"name": "rollout", "env": [{"name": name, "value": "x"}]}]}}
        with pytest.raises(FieldProblem) as info:
            check_pod_template(template, "rollout", "rollout.template", role=True)
        assert info.value.path == "rollout.template.spec.containers[0].env[0]"
        assert f"{name} is set by the operator" in info.value.requirement and "remove this entry" in info.value.requirement
    allowed = [{"name": n, "value": "1"} for n in sorted(user)]
    check_pod_template({"spec": {"containers": [{"name": "rollout", "env": allowed}]}}, "rollout", "t", role=True)



_REFUSED = {
    "rollout": [{"name": "OMNIRL_OUT", "value": "/x"}],
    "actor": [{"name": "OMNIRL_JOB_NAME", "value": "x"}, {"name": "OMNIRL_DEVICE", "value": "cpu"},
              {"name": "OMNIRL_HEALTH_PORT", "value": "9000"}, {"name": "OMNIRL_RESUME", "value": "0"}],
}
# (role, env index, variable): every refused entry, the allowed OMNIRL_DEVICE (env[1]) not among them
_EXPECTED = [("rollout", 0, "OMNIRL_OUT"), ("actor", 0, "OMNIRL_JOB_NAME"), ("actor", 2, "OMNIRL_HEALTH_PORT"),
             ("actor", 3, "OMNIRL_RESUME")]


def _refusing_manifest() -> dict:
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "env", "namespace": "team"},
            "spec": {"data": {"trainPrompts": "/data/train.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
                     "transferQueue": {"redisUrl": "redis://redis:6379/0"},
                     "roles": {role: {"template": {"spec": {"containers": [{"name": role, "env": env}]}}}
                               for role, env in _REFUSED.items()}}}


def test_validate_reports_every_refused_env_entry_of_every_role_template_at_once(tmp_path, capsys):
    """Several operator-owned variables in role templates: `omnirl validate` prints one line per
    entry, each with its field path and line, not only the first (a user fixed one, validated again,
    found the next)."""
    import yaml

    from omnirl.cli import main

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_refusing_manifest(), sort_keys=False))
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        f"spec.roles.{role}.template.spec.containers[0].env[{j}]" for role, j, _ in _EXPECTED], lines
    text = yaml.safe_dump(_refusing_manifest(), sort_keys=False).splitlines()
    for line, (_, _, name) in zip(lines, _EXPECTED, strict=True):
        assert f"is invalid: {name} is set by the operator" in line and "remove this entry" in line, line
        number = int(line.rsplit("(line ", 1)[1].rstrip(")"))
        assert f"- name: {name}" in text[number - 1], (line, text[number - 1])


def test_the_operator_fails_the_rljob_naming_every_refused_env_entry():
    """The operator's check is the same: the RLJob's InvalidSpec message names every entry."""
    import asyncio
    import logging
    from datetime import datetime, timezone

    from omnirl_operator.reconcile import reconcile
    from omnirl_operator.settings import OperatorSettings
    from omnirl_operator.testing import EmulatedCluster, rljob_body

    async def main() -> dict:
        async with EmulatedCluster() as cluster:
            body = await cluster.create(rljob_body(_refusing_manifest()))
            out = await reconcile(body, cluster.api, OperatorSettings(), datetime(2026, 1, 1, tzinfo=timezone.utc),
                                  logging.getLogger("test"))
            return out.status

    status = asyncio.run(main())
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (status["phase"], failed["reason"]) == ("Failed", "InvalidSpec")
    found = [(p.split(": ", 1)[0], p) for p in failed["message"].removeprefix("invalid spec: ").split("; spec.")]
    assert [f"spec.{path}".replace("spec.spec.", "spec.") for path, _ in found] == [
        f"spec.roles.{role}.template.spec.containers[0].env[{j}]" for role, j, _ in _EXPECTED], failed["message"]
    for (_, text), (_, _, name) in zip(found, _EXPECTED, strict=True):
        assert f"{name} is set by the operator" in text, text
