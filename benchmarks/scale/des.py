"""A small discrete-event simulator: processes are generators that yield events (standard library only).

    sim = Sim()
    redis = FifoServer(sim, "redis")
    def producer():
        yield redis.serve(0.002)          # queue at the server, then 2 ms of service
        yield sim.timeout(1.0)
    sim.process(producer())
    sim.run()

- `FifoServer`: one server, first come first served (Redis's single thread, the controller, a GPU).
- `ProcessorSharing`: `cores` identical cores shared equally by every job in service plus
  `background` jobs that never end (other programs on a loaded host): a job of `work` CPU-seconds
  progresses at min(1, cores / (n + background)) per second (Kleinrock's processor-sharing queue).
- `Channel`: an unbounded FIFO of items (a stream); `get()` waits for an item.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator, Iterable
from typing import Any


class Event:
    """Something that happens once; callbacks run when it does (`succeed`), in registration order."""

    __slots__ = ("sim", "callbacks", "triggered", "value")

    def __init__(self, sim: Sim):
        self.sim = sim
        self.callbacks: list[Callable[[Event], None]] | None = []
        self.triggered = False
        self.value: Any = None

    def succeed(self, value: Any = None) -> Event:
        """Trigger now: the callbacks run at the current simulated time (scheduled, not nested)."""
        if self.triggered:
            raise RuntimeError("event triggered twice")
        self.triggered, self.value = True, value
        self.sim._at(self.sim.now, self._fire)
        return self

    def _fire(self) -> None:
        callbacks, self.callbacks = self.callbacks, None
        for cb in callbacks or ():
            cb(self)

    def on(self, cb: Callable[[Event], None]) -> None:
        if self.callbacks is None:  # already fired
            self.sim._at(self.sim.now, lambda: cb(self))
        else:
            self.callbacks.append(cb)


class Sim:
    """The clock and the event list. Times are seconds (floats)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.events = 0

    def _at(self, t: float, fn: Callable[[], None]) -> None:
        if t < self.now:
            raise ValueError(f"cannot schedule in the past: {t} < {self.now}")
        self._seq += 1
        heapq.heappush(self._queue, (t, self._seq, fn))

    def timeout(self, dt: float, value: Any = None) -> Event:
        """An event `dt` ≥ 0 seconds from now."""
        if dt < 0:
            raise ValueError(f"timeout must be >= 0, got {dt}")
        ev = Event(self)
        self._at(self.now + dt, lambda: ev.succeed(value))
        return ev

    def process(self, gen: Generator[Event, Any, Any]) -> Event:
        """Run generator `gen` (it yields events and resumes with each one's value); the returned
        event triggers with its return value when it finishes."""
        done = Event(self)

        def step(value: Any = None) -> None:
            try:
                ev = gen.send(value)
            except StopIteration as stop:
                done.succeed(stop.value)
                return
            ev.on(lambda e: step(e.value))

        self._at(self.now, step)
        return done

    def all_of(self, events: Iterable[Event]) -> Event:
        """An event that triggers when every one of `events` has (with the list of their values)."""
        events = list(events)
        out = Event(self)
        left = [len(events)]
        if not events:
            return out.succeed([])

        def one(_: Event) -> None:
            left[0] -= 1
            if left[0] == 0:
                out.succeed([e.value for e in events])

        for e in events:
            e.on(one)
        return out

    def run(self, until: float | None = None) -> None:
        """Process events in time order until none are left (or the clock would pass `until`)."""
        while self._queue:
            t, _, fn = self._queue[0]
            if until is not None and t > until:
                self.now = until
                return
            heapq.heappop(self._queue)
            self.now = t
            self.events += 1
            fn()


class FifoServer:
    """One server, FIFO: `serve(d)` waits for the server, holds it `d` seconds, then triggers.

    Attributes:
        busy_s: seconds of service given so far (utilisation = busy_s / elapsed).
        served: jobs completed.
    """

    def __init__(self, sim: Sim, name: str):
        self.sim, self.name = sim, name
        self._free_at = 0.0
        self.busy_s = 0.0
        self.served = 0

    def serve(self, duration: float) -> Event:
        """Queue a job of `duration` ≥ 0 seconds; its event triggers when its service ends."""
        if duration < 0:
            raise ValueError(f"service time must be >= 0, got {duration}")
        start = max(self.sim.now, self._free_at)
        self._free_at = start + duration
        self.busy_s += duration
        self.served += 1
        return self.sim.timeout(self._free_at - self.sim.now)

    @property
    def free_at(self) -> float:
        """When the jobs queued so far will be done."""
        return max(self._free_at, self.sim.now)


class ProcessorSharing:
    """`cores` cores shared equally by the jobs in service and `background` endless jobs.

    Each job of ``work`` CPU-seconds runs at ``min(1, cores / (n + background))`` CPU-seconds per
    second while ``n`` jobs are in service (a single-threaded job never uses more than one core).

    Attributes:
        busy_s: CPU-seconds delivered to this pool's jobs.
    """

    def __init__(self, sim: Sim, cores: float, background: float = 0.0, name: str = "cpu"):
        if cores <= 0 or background < 0:
            raise ValueError(f"cores must be > 0 and background >= 0, got {cores}, {background}")
        self.sim, self.cores, self.background, self.name = sim, cores, background, name
        self._jobs: dict[int, list] = {}  # id → [remaining work, event]
        self._last = 0.0
        self._next = 0
        self._token = 0
        self.busy_s = 0.0

    def rate(self, n: int | None = None) -> float:
        """CPU-seconds per second each job gets with `n` jobs in service (default: now)."""
        n = len(self._jobs) if n is None else n
        return min(1.0, self.cores / (n + self.background)) if n else 0.0

    def run(self, work: float) -> Event:
        """Start a job of `work` ≥ 0 CPU-seconds; its event triggers when the work is done."""
        if work < 0:
            raise ValueError(f"work must be >= 0, got {work}")
        self._advance()
        ev = Event(self.sim)
        self._next += 1
        self._jobs[self._next] = [work, ev]
        self._reschedule()
        return ev

    def _advance(self) -> None:
        elapsed = self.sim.now - self._last
        if elapsed > 0 and self._jobs:
            r = self.rate()
            for job in self._jobs.values():
                job[0] -= r * elapsed
            self.busy_s += r * elapsed * len(self._jobs)
        self._last = self.sim.now

    def _reschedule(self) -> None:
        self._token += 1
        if not self._jobs:
            return
        token = self._token
        r = self.rate()
        jid, (left, _) = min(self._jobs.items(), key=lambda kv: kv[1][0])
        self.sim._at(self.sim.now + max(left, 0.0) / r, lambda: self._finish(token))

    def _finish(self, token: int) -> None:
        if token != self._token:
            return  # superseded by an arrival or a departure
        self._advance()
        done = [jid for jid, (left, _) in self._jobs.items() if left <= 1e-12]
        for jid in done:
            self._jobs.pop(jid)[1].succeed()
        self._reschedule()


class Channel:
    """An unbounded FIFO of items: `put` never waits; `get` waits for an item (FIFO among getters)."""

    def __init__(self, sim: Sim):
        self.sim = sim
        self.items: deque = deque()
        self._getters: deque[Event] = deque()

    def put(self, item: Any) -> None:
        if self._getters:
            self._getters.popleft().succeed(item)
        else:
            self.items.append(item)

    def get(self) -> Event:
        ev = Event(self.sim)
        if self.items:
            ev.succeed(self.items.popleft())
        else:
            self._getters.append(ev)
        return ev

    def take(self, limit: int) -> list:
        """Up to `limit` items available now, without waiting."""
        out = []
        while self.items and len(out) < limit:
            out.append(self.items.popleft())
        return out

    def __len__(self) -> int:
        return len(self.items)
