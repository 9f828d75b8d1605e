"""A remote scorer that timed out: up but slower than `timeoutSeconds`, or away?

Waiting cures a scorer that is away (restarting, unreachable): the reward role holds its samples
(`ScorerError.unavailable`). It does not cure one that answers its cheap request (a judge's
`GET /models`, an empty scorer-protocol request) but not a real one within `timeoutSeconds`: that
is a setting to change, so its samples fail at once with this module's reason, which names the
field and the time one real request took, measured with a longer timeout.
"""

from __future__ import annotations

import math

PROBE_TIMEOUT_S = (2.0, 10.0)
"""Bounds of the cheap request's timeout (`timeoutSeconds` clipped to them)."""
MEASURE_TIMEOUT_S = (60.0, 300.0)
"""Bounds of the timeout of the one real request that measures a slow scorer (10 × `timeoutSeconds`
clipped to them): long enough to see a big model answer. The reward worker keeps beating meanwhile
(`longest_call_s`), so it may exceed `failurePolicy.progressDeadlineSeconds`."""


def probe_timeout(timeout_s: float) -> float:
    """Seconds the cheap request may take: `timeout_s` within `PROBE_TIMEOUT_S`."""
    return min(max(timeout_s, PROBE_TIMEOUT_S[0]), PROBE_TIMEOUT_S[1])


def measure_timeout(timeout_s: float) -> float:
    """Seconds the measuring request may take: 10 × `timeout_s` within `MEASURE_TIMEOUT_S`."""
    return min(max(10 * timeout_s, MEASURE_TIMEOUT_S[0]), MEASURE_TIMEOUT_S[1])


def slow_reason(name: str, where: str, field: str, timeout_s: float, attempts: int, answered_s: float,
                took_s: float | None, *, cheap: str, fix: str = "") -> str:
    """The reason a sample of a slow scorer fails with.

    Args:
        name: the reward's name; where: its URL or target; field: its path (`spec.reward[1]`).
        timeout_s: its `timeoutSeconds`; attempts: the attempts that timed out.
        answered_s: seconds the cheap request took; cheap: what it was (`listed its models`).
        took_s: seconds the measuring request took, or None when it did not finish within
            `measure_timeout(timeout_s)` either.
        fix: a further fix, after the timeout's (`or lower … concurrency`).
    """
    cap = measure_timeout(timeout_s)
    if took_s is None:
        took = f"one request given {cap:g} s did not finish either"
        change = (f"raise {field}.timeoutSeconds well beyond {cap:g}, or look at the scorer (a stuck model may "
                  "still answer that)")
    else:
        took = f"one request took {took_s:.1f} s (measured, given {cap:g} s)"
        change = f"set {field}.timeoutSeconds above that, e.g. {max(1, math.ceil(2 * took_s))}"
    return (f"{name}: {where} is up (it {cheap} in {answered_s:.2f} s) but slower than {field}.timeoutSeconds "
            f"{timeout_s:g}: {attempts} attempt(s) timed out and {took}; {change}{fix}; not held, as waiting does "
            "not make a scorer faster")


def longest_call_s(timeout_s: float, attempts: int, waits_s: float) -> float:
    """The longest one scorer call can take when its server is slow or away, seconds: `attempts`
    attempts of `timeout_s` each that time out, `waits_s` of backoff between them, then the cheap
    request (`probe_timeout`) and the measuring one (`measure_timeout`). The reward worker's
    heartbeat covers that long (`Heartbeat.covering`), so the wait is not taken for a hang."""
    return attempts * timeout_s + waits_s + probe_timeout(timeout_s) + measure_timeout(timeout_s)
