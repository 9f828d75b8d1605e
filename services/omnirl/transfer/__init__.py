"""The TransferQueue on Redis Streams and its wire codec (DESIGN.md §4).

Import surface: :class:`TransferQueue`, :class:`Message`, :class:`StreamNames`, the codec
functions, the errors, and :func:`start_redis_server` (the embedded Redis of local mode).
"""

from omnirl.transfer.codec import decode_meta, decode_tensors, encode_meta, encode_tensors
from omnirl.transfer.errors import BackpressureTimeout, MissingTensors, TransferError
from omnirl.transfer.keys import StreamNames, done_key, job_pattern, kv_key, tensor_key, validate_job
from omnirl.transfer.message import Message
from omnirl.transfer.queue import TransferQueue
from omnirl.transfer.redis_server import RedisServer, RedisServerError, start_redis_server

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
    "job_pattern",
    "kv_key",
    "start_redis_server",
    "tensor_key",
    "validate_job",
]
