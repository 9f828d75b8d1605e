"""Actor ranks read the control stream through their own groups and must start a step's collectives
together: an entry that reached one rank's 200 ms read and missed the other's is read by both
before either trains it (real redis-server, two real processes in a gloo group)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
import types

import redis

from omnirl.actor.ranks import Ranks
from omnirl.actor.service import ActorService
from omnirl.transfer import TransferQueue

JOB = "ranks-control"


def _rank(rank: int, port: int, url: str, delay_s: float, out) -> None:
    ranks = Ranks.init(rank, 2, "127.0.0.1", port, "cpu")
    queue = TransferQueue(redis.Redis.from_url(url), JOB)
    group = "actor" if rank == 0 else f"actor-rank{rank}"
    queue.ensure_group(queue.streams.control, group)
    ranks.max(0.0)  # both groups exist before the entry is published
    time.sleep(delay_s)
    me = types.SimpleNamespace(queue=queue, ranks=ranks, heartbeat=types.SimpleNamespace(beat=lambda: None),
                               env=types.SimpleNamespace(worker_id=f"actor-{rank}"))
    got = ActorService._next_control(me, queue.streams.control, group)
    out.put((rank, [m.meta.get("step") for m in got]))


def test_an_entry_one_rank_missed_is_read_by_both_before_either_trains(redis_url):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    # rank 1 reads at once (its 200 ms read ends empty); the entry arrives; rank 0 reads later and gets it
    procs = [ctx.Process(target=_rank, args=(r, port, redis_url, d, out)) for r, d in ((0, 1.5), (1, 0.0))]
    for p in procs:
        p.start()
    queue = TransferQueue(redis.Redis.from_url(redis_url), JOB)
    deadline = time.monotonic() + 60
    while len(queue.redis.xinfo_groups(queue.streams.control) if queue.redis.exists(queue.streams.control) else []) < 2:
        assert time.monotonic() < deadline, "the ranks did not create their groups"
        time.sleep(0.05)
    time.sleep(0.9)  # rank 1's first read (200 ms) is over; rank 0 still sleeps
    queue.publish(queue.streams.control, {"type": "train", "step": 7})
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert results == {0: [7], 1: [7]}
