"""A rollout replica of several ranks (docs/parallel.md): rank 0 leads, the others follow.

The leader runs the rollout role as a single-device worker does (requests, the engine, publishing, leases, the
weight-sync drain); its adapter is a `LeaderAdapter`, which before each call that runs a split model —
`encode` (a split text encoder) and `velocity` (a split transformer) — sends the call and its inputs to the
followers over the replica's process group, then makes it itself. A follower (`follow`) makes the same calls
with the same inputs, so every rank enters each collective of the split model in the same order; its results
are dropped (the leader's are every rank's: diffusers gathers the tokens back on every rank). Noise, σ grids and
the SDE math stay on the leader, whose inputs the followers receive whole.

Weight sync: every rank is a receiver of the actor's broadcast (`weight_sync`, worker ids `<leader>.r<k>`); the
leader drains its engine, sends `sync`, and all ranks receive the announced version together, each binding what it
holds. `stop` ends the followers.

Wire: a command is a JSON header (operation, arguments, tensor names/dtypes/shapes) broadcast as bytes from rank 0
over a gloo group (a CPU group beside an NCCL one: headers never touch the device), then its tensors broadcast
over the replica's default group on the device. No pickle.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

STOP, SYNC, VELOCITY, ENCODE = "stop", "sync", "velocity", "encode"
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool,
                               torch.uint8)}


def follower_id(leader: str, rank: int) -> str:
    """The weight-sync worker id of rank `rank` of the replica whose leader is `leader` (rank 0 keeps it)."""
    return leader if rank == 0 else f"{leader}.r{rank}"


class ReplicaChannel:
    """Commands from rank 0 of a replica to its other ranks (collectives over the replica's default group).

    Args:
        device: where tensors travel (the replica's device; gloo stages CPU tensors).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        backend = str(dist.get_backend())
        self._headers = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")

    def send(self, op: str, args: dict | None = None, tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Rank 0: broadcast one command (a collective the followers meet in `receive`)."""
        tensors = tensors or {}
        header = {"op": op, "args": args or {},
                  "tensors": [[name, str(t.dtype), list(t.shape)] for name, t in tensors.items()]}
        self._header(json.dumps(header).encode())
        for t in tensors.values():
            dist.broadcast(t.to(self.device).contiguous(), src=0)

    def receive(self) -> tuple[str, dict, dict[str, torch.Tensor]]:
        """Another rank: the next command, its arguments and its tensors (on the device)."""
        header = json.loads(self._header(None).decode())
        tensors = {}
        for name, dtype, shape in header["tensors"]:
            t = torch.empty(shape, dtype=_DTYPES[dtype], device=self.device)
            dist.broadcast(t, src=0)
            tensors[name] = t
        return header["op"], header["args"], tensors

    def _header(self, data: bytes | None) -> bytes:
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self._headers)
        buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None
               else torch.empty(int(size), dtype=torch.uint8))
        dist.broadcast(buf, src=0, group=self._headers)
        return bytes(buf.numpy())


class LeaderAdapter:
    """The leader's adapter: the wrapped adapter, whose split-model calls are first sent to the followers.

    Every attribute but `encode` and `velocity` is the wrapped adapter's (its module, tokenizer, grids, decoding).
    """

    def __init__(self, adapter: Any, channel: ReplicaChannel) -> None:
        self._adapter = adapter
        self._channel = channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)

    def encode(self, prompt_ids: list[list[int]], device: torch.device | str = "cpu"):
        """Send the ids, then encode (a split text encoder is a collective of every rank)."""
        self._channel.send(ENCODE, {"prompt_ids": [list(map(int, ids)) for ids in prompt_ids]})
        return self._adapter.encode(prompt_ids, device=device)

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: dict[str, torch.Tensor], **kwargs):
        """Send x, σ and the conditioning, then run the split transformer with the followers."""
        self._channel.send(VELOCITY, {"kwargs": kwargs},
                           {"x": x, "sigma": sigma, **{f"cond.{k}": v for k, v in cond.items()}})
        return self._adapter.velocity(x, sigma, cond, **kwargs)


def follow(adapter: Any, channel: ReplicaChannel, *, sync: Callable[[], object] | None = None) -> int:
    """A follower's loop: make every call the leader sends until `stop`; returns the calls made.

    Args:
        adapter: this rank's adapter (its split modules the leader's peers).
        sync: receives the announced weights into this rank's module (its `WeightReceiver.receive`), called on
            `sync`.
    Raises:
        ValueError: an operation this follower does not know (leader and follower of different versions).
    """
    calls = 0
    while True:
        op, args, tensors = channel.receive()
        if op == STOP:
            return calls
        calls += 1
        with torch.no_grad():
            if op == VELOCITY:
                cond = {k[len("cond."):]: v for k, v in tensors.items() if k.startswith("cond.")}
                adapter.velocity(tensors["x"], tensors["sigma"], cond, **args.get("kwargs", {}))
            elif op == ENCODE:
                adapter.encode(args["prompt_ids"], device=channel.device)
            elif op == SYNC:
                if sync is None:
                    raise ValueError("the leader sent a weight sync and this follower has no receiver")
                sync()
            else:
                raise ValueError(f"unknown replica command {op!r}")
