"""The consumer-side view of one stream entry."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Message:
    """One stream entry as a consumer sees it.

    Attributes:
        id: the stream entry id (``"{ms}-{seq}"``), what :meth:`TransferQueue.ack` takes.
        stream: the stream key it came from.
        meta: the decoded metadata dict.
        tensor_key: the Redis key of its tensors, or ``None`` when it carries none.
        delivery_count: how many times the group delivered it (1 the first time; > 1 after a
            reclaim from a dead consumer).
    """

    id: str
    stream: str
    meta: dict = field(repr=False)
    tensor_key: str | None = None
    delivery_count: int = 1

    @property
    def sample_id(self) -> str | None:
        """``meta["sample_id"]`` when present."""
        return self.meta.get("sample_id")
