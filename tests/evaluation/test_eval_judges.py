"""`omnirl eval` of a manifest whose judge the job runs (`reward[].server`), as real processes: eval
serves the judge itself as `omnirl run` does (`reward/servers.py::serving`), scores with it and stops it.

Found on the user's path: `omnirl run` wrote its judge's URL of that run into `OUT/job.yaml`, and
`omnirl eval OUT/job.yaml --checkpoint OUT/checkpoints/latest` after the run ended refused it, exit 2
in 11 s: `spec.reward[1].url: the scorer at http://127.0.0.1:32833/v1/score does not answer
(ConnectionRefusedError …)` — a URL the user never wrote; eval of the manifest as written refused its
`server` ("omnirl eval does not start judge servers"). The run's side (OUT/job.yaml keeps `server`,
eval of it equals the run's validation) is `e2e/test_reward_judges.py`.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from omnirl.cli import main as cli_main
from omnirl.transfer.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "examples" / "prompts" / "ocr-heldout.txt"
# the HTTP scorer of the scorer protocol serving the OCR reward: the judge stand-in of the local e2e tests
JUDGE = [sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "ocr", "--protocol", "http",
         "--host", "127.0.0.1", "--port"]


def manifest(tmp: Path, name: str, reward: dict) -> Path:
    """The FlowGRPO example with `reward` as its only reward, 4 held-out prompts, 4 steps."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["spec"]["data"] = {"trainPrompts": str(HELDOUT), "validationPrompts": str(HELDOUT)}
    doc["spec"]["reward"] = [reward]
    doc["spec"]["validation"] = {"everySteps": 1, "numSteps": 4, "maxPrompts": 4, "seed": 7}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def served(server: dict) -> dict:
    return {"name": "judge", "kind": "http", "server": {"urlPath": "/v1/score", "healthPath": "/healthz", **server}}


def rewards(out: Path) -> list[float]:
    return json.loads((out / "rewards.json").read_text())["rewards"]


def gone(pid: int) -> bool:
    """No process `pid` and none left in its process group (the judge runs in a session of its own)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return not Path(f"/proc/{pid}").exists()
    return False


def test_eval_serves_the_judge_scores_with_it_and_stops_it(tmp_path, capsys):
    job = manifest(tmp_path, "served", served({"command": [*JUDGE, "{port}"]}))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "eval", str(job), "--out", str(tmp_path / "served")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr
    port, pid = map(int, re.search(r"omnirl: judge judge starting on port (\d+) \(pid (\d+);", proc.stdout).groups())
    assert gone(pid), f"the judge eval started (pid {pid}) outlived it"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert (tmp_path / "served" / "logs" / "judge-judge.log").read_text() == (
        f"serving ocr over http on 127.0.0.1:{port}\nstopped\n")  # it answered, then stopped on SIGTERM, not killed
    got = rewards(tmp_path / "served")
    assert len(got) == 4 and len(set(got)) > 1, got  # four samples the judge scored, not one default value
    assert seconds < 120, seconds

    # the same reward scored in-process (what the judge serves), and the same judge at a url the user gives
    # (started by the test, left running by eval): the same numbers
    assert cli_main(["eval", str(manifest(tmp_path, "inproc", {"name": "judge", "kind": "ocr"})),
                     "--out", str(tmp_path / "inproc")]) == 0
    assert rewards(tmp_path / "inproc") == got
    port = free_port()
    judge = subprocess.Popen([*JUDGE, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and judge.poll() is None, "the external judge did not start"
                time.sleep(0.2)
        external = manifest(tmp_path, "external", {"name": "judge", "kind": "http",
                                                   "url": f"http://127.0.0.1:{port}/v1/score"})
        capsys.readouterr()
        assert cli_main(["eval", str(external), "--out", str(tmp_path / "external")]) == 0
        assert "starting on port" not in capsys.readouterr().out  # a judge with a url is the user's: none started
        assert rewards(tmp_path / "external") == got
        assert judge.poll() is None  # eval leaves the user's judge running
    finally:
        judge.terminate()
        judge.wait(10)


def test_a_judge_that_exits_ends_eval_with_one_line_naming_the_field(tmp_path, capsys):
    job = manifest(tmp_path, "dead", served({"command": [sys.executable, "-c",
                                                         "print('no model at /models/qwen'); raise SystemExit(3)"],
                                                "startupSeconds": 20}))  # what a broken fix would wait out
    out = tmp_path / "o"
    t0 = time.monotonic()
    assert cli_main(["eval", str(job), "--out", str(out)]) == 4  # CONFIG_ERROR_EXIT, as omnirl run (was 1)
    assert time.monotonic() - t0 < 30  # not the 600 s a judge that never listens is given
    out_text, err = capsys.readouterr()
    assert gone(int(re.search(r"\(pid (\d+);", out_text)[1]))
    log = out / "logs" / "judge-judge.log"
    assert re.fullmatch(
        r"omnirl eval: spec\.reward\[0\]\.server: judge judge exited 3 \d+\.\d s after it started, before it answered "
        rf"on port \d+; its log {re.escape(str(log))} ends: 'no model at /models/qwen'; fix the judge's command or "
        r"model \(spec\.reward\[0\]\.server\), or run the judge yourself and give spec\.reward\[0\]\.url instead of "
        r"server; nothing written\n", err), err
    assert not (out / "rewards.json").exists() and not (out / "grid.png").exists()
