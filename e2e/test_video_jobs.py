"""Whole video and audio+video RLJobs through the role processes on the CPU: tiny `wan`, `ltx2` and `minimax-h3`
pipelines saved locally (`tests/video_models.py`), trained a couple of steps with FlowGRPO (the joint SDE over the
flat latent) and DiffusionNFT, with the media rewards, validation writing MP4s with sound, and `omnirl export` of
the run loading back into the family's own diffusers pipeline. Slow (`make test-omni`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from e2e.test_local_job import ROOT, assert_each_sample_once, run

pytest.importorskip("diffusers")

pytestmark = [pytest.mark.slow, pytest.mark.omni]

CLIPS = {"wan": {"frames": 9, "height": 16, "width": 16, "fps": 8.0},
         "ltx2": {"frames": 9, "height": 32, "width": 32, "fps": 25.0},
         "minimax-h3": {"frames": 124, "height": 32, "width": 32, "fps": 24.0}}
REWARDS = {  # what each family's samples can be scored on (a tiny random model draws noise: rewards that vary)
    "wan": [{"name": "smooth", "kind": "temporal-consistency"},
            {"name": "frames_jpeg", "kind": "frames", "weight": 0.01,
             "params": {"kind": "jpeg", "innerParams": '{"quality": 90}', "frameStride": 4}}],
    "ltx2": [{"name": "smooth", "kind": "temporal-consistency"},
             {"name": "loud", "kind": "audio-signal", "params": {"measure": "loudness"}}],
    "minimax-h3": [{"name": "smooth", "kind": "temporal-consistency"},
                   {"name": "quiet", "kind": "audio-signal", "params": {"measure": "silence", "silenceDb": -20.0}}],
}


def video_job(tmp: Path, family: str, redis_url: str, *, algorithm: str = "flow-grpo", steps: int = 2,
              model_dir: Path | None = None, accelerator: dict | None = None) -> Path:
    """A tiny `family` job: 2 prompts x 2 samples a step, 3 denoising steps, LoRA, validation every 2 steps."""
    if model_dir is None:
        from tests.video_models import save_tiny

        model_dir = save_tiny(family, tmp / f"tiny-{family}")
    name = f"{family}-{algorithm}".replace("_", "-")
    algo: dict = {"name": algorithm, "steps": steps, "groupSize": 2, "promptsPerStep": 2,
                  "sampling": {"numSteps": 3, "guidanceScale": 1.0 if family == "minimax-h3" else 2.0},
                  "optimizer": {"learningRate": 1e-4, "microBatchSize": 2, "updatesPerStep": 1}}
    if algorithm == "flow-grpo":
        algo["flowGrpo"] = {"window": {"size": 1, "range": [0, 2]}, "clipRange": 1e-3}
    doc = {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name},
           "spec": {"model": {"family": family, "path": str(model_dir), "dtype": "float32", "video": CLIPS[family],
                              "lora": {"enabled": True, "rank": 4, "alpha": 8}},
                    "data": {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt"),
                             "validationPrompts": str(ROOT / "examples/prompts/ocr-heldout.txt")},
                    "algorithm": algo, "reward": REWARDS[family],
                    "pipeline": {"mode": "async-reward", "maxStaleness": 1},
                    "validation": {"everySteps": steps, "numSteps": 3, "maxPrompts": 2},
                    "checkpoint": {"everySteps": steps, "keep": 1},
                    "transferQueue": {"redisUrl": redis_url, "claimIdleSeconds": 60}}}
    if accelerator is not None:
        doc["spec"]["roles"] = {"rollout": {"replicas": 1, "accelerator": accelerator},
                                "actor": {"replicas": 1, "accelerator": accelerator}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def check_video_run(out: Path, proc, steps: int, family: str) -> None:
    """Exit 0, every sample scored and trained once, finite losses, the validation's MP4s and contact sheet."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert_each_sample_once(out, steps * 2 * 2)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in records if r["event"] == "step"]
    assert [r["policy_version"] for r in step_rows] == list(range(1, steps + 1))
    assert all(r["loss"] == r["loss"] for r in step_rows)  # finite, not NaN
    videos = sorted(out.glob("samples/**/*.mp4"))
    assert videos and all(v.stat().st_size > 0 for v in videos), sorted(p.name for p in out.rglob("*"))[:40]
    if family != "wan":  # audio+video: the MP4 carries a sound stream
        import subprocess

        from omnirl.controller.media_files import ffmpeg_exe

        probe = subprocess.run([ffmpeg_exe(), "-i", str(videos[0])], capture_output=True, text=True)
        assert "Audio:" in probe.stderr and "Video:" in probe.stderr, probe.stderr[-2000:]


@pytest.mark.parametrize("family, algorithm", [(f, a) for f in ("wan", "ltx2", "minimax-h3")
                                                for a in ("flow-grpo", "diffusion-nft")] + [("wan", "awm")])
def test_video_job_trains_through_the_roles_and_writes_mp4s(tmp_path, redis_url, family, algorithm):
    torch.set_num_threads(1)
    out = tmp_path / "out"
    proc = run(video_job(tmp_path, family, redis_url, algorithm=algorithm), out, timeout=900)
    check_video_run(out, proc, 2, family)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algorithm", ["flow-grpo", "diffusion-nft"])
@pytest.mark.parametrize("family", ["wan", "ltx2"])
def test_video_job_on_one_shared_gpu(tmp_path, redis_url, family, algorithm):
    """Tiny `wan` / `ltx2` jobs in bfloat16 with rollout and actor on one GPU (`--share-gpus`: the weight broadcast
    over CUDA IPC), the media rewards on the CPU: every sample scored and trained once, MP4s written."""
    path = video_job(tmp_path, family, redis_url, algorithm=algorithm,
                     accelerator={"type": "nvidia", "count": 1})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["model"]["dtype"] = "bfloat16"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    proc = run(path, out, "--share-gpus", timeout=900)
    check_video_run(out, proc, 2, family)
    assert "weight sync over cuda-ipc" in (out / "logs" / "actor-0.log").read_text()
    assert "rollout on cuda:0" in (out / "logs" / "rollout-0.log").read_text()
