"""A rollout whose module does not fit the actor's weights, on the user's path (`omnirl run`, real
role processes): a configuration mismatch every restart meets again, so the job stops once with
exit 4 (`CONFIG_ERROR_EXIT`) and one line naming the fix instead of restarting until
`failurePolicy.maxRestarts` (measured before: exit 1, 3 starts, 49 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnirl.api.exits import CONFIG_ERROR_EXIT

REPO = Path(__file__).resolve().parents[1]
# loaded by the role processes (sitecustomize on PYTHONPATH): the rollout's module gains one parameter
# the actor's has not, as a rollout built from other model code would
ROLLOUT_EXTRA_PARAMETER = '''
import importlib.abc, importlib.util, sys
if "role" in sys.argv and "rollout" in sys.argv:
    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "omnirl.weight_sync.receiver":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                original = module.WeightReceiver.receive
                def receive(self, mod, *a, **k):
                    import torch
                    if not hasattr(mod, "rollout_only"):
                        mod.register_parameter("rollout_only", torch.nn.Parameter(torch.zeros(1)))
                    return original(self, mod, *a, **k)
                module.WeightReceiver.receive = receive
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Hook())
'''


@pytest.mark.slow
def test_a_rollout_module_that_does_not_fit_the_actors_weights_stops_the_job_once(tmp_path):
    from e2e.chaos import chaos_job

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(ROLLOUT_EXTRA_PARAMETER)
    job, out = chaos_job(tmp_path, "binding-mismatch", steps=2), tmp_path / "out"
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["failurePolicy"]["maxRestarts"] = 2
    job.write_text(yaml.safe_dump(doc))
    paths = [str(hook), str(REPO / "services"), str(REPO / "operator"), str(REPO)]
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
    assert done.returncode == CONFIG_ERROR_EXIT, done.stdout[-3000:] + done.stderr[-3000:]
    rollout = [line for line in done.stdout.splitlines() if line.startswith("[rollout-0] omnirl role rollout")]
    assert rollout == [
        "[rollout-0] omnirl role rollout: configuration error: worker rollout-0: weight binding failed for "
        "policy_version 0: bound 0 tensors (0 modules); missing: rollout_only; modules: <root>; the actor's model "
        "and the rollout's differ (each restart loads the same two again): both roles must load the same "
        "spec.model (family, path, lora) with the same omnirl version (the same image in roles.actor.template "
        "and roles.rollout.template)"], done.stdout[-3000:]
    actions = [json.loads(line)["action"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert actions[-1] == "fail-job (configuration error: not restarted)", actions
    assert "restart-job" not in actions, actions
