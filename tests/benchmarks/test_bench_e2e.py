"""benchmarks/gpu/e2e.py on its CPU path (tiny SD3, eager): the in-process RL step runs end to end
(it went stale once, unnoticed, when `flow_grpo_step` gained an argument)."""

import pytest
import torch

pytest.importorskip("diffusers")

from benchmarks.gpu import e2e  # noqa: E402
from benchmarks.gpu.model import TINY  # noqa: E402


def test_the_baseline_step_runs_rollout_reward_update_and_sync():
    torch.set_num_threads(1)
    out = e2e.run_config("baseline", TINY, torch.device("cpu"), steps=2, prompts=1, side=64, denoise_steps=8)
    assert [r["step"] for r in out["steps"]] == [0, 1]
    assert all(r["images"] == 8 for r in out["steps"])  # one prompt × group 8, every sample back
    assert all(r["loss"] == r["loss"] for r in out["steps"])  # finite
    assert out["step_seconds"] == out["steps"][1]["seconds"]  # step 0 is the warm-up
