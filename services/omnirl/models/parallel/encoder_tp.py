"""Tensor parallelism of a text encoder ("ETP") over some of a replica's ranks, with DTensor plans.

A 32B text encoder (MiniMax-H3's Qwen3-VL-32B, ~67 GB in bf16) does not fit beside the DiT on one GPU; split
over `E` ranks it is 1/E per rank. `shard_encoder(model, mesh)` applies Megatron's split (Shoeybi et al.,
arXiv 1909.08053 §3) with `torch.distributed.tensor.parallel.parallelize_module`: each attention's query, key
and value projections column-wise (each rank computes heads / E heads) and its output projection row-wise
(partial sums all-reduced), each MLP's input projections column-wise and its output projection row-wise, and
T5's relative-position bias table column-wise (its heads). Outputs are ordinary tensors again
(`use_local_output`), so the rest of the model and the adapter see the unsplit hidden states; the attention
code reshapes with `-1` heads (transformers 5.x: T5, CLIP, Gemma 3, Qwen, Llama) or with a head count
attribute that is set to the local one (`HEAD_ATTRIBUTES`: UMT5's `n_heads`).

The plan is found from module names (`encoder_plan`): T5/UMT5 (`SelfAttention.{q,k,v,o,relative_attention_bias}`,
`DenseReluDense.{wi,wi_0,wi_1,wo}`), CLIP (`self_attn.{q,k,v,out}_proj`, `mlp.fc{1,2}`), and the Llama-style
decoders (`self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`: Gemma 3, Qwen2/2.5-VL, Qwen3/3-VL). A vision
tower of a vision-language encoder is left whole (prompts are text).

Every call of a sharded encoder is a collective over its `E` ranks: they must encode the same prompts in the
same order (a replica's ranks mirror one another's calls; the adapters' prompt cache then hits alike on all).
"""

from __future__ import annotations

import re

import torch.distributed as dist
from torch import nn

_COLWISE = re.compile(r"(\.|^)(SelfAttention\.(q|k|v|relative_attention_bias)|DenseReluDense\.(wi|wi_0|wi_1)"
                      r"|self_attn\.(q_proj|k_proj|v_proj)|mlp\.(gate_proj|up_proj|fc1))$")
_ROWWISE = re.compile(r"(\.|^)(SelfAttention\.o|DenseReluDense\.wo|self_attn\.(o_proj|out_proj)|mlp\.(down_proj|fc2))$")
_VISION = re.compile(r"(^|\.)(visual|vision_tower|vision_model|vision_encoder)(\.|$)")


def encoder_plan(model: nn.Module) -> dict[str, str]:
    """Module name → `"colwise"` or `"rowwise"` for every layer `shard_encoder` splits (text part only)."""
    plan = {}
    for name, module in model.named_modules():
        if _VISION.search(name) or not isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        if _COLWISE.search(name):
            plan[name] = "colwise"
        elif _ROWWISE.search(name) and isinstance(module, nn.Linear):
            plan[name] = "rowwise"
    return plan


def shard_encoder(model: nn.Module, mesh) -> int:
    """Split `model`'s attention and MLP layers over the 1-D DeviceMesh `mesh` (a collective over its ranks).

    Args:
        model: a transformers text encoder, every rank holding the same weights.
        mesh: a 1-D DeviceMesh of the `E` ranks that share the encoder (`encoder_mesh`).
    Returns:
        The number of layers split.
    Raises:
        ValueError: nothing to split (an architecture without a plan), or a layer whose split dimension does
            not divide by E (the heads or the MLP width: `layout.check_layout` says so before any role starts).
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = encoder_plan(model)
    if not plan:
        raise ValueError(f"{type(model).__name__} has no layer encoder tensor parallelism splits (no T5, CLIP or "
                         "Llama-style attention and MLP names)")
    size = mesh.size()
    modules = dict(model.named_modules())
    for name, style in plan.items():
        module = modules[name]
        # the split dimension: a column-wise Linear's outputs, an Embedding's columns, a row-wise Linear's inputs
        dim = module.weight.shape[0 if style == "colwise" and isinstance(module, nn.Linear) else 1]
        if dim % size:
            raise ValueError(f"{name}: {dim} does not divide by the encoder's tensor-parallel degree {size}")
    styles = {name: ColwiseParallel() if style == "colwise" else RowwiseParallel() for name, style in plan.items()}
    parallelize_module(model, mesh, styles)
    _local_heads(model, plan, size)
    return len(plan)


HEAD_ATTRIBUTES = ("n_heads", "num_heads", "num_key_value_heads", "inner_dim")
"""Attention attributes that count heads (or heads × head dim): UMT5 reshapes with `self.n_heads`, so a
split attention must say its local count."""


def _local_heads(model: nn.Module, plan: dict[str, str], size: int) -> None:
    """Divide the head counts of every attention whose projections were split by `size`."""
    owners = {name.rsplit(".", 1)[0] for name, style in plan.items() if style == "colwise"}
    for name in owners:
        module = model.get_submodule(name)
        for attr in HEAD_ATTRIBUTES:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(module, attr, value // size)


def encoder_mesh(degree: int, device_type: str):
    """The 1-D DeviceMesh of this rank's encoder group: the default group's ranks in consecutive groups of
    `degree` (a replica's ranks are consecutive, so each group lies inside one replica). A collective.

    Raises:
        ValueError: `degree` does not divide the default group's size.
    """
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world % degree:
        raise ValueError(f"an encoder tensor-parallel degree of {degree} does not divide the {world} ranks")
    return init_device_mesh(device_type, (world // degree, degree), mesh_dim_names=("encoder_dp", "encoder_tp"))[
        "encoder_tp"]


def adapter_encoders(adapter) -> list[nn.Module]:
    """The text encoders of a diffusers-family adapter (`text_encoders` list or `text_encoder`), in order."""
    encoders = getattr(adapter, "text_encoders", None)
    if encoders is None:
        encoders = [getattr(adapter, "text_encoder", None)]
    return [m for m in encoders if isinstance(m, nn.Module)]


def shard_adapter_encoders(adapter, degree: int, device_type: str) -> int:
    """Split every text encoder of `adapter` over groups of `degree` consecutive ranks (a collective); the
    adapter's prompt cache is cleared (rows computed before hold the same values, but a cache must start alike
    on every rank). Returns the layers split (0 for degree 1)."""
    if degree == 1:
        return 0
    mesh = encoder_mesh(degree, device_type)
    split = sum(shard_encoder(m, mesh) for m in adapter_encoders(adapter))
    cache = getattr(adapter, "cache", None)
    if cache is not None:
        cache.clear()
    return split
