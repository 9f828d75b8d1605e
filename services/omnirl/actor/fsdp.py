"""FSDP2 for the actor: shard per transformer block, activation checkpointing, full-state gathering.

Applied after the model is built (torchtitan's order: activation checkpointing → `fully_shard` per
block → `fully_shard` on the root). Uses PyTorch's composable FSDP2 API
(`torch.distributed.fsdp.fully_shard`, parameters become `DTensor`s sharded on dim 0) and the
composable `checkpoint`, neither of which renames parameters, so weight-sync names stay the
module's own names.

Every function here that talks to other ranks is a collective: all ranks must call it in the same
order with the same arguments (`torch.distributed` must already be initialised: NCCL on GPU,
gloo on CPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn

from omnirl.api.spec import is_lora_tensor

MODULE_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def _resolve_block_types(module: nn.Module, block_types: Iterable[type | str] | None) -> tuple:
    """Block classes/class names: given, else the model's `_no_split_modules` (diffusers, transformers)."""
    if block_types is None:
        block_types = getattr(module, "_no_split_modules", None) or ()
    return tuple(block_types)


def find_blocks(module: nn.Module, block_types: Iterable[type | str] | None = None) -> list[nn.Module]:
    """The outermost sub-modules whose class (or class name) is in `block_types`.

    Default `block_types`: the model's `_no_split_modules` (e.g. `JointTransformerBlock` for SD3,
    `QwenImageTransformerBlock` for Qwen-Image); failing that, the children of every
    `nn.ModuleList` (the usual `blocks`/`layers` list).
    Raises:
        ValueError: nothing matched (sharding only the root would gather every weight at once).
    """
    types = _resolve_block_types(module, block_types)

    def is_block(m: nn.Module) -> bool:
        return any(isinstance(m, t) if isinstance(t, type) else type(m).__name__ == t for t in types)

    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for m in module.modules():
        if id(m) in inside or m is module:
            continue
        if (types and is_block(m)) or (not types and isinstance(m, nn.ModuleList)):
            blocks.extend([m] if types else list(m))
            inside.update(id(sub) for sub in m.modules())
    if not blocks:
        raise ValueError(f"no transformer block found in {type(module).__name__} (block_types={list(types)}); "
                         "pass block_types=")
    return blocks


def enable_activation_checkpointing(module: nn.Module, block_types: Iterable[type | str] | None = None) -> int:
    """Recompute each block's activations in backward (composable `checkpoint`, names unchanged).

    Call before `shard_model`. Trades ~one extra block forward for activation memory.
    Returns:
        The number of blocks checkpointed.
    Raises:
        ValueError: no block found (see `find_blocks`).
    """
    from torch.distributed._composable import checkpoint

    blocks = find_blocks(module, block_types)
    for block in blocks:
        checkpoint(block)
    return len(blocks)


def _mesh(mesh_or_world_size, module: nn.Module):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if isinstance(mesh_or_world_size, DeviceMesh):
        return mesh_or_world_size
    world_size = int(mesh_or_world_size)
    if not torch.distributed.is_initialized():
        raise RuntimeError("shard_model needs torch.distributed initialised (init_process_group) first")
    if world_size != torch.distributed.get_world_size():
        raise ValueError(f"world size {world_size} != the process group's {torch.distributed.get_world_size()}")
    device = next(module.parameters()).device
    return init_device_mesh(device.type, (world_size,))


def hsdp_mesh(ranks, replicate: int):
    """The 2-D `(replicate, shard)` DeviceMesh of HSDP over every actor rank (`roles.actor.parallel.replicate`):
    `replicate` groups of world / replicate consecutive ranks, each holding one sharded copy; FSDP2 all-reduces
    gradients between the groups and reduce-scatters within each (a collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(torch.device(ranks.device).type, (replicate, ranks.world // replicate),
                            mesh_dim_names=("replicate", "shard"))


def shard_model(module: nn.Module, mesh_or_world_size, *, block_types: Iterable[type | str] | None = None,
                reshard_after_forward: bool = True, mixed_precision: bool = False) -> nn.Module:
    """Shard `module` with FSDP2: `fully_shard` on each transformer block, then on the root.

    Args:
        module: the model, on its device (every rank holds the same initial weights).
        mesh_or_world_size: a 1-D `DeviceMesh`, or the world size (a mesh over all ranks is built
            on the parameters' device type).
        block_types: block classes or class names (default: see `find_blocks`).
        reshard_after_forward: free gathered parameters after each block's forward (ZeRO-3;
            False keeps them until backward: more memory, one all-gather fewer per block).
        mixed_precision: compute in bfloat16 with float32 gradient reduction
            (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`); the sharded master
            weights keep their dtype.
    Returns:
        The same module, now an `FSDPModule` whose parameters are `DTensor` shards. Gradients
        are averaged over ranks.
    Raises:
        RuntimeError: torch.distributed not initialised; ValueError: no block found or a world
        size that differs from the process group's.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = _mesh(mesh_or_world_size, module)
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in find_blocks(module, block_types):
        fully_shard(block, **kwargs)
    fully_shard(module, **kwargs)
    return module


def clean_name(name: str) -> str:
    """Drop wrapper prefixes (`_orig_mod.` of torch.compile, checkpoint/FSDP1 wrappers) from a name."""
    for prefix in MODULE_PREFIXES:
        name = name.replace(prefix, "")
    return name


def gather_full_state(module: nn.Module, adapters_only: bool = False, *,
                      bucket_bytes: int = 256 * 2**20) -> Iterator[tuple[str, Tensor]]:
    """Yield `(name, full tensor)` for the module's state, gathered bucket by bucket (collective).

    Sharded entries (`DTensor`) are all-gathered with `full_tensor()` a bucket at a time (about
    `bucket_bytes` of full tensors), so peak extra memory is one bucket, not the whole model;
    plain tensors pass through. Names are the module's own (wrapper prefixes dropped).
    Every rank must consume the whole iterator in step (each bucket is a collective); typically
    rank 0 broadcasts what it receives to the rollout workers and the others discard it.

    Args:
        module: a module sharded by `shard_model` (or an ordinary one).
        adapters_only: only LoRA tensors (names containing `lora_`).
        bucket_bytes: full-tensor bytes gathered per bucket (> 0).
    Yields:
        `(name, tensor)`: full, detached tensors on the module's device and dtype.
    Raises:
        ValueError: bucket_bytes ≤ 0.
    """
    from torch.distributed.tensor import DTensor

    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    entries = [(clean_name(n), t) for n, t in module.state_dict().items() if not adapters_only or is_lora_tensor(n)]
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in entries:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield from _gather(bucket, DTensor)
            bucket, size = [], 0
    if bucket:
        yield from _gather(bucket, DTensor)


def _gather(bucket: list[tuple[str, Tensor]], dtensor_type) -> list[tuple[str, Tensor]]:
    return [(name, t.full_tensor().detach() if isinstance(t, dtensor_type) else t.detach()) for name, t in bucket]
