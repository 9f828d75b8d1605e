"""One whole RL job under `omnirl run` on the CPU with parallel replicas (docs/parallel.md) gives the unsharded run's
weights: the tiny Wan pipeline, FlowGRPO with LoRA, 2 steps (rollout, reward, update, weight sync each), once on one
rollout process and one actor process, once with a 2-rank Ulysses rollout replica and a 2-rank FSDP actor, and once
with a 2-rank Ulysses actor (one data-parallel rank). The samples are the same within fp32 rounding, so are the
rewards, advantages and updates: the trained adapters (`checkpoints/step-000001/policy.safetensors`) agree within
1e-5, and they trained (LoRA's B starts at 0 and moved)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from tests.video_models import save_tiny

ROOT = Path(__file__).resolve().parents[1]


def manifest(tmp: Path, model: Path, name: str, roles: dict) -> Path:
    prompts = tmp / "prompts.txt"
    prompts.write_text("a red ball\na blue cube\na green cone\n")
    doc = {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": {
        "seed": 3,
        "model": {"family": "wan", "path": str(model), "video": {"frames": 5, "height": 32, "width": 48, "fps": 8},
                  "lora": {"enabled": True, "rank": 4, "alpha": 4}},
        "data": {"trainPrompts": str(prompts)},
        "algorithm": {"name": "flow-grpo", "steps": 2, "groupSize": 2, "promptsPerStep": 2,
                      "sampling": {"numSteps": 4, "guidanceScale": 1.0},
                      "optimizer": {"microBatchSize": 1, "learningRate": 1.0e-3},
                      "flowGrpo": {"window": {"size": 1, "range": [0, 2]}}},
        "reward": [{"name": "motion", "kind": "temporal-consistency"}],
        "validation": {"everySteps": 0}, "checkpoint": {"everySteps": 0},
        "roles": roles}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(job: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray",
                           "--device", "cpu"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return load_file(str(out / "checkpoints" / "step-000001" / "policy.safetensors"))


@pytest.mark.slow
@pytest.mark.omni
@pytest.mark.timeout(2400)
def test_parallel_replicas_train_the_unsharded_runs_weights(tmp_path):
    model = save_tiny("wan", tmp_path / "wan")
    base = run(manifest(tmp_path, model, "par-base", {}), tmp_path / "base")
    split = run(manifest(tmp_path, model, "par-split", {"rollout": {"parallel": {"ulysses": 2}},
                                                         "actor": {"replicas": 2}}), tmp_path / "split")
    actor_u = run(manifest(tmp_path, model, "par-actor-u", {"actor": {"parallel": {"ulysses": 2}}}),
                  tmp_path / "actor-u")
    assert sorted(split) == sorted(base) == sorted(actor_u) and len(base) == 2 * 2 * 4 * 2  # blocks×attn×q,k,v,o×A,B
    assert max(t.abs().max().item() for n, t in base.items() if "lora_B" in n) > 1e-4  # B starts at 0: it trained
    for other in (split, actor_u):
        assert max((other[n] - t).abs().max().item() for n, t in base.items()) <= 1e-5
