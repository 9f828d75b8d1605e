"""A whole RLJob through every real part: `omnirl run` → embedded roles as processes, a real
redis-server, real weight broadcast over gloo, the real OCR reward. Tiny settings, 2–3 steps."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
import yaml

from omnirl.api.exits import JOB_FAILED_EXIT

ROOT = Path(__file__).resolve().parents[1]
# Every test runs a whole job (20 s - 2 min on 2 cores): `make test-slow` runs them, except the async-reward ledger
# test, which `make test` keeps as its one local whole job.


def tiny_job(tmp: Path, name: str, redis_url: str, *, algorithm: str = "flow-grpo", mode: str = "async-reward",
             steps: int = 3, reward: dict | None = None, actor_ranks: int = 1) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    spec = doc["spec"]
    doc["metadata"]["name"] = name
    spec["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt"),
                    "validationPrompts": str(ROOT / "examples/prompts/ocr-heldout.txt")}
    algo = spec["algorithm"]
    algo.update(name=algorithm, steps=steps, groupSize=3, promptsPerStep=2)
    algo["sampling"] = {"numSteps": 4}
    if algorithm == "flow-grpo":
        algo["flowGrpo"]["window"] = {"size": 2, "range": [0, 3]}
    else:  # another algorithm's block is refused (the job would silently ignore it)
        del algo["flowGrpo"]
    algo["optimizer"] = {"learningRate": 1e-4, "microBatchSize": 4, "updatesPerStep": 1}
    spec["pipeline"] = {"mode": mode, "maxStaleness": 1}
    spec["validation"] = {"everySteps": 2, "numSteps": 4, "maxPrompts": 4}
    spec["checkpoint"] = {"everySteps": 2, "keep": 1}
    spec["transferQueue"] = {"redisUrl": redis_url, "claimIdleSeconds": 30}
    if reward is not None:
        spec["reward"] = [reward]
    spec.setdefault("roles", {})["actor"] = {"replicas": actor_ranks}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(job: Path, out: Path, *extra: str, timeout: int = 420) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray", *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def ledger(out: Path, role: str) -> list[dict]:
    rows = []
    for f in sorted((out / "ledger").glob(f"{role}-*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines()]
    return rows


def assert_each_sample_once(out: Path, train_samples: int) -> None:
    """The ledgers show `train_samples` training samples generated, every generated sample (train
    and validation) scored exactly once, and every training sample trained exactly once."""
    generated = ledger(out, "rollout")
    train_ids = {r["sample_id"] for r in generated if not r["sample_id"].startswith("val")}
    assert len(train_ids) == train_samples
    scored = Counter(r["sample_id"] for r in ledger(out, "reward"))
    trained = Counter(r["sample_id"] for r in ledger(out, "actor"))
    assert set(scored) == {r["sample_id"] for r in generated} and set(scored.values()) == {1}
    assert set(trained) == train_ids and set(trained.values()) == {1}


@pytest.mark.parametrize("mode", ["async-reward", pytest.param("fully-async", marks=pytest.mark.slow)])
def test_every_sample_scored_once_and_trained_once(tmp_path, redis_url, mode):
    name = f"ledger-{mode}"
    proc = run(tiny_job(tmp_path, name, redis_url, mode=mode), tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    generated = ledger(out, "rollout")
    scored = Counter(r["sample_id"] for r in ledger(out, "reward"))
    trained = Counter(r["sample_id"] for r in ledger(out, "actor"))
    train_ids = {r["sample_id"] for r in generated if not r["sample_id"].startswith("val")}
    assert len(train_ids) == 3 * 2 * 3  # steps × prompts × group size (no refills on a healthy run)
    assert set(scored) == {r["sample_id"] for r in generated} and set(scored.values()) == {1}
    assert set(trained) == train_ids and set(trained.values()) == {1}
    versions: dict[str, set[int]] = {}
    for r in generated:
        if not r["sample_id"].startswith("val"):
            versions.setdefault(r["sample_id"].split(":")[0], set()).add(r["policy_version"])
    if mode == "async-reward":  # on-policy: step n is sampled with version n
        assert versions == {str(s): {s} for s in range(3)}
    else:  # step n+1 overlaps training of step n: one version per step, at most 1 behind
        assert all(len(v) == 1 and s - min(v) <= 1 for s, v in ((int(k), v) for k, v in versions.items()))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2] and [r["policy_version"] for r in steps] == [1, 2, 3]
    vals = [r for r in records if r["event"] == "validation"]
    assert [v["step"] for v in vals] == [0, 2, 3] and all(v["n"] == 4 for v in vals)
    assert (out / "samples" / "step-00003.png").exists()
    assert (out / "checkpoints" / "latest" / "policy.safetensors").exists()
    # the run's summary: machine-readable as metrics.jsonl's last line, readable at the end of the output (it was
    # the controller's raw `{"event": "controller-finished", "validation": [...]}` line, and the record held no more
    # than `{"event": "finish", "time": …}`)
    finish = records[-1]
    ckpt = next(r["checkpoint"] for r in reversed(steps) if r.get("checkpoint"))
    assert {k: v for k, v in finish.items() if k != "time"} == {
        "event": "finish", "total_steps": 3, "start_step": 0, "last_checkpoint": ckpt,
        "last_export": str(out / "exports" / Path(ckpt).name),
        "validation": {"step": 3, "val_reward_mean": vals[-1]["val_reward_mean"],
                       "val_exact_match": vals[-1]["val_exact_match"]}}
    assert "controller-finished" not in proc.stdout
    lines = proc.stdout.splitlines()
    at = lines.index(f"omnirl: job {name} finished")
    assert lines[at + 1:] == [
        f"  training steps   3 in {finish['time'] - records[0]['time']:.0f} s",
        f"  train reward     {steps[0]['reward_mean']:.3f} at step 0 → {steps[-1]['reward_mean']:.3f} at step 2",
        f"  held-out reward  {vals[0]['val_reward_mean']:.3f} at step 0 → {vals[-1]['val_reward_mean']:.3f} at step 3 "
        f"(exact match {vals[-1]['val_exact_match']:.3f})",
        f"  checkpoint       {ckpt}",
        f"  export           {out / 'exports' / Path(ckpt).name}",
        f"  record           {out / 'metrics.jsonl'} (its 'finish' line)"], proc.stdout[-3000:]
    # a run that finished on the manifest's Redis leaves nothing there: no stream, trajectory, image or flag
    # (`preflight.mark_stopped`; the ledgers above show nothing was pending)
    assert list(redis.Redis.from_url(redis_url).scan_iter(match=f"omnirl:{name}:*")) == []


@pytest.mark.slow
def test_two_fsdp_actor_ranks_train_the_job(tmp_path, redis_url):
    name = "two-ranks"
    out = tmp_path / "out"
    proc = run(tiny_job(tmp_path, name, redis_url, steps=2, actor_ranks=2), out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trained = Counter(r["sample_id"] for r in ledger(out, "actor"))  # the leader writes the ledger
    assert len(trained) == 2 * 2 * 3 and set(trained.values()) == {1}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1] and [r["policy_version"] for r in steps] == [1, 2]
    state = json.loads((out / "checkpoints" / "latest" / "state.json").read_text())
    assert state["actor_ranks"] == 2 and state["policy_version"] == 2
    # both ranks trained both steps (an FSDP step needs every rank); the finished run left no key on the Redis
    assert list(redis.Redis.from_url(redis_url).scan_iter(match=f"omnirl:{name}:*")) == []


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["flow-grpo", "awm"])
def test_resume_continues_from_the_latest_checkpoint(tmp_path, redis_url, algorithm):
    job = tiny_job(tmp_path, f"resume-{algorithm}", redis_url, algorithm=algorithm, steps=2)
    out = tmp_path / "out"
    first = run(job, out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = run(job, out, "--resume", "--steps", "3")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert steps[-1]["policy_version"] == 3
    state = json.loads((out / "checkpoints" / "latest" / "state.json").read_text())
    assert state["step"] == 2 and state["policy_version"] == 3
    if algorithm == "awm":  # ODE rollouts, the AWM update, its EMA anchor in the checkpoint
        assert "matching_error" in steps[-1] and steps[-1]["old_policy_decay"] == pytest.approx(0.003)
        assert (out / "checkpoints" / "latest" / "old.safetensors").exists()


class _Broken(BaseHTTPRequestHandler):
    """A scorer that passes `omnirl run`'s pre-flight (its empty request gets the protocol's 400)
    and then answers every batch 503: one that broke after the job started."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = 503 if body.get("samples") else 400
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
def test_a_dead_required_scorer_fails_the_job_with_its_reason(tmp_path, redis_url):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dead = {"name": "judge", "kind": "http", "url": f"http://127.0.0.1:{server.server_address[1]}/v1/score",
                "timeoutSeconds": 2}
        path = tiny_job(tmp_path, "deadscorer", redis_url, steps=1, reward=dead)
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["failurePolicy"] = {"scorerOutageSeconds": 0}  # fail at once, not after holding the samples 600 s
        path.write_text(yaml.safe_dump(doc))
        proc = run(path, tmp_path / "out")
    finally:
        server.shutdown()
    text = proc.stdout + proc.stderr
    assert proc.returncode == JOB_FAILED_EXIT, text[-3000:]  # the reward role already retried; no restart
    assert "controller" in text and "unreachable: HTTP 503" in text
    assert "restart-job" not in (tmp_path / "out" / "events.jsonl").read_text()


@pytest.mark.slow
def test_a_grpc_scorer_served_by_omnirl_scorer_serve_scores_the_job(tmp_path, redis_url):
    server = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "ocr", "--protocol",
                               "grpc", "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving ocr over grpc on 127.0.0.1:"), line
        reward = {"name": "ocr", "kind": "grpc", "url": line.strip().rsplit(" ", 1)[1]}
        out = tmp_path / "out"
        proc = run(tiny_job(tmp_path, "grpcscorer", redis_url, steps=2, reward=reward), out)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    finally:
        server.terminate()
        assert server.wait(timeout=60) == 0
    generated = {r["sample_id"] for r in ledger(out, "rollout")}
    scored = ledger(out, "reward")
    assert {r["sample_id"] for r in scored} == generated and len(scored) == len(generated)
    assert all(r["reward"] is not None and 0.0 <= r["reward"] <= 1.0 for r in scored)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "step"] == [0, 1]
