"""Tensor parallelism of a diffusers transformer (a rollout replica's `parallel.tensor`), through diffusers'
own API: `enable_parallelism(TensorParallelConfig(mesh=...))` applies the model's `_tp_plan` (FLUX and
Qwen-Image in diffusers 0.42.1) with DTensor column- and row-wise splits, each rank holding 1/T of every split
weight. Inference only (the actor shards with FSDP2): the rollout replica's forward equals the single
process's (`tests/weight_sync/test_parallel_weight_sync.py`), and weight sync binds each rank's shard
(`omnirl.weight_sync.binding`).
"""

from __future__ import annotations

from torch import nn

from omnirl.models.parallel._shims import tensor_parallel_on


def tensor_mesh(degree: int, device_type: str):
    """The 1-D `("tp",)` DeviceMesh over the default group's `degree` ranks (one replica's). A collective."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.get_world_size() != degree:
        raise ValueError(f"a tensor-parallel degree of {degree} needs a replica of {degree} ranks, the process "
                         f"group has {dist.get_world_size()}")
    return init_device_mesh(device_type, (degree,), mesh_dim_names=("tp",))


def enable_tensor_parallel(transformer: nn.Module, mesh) -> None:
    """Split `transformer`'s linear layers over the 1-D `mesh` with its diffusers `_tp_plan` (a collective).

    Raises:
        ValueError: the model has no `_tp_plan`, its heads do not divide by the degree, or it is wrapped by
            adapters (peft LoRA: diffusers refuses to shard those; `spec.model.lora` with `parallel.tensor` is
            refused before any role starts).
    """
    from diffusers.models._modeling_parallel import TensorParallelConfig

    with tensor_parallel_on(mesh.device_type):
        transformer.enable_parallelism(config=TensorParallelConfig(tp_degree=mesh.size(), mesh=mesh))
