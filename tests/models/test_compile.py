"""Regional compilation: same samples as eager, and a changing batch size never recompiles."""

import pytest
import torch
from torch import nn

from omnirl.models.compile import block_types, compile_adapter_module, compile_blocks
from omnirl.models.registry import load_adapter
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest


def _rollout(adapter, n: int, max_batch: int) -> list:
    ids = tuple(adapter.tokenize('"1234"'))
    engine = RolloutEngine(adapter, max_batch_size=max_batch)
    for i in range(n):
        engine.submit(SampleRequest(f"s{i}", "", ids, seed=i, num_steps=4, window=(0, 1), noise_level=0.7))
    return sorted(engine.run_until_idle(), key=lambda r: r.request.sample_id)


@pytest.mark.slow
def test_compiled_blocks_match_eager_and_do_not_recompile_on_new_batch_sizes():
    from torch._dynamo.utils import counters

    torch.set_num_threads(1)
    torch._dynamo.reset()
    adapter = load_adapter("ocr-digits", "builtin")
    eager = _rollout(adapter, 6, 4)  # batches of 4 then 2
    assert compile_adapter_module(adapter) == len(adapter.module.blocks)
    compiled = _rollout(adapter, 6, 4)
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(b.x0, a.x0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.log_probs, a.log_probs, atol=1e-5, rtol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    _rollout(adapter, 5, 5)  # batch sizes 5 (and the state dict is untouched by compile)
    assert counters["stats"]["unique_graphs"] == graphs
    assert not any("_orig_mod" in k for k in adapter.module.state_dict())


def test_block_types_come_from_the_adapter_or_diffusers_attribute():
    class Model(nn.Module):
        _repeated_blocks = ["Linear"]

    assert block_types(Model()) == ["Linear"]
    assert block_types(nn.Sequential(), ["Block"]) == ["Block"]
    with pytest.raises(ValueError, match="compile_block_types"):
        block_types(nn.Sequential())


def test_compile_blocks_refuses_names_that_match_nothing():
    with pytest.raises(ValueError, match="nothing to compile"):
        compile_blocks(nn.Sequential(nn.Linear(2, 2)), ["JointTransformerBlock"])


def test_blocks_compile_with_the_inductor_options_unless_a_mode_is_named(monkeypatch):
    """Every block gets `INDUCTOR_OPTIONS` (torch accepts them: the compiled block runs and equals
    eager); a named mode replaces them, since torch.compile refuses mode and options together."""
    from omnirl.models.compile import INDUCTOR_OPTIONS

    seen = []
    real = nn.Module.compile

    def spy(self, *args, **kwargs):
        seen.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "compile", spy)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    eager = model(x)
    assert compile_blocks(model, ["Linear"]) == 2
    assert seen == [{"dynamic": True, "options": INDUCTOR_OPTIONS}] * 2
    torch.testing.assert_close(model(x), eager)
    seen.clear()
    compile_blocks(nn.Sequential(nn.Linear(4, 4)), ["Linear"], mode="max-autotune-no-cudagraphs")
    assert seen == [{"dynamic": True, "mode": "max-autotune-no-cudagraphs"}]


def test_blocks_sharded_by_fsdp2_are_found_and_compiled():
    """The actor compiles after FSDP2 sharding, which swaps each block's class for `FSDP<Name>`: the
    class-name match found none, so `examples/gpu-sd3-flowgrpo.yaml` (two actor ranks, `compile: true`)
    stopped every actor rank at start with "no submodule of FSDPSD3Transformer2DModel has a class in
    ['JointTransformerBlock']; nothing to compile". A gloo group of one rank shards for real."""
    import socket

    import torch.distributed as dist
    from tests.actor.test_fsdp import Tiny

    from omnirl.actor.fsdp import shard_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = shard_model(Tiny(), 1)
        assert [type(b).__name__ for b in model.blocks] == ["FSDPBlock", "FSDPBlock"]
        assert compile_blocks(model, ["Block"]) == 2
        assert all(b._compiled_call_impl is not None for b in model.blocks)  # nn.Module.compile's mark
        assert model.inp._compiled_call_impl is None  # only the blocks
    finally:
        dist.destroy_process_group()


# run in a fresh process, as a restarted role is: compiles the digits model's blocks, samples, and
# prints Inductor's FX-graph cache counters
_COMPILE_ONCE = """
import json, torch
from torch._dynamo.utils import counters
from omnirl.models.compile import compile_adapter_module
from tests.helpers import tiny_adapter
from tests.models.test_compile import _rollout
torch.set_num_threads(1)
adapter = tiny_adapter()
compile_adapter_module(adapter)
_rollout(adapter, 2, 2)
print(json.dumps({k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}))
"""


@pytest.mark.slow
def test_a_restarted_process_reuses_the_compiled_kernels_in_the_cache_the_operator_points_at(tmp_path):
    """The operator sets `TORCHINDUCTOR_CACHE_DIR` to `<run volume>/cache/inductor` for a compiled
    job's model pods (`omnirl.api.runtime.COMPILE_CACHE`). A second process on the same cache (a pod
    restarted on the run volume) loads every compiled graph (hits = the first's misses) and compiles
    none, as the first did on its empty cache (a container's fresh /tmp)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from omnirl.api.runtime import COMPILE_CACHE, INDUCTOR_CACHE_VARIABLE

    root = Path(__file__).resolve().parents[2]

    def counters_of(cache: Path) -> dict:
        env = {**os.environ, INDUCTOR_CACHE_VARIABLE: str(cache),
               "PYTHONPATH": os.pathsep.join([str(root / "services"), str(root)])}
        done = subprocess.run([sys.executable, "-c", _COMPILE_ONCE], env=env, capture_output=True, text=True,
                              timeout=600, cwd=root)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    volume = tmp_path / "run-volume" / COMPILE_CACHE
    first = counters_of(volume)
    assert first.get("fxgraph_cache_miss", 0) >= 1 and first.get("fxgraph_cache_hit", 0) == 0, first
    restarted = counters_of(volume)
    assert restarted.get("fxgraph_cache_hit", 0) == first["fxgraph_cache_miss"], restarted
    assert restarted.get("fxgraph_cache_miss", 0) == 0, restarted
