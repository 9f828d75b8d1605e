"""User-facing paths of a local run that the ledger tests do not take, in one short job:
`omnirl run` with Ray placement (the default of `make demo`), the `sync` pipeline mode, two weighted
rewards one of which is an HTTP reward model (a real server in this process), the controller's
`/metrics` scraped while the job runs (its values; `e2e/test_dashboard_data.py` checks every dashboard
panel gets data), then `omnirl eval --checkpoint` on the run's checkpoint."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import yaml
from e2e.test_local_job import ROOT, ledger, tiny_job
from PIL import Image
from tests.dashboards import run_scraped

HTTP_WEIGHT = 0.5


def ink(png_b64: str) -> float:
    """The HTTP reward model's score: the share of dark pixels (a closed form the test recomputes)."""
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(png_b64))).convert("L"))
    return float((image < 128).mean())


class RewardModel(ThreadingHTTPServer):
    """The scorer protocol's HTTP twin (`POST /v1/score`, proto3 JSON with field names as in
    `reward/protocol/scorer.proto`): one `score` (ink share) per sample; remembers every id and score."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.posts = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                ids = [s["sample_id"] for s in body["samples"]]
                rewards = [ink(s["image_png"]) for s in body["samples"]]
                server.posts += 1
                server.seen.update(zip(ids, rewards, strict=True))
                reply = json.dumps({"results": [{"sample_id": i, "score": r} for i, r in zip(ids, rewards, strict=True)],
                                    "scorer": "ink"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.mark.slow
def test_ray_sync_job_with_http_reward_metrics_and_eval(tmp_path, redis_url, request):
    server = RewardModel()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    request.addfinalizer(server.shutdown)  # after `omnirl eval` too: it scores with every reward
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/score"
    job = tiny_job(tmp_path, "userpaths", redis_url, mode="sync", steps=2,
                   reward={"name": "ocr", "kind": "ocr", "weight": 1.0})
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["reward"].append({"name": "judge", "kind": "http", "url": url, "weight": HTTP_WEIGHT,
                                  "timeoutSeconds": 60})
    doc["spec"]["algorithm"]["optimizer"]["learningRate"] = 3e-3
    job.write_text(json.dumps(doc))
    out = tmp_path / "out"
    code, log, _, scraped = run_scraped(job, out, timeout_s=540)
    assert code == 0, log[-4000:]
    assert any(line.startswith("omnirl: job userpaths") and line.endswith(", ray)") for line in log.splitlines())

    # two weighted rewards: every sample went to the HTTP model once, and the total is the weighted sum
    scored = {r["sample_id"]: r["reward"] for r in ledger(out, "reward")}
    assert set(server.seen) == set(scored) and len(scored) == 2 * 2 * 3 + 2 * 4  # train + validations at steps 0 and 2, 4 each
    for sid, total in scored.items():
        ocr = total - HTTP_WEIGHT * server.seen[sid]
        assert -1e-5 <= ocr <= 1 + 1e-5, (sid, total, server.seen[sid])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1]
    for r in steps:
        assert r["reward_mean"] == pytest.approx(r["reward_ocr"] + HTTP_WEIGHT * r["reward_judge"], abs=1e-5)
        assert r["reward_judge"] > 0

    # the controller's /metrics served the job's numbers while it ran; the last scrape (every 0.2 s)
    # may come before the last step's update, as the controller exits right after it
    step = scraped["omnirl_training_step"]
    assert step in (0, 1) and scraped["omnirl_policy_version"] == step + 1
    assert scraped["omnirl_samples_trained_total"] == (step + 1) * 2 * 3

    # `omnirl eval --checkpoint` on the run's checkpoint: the trained policy, not the base model
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join((ROOT / "examples/prompts/ocr-heldout.txt").read_text().splitlines()[:4]) + "\n")
    grids = {}
    for name, extra in (("trained", ["--checkpoint", str(out / "checkpoints" / "latest")]), ("base", [])):
        ev = subprocess.run([sys.executable, "-m", "omnirl.cli", "eval", str(job), "--prompts", str(prompts),
                             "--sampling-steps", "4", "--out", str(tmp_path / name), *extra],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-2000:]
        result = json.loads((tmp_path / name / "rewards.json").read_text())
        assert result["n"] == 4 and len(result["rewards"]) == 4
        grids[name] = np.asarray(Image.open(tmp_path / name / "grid.png"))
        if extra:
            assert "step 1 policy_version 2" in ev.stdout
        # validation's weighted sum: the HTTP model scored every eval sample too
        assert {f"eval:{i}" for i in range(4)} <= set(server.seen)
    assert not np.array_equal(grids["trained"], grids["base"])
