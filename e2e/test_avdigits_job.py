"""The built-in audio+video task through `omnirl run` with each algorithm (FlowGRPO, DiffusionNFT, AWM, DGPO): real
role processes, Redis and the four rewards on media that travel as one safetensors blob per sample; each run's
validation writes a contact sheet and MP4s with sound, and `omnirl eval` of its checkpoint writes the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.controller.test_media_files import decoded_audio, probe

ROOT = Path(__file__).resolve().parents[1]
TERMS = ("ocr", "beeps", "pitch", "sync")


def tiny(example: str, redis_url: str, tmp: Path) -> Path:
    """The example with 2 steps of 2 prompts × 4 samples, 4-step sampling, validation of 4 prompts at 0 and 2."""
    doc = yaml.safe_load((ROOT / "examples" / f"avdigits-{example}.yaml").read_text())
    spec = doc["spec"]
    spec["data"] = {k: str(ROOT / "examples" / v) for k, v in spec["data"].items()}
    algo = spec["algorithm"]
    algo.update(steps=2, groupSize=4, promptsPerStep=2)
    algo["sampling"]["numSteps"] = 4
    algo["optimizer"]["microBatchSize"] = 8
    if "flowGrpo" in algo:
        algo["flowGrpo"]["window"] = {"size": 2, "range": [0, 2]}
    spec["validation"] = {"everySteps": 2, "numSteps": 4, "maxPrompts": 4}
    spec["checkpoint"] = {"everySteps": 2, "keep": 1}
    spec["transferQueue"] = {"redisUrl": redis_url}
    path = tmp / f"{example}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.omni
@pytest.mark.parametrize("example", ["flowgrpo", "nft", "awm", "dgpo"])
def test_each_algorithm_trains_the_audio_video_task_and_writes_mp4s_with_sound(example, tmp_path, redis_url):
    out = tmp_path / "out"
    job = tiny(example, redis_url, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    vals = [r for r in records if r["event"] == "validation"]
    assert [s["step"] for s in steps] == [0, 1] and [v["step"] for v in vals] == [0, 2]
    for v in vals:  # each term's held-out mean, and the sum is their weighted sum
        assert all(0.0 <= v[f"val_reward_{t}"] <= 1.0 for t in TERMS)
        assert v["val_reward_mean"] == pytest.approx(sum(0.25 * v[f"val_reward_{t}"] for t in TERMS), abs=1e-6)
        assert len(v["videos"]) == 4 and Path(v["grid"]).is_file()
    assert "held-out reward" in proc.stdout and all(t in proc.stdout for t in TERMS)  # the table's columns
    video = Path(vals[-1]["videos"][0])
    assert "Video: h264" in probe(video) and "Audio: aac" in probe(video)
    assert decoded_audio(video).size > 0.9 * 8000

    if example != "awm":
        return
    evaluated = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "eval", str(job), "--checkpoint",
                           str(out / "checkpoints" / "latest"), "--out", str(evaluated), "--sampling-steps", "4"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((evaluated / "rewards.json").read_text())
    assert result["n"] == 4 and sorted(result["components"]) == sorted(TERMS)
    assert result["mean_reward"] == pytest.approx(vals[-1]["val_reward_mean"], abs=1e-6)  # validation's samples
    assert (evaluated / "grid.png").is_file() and len(result["videos"]) == 4
    assert "Audio: aac" in probe(result["videos"][0])
