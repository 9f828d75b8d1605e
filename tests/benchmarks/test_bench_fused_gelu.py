"""The fused feed-forward GELU experiment (`benchmarks.gpu.fused_gelu`): the formula, which modules
it takes, and that compiled blocks keep it in one graph (what the H200 measurement relies on)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from benchmarks.gpu.fused_gelu import fuse_feedforward_gelu, linear_gelu_tanh, unfuse_feedforward_gelu
from benchmarks.gpu.model import TINY, BenchSD3Adapter, build_transformer

from omnirl.api.spec import LoRASpec
from omnirl.models.lora import inject_lora

TINY_GELUS = 5
"""TINY has 3 blocks, each with a feed-forward; the last is context_pre_only (no ff_context): 3 + 2."""


def _adapter() -> BenchSD3Adapter:
    return BenchSD3Adapter(build_transformer(TINY, "cpu", torch.float32), resolution=(64, 64), text_tokens=7,
                           attention="torch")


def _velocity(adapter: BenchSD3Adapter, batch: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 16, 8, 8, generator=g)
    cond = adapter.encode([adapter.tokenize(f"p{i}") for i in range(batch)], "cpu")
    with torch.no_grad():
        return adapter.velocity(x, torch.full((batch,), 0.7), cond)


def test_linear_gelu_tanh_is_the_tanh_formula():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(3, 4, 8, generator=g), torch.randn(16, 8, generator=g), torch.randn(16, generator=g)
    z = x @ w.T + b
    closed = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    got = linear_gelu_tanh(x, w, b)
    assert got.shape == (3, 4, 16)
    torch.testing.assert_close(got, closed, atol=1e-5, rtol=1e-5)
    assert (got - F.gelu(z, approximate="none")).abs().max() > 1e-4  # the tanh form, not the exact GELU


def test_fusing_takes_every_feed_forward_and_keeps_the_velocity_and_names():
    adapter = _adapter()
    names = list(adapter.module.state_dict())
    before = _velocity(adapter)
    assert fuse_feedforward_gelu(adapter.module) == TINY_GELUS
    assert list(adapter.module.state_dict()) == names  # weight sync binds the same tensor names
    torch.testing.assert_close(_velocity(adapter), before, atol=1e-6, rtol=1e-6)
    assert unfuse_feedforward_gelu(adapter.module) == TINY_GELUS and fuse_feedforward_gelu(adapter.module) == TINY_GELUS


def test_a_lora_wrapped_feed_forward_is_left_unfused():
    adapter = _adapter()
    inject_lora(adapter.module, LoRASpec(enabled=True, rank=4, alpha=8), ["ff.net.0.proj"])
    assert fuse_feedforward_gelu(adapter.module) == TINY_GELUS - 3  # the 3 image-stream ff's carry LoRA


@pytest.mark.slow  # 20-70 s on 2 cores: make test-slow
def test_compiled_blocks_keep_the_fused_op_in_one_graph():
    from omnirl.models.compile import compile_adapter_module

    adapter = _adapter()
    before = _velocity(adapter)
    fuse_feedforward_gelu(adapter.module)
    torch._dynamo.reset()
    compile_adapter_module(adapter)
    for batch in (2, 3):  # dynamic shapes: a second batch size runs too
        v = _velocity(adapter, batch)
    torch.testing.assert_close(v[:2], before, atol=1e-4, rtol=1e-4)
    block = next(m for m in adapter.module.modules() if type(m).__name__ == "JointTransformerBlock")
    whole = torch.compile(block.forward, fullgraph=True, dynamic=True)  # raises on a graph break
    h, c, temb = torch.randn(2, 16, 16), torch.randn(2, 7, 16), torch.randn(2, 16)
    with torch.no_grad():
        whole(h, c, temb)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fused_op_matches_addmm_then_gelu():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16, generator=g) / 16
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16, generator=g)
    ref = F.gelu(F.linear(x.float(), w.float(), b.float()), approximate="tanh")
    fused, unfused = linear_gelu_tanh(x, w, b).float(), F.gelu(F.linear(x, w, b), approximate="tanh").float()
    # the fused op rounds once (from the fp32 accumulator), the unfused twice: no farther from fp32
    assert (fused - ref).norm() <= (unfused - ref).norm() * 1.01
    assert (fused - ref).abs().max() < 3e-2
