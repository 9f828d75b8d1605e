"""A job whose reward is a user's Python function, through `omnirl run`: scored in-process by the reward role
(`kind: python`) and, the same function, by a judge server `omnirl scorer serve --function` that the run starts
itself (`kind: grpc` with `server`); every sample's reward is the function's closed form (docs/rewards-python.md).
The job also writes TensorBoard event files (`spec.telemetry.tensorboard`), read back equal to metrics.jsonl."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml
from e2e.test_local_job import ledger, run, tiny_job
from tests.telemetry.test_tensorboard import assert_tensorboard_is_metrics_jsonl

from omnirl.controller.data import read_prompts

FUNCTION = '''
import numpy as np

def score(images, prompts):
    """0.01 per character of the prompt line; refuses anything but the batch omnirl documents."""
    if not (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 4 and images.shape[3] == 3
            and len(prompts) == len(images) and all(isinstance(p, str) for p in prompts)):
        raise TypeError(f"unexpected batch {type(images)} {getattr(images, 'shape', None)} {prompts!r}")
    return [0.01 * len(p) for p in prompts]
'''


@pytest.mark.slow  # a 2-step local job with a judge server: about 100 s on 2 cores
def test_a_python_function_reward_in_process_and_served(tmp_path, redis_url, monkeypatch):
    (tmp_path / "user_reward_e2e.py").write_text(FUNCTION)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    path = tiny_job(tmp_path, "python-reward", redis_url, steps=2)
    doc = yaml.safe_load(path.read_text())
    server = {"command": [sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--function", "user_reward_e2e:score",
                          "--port", "{port}", "--host", "127.0.0.1"]}
    doc["spec"]["reward"] = [
        {"name": "mine", "kind": "python", "params": {"function": "user_reward_e2e:score"}},
        {"name": "served", "kind": "grpc", "weight": 0.5, "server": server},
    ]
    doc["spec"]["telemetry"] = {"tensorboard": True}
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    proc = run(path, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " over grpc on 127.0.0.1:" in (out / "logs" / "judge-served.log").read_text()

    train = read_prompts(doc["spec"]["data"]["trainPrompts"])
    held = read_prompts(doc["spec"]["data"]["validationPrompts"])
    rows = ledger(out, "reward")
    assert rows and all(r["reward"] is not None for r in rows), rows
    for r in rows:  # sample ids: `{step}:{prompt index}:{i}`, `val{step}:{held-out index}:{tag}`
        sid = r["sample_id"]
        prompt = held[int(sid.split(":")[1])] if sid.startswith("val") else train[int(sid.split(":")[1])]
        assert abs(r["reward"] - 1.5 * 0.01 * len(prompt)) < 1e-6, (sid, prompt, r)  # weights 1 and 0.5
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1]
    for r in steps:  # the served function and the in-process one gave every sample the same value
        assert r["reward_mine"] > 0 and abs(r["reward_mine"] - r["reward_served"]) < 1e-6, r
    vals = [r for r in records if r["event"] == "validation"]
    assert vals and all(abs(v["val_reward_mine"] - v["val_reward_served"]) < 1e-6 for v in vals)
    assert_tensorboard_is_metrics_jsonl(out)
