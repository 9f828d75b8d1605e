"""How many generate requests a rollout replica takes from the requests stream per poll.

A replica polls whenever its engine has room (`RolloutService._serve`). One replica alone takes up to
`POLL_LIMIT` requests a poll, as it always did. With several, the first to poll after a step is published
took `POLL_LIMIT` groups while the others idled, and the step waited for the busiest one
(`python -m benchmarks.scale --what-if`: "+ fair admission of groups to replicas", docs/scale.md).
So a replica of several takes at most its share of the work not yet finished (`fair_share`).

Kept free of torch: the simulation (`benchmarks.scale.model`) runs the same rule.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omnirl.transfer import Message, TransferQueue

POLL_LIMIT = 4
"""Requests (prompt groups or held-out cohorts) one poll takes at most: a few groups fill one engine batch
(maxBatchSize 32 = 4 groups of 8), and the engine asks again while it has room."""


def fair_share(limit: int, replicas: int, undelivered: int, in_flight: int, held: int) -> int:
    """Requests one replica's poll may take (the XREADGROUP/XAUTOCLAIM ``COUNT``).

    One replica: ``limit``. Several: ``max(1, min(limit, ⌈(undelivered + in_flight) / replicas⌉ - held))``,
    i.e. at most what brings this replica up to an even share of the requests not yet finished, and never
    less than one (a replica whose engine has room never idles while a request waits). When nothing is in
    flight (a step just published, every replica idle) this is ``⌈undelivered / replicas⌉``: 8 groups on
    4 replicas polling in turn give 2, 2, 2, 2 (counting only the undelivered ones would give 2, 2, 1, 1,
    and greedy ``limit`` 4, 4, 0, 0).

    Args:
        limit: the most one poll takes (`POLL_LIMIT` in the service), >= 1.
        replicas: the role's replicas (`roles.rollout.replicas`), >= 1.
        undelivered: requests in the stream not yet delivered to any consumer of the group (XINFO GROUPS
            ``lag``), >= 0.
        in_flight: requests delivered to a consumer of the group and not yet acknowledged (XINFO GROUPS
            ``pending``; this replica's included), >= 0.
        held: of those, the ones this replica holds, >= 0.

    Returns:
        An int in [1, limit].

    Raises:
        ValueError: a count below its bound, naming it.
    """
    for name, value, low in (("limit", limit, 1), ("replicas", replicas, 1), ("undelivered", undelivered, 0),
                             ("in_flight", in_flight, 0), ("held", held, 0)):
        if value < low:
            raise ValueError(f"fair_share: {name} must be >= {low}, got {value}")
    if replicas == 1:
        return limit
    return max(1, min(limit, math.ceil((undelivered + in_flight) / replicas) - held))


def admit(queue: TransferQueue, group: str, consumer: str, *, replicas: int, held: int, block_ms: int,
          limit: int = POLL_LIMIT) -> list[Message]:
    """One poll of the requests stream (`TransferQueue.consume`: stale ones reclaimed first, then new ones)
    for `consumer` of `group`, taking at most `fair_share` of them; one replica reads no backlog (one
    round trip less, the same requests as before).

    Returns:
        Up to that many messages; ``[]`` after ``block_ms``.
    """
    stream = queue.streams.requests
    if replicas == 1:
        count = limit
    else:
        backlog = queue.backlog(stream, group)
        count = fair_share(limit, replicas, backlog.undelivered, backlog.in_flight, held)
    return queue.consume(stream, group, consumer, count=count, block_ms=block_ms)
