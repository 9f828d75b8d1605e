"""The TransferQueue on Redis Streams and its wire codec (docs/architecture.md §2 "Streams, groups and keys actually used").

Import surface: :class:`TransferQueue`, :class:`Message`, :class:`StreamNames`, the codec
functions, the errors, and :func:`start_redis_server` (the embedded Redis of local mode).

The codec and :class:`TransferQueue` need torch; they are imported on first use (PEP 562), so
``from omnirl.transfer.keys import job_pattern`` — the key layout the operator relies on — loads
no torch (the operator image has none).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omnirl.transfer.errors import BackpressureTimeout, MissingTensors, TransferError
from omnirl.transfer.keys import StreamNames, done_key, image_key, job_pattern, kv_key, tensor_key, validate_job
from omnirl.transfer.message import Message
from omnirl.transfer.redis_server import RedisServer, RedisServerError, start_redis_server

if TYPE_CHECKING:
    from omnirl.transfer.codec import decode_meta, decode_tensors, encode_meta, encode_tensors
    from omnirl.transfer.queue import TransferQueue

# name → submodule of the names that import torch, loaded on first attribute access
_LAZY = {
    "TransferQueue": "queue",
    "decode_meta": "codec",
    "decode_tensors": "codec",
    "encode_meta": "codec",
    "encode_tensors": "codec",
}


def __getattr__(name: str) -> Any:
    """Import a torch-dependent name (the codec, the queue) on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BackpressureTimeout",
    "Message",
    "MissingTensors",
    "RedisServer",
    "RedisServerError",
    "StreamNames",
    "TransferError",
    "TransferQueue",
    "decode_meta",
    "decode_tensors",
    "done_key",
    "encode_meta",
    "encode_tensors",
    "image_key",
    "job_pattern",
    "kv_key",
    "start_redis_server",
    "tensor_key",
    "validate_job",
]
