"""A consumer's claim on the entries it is working on, renewed from a thread while the work runs.

An entry read from a stream stays pending under its consumer until acknowledged; once it has been
idle longer than ``claimIdleSeconds`` the next :meth:`~omnirl.transfer.queue.TransferQueue.consume`
of any consumer of the group reclaims it (XAUTOCLAIM: a dead consumer's work). Work that may
outlast that on a live consumer — the reward role's batch while a scorer is away (held up to
``failurePolicy.scorerOutageSeconds``), a slow judge's call, a ``sync``-mode wait for a step's
rollouts — renews its claim under :func:`holding`, so no other replica does it a second time.

The claim still lapses (and the entries go to another consumer ``claimIdleSeconds`` later) when
the process dies (the thread dies with it), when the block ends unacknowledged (SIGTERM: hand the
work back), and when ``alive()`` turns false (the role's own liveness, e.g. a main loop that has not
beaten for ``progressDeadlineSeconds``: a stuck worker's work goes to another).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from omnirl.transfer.queue import TransferQueue

log = logging.getLogger("omnirl.transfer")


@contextmanager
def holding(queue: TransferQueue, stream: str, group: str, consumer: str, ids: list[str], *,
            alive: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """Renew ``consumer``'s claim on the entries ``ids`` of ``stream`` every ``claim_idle_s / 3``
    seconds from a thread while the block runs (:meth:`TransferQueue.touch`).

    Acknowledge after the block: an entry acknowledged inside it reads as lost to another
    consumer. Entries another consumer reclaimed meanwhile (this one's renewals lapsed: Redis away
    for long) are left with it and named in one warning. A Redis error is logged once and the
    renewal tried again at the next period; the block's own calls meet the error themselves.

    Args:
        queue: the TransferQueue the entries were read with (its ``claim_idle_s``, seconds).
        stream, group, consumer: where they are pending and whose they are.
        ids: the entry ids.
        alive: checked before each renewal; once false, renewals stop for good (the claim lapses).
    """
    every_s = queue.claim_idle_s / 3
    done = threading.Event()

    def renew() -> None:
        held, warned = list(ids), False
        while held and not done.wait(every_s):
            if not alive():
                log.warning("%s: not live, its claim on %d entries of %s lapses in %g s (claimIdleSeconds)",
                            consumer, len(held), stream, queue.claim_idle_s)
                return
            try:
                kept = queue.touch(stream, group, consumer, held)
            except redis.RedisError as err:
                if not warned:
                    log.warning("%s: claim on %d entries of %s not renewed (%s); trying again every %.2g s",
                                consumer, len(held), stream, err, every_s)
                warned = True
                continue
            lost = [i for i in held if i not in kept]
            if lost:
                log.warning("%s: %d entries of %s were reclaimed by another consumer (its claim lapsed for "
                            "claimIdleSeconds=%g s); they may be worked on twice: %s", consumer, len(lost), stream,
                            queue.claim_idle_s, ", ".join(lost[:4]))
            held = kept

    thread = threading.Thread(target=renew, name=f"lease-{consumer}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
