"""Exceptions of the TransferQueue."""

from __future__ import annotations


class TransferError(RuntimeError):
    """Base class of every TransferQueue error."""


class BackpressureTimeout(TransferError):
    """A producer waited longer than ``backpressure_timeout_s`` for room in a full stream.

    Attributes:
        stream: the stream key; length: its XLEN at the last check; max_length: the bound;
        waited_s: seconds waited.
    """

    def __init__(self, stream: str, length: int, max_length: int, waited_s: float):
        self.stream, self.length, self.max_length, self.waited_s = stream, length, max_length, waited_s
        super().__init__(
            f"stream {stream!r} still holds {length} entries (bound {max_length}) after waiting "
            f"{waited_s:.1f} s: its consumers are dead, too slow or not acknowledging; start more "
            "consumers or raise transferQueue.maxStreamLength"
        )


class MissingTensors(TransferError, LookupError):
    """The tensors a message names are gone (their TTL expired, or they were deleted).

    Attributes:
        key: the Redis key that was looked up.
    """

    def __init__(self, key: str):
        self.key = key
        super().__init__(
            f"tensor key {key!r} is absent: it expired (raise transferQueue.tensorTtlSeconds) or "
            "was deleted before this consumer read it"
        )
