"""What a consumer group of a job's stream still holds, torch-free: who holds its pending entries (the
controller's line about a wait for scores, `controller/stall.py`) and its backlog (the operator's reward
autoscaler, `omnirl_operator/autoscale.py`, whose image has no torch)."""

from __future__ import annotations

import redis

from omnirl.transfer.keys import StreamNames

REWARD_GROUP = "reward"  # the reward workers' consumer group (omnirl.reward.service.GROUP)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def holders(client: redis.Redis, stream: str, group: str) -> tuple[list[str], str]:
    """Who holds `stream`'s entries in consumer group `group`: the consumers with a pending entry (XPENDING),
    and the text ``reward-0 holds 6, 2 not delivered yet`` (per consumer, and the entries not delivered yet:
    XINFO GROUPS' lag, Redis 7), ``none pending`` when nothing is. Never raises for a stream or group not there
    yet. (XPENDING's idle time is not given: a worker renews its claim while it works, so it says nothing.)

    Raises:
        redis.RedisError: Redis unreachable (after the client's retries).
    """
    try:
        pending = client.xpending_range(stream, group, min="-", max="+", count=1000)
        info = next((g for g in client.xinfo_groups(stream) if _s(g["name"]) == group), None)
    except redis.ResponseError:  # no such stream or group (yet)
        return [], "none pending"
    per: dict[str, int] = {}
    for entry in pending:
        per[_s(entry["consumer"])] = per.get(_s(entry["consumer"]), 0) + 1
    parts = [f"{who} holds {n}" for who, n in sorted(per.items())]
    lag = info.get("lag") if info else None
    if lag:
        parts.append(f"{lag} not delivered yet")
    return sorted(per), ", ".join(parts) or "none pending"


def reward_backlog(client: redis.Redis, job: str) -> int:
    """Samples of `job` not yet scored: the ``reward`` group's lag plus its pending entries (0 before the
    stream or the group exists).

    Raises:
        redis.RedisError: Redis unreachable or refusing.
    """
    stream = StreamNames(job).samples
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such key: nothing produced yet
        return 0
    for info in groups:
        if _s(info["name"]) == REWARD_GROUP:
            lag = info.get("lag")
            if lag is None:  # Redis < 7, or a lag Redis cannot compute after trimming
                lag = len(client.xrange(stream, min="(" + _s(info["last-delivered-id"]), max="+"))
            return int(lag) + int(info["pending"])
    return client.xlen(stream)  # the workers have not joined yet: every entry waits
