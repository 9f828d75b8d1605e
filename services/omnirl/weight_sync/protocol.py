"""The TCPStore key layout shared by `WeightSender` and `WeightReceiver` (all values are JSON text).

| key | writer | value |
| --- | --- | --- |
| ``session`` | sender, at start | ``{"id": uuid, "backend"}`` — a new id each time the actor (re)starts |
| ``reg/count``, ``reg/log`` | receiver | counter + append-only JSON lines ``{"event": "join"/"leave", "worker_id", "incarnation"}`` |
| ``members/{worker_id}`` | receiver | ``{"incarnation", "time"}`` (informational) |
| ``evict/{worker_id}`` | sender | incarnation the sender dropped; that receiver registers again |
| ``assign/{worker_id}`` | sender | ``{"generation", "version", "incarnation"}``: a sync for this receiver is announced |
| ``gen/{g}/manifest`` | sender | the `Manifest` of generation g (deleted once g is done) |
| ``gen/{g}/ready/{worker_id}`` | receiver | its incarnation: it read the manifest and waits for ``go`` (deleted once g is done) |
| ``gen/{g}/go`` | sender | ``{"ranks": [worker ids, rank 1..n], "group": "sync/{gid}"}`` |
| ``sync/{gid}/...`` | torch | the process group's own rendezvous (PrefixStore) |
| ``ack/{version}/{worker_id}`` | receiver | ``{"generation", "incarnation", "ok", "error", "report": BindReport}`` (deleted once read) |

A generation g is one sync: the sender announces (manifest, assign), waits for ``ready`` (timeout),
publishes ``go`` with the receivers that are ready, builds (or reuses) the group, broadcasts the
buckets, and waits for the acks (timeout). The incarnation (a uuid per registration) tells a
restarted receiver apart from its previous life under the same worker id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

SESSION = "session"
REG_COUNT = "reg/count"
REG_LOG = "reg/log"
POLL_S = 0.01  # store polling period while waiting for several keys


def member_key(worker_id: str) -> str:
    """``members/{worker_id}``."""
    return f"members/{worker_id}"


def evict_key(worker_id: str) -> str:
    """``evict/{worker_id}``."""
    return f"evict/{worker_id}"


def assign_key(worker_id: str) -> str:
    """``assign/{worker_id}``."""
    return f"assign/{worker_id}"


def manifest_key(generation: int) -> str:
    """``gen/{g}/manifest``."""
    return f"gen/{generation}/manifest"


def ready_key(generation: int, worker_id: str) -> str:
    """``gen/{g}/ready/{worker_id}``."""
    return f"gen/{generation}/ready/{worker_id}"


def go_key(generation: int) -> str:
    """``gen/{g}/go``."""
    return f"gen/{generation}/go"


def ack_key(version: int, worker_id: str) -> str:
    """``ack/{version}/{worker_id}``."""
    return f"ack/{version}/{worker_id}"


def set_json(store: dist.Store, key: str, value: Any) -> None:
    """Write `value` as JSON text."""
    store.set(key, json.dumps(value))


def get_json(store: dist.Store, key: str) -> Any:
    """Read a JSON value that must exist (`store.get` blocks up to the store timeout otherwise)."""
    return json.loads(store.get(key))


def try_get_json(store: dist.Store, key: str) -> Any | None:
    """Non-blocking read: the JSON value, or None when the key does not exist."""
    return json.loads(store.get(key)) if store.check([key]) else None


def wait_keys(store: dist.Store, keys: dict[str, str], timeout_s: float,
              abort: Callable[[], bool] | None = None) -> tuple[list[str], list[str]]:
    """Wait until every key exists, `timeout_s` passes, or `abort()` returns True.

    Args:
        keys: label (e.g. a worker id) → store key.
        abort: polled with the keys; True ends the wait early (the caller checks it again).

    Returns:
        (labels whose key appeared, labels still missing at the deadline), each in input order.
    """
    deadline = time.monotonic() + timeout_s
    pending = dict(keys)
    while pending and time.monotonic() < deadline and not (abort is not None and abort()):
        for label, key in list(pending.items()):
            if store.check([key]):
                del pending[label]
        if pending:
            time.sleep(POLL_S)
    return [k for k in keys if k not in pending], list(pending)


def append_registration(store: dist.Store, event: str, worker_id: str, incarnation: str) -> None:
    """Append one membership event to ``reg/log`` and bump ``reg/count`` (the sender's cheap check)."""
    line = json.dumps({"event": event, "worker_id": worker_id, "incarnation": incarnation})
    store.append(REG_LOG, line + "\n")
    store.add(REG_COUNT, 1)


def read_registrations(store: dist.Store, seen: int) -> tuple[int, list[dict]]:
    """Events of ``reg/log`` after the first `seen` ones.

    Returns:
        (new count, new events in order). Cheap when nothing changed (one counter read). The count
        is bumped after the append, so every counted event is already in the log.
    """
    count = store.add(REG_COUNT, 0)
    if count == seen:
        return seen, []
    lines = store.get(REG_LOG).decode().splitlines()
    return count, [json.loads(line) for line in lines[seen:count]]
