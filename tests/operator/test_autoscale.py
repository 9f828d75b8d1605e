"""The reward autoscaler's decision (pure) and the backlog it reads from a real redis-server."""

from __future__ import annotations

import pytest

from omnirl.api.spec import RewardAutoscaleSpec
from omnirl.transfer.pending import reward_backlog
from omnirl_operator.autoscale import decide_replicas

POLICY = RewardAutoscaleSpec(minReplicas=1, maxReplicas=4, targetBacklogPerReplica=10, scaleUpCooldownSeconds=30,
                             scaleDownCooldownSeconds=300, scaleDownRatio=0.5)

# (current, backlog, seconds since the last scaling or None, expected replicas, reason)
CASES = [
    (1, 0, None, 1, "steady"),             # idle at the floor
    (1, 10, None, 1, "steady"),            # exactly one worker's share
    (1, 11, None, 2, "scale-up"),          # ceil(11 / 10)
    (1, 35, None, 4, "scale-up"),          # ceil(35 / 10) = 4 in one step
    (2, 1000, None, 4, "scale-up"),        # capped at maxReplicas
    (1, 35, 10.0, 1, "cool-down"),         # scaled 10 s ago: up waits for 30 s
    (1, 35, 30.0, 4, "scale-up"),          # cool-down over
    (3, 25, None, 3, "steady"),            # hysteresis: ceil(25 / 5) = 5 ≥ 3, hold (no flap down to 3 → 2 → 3)
    (3, 14, None, 3, "steady"),            # ceil(14 / 5) = 3: hold
    (3, 10, None, 2, "scale-down"),        # ceil(10 / 5) = 2
    (3, 0, None, 1, "scale-down"),         # empty queue: to the floor
    (3, 0, 299.0, 3, "cool-down"),         # down waits 300 s after any scaling
    (3, 0, 300.0, 1, "scale-down"),
    (6, 0, 1.0, 4, "bounds"),              # bounds lowered: clamp at once, cool-down or not
    (0, 0, None, 1, "bounds"),
]


@pytest.mark.parametrize(("current", "backlog", "since", "want", "reason"), CASES)
def test_decision_table(current, backlog, since, want, reason):
    now = 10_000.0
    decision = decide_replicas(current, backlog, POLICY, now, None if since is None else now - since)
    assert (decision.replicas, decision.reason) == (want, reason)


def test_no_flapping_on_a_backlog_oscillating_around_a_boundary():
    """A backlog that wobbles around one worker's share scales up once and then holds."""
    replicas, last, history = 1, None, []
    for t, backlog in enumerate([9, 11, 9, 11, 9, 11, 9, 11] * 10):
        now = 60.0 * t  # a decision every minute: every cool-down but the 300 s one has passed
        d = decide_replicas(replicas, backlog, POLICY, now, last)
        if d.replicas != replicas:
            last = now
        replicas = d.replicas
        history.append(replicas)
    assert history[0] == 1 and set(history[1:]) == {2}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        decide_replicas(1, -1, POLICY, 0.0, None)


def test_backlog_is_undelivered_plus_unacknowledged(redis_client):
    stream = "omnirl:bk:samples"
    assert reward_backlog(redis_client, "bk") == 0  # no stream yet
    for i in range(7):
        redis_client.xadd(stream, {"i": i})
    assert reward_backlog(redis_client, "bk") == 7  # no reward worker has joined: everything waits
    redis_client.xgroup_create(stream, "reward", id="0")
    assert reward_backlog(redis_client, "bk") == 7
    got = redis_client.xreadgroup("reward", "w0", {stream: ">"}, count=3)
    ids = [entry_id for entry_id, _ in got[0][1]]
    assert reward_backlog(redis_client, "bk") == 7  # 4 undelivered + 3 pending
    redis_client.xack(stream, "reward", *ids[:2])
    assert reward_backlog(redis_client, "bk") == 5
