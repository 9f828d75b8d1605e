"""Whole RLJobs through the role processes on CUDA GPUs — the path users take, not in-process.

`omnirl run` places rollout and actor on GPUs as the manifest asks (`accelerator: nvidia`), with
a real redis-server, the real weight broadcast and real scorers on the CPU:
- one GPU (`--share-gpus`): rollout and actor share it, the broadcast goes through CUDA IPC
  handles (`cuda-ipc`, device to device);
- two GPUs: actor on one, rollout on the other, the broadcast goes over NCCL.
For the built-in model (OCR reward) and for a diffusers SD3 pipeline built from a tiny random
configuration and saved locally (JPEG reward). Marked `gpu`: CI (no GPU) skips them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from e2e.test_local_job import assert_each_sample_once, run, tiny_job

from omnirl.api.exits import USAGE_EXIT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
GPU = {"type": "nvidia", "count": 1}


def gpu_job(tmp: Path, name: str, redis_url: str, family: str, steps: int = 2) -> Path:
    """`tiny_job` with rollout and actor on NVIDIA GPUs; `sd3` swaps in a tiny saved SD3 pipeline."""
    path = tiny_job(tmp, name, redis_url, steps=steps)
    doc = yaml.safe_load(path.read_text())
    spec = doc["spec"]
    spec["roles"]["rollout"] = {"replicas": 1, "accelerator": GPU}
    spec["roles"]["actor"] = {"replicas": 1, "accelerator": GPU}
    if family == "sd3":
        from tests.models.test_diffusers import _sd3_pipeline

        model_dir = tmp / "tiny-sd3"
        _sd3_pipeline().save_pretrained(model_dir)
        spec["model"] = {"family": "sd3", "path": str(model_dir), "dtype": "bfloat16", "resolution": [32, 32],
                         "lora": {"enabled": True, "rank": 4, "alpha": 8}}
        spec["algorithm"]["sampling"].update(shift=3.0, guidanceScale=2.0)
        spec["reward"] = [{"name": "jpeg", "kind": "jpeg"}]
    path.write_text(yaml.safe_dump(doc))
    return path


def check_job(out: Path, proc, steps: int, backend: str, gpus: dict[str, str], family: str) -> None:
    """Exit 0, placement as asked, the expected transport and attention kernel, every train sample
    scored and trained once."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for role, gpu in gpus.items():
        assert any(line.split()[:4] == [role, "cuda:0", "=", "GPU"] and line.split()[4] == gpu
                   for line in proc.stdout.splitlines()), (role, proc.stdout[:2000])
    actor_log = (out / "logs" / "actor-0.log").read_text()
    assert f"weight sync over {backend}" in actor_log
    assert "rollout on cuda:0" in (out / "logs" / "rollout-0.log").read_text()
    if family == "sd3" and torch.cuda.get_device_capability() >= (9, 0):  # bf16, head dim 8: auto is cuDNN
        for log in ("rollout-0.log", "actor-0.log"):
            assert "attention: cudnn (spec.model.attention auto)" in (out / "logs" / log).read_text(), log
    assert_each_sample_once(out, steps * 2 * 3)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in records if r["event"] == "step"]
    assert [r["policy_version"] for r in step_rows] == list(range(1, steps + 1))
    assert all(r["loss"] == r["loss"] for r in step_rows)  # finite, not NaN


@pytest.mark.parametrize("family", ["ocr-digits", "sd3"])
def test_job_on_one_shared_gpu(tmp_path, redis_url, family):
    out = tmp_path / "out"
    proc = run(gpu_job(tmp_path, f"gpu1-{family}", redis_url, family), out, "--share-gpus", timeout=900)
    check_job(out, proc, 2, "cuda-ipc", {"actor-0": "0", "rollout-0": "0"}, family)


@two_gpus
@pytest.mark.parametrize("family", ["ocr-digits", "sd3"])
def test_job_on_two_gpus_broadcasts_over_nccl(tmp_path, redis_url, family):
    out = tmp_path / "out"
    proc = run(gpu_job(tmp_path, f"gpu2-{family}", redis_url, family), out, timeout=900)
    check_job(out, proc, 2, "nccl", {"actor-0": "0", "rollout-0": "1"}, family)


def test_a_gpu_manifest_needs_the_gpus_or_an_explicit_choice(tmp_path, redis_url):
    job = gpu_job(tmp_path, "gpu-refuse", redis_url, "ocr-digits")
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["roles"]["rollout"]["replicas"] = torch.cuda.device_count()  # + 1 actor GPU = one too many
    job.write_text(yaml.safe_dump(doc))
    proc = run(job, tmp_path / "out")
    assert proc.returncode == USAGE_EXIT and "pass --share-gpus" in proc.stderr, proc.stderr


def test_packed_sd3_job_on_one_shared_gpu(tmp_path, redis_url):
    """`roles.rollout.batching: packed` with `model.resolutions` through the role processes on a GPU
    (bf16 SD3, CFG): three sizes in turn, packed into shared forwards."""
    from e2e.test_packed_job import RESOLUTIONS, check_sizes

    job = gpu_job(tmp_path, "gpu1-packed", redis_url, "sd3")
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["roles"]["rollout"]["batching"] = "packed"
    del doc["spec"]["model"]["resolution"]
    doc["spec"]["model"]["resolutions"] = RESOLUTIONS
    job.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    proc = run(job, out, "--share-gpus", timeout=900)
    check_job(out, proc, 2, "cuda-ipc", {"actor-0": "0", "rollout-0": "0"}, "sd3")
    assert "engine: batching packed" in (out / "logs" / "rollout-0.log").read_text()
    check_sizes(out, 2)
