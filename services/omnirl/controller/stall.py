"""A wait for scores that makes no progress while every role beats: one line naming it, repeated.

The controller waits for a step's scores (`Controller._collect`) and a validation round's (`_validate`) for as
long as it takes: the roles' own bounds end a real hang (a role that stops beating is replaced after
`failurePolicy.progressDeadlineSeconds`; a reward worker waiting on a remote scorer beats meanwhile only up to
that scorer's `timeoutSeconds` and retries, then holds its samples for `scorerOutageSeconds` before they fail).
A failure here would duplicate those. But a wait within them — a judge that accepts connections and answers
nothing, with a long `timeoutSeconds`; a reward role inside a scorer call — printed nothing: a run sat silent.
`ScoreWait` says, once no new score has arrived for `progressDeadlineSeconds` and again every as long: the
step, how many of how many scores are in, who holds the pending samples and requests (XPENDING of the
samples and requests streams), and what the user can do.
"""

from __future__ import annotations

import logging
import time

from omnirl.api.spec import REMOTE_KINDS, RLJobSpec
from omnirl.transfer import TransferQueue
from omnirl.transfer.client import RedisError
from omnirl.transfer.heartbeat import read_heartbeats

log = logging.getLogger("omnirl.controller")


class ScoreWait:
    """Watches one wait for scores (a step's or a validation round's).

    `begin(what)` starts a wait; `arrived()` notes a new score; `check(have, want)` in the wait's loop logs the
    line once `progressDeadlineSeconds` passed with no new score, then again every as long (`said` counts them).
    Times are monotonic seconds; `now` may be passed for tests.
    """

    def __init__(self, queue: TransferQueue, spec: RLJobSpec) -> None:
        self.queue, self.spec = queue, spec
        self.after_s = spec.failurePolicy.progressDeadlineSeconds
        self.what = ""
        self.last = 0.0  # the wait's start or its last new score
        self.next_at = 0.0  # when the next line is due
        self.said = 0

    def begin(self, what: str, now: float | None = None) -> None:
        """A new wait (`what`: "step 3", "validation at step 4")."""
        self.what, self.said = what, 0
        self.arrived(now)

    def arrived(self, now: float | None = None) -> None:
        """A score came in: the silence counts from now."""
        self.last = time.monotonic() if now is None else now
        self.next_at = self.last + self.after_s

    def check(self, have: int, want: int, now: float | None = None) -> str | None:
        """The line, logged as a warning, when it is due (None otherwise): `have` of `want` scores are in."""
        now = time.monotonic() if now is None else now
        if not self.what or now < self.next_at:
            return None
        self.next_at = now + self.after_s
        self.said += 1
        streams = self.queue.streams
        scorers, samples = self.queue.holders(streams.samples, "reward")
        makers, requests = self.queue.holders(streams.requests, "rollout")
        remote = [f"{r.name} {r.timeoutSeconds:g} s" for r in self.spec.reward if r.kind in REMOTE_KINDS]
        who = scorers or makers
        starting = self._starting()
        line = (f"{self.what}: no new score for {now - self.last:.0f} s (failurePolicy.progressDeadlineSeconds "
                f"{self.after_s:g}), {have} of {want} scores in; samples to score: {samples}; requests to generate: "
                f"{requests}. "
                + (f"{' and '.join(starting)} {'is' if len(starting) == 1 else 'are'} still loading or compiling "
                   "(the last beat says so), which may take up to failurePolicy.startupDeadlineSeconds "
                   f"({self.spec.failurePolicy.startupDeadlineSeconds:g} s) per start-up or compilation; "
                   if starting else "")
                + "A role that beats is working or waiting"
                + (f": look at {', '.join(who)}'s log (omnirl run: OUT/logs/{who[0]}.log)" if who else "")
                + ("; a remote scorer that accepts a call and does not answer holds it up to "
                   f"spec.reward[].timeoutSeconds ({', '.join(remote)}) per try: lower it to fail such calls sooner"
                   if remote and scorers else "")
                + ". The run goes on waiting")
        log.warning(line)
        return line

    def _starting(self) -> list[str]:
        """The rollout and reward workers whose last beat a start-up or a torch.compile wrote (`"startup": true`,
        transfer/heartbeat.py), sorted: on a GPU the first step's compilation alone can outlast
        `progressDeadlineSeconds`, and the line should not read as a hang. [] when Redis does not answer."""
        try:
            beats = read_heartbeats(self.queue.redis, self.queue.job)
        except RedisError:
            return []
        return sorted(w for w, b in beats.items() if b.get("startup") and b.get("role") in ("rollout", "reward"))
