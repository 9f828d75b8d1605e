"""`omnirl.models.attention` (`spec.model.attention`): the SDPA backend chosen for a transformer's
blocks reaches eager and compiled blocks, deep copies and the packed forward; what `auto` means."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend
from torch.profiler import ProfilerActivity, profile

from omnirl.models.attention import backends, head_dim, resolve, use_backend

CPU_FLASH_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"


class Block(nn.Module):
    """Self-attention on `[B, H, S, d]` with a projection, so a compiled graph has more than the SDPA call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(F.scaled_dot_product_attention(x, x, x))


def _ops(fn) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def test_a_name_allows_exactly_its_backend():
    assert backends("cudnn") == [SDPBackend.CUDNN_ATTENTION]
    assert backends("math") == [SDPBackend.MATH]
    with pytest.raises(ValueError, match="unknown attention backend 'fa3'.*torch, cudnn, flash"):
        backends("fa3")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_named_backend_runs_inside_eager_and_compiled_blocks(compiled):
    """The selection reaches the block's graph: on the CPU torch runs its flash kernel unless told otherwise."""
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    x = torch.randn(2, 2, 32, 16)
    with torch.no_grad():
        reference = model(x)
        assert CPU_FLASH_OP in _ops(lambda: model(x))  # torch's own choice on the CPU
        assert use_backend(model, ["Block"], "math") == 2
        if compiled:
            for block in model:
                block.compile(dynamic=True)
            model(x)  # compile outside the profiled call
        ops = _ops(lambda: model(x))
        torch.testing.assert_close(model(x), reference, atol=1e-5, rtol=1e-5)
    assert CPU_FLASH_OP not in ops


def test_a_deep_copy_runs_its_own_weights():
    """The actor deep-copies the module (θ_old, reference): a copy's blocks must call their own forward."""
    torch.manual_seed(0)
    model = nn.Sequential(Block())
    use_backend(model, ["Block"], "math")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].proj.weight.zero_()
        twin[0].proj.bias.fill_(3.0)
        out = twin(torch.randn(1, 1, 4, 16))
    assert twin[0].forward.__self__ is twin[0]
    assert torch.equal(out, torch.full_like(out, 3.0))


def test_no_matching_block_or_unknown_backend_is_an_error():
    model = nn.Sequential(Block())
    with pytest.raises(ValueError, match="no submodule of Sequential has a class in"):
        use_backend(model, ["JointTransformerBlock"], "cudnn")
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        use_backend(model, ["Block"], "fast")
    assert use_backend(model, ["JointTransformerBlock"], "torch") == 0  # torch's choice touches nothing


def test_head_dim_and_what_each_value_means_on_the_cpu():
    pytest.importorskip("diffusers")
    from tests.models.test_diffusers import _sd3_pipeline

    transformer = _sd3_pipeline().transformer
    assert head_dim(transformer) == 8
    assert head_dim(nn.Linear(2, 2)) is None  # no config: auto cannot vouch for cuDNN
    assert resolve("auto", "sd3", transformer, "cpu", torch.bfloat16) == "torch"
    assert resolve("torch", "sd3", transformer, "cpu", torch.float32) == "torch"
    assert resolve("math", "sd3", transformer, "cpu", torch.float32) == "math"
    with pytest.raises(ValueError, match="spec.model.attention: cudnn runs on CUDA GPUs only, and this role runs "
                                         "on cpu; set auto or torch"):
        resolve("cudnn", "sd3", transformer, "cpu", torch.bfloat16)


def test_auto_and_cudnn_by_gpu_generation_and_head_dim(monkeypatch):
    """What `resolve` decides per GPU generation and head dim (the GPU's answers stood in for: CI
    has none; the H200 runs the real ones in the GPU tests)."""
    pytest.importorskip("diffusers")
    from types import SimpleNamespace

    from tests.models.test_diffusers import _sd3_pipeline

    transformer = _sd3_pipeline().transformer  # head dim 8
    wide = nn.Linear(2, 2)
    wide.config = SimpleNamespace(attention_head_dim=100)

    def gpu(major, minor, name):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    gpu(9, 0, "NVIDIA H200")
    assert resolve("auto", "sd3", transformer, "cuda", torch.bfloat16) == "cudnn"
    assert resolve("auto", "qwen-image", transformer, "cuda", torch.float16) == "cudnn"
    assert resolve("auto", "flux", transformer, "cuda", torch.bfloat16) == "torch"
    assert resolve("auto", "sd3", transformer, "cuda", torch.float32) == "torch"
    assert resolve("auto", "sd3", wide, "cuda", torch.bfloat16) == "torch"
    with pytest.raises(ValueError, match="multiples of 8 up to 128, and this model's attention_head_dim is 100"):
        resolve("cudnn", "sd3", wide, "cuda", torch.bfloat16)
    gpu(10, 0, "NVIDIA B200")  # not measured: auto leaves it to torch, cudnn is the user's call
    assert resolve("auto", "sd3", transformer, "cuda", torch.bfloat16) == "torch"
    assert resolve("cudnn", "sd3", transformer, "cuda", torch.bfloat16) == "cudnn"
    gpu(7, 0, "Tesla V100-SXM2-32GB")
    assert resolve("auto", "sd3", transformer, "cuda", torch.bfloat16) == "torch"
    with pytest.raises(ValueError, match=r"compute capability 8.0 or newer \(Ampere\+\), and Tesla V100-SXM2-32GB "
                                         "has 7.0; set auto or torch"):
        resolve("cudnn", "sd3", transformer, "cuda", torch.bfloat16)


def test_the_packed_forward_runs_the_blocks_backend():
    """`sd3_packed_forward` calls SDPA itself (outside the block's forward): it must enter the block's selection."""
    pytest.importorskip("diffusers")
    from tests.models.test_sd3_packed import RESOLUTIONS, _adapter, _inputs

    adapter = _adapter(torch.float32, "cpu")
    xs, sigma, cond = _inputs(adapter)
    with torch.no_grad():
        reference = adapter.velocity_packed(xs, sigma, cond)
        assert CPU_FLASH_OP in _ops(lambda: adapter.velocity_packed(xs, sigma, cond))
        assert use_backend(adapter.module, adapter.compile_block_types, "math") == 2
        ops = _ops(lambda: adapter.velocity_packed(xs, sigma, cond))
        got = adapter.velocity_packed(xs, sigma, cond)
    assert CPU_FLASH_OP not in ops
    assert len(got) == len(RESOLUTIONS)
    for a, b in zip(got, reference, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name,kernel", [("cudnn", "cudnn"), ("flash", "flash")])
def test_the_named_kernel_runs_in_a_compiled_block_on_cuda(name, kernel):
    """Head dim 64 bf16, as SD3.5: the compiled graph holds the named backend's kernel."""
    torch.manual_seed(0)

    class Wide(nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x) * 2

    model = nn.Sequential(Wide()).cuda()
    x = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
    reference = F.scaled_dot_product_attention(x.float(), x.float(), x.float()) * 2
    use_backend(model, ["Wide"], name)
    model[0].compile(dynamic=True)
    with torch.no_grad():
        model(x)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = model(x)
            torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    assert kernel in names, names
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)


def check_cudnn_matches_torchs_choice(adapter, x, sigma, cond) -> None:
    """bf16 on CUDA: the velocity and its input gradient with cuDNN attention in the adapter's
    blocks equal torch's own choice's (relative error norm, bf16 rounding), and cuDNN's kernel
    runs. Used by each diffusers family's GPU test (`CUDNN_FAMILIES` are the ones that pass)."""
    x = x.clone().requires_grad_()
    v_ref = adapter.velocity(x, sigma, cond)
    (g_ref,) = torch.autograd.grad(v_ref.square().mean(), x)
    use_backend(adapter.module, adapter.compile_block_types, "cudnn")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        v = adapter.velocity(x, sigma, cond)
        (g,) = torch.autograd.grad(v.square().mean(), x)
        torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    assert "cudnn" in names, names
    assert ((v - v_ref).norm() / v_ref.norm()).item() < 2e-2
    assert ((g - g_ref).norm() / g_ref.norm()).item() < 5e-2
