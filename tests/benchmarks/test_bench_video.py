"""The video benchmark (`benchmarks.gpu.video`) on the CPU: Wan's FLOP formula against torch's own count and a closed
form, the `--smoke` run writing every key, and a budget too small for any part recording what it skipped."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("diffusers")

from benchmarks.gpu.flops import wan_forward_flops  # noqa: E402
from benchmarks.gpu.video import HEADLINE, PARTS, SMOKE_RECIPE, WAN21_T2V_1_3B, WAN_TINY  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("config", "thw", "text"), [(WAN_TINY, (3, 8, 12), 7), (WAN21_T2V_1_3B, (9, 30, 52), 512)])
def test_wan_formula_matches_flop_counter(config, thw, text):
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):  # the counter sees the SDPA calls on meta (the CPU's flash kernel goes uncounted)
        module = WanTransformer3DModel(**config)
    batch = 2
    x = torch.randn(batch, 16, *thw, device="meta")
    embeds = torch.randn(batch, text, config["text_dim"], device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(hidden_states=x, timestep=torch.full((batch,), 500.0, device="meta"), encoder_hidden_states=embeds,
               return_dict=False)
    assert counter.get_total_flops() == batch * wan_forward_flops(config, thw, text)


def test_wan_formula_closed_form():
    # WAN_TINY at latent 3x8x12, 7 text tokens: N = 3*4*6 = 72, D = 24, F = 32, X = 32, f = 256, C = 16, p = 1*2*2
    n, t, d, f, x, freq, c, p = 72, 7, 24, 32, 32, 256, 16, 4
    block = 8 * n * d * d + 4 * n * n * d + 4 * n * d * d + 4 * t * d * d + 4 * n * t * d + 4 * n * d * f
    total = 2 * n * c * p * d + 2 * (freq * d + d * d) + 12 * d * d + 2 * t * (x * d + d * d) + 2 * block + 2 * n * d * c * p
    assert total == 3_043_584
    assert wan_forward_flops(WAN_TINY, (3, 8, 12), 7) == total
    # Wan2.1-1.3B at flow_grpo's 33 frames x 240x416 (latent 9x30x52: 3,510 tokens), 512 text tokens
    assert wan_forward_flops(WAN21_T2V_1_3B, (9, 30, 52), 512) == 11_535_310_209_024


def test_wan_formula_rejects_a_size_off_the_patch_grid():
    with pytest.raises(ValueError, match=r"patch_size \(1, 2, 2\)"):
        wan_forward_flops(WAN21_T2V_1_3B, (9, 31, 52), 512)
    with pytest.raises(ValueError, match="text_tokens"):
        wan_forward_flops(WAN21_T2V_1_3B, (9, 30, 52), 0)


def smoke(tmp_path: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.video", "--smoke", "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work"), *args], capture_output=True, text=True, timeout=840,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = (tmp_path / "out").glob("*-cpu-tiny.json")
    data = json.loads(path.read_text())
    assert "headline" not in data  # a smoke run's numbers go into no headline
    return data["video"]


def test_a_budget_too_small_skips_every_part_and_says_so(tmp_path):
    video = smoke(tmp_path, "--budget-s", "0")
    assert video["headline"] == dict.fromkeys(HEADLINE)
    assert set(video["skipped"]) == set(PARTS)
    assert all(why.startswith("did not fit: ") for why in video["skipped"].values()), video["skipped"]


@pytest.mark.slow
def test_smoke_run_writes_every_number(tmp_path):
    video = smoke(tmp_path, "--budget-s", "800")
    assert video["skipped"] == {}
    assert set(video["headline"]) == set(HEADLINE)
    assert all(isinstance(v, float) and math.isfinite(v) for v in video["headline"].values()), video["headline"]
    rollout = video["rollout"]
    # 4 samples x 3 steps x 2 CFG rows of Wan's forward at the smoke clip (5 frames of 32x32: latent 2x4x4)
    assert rollout["flops"] == 4 * SMOKE_RECIPE["steps"] * 2 * wan_forward_flops(WAN_TINY, (2, 4, 4), 16)
    assert rollout["video_rollout_mfu"] == pytest.approx(
        rollout["flops"] / rollout["optimised"]["seconds"] / (video["matmul_peak_tflops"] * 1e12))
    assert rollout["video_speedup_vs_eager"] == pytest.approx(rollout["eager"]["seconds"]
                                                              / rollout["optimised"]["seconds"])
    assert [s["samples"] for s in video["inprocess"]["steps"]] == [4, 4]
    assert len(video["service"]["steps"]) == 2 and video["service"]["samples"] == 4
    ltx2 = video["ltx2"]
    assert set(ltx2["runs"]) == {"1_blocks", "3_blocks"} and ltx2["runs"]["3_blocks"]["parameters"] > \
        ltx2["runs"]["1_blocks"]["parameters"]
