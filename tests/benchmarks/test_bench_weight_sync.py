"""The weight-sync benchmark on CPU/gloo: TINY SD3 transformer, one spawned rollout process.

Checks that what the benchmark times is a real, complete sync: after it, the rollout process's
tensors equal the actor's bit for bit (every LoRA tensor; every state_dict entry for the full
case), they differed before, the reported payload is the sum of the tensor bytes, and a failing
rollout child surfaces as an exception carrying its own error.
"""

from __future__ import annotations

import pytest
import torch
from benchmarks.gpu.model import TINY, build_transformer
from benchmarks.gpu.weight_sync import (
    MB,
    RolloutChild,
    RolloutChildError,
    measure_weight_sync,
    plan_placement,
)
from safetensors.torch import load_file

from omnirl.models.diffusers.sd3 import SD3_LORA_TARGETS

LORA_RANK = 4


def _load(tmp_path, case: str, tag: str) -> dict[str, torch.Tensor]:
    return load_file(str(tmp_path / f"{case}_{tag}.safetensors"))


def test_tiny_cpu_sync_is_complete_and_exact(tmp_path) -> None:
    torch.set_num_threads(1)
    out = measure_weight_sync(TINY, "cpu", lora_rank=LORA_RANK, repeats=1, dump_dir=tmp_path, timeout_s=60)

    assert out["backend"] == "gloo" and out["transport"] == "cpu" and out["rollout_device"] == "cpu"
    rows = {r["case"]: r for r in out["cases"]}
    for case in ("full", "lora"):
        actor, after, before = (_load(tmp_path, case, t) for t in ("actor", "rollout", "rollout_before"))
        assert sorted(after) == sorted(actor)
        assert all(torch.equal(after[k], actor[k]) for k in actor), f"{case}: rollout differs after sync"
        assert any(not torch.equal(before[k], actor[k]) for k in actor), f"{case}: no change to verify"
        nbytes = sum(t.numel() * t.element_size() for t in actor.values())
        assert round(out[f"{case}_payload_mb"] * MB) == nbytes
        assert rows[case]["tensors"] == len(actor)
        assert out[f"{case}_sync_seconds"] > 0 and len(out[f"{case}_sync_seconds_all"]) == 1
        assert rows[case]["first_sync_s"] > 0
    lora = _load(tmp_path, "lora", "actor")
    plain = build_transformer(TINY, "cpu", torch.bfloat16)
    targets = [n for n, m in plain.named_modules() if isinstance(m, torch.nn.Linear)
               and any(n == t or n.endswith("." + t) for t in SD3_LORA_TARGETS)]
    assert sorted(lora) == sorted(f"{n}.lora_{ab}.default.weight" for n in targets for ab in "AB")
    assert all(t.shape[0] == LORA_RANK for k, t in lora.items() if ".lora_A." in k)
    full = _load(tmp_path, "full", "actor")
    assert sum(t.numel() for t in full.values()) == 183_328  # TINY's parameter + buffer count
    assert rows["full"]["group_build_s"] > 0 and rows["lora"]["group_build_s"] == 0.0  # group reused


def test_plan_placement_rejects_impossible_pairs() -> None:
    assert plan_placement("cpu") == plan_placement("cpu", "gloo")
    assert plan_placement("cpu").rollout_device == "cpu"
    with pytest.raises(ValueError, match="nccl"):
        plan_placement("cpu", "nccl")
    with pytest.raises(ValueError, match="hccl"):
        plan_placement("cpu", "hccl")
    with pytest.raises(ValueError, match="cpu"):
        plan_placement("meta")


def test_child_failure_surfaces_its_error() -> None:
    child = RolloutChild({"config": {"no_such_option": 1}, "device": "cpu", "port": 1, "backend": "gloo",
                    "lora_rank": LORA_RANK, "timeout_s": 5})
    try:
        with pytest.raises(RolloutChildError, match="no_such_option"):
            child.reply(timeout_s=60)
    finally:
        child.stop()
    assert not child.proc.is_alive()
