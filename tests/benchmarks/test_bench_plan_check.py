"""The GPU memory check of `omnirl plan` (`benchmarks/gpu/plan_check.py`) end to end on the CPU with tiny configs:
it builds every component from its config, runs a rollout forward and a training step (LoRA and full fine-tuning),
and returns the plan's prediction beside the measurement (none on the CPU: `torch.cuda.max_memory_allocated`)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from benchmarks.gpu.plan_check import presets, run_preset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan")
    configs = {
        "transformer": {"_class_name": "WanTransformer3DModel", "num_attention_heads": 2, "attention_head_dim": 8,
                        "in_channels": 16, "out_channels": 16, "text_dim": 32, "freq_dim": 16, "ffn_dim": 32,
                        "num_layers": 2},
        "text_encoder": {"architectures": ["UMT5EncoderModel"], "model_type": "umt5", "d_model": 32, "d_ff": 64,
                         "d_kv": 8, "num_heads": 4, "num_layers": 1, "vocab_size": 64, "feed_forward_proj": "gated-gelu"},
        "vae": {"_class_name": "AutoencoderKLWan", "base_dim": 8, "z_dim": 16, "dim_mult": [1, 1, 1, 1],
                "num_res_blocks": 1},
    }
    for name, config in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(("lora", "steady"), [(True, False), (False, False), (False, True)])
def test_a_preset_runs_on_the_cpu_and_reports_the_plans_prediction(tiny, lora, steady):
    doc = copy.deepcopy(presets()["wan-full"][0])
    doc["spec"]["model"]["video"] = {"frames": 5, "height": 32, "width": 32, "fps": 16}
    doc["spec"]["roles"]["rollout"]["maxBatchSize"] = 2
    if lora:
        doc["spec"]["model"]["lora"] = {"enabled": True, "rank": 4, "alpha": 4}
        doc["spec"]["model"]["gradientCheckpointing"] = True
    import torch

    row = run_preset("tiny", doc, tiny, torch.device("cpu"), steady=steady)
    assert row["actor_phase"].startswith("steady state" if steady else "first step")
    assert set(row["predicted_gib"]) == {"rollout", "actor"} and all(v > 0 for v in row["predicted_gib"].values())
    assert all(math.isnan(v) for v in row["measured_gib"].values()) and row["device"] == "cpu"
    assert row["rollout_seconds"] > 0 and row["actor_seconds"] > 0
