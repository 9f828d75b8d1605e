"""Fair admission of requests to rollout replicas (`omnirl.rollout.admission`): the rule in closed form, and on
a real redis-server through `admit` (what `RolloutService._serve` calls each poll): 8 groups on 4 replicas
polling in turn give each 2 (the greedy `consume(count=4)` gave 4, 4, 0, 0); one replica takes 4 as before.
"""

from __future__ import annotations

import math

import pytest
import redis

from omnirl.rollout.admission import POLL_LIMIT, admit, fair_share
from omnirl.transfer import TransferQueue
from omnirl.transfer.queue import Backlog

GROUP = "rollout"  # the role's group (omnirl.rollout.service.GROUP; importing it loads torch models)


@pytest.mark.parametrize("limit,undelivered,in_flight,held", [(4, 0, 0, 0), (4, 100, 7, 3), (1, 5, 0, 0)])
def test_one_replica_takes_the_limit_as_before(limit: int, undelivered: int, in_flight: int, held: int) -> None:
    assert fair_share(limit, 1, undelivered, in_flight, held) == limit


@pytest.mark.parametrize("replicas,undelivered,in_flight,held,want", [
    (4, 8, 0, 0, 2),     # a step just published: ⌈8 / 4⌉
    (4, 6, 2, 0, 2),     # the second replica in turn: (6 + 2) / 4
    (4, 2, 6, 0, 2),     # the fourth
    (2, 64, 0, 0, 4),    # a share above the limit: the limit
    (8, 3, 0, 0, 1),     # fewer requests than replicas: one each
    (4, 0, 0, 0, 1),     # nothing waiting (an idle replica's blocking read): one, when it comes
    (2, 4, 4, 4, 1),     # holds its share of the last step's already: one, so it never idles with room
    (2, 3, 5, 1, 3),     # the other one: ⌈8 / 2⌉ - 1
    (3, 10, 0, 0, 4),    # ⌈10 / 3⌉ = 4
    (3, 5, 3, 2, 1),     # ⌈8 / 3⌉ - 2
])
def test_several_replicas_take_their_share(replicas: int, undelivered: int, in_flight: int, held: int,
                                           want: int) -> None:
    got = fair_share(POLL_LIMIT, replicas, undelivered, in_flight, held)
    assert got == want == max(1, min(POLL_LIMIT, math.ceil((undelivered + in_flight) / replicas) - held))


@pytest.mark.parametrize("args,name", [((0, 2, 1, 0, 0), "limit"), ((4, 0, 1, 0, 0), "replicas"),
                                       ((4, 2, -1, 0, 0), "undelivered"), ((4, 2, 1, -1, 0), "in_flight"),
                                       ((4, 2, 1, 0, -1), "held")])
def test_bad_counts_are_refused_by_name(args: tuple, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        fair_share(*args)


def _publish_groups(q: TransferQueue, step: int, n: int) -> list[str]:
    return [q.publish(q.streams.requests, {"kind": "train", "step": step, "group_id": f"{step}:{i}"})
            for i in range(n)]


def _poll_in_turn(q: TransferQueue, replicas: int, held: dict[str, list[str]]) -> list[int]:
    """Each replica polls once, in order, through the service's `admit`; returns how many each took."""
    took = []
    for worker in sorted(held):
        got = admit(q, GROUP, worker, replicas=replicas, held=len(held[worker]), block_ms=0)
        held[worker] += [m.id for m in got]
        took.append(len(got))
    return took


def test_four_replicas_polling_in_turn_take_two_groups_each(redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, "fair")
    s = q.streams.requests
    q.ensure_group(s, GROUP)
    held: dict[str, list[str]] = {f"rollout-{i}": [] for i in range(4)}
    for step in range(2):
        sent = _publish_groups(q, step, 8)
        # right after XADD the group's lag counts all 8 (XINFO GROUPS entries-read/lag), nothing pending
        assert q.backlog(s, GROUP) == Backlog(undelivered=8, in_flight=0)
        assert _poll_in_turn(q, 4, held) == [2, 2, 2, 2]
        # after the XREADGROUPs: lag 0, each delivered entry pending once, with the replica that read it
        assert q.backlog(s, GROUP) == Backlog(undelivered=0, in_flight=8)
        assert sorted(i for ids in held.values() for i in ids) == sorted(sent)
        assert _poll_in_turn(q, 4, held) == [0, 0, 0, 0]
        for ids in held.values():  # every group finished: acknowledged (and the stream trimmed)
            q.ack(s, GROUP, ids)
            ids.clear()
        assert q.backlog(s, GROUP) == Backlog(0, 0) and q.stream_length(s) == 0


def test_a_replica_holding_last_steps_groups_takes_fewer(redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, "fair")
    s = q.streams.requests
    q.ensure_group(s, GROUP)
    held: dict[str, list[str]] = {"rollout-0": [], "rollout-1": []}
    _publish_groups(q, 0, 4)
    held["rollout-0"] += [m.id for m in q.consume(s, GROUP, "rollout-0", count=4, block_ms=0)]  # a slow step's
    _publish_groups(q, 1, 4)
    assert q.backlog(s, GROUP) == Backlog(undelivered=4, in_flight=4)
    assert _poll_in_turn(q, 2, held) == [1, 3]  # rollout-0: ⌈8 / 2⌉ - 4 → at least 1; rollout-1 the rest


def test_one_replica_takes_four_as_before(redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, "fair")
    q.ensure_group(q.streams.requests, GROUP)
    _publish_groups(q, 0, 8)
    assert [len(admit(q, GROUP, "rollout-0", replicas=1, held=0, block_ms=0)) for _ in range(3)] == [4, 4, 0]


def test_backlog_counts_when_redis_reports_no_lag(redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, "fair")
    s = q.streams.requests
    assert q.backlog(s, GROUP) == Backlog(0, 0)  # no stream yet: nothing waits
    q.ensure_group(s, GROUP)
    ids = _publish_groups(q, 0, 6)
    q.consume(s, GROUP, "rollout-0", count=1, block_ms=0)
    redis_client.xdel(s, ids[3])  # a hole after the group's last-delivered id: Redis cannot tell the lag
    info = next(g for g in redis_client.xinfo_groups(s) if g["name"] == GROUP.encode())
    assert info["lag"] is None
    assert q.backlog(s, GROUP) == Backlog(undelivered=4, in_flight=1)  # counted with XRANGE
    with pytest.raises(ValueError, match="not a key of job"):
        q.backlog("omnirl:other:requests", GROUP)
