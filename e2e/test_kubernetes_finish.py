"""An RLJob whose controller pod dies after writing the job's `finish` record, through the operator and the
stand-in kubelet (`e2e/test_kubernetes_job.py`'s path: every pod runs as a local process from what the
operator wrote into kmock's emulator).

A `sitecustomize.py` on the pods' PYTHONPATH (the one variable of the test's environment the kubelet passes
on) SIGKILLs the controller once, right after `Reporter.finished` wrote the `finish` line or after it set
`stop` (`e2e/test_crash_points.py`'s hook, its kill spec written into the file). The controller Job fails
(`backoffLimit` 0 under the default `restart-job`). Before, the operator made a new one and rolled every role,
and the new controller met the old actor's `actor_ready` and state (step 2 of 3), started at step 3 and
exported the last checkpoint again: `exports/step-000002.1` (with `checkpoint.keep` 1 the finished run's
`step-000002` was deleted for it), and `metrics.jsonl` got a second `start` and `finish` (measured at both
points: the RLJob Succeeded 36 s and 41 s after the kill, `restarts` 1, with those two defects). Now the
operator reads the job's `finish` record (`kv:finished`) when the controller Job failed and ends the RLJob
Succeeded; killed before the controller wrote that key, the job is restarted and every restarted role process,
the controller first, finds the record and exits 0 at once with one line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from e2e.kubelet import Kubelet
from e2e.test_crash_points import KILL_AT
from e2e.test_kubernetes_job import (
    NAME,
    NS,
    kubectl,
    manifest,
    print_record,
    run_until_succeeded,
    secret,
    wait_children,
)

from omnirl.evaluation.ledger import account
from omnirl_operator.kube import KubeApi
from omnirl_operator.settings import OperatorSettings
from omnirl_operator.testing import BackgroundCluster

ROOT = Path(__file__).resolve().parents[1]
FINISHED_LINE = "the job had finished (3 training steps; its controller wrote the finish record at"


def armed_hook(tmp_path: Path, role: str, target: str, when: str, cond: str) -> Path:
    """A sitecustomize directory whose hook SIGKILLs `role` once at `target` (`e2e/test_crash_points.py`)."""
    spec = {"role": role, "target": target, "when": when, "cond": cond, "marker": str(tmp_path / "killed")}
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"import os\nos.environ.setdefault('OMNIRL_TEST_KILL', {json.dumps(spec)!r})\n"
                                           + KILL_AT)
    return hook


# where the controller is SIGKILLed: right after the `finish` line (before `kv:finished`), or after `stop`
KILLS = {"after-finish-line": "omnirl.controller.report:Reporter.finished",
         "after-stop": "omnirl.controller.loop:Controller.stop"}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("point", sorted(KILLS))
def test_a_controller_killed_after_the_finish_record_ends_the_rljob_once(tmp_path, monkeypatch, protected_redis,
                                                                          point):
    """The RLJob ends Succeeded with 3 steps; one `start` and one `finish` record; exports of the real steps
    only (`latest`, `step-000002`: no `step-000002.1`); every other pod exits 0 or is stopped; the ledger
    accounts 18 samples trained once. Killed before `kv:finished` was written, the operator restarts the job
    and the new controller pod exits 0 with the one line, starting nothing (no torch set-up line), after
    writing the key from the line; killed after it (and `stop`), the operator takes the failed Job as
    succeeded and restarts nothing (before: `restarts` 1 and `step-000002.1` there too)."""
    redis_url, password = protected_redis
    hook = armed_hook(tmp_path, "controller", KILLS[point], "after", "True")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), str(ROOT / "services"), str(ROOT / "operator"),
                                                      str(ROOT)]))
    home = tmp_path / "kubectl"
    home.mkdir()
    with BackgroundCluster(OperatorSettings(), resync_seconds=1.0) as bg:
        server = bg.cluster.url
        kube = KubeApi.for_server(server)
        kubelet = Kubelet(kube, server, NS, NAME, tmp_path / "pods", Path(sys.executable).parent)
        try:
            kubectl(server, home, "apply", "--validate=false", "-f", str(secret(tmp_path, password)))
            start = time.monotonic()
            kubectl(server, home, "apply", "--validate=false", "-f", str(manifest(tmp_path, redis_url)))
            wait_children(kube)
            job, transitions = run_until_succeeded(kube, kubelet, start, timeout_s=480)
        finally:
            kubelet.stop()
        print_record(transitions, kubelet, "", "")
    tails = kubelet.tails(40)
    assert (tmp_path / "killed").exists(), tails  # the fault happened
    assert transitions[-1][2] == "Succeeded", tails
    assert (job["status"]["step"], job["status"]["policyVersion"]) == (3, 3)
    claim = tmp_path / "pods" / "claims" / f"{NAME}-run"
    records = [json.loads(line) for line in (claim / "metrics.jsonl").read_text().splitlines()]
    events = [r["event"] for r in records]
    # before: [..., 'finish', 'start', 'finish'] and ['latest', 'step-000002.1']
    assert (events.count("start"), events.count("finish"), events[-1]) == (1, 1, "finish"), events
    assert [r["step"] for r in records if r["event"] == "step"] == [0, 1, 2]
    assert sorted(p.name for p in (claim / "exports").iterdir()) == ["latest", "step-000002"]
    assert json.loads((claim / "exports" / "latest" / "export.json").read_text())["step"] == 2
    controllers = [p for p in kubelet.deleted if p.owner == ("Job", f"{NAME}-controller")]
    if point == "after-finish-line":
        assert [p.exits for p in controllers] == [[-9], [0]] and job["status"]["restarts"] == 1, tails
        after = controllers[1].log.read_text().splitlines()
        assert len(after) == 1 and FINISHED_LINE in after[0], after  # not even "controller on cpu"
    else:
        assert [p.exits for p in controllers] == [[-9]] and job["status"]["restarts"] == 0, tails
        assert job["status"]["message"].startswith("the controller finished the job (3 training steps; its finish "
                                                   "record at "), job["status"]["message"]
    for pod in kubelet.deleted:  # every other pod ended cleanly (exit 0) or was stopped (deleted) running
        assert pod is controllers[0] or pod.exits in ([], [0]), (pod.name, pod.exits, tails)
    accounted = account(claim)
    counts = accounted.counts
    assert accounted.finished and (counts.trained, counts.lost, counts.duplicated) == (18, 0, 0), counts.line()
