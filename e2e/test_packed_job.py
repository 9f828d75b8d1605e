"""`roles.rollout.batching: packed` with `model.resolutions` through the role processes: `omnirl run`
of a tiny SD3 pipeline (random weights, saved locally) on the CPU, its prompt groups sampled at three
sizes, packed into shared forwards and trained in micro-batches of one shape. The mixed-shape forward
itself is checked against the unpacked one in `tests/models/test_sd3_packed.py`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from e2e.test_local_job import assert_each_sample_once, run, tiny_job

pytest.importorskip("diffusers")
pytestmark = pytest.mark.slow  # a whole job


RESOLUTIONS = [[32, 32], [32, 48], [48, 32]]  # pixels; the tiny VAE halves them


def packed_sd3_job(tmp: Path, name: str, redis_url: str, *, steps: int, dtype: str = "float32") -> Path:
    """`tiny_job` with a tiny saved SD3 pipeline (RESOLUTIONS in turn, CFG 2, LoRA r4), a JPEG reward and
    packed batching."""
    from tests.models.test_diffusers import _sd3_pipeline

    path = tiny_job(tmp, name, redis_url, steps=steps)
    doc = yaml.safe_load(path.read_text())
    spec = doc["spec"]
    model_dir = tmp / "tiny-sd3"
    _sd3_pipeline().save_pretrained(model_dir)
    spec["model"] = {"family": "sd3", "path": str(model_dir), "dtype": dtype, "resolutions": RESOLUTIONS,
                     "lora": {"enabled": True, "rank": 4, "alpha": 8}}
    spec["algorithm"]["sampling"].update(shift=3.0, guidanceScale=2.0)
    spec["reward"] = [{"name": "jpeg", "kind": "jpeg"}]
    spec["roles"]["rollout"] = {"batching": "packed", "maxBatchSize": 8}
    del spec["data"]["validationPrompts"]  # no validation rounds: the lean job the check needs
    path.write_text(yaml.safe_dump(doc))
    return path


def check_packed_job(out: Path, proc, steps: int) -> None:
    """Exit 0, a packed engine, every train sample (steps × 2 prompts × G 3) scored and trained once."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rollout = (out / "logs" / "rollout-0.log").read_text()
    assert "engine: batching packed" in rollout and "could not deregister" not in rollout  # a quiet clean end
    controller = (out / "logs" / "controller-0.log").read_text()  # console and checkpoints count steps alike
    assert f"step {steps - 1} [{steps}/{steps}] " in controller and f"checkpoint step-{steps - 1:06d}" in controller
    state = json.loads((out / "checkpoints" / f"step-{steps - 1:06d}" / "state.json").read_text())
    assert (state["step"], state["job"], state["family"]) == (steps - 1, "packed-sd3", "sd3")  # what export checks
    assert_each_sample_once(out, steps * 2 * 3)
    check_sizes(out, steps)


def check_sizes(out: Path, steps: int) -> None:
    """Groups in turn over RESOLUTIONS (group i of step s at (s + i) mod 3; 2 prompts a step): every
    size made, each group one size."""
    lines = [json.loads(line) for f in (out / "ledger").glob("rollout-*.jsonl") for line in f.read_text().splitlines()]
    by_group: dict[str, set] = {}
    for line in lines:
        by_group.setdefault(line["sample_id"].rsplit(":", 1)[0], set()).add(tuple(line["latent"][1:]))
    assert all(len(sizes) == 1 for sizes in by_group.values()), by_group
    made = sorted({next(iter(sizes)) for sizes in by_group.values()})
    expected = sorted({tuple(v // 2 for v in RESOLUTIONS[(s + i) % 3]) for s in range(steps) for i in range(2)})
    assert made == expected, (made, expected)


def test_a_packed_sd3_job_runs_through_the_role_processes(tmp_path, redis_url):
    out = tmp_path / "out"
    proc = run(packed_sd3_job(tmp_path, "packed-sd3", redis_url, steps=2), out, timeout=600)
    check_packed_job(out, proc, 2)
