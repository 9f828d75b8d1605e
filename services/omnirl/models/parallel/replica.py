"""One model replica's ranks: join the replica's process group and split the adapter's models over it as the job's
layout says (docs/parallel.md). Every rank of the replica calls these, in the same order (collectives)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from omnirl.models.parallel.encoder_tp import shard_adapter_encoders
from omnirl.models.parallel.tensor import enable_tensor_parallel, tensor_mesh
from omnirl.models.parallel.ulysses import enable_ulysses, ulysses_mesh


def join_replica(rank: int, size: int, master_addr: str, master_port: int, device: torch.device,
                 timeout_s: float = 600.0) -> None:
    """Initialise the default process group as the replica's `size` ranks (NCCL on CUDA, HCCL on Ascend, gloo on
    the CPU), meeting at `master_addr:master_port` (rank 0's; the launcher or the operator says where).

    Raises:
        torch.distributed.DistError: the ranks did not meet within `timeout_s`.
    """
    backend = {"cuda": "nccl", "npu": "hccl"}.get(torch.device(device).type, "gloo")
    dist.init_process_group(backend, rank=rank, world_size=size, init_method=f"tcp://{master_addr}:{master_port}",
                            timeout=datetime.timedelta(seconds=timeout_s))


def parallelize(adapter, layout, device: torch.device) -> dict:
    """Split `adapter`'s transformer (Ulysses or tensor parallel) and text encoders (`encoderTensor`) over the
    replica's ranks, per `layout` (`RolloutLayoutSpec` / `ActorLayoutSpec`).

    Returns:
        What was done: `{"ulysses": U, "tensor": T, "encoder_layers": layers split}`.
    Raises:
        ValueError: a degree the model cannot take (heads, widths; `layout.check_layout` says so earlier).
    """
    kind = torch.device(device).type
    if layout.ulysses > 1:
        data_parallel = dist.get_world_size() // layout.ulysses
        enable_ulysses(adapter.module, ulysses_mesh(layout.ulysses, kind, data_parallel=data_parallel))
    if layout.tensor > 1:
        enable_tensor_parallel(adapter.module, tensor_mesh(layout.tensor, kind))
    split = shard_adapter_encoders(adapter, layout.encoderTensor, kind)
    return {"ulysses": layout.ulysses, "tensor": layout.tensor, "encoder_layers": split}
