"""An experiment, not in the product: the feed-forward's tanh-GELU in the first GEMM's epilogue.

In a compiled DiT block the feed-forward's first projection writes a [tokens, 4·dim] activation
that a separate Inductor kernel reads and writes again to apply GELU (~1 GB per block at
SD3.5-Medium's 512² batch 32). `torch._addmm_activation(bias, x, W.T, use_gelu=True)` asks
cuBLASLt for its GELU_BIAS epilogue, which applies the tanh approximation to the fp32 accumulator
before the single store. The call is a custom op so that Inductor keeps it whole.

Measured on the H200 (benchmarks/README.md, "The rest of the gap to 65%"): the compiled forward is
1.04× faster, but a rollout fused this way no longer computes what the unfused actor computes:
rollout-vs-actor |Δ log_prob| grows from ≤ 1e-6 to 1e-5…1e-4 over the trained steps (more with
CFG), the size of FlowGRPO's clip range, which matters under `bypass`. Fusing the actor too needs
the pre-activation in the backward (one more GEMM per feed-forward), which costs the actor what
the rollout gains. So the product keeps torch's GELU; `python -m benchmarks.gpu.attention
--variants frozen,frozen+gelu`, `python -m benchmarks.gpu.run --sections rollout --fused-gelu` and
`python -m benchmarks.gpu.logprob_mismatch --fused-gelu` reproduce the numbers.
"""

from __future__ import annotations

from types import MethodType

import torch
import torch.nn.functional as F
from diffusers.models.activations import GELU
from torch import Tensor, nn


@torch.library.custom_op("omnirl_bench::linear_gelu_tanh", mutates_args=())
def linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """`gelu(x @ weight.T + bias, approximate="tanh")` in one cuBLASLt call on CUDA; the tanh form
    is Hendrycks & Gimpel 2016, "Gaussian Error Linear Units": 0.5·z·(1 + tanh(√(2/π)·(z + 0.044715·z³))).

    Args:
        x: `[..., in]` activations (bf16/fp16/fp32).
        weight: `[out, in]`, same dtype and device as `x`.
        bias: `[out]`.
    Returns:
        `[..., out]`, dtype of `x` (off CUDA: the same formula, unfused).
    """
    if x.device.type != "cuda":  # CPU's _addmm_activation applies the exact (erf) GELU, not the tanh form
        return F.gelu(F.linear(x, weight, bias), approximate="tanh")
    flat = x.reshape(-1, x.shape[-1])
    return torch._addmm_activation(bias, flat, weight.t(), use_gelu=True).reshape(*x.shape[:-1], weight.shape[0])


@linear_gelu_tanh.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _fused_forward(self, hidden_states: Tensor) -> Tensor:
    return linear_gelu_tanh(hidden_states, self.proj.weight, self.proj.bias)


def fusable(module: nn.Module) -> bool:
    """A diffusers `GELU(approximate="tanh")` whose `proj` is a plain biased `nn.Linear` (not LoRA-wrapped)."""
    return (isinstance(module, GELU) and module.approximate == "tanh" and type(module.proj) is nn.Linear
            and module.proj.bias is not None)


def fuse_feedforward_gelu(module: nn.Module) -> int:
    """Route every fusable feed-forward GELU of `module` through `linear_gelu_tanh`, in place
    (forward only: no backward is registered). Parameter names are unchanged. Call before
    compiling the blocks. Returns how many were fused (0 for a model with no such module)."""
    count = 0
    for m in module.modules():
        if fusable(m):
            m.forward = MethodType(_fused_forward, m)
            count += 1
    return count


def unfuse_feedforward_gelu(module: nn.Module) -> int:
    """Undo `fuse_feedforward_gelu` in place (the module's own forward again); returns how many."""
    count = 0
    for m in module.modules():
        if fusable(m) and vars(m).pop("forward", None) is not None:
            count += 1
    return count
