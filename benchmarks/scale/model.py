"""The discrete-event model of one RL job: controller, rollout replicas, reward workers, actor ranks,
Redis and the weight sync (docs/architecture.md §2 is what it mirrors; docs/scale.md what it says).

One step, as the roles run it:

1. the controller publishes the step's requests (one per prompt group; Redis: one small op each);
2. a rollout replica takes whole groups up to ``max_batch`` samples (with several replicas at most its
   share: ``Cluster.admission``), runs the batch on its device
   (``rollout_s_per_sample`` × batch / efficiency(batch)), and publishes each sample (Redis:
   `Redis.publish_s`); the client's share overlaps the next batch (the engine's handover);
3. a reward worker takes up to ``reward_batch`` samples (in ``sync`` mode only once the step's
   samples are all generated), reads each image (Redis), scores them (``reward_s_per_sample`` CPU
   seconds over ``reward_threads``), publishes the scores and acks (Redis);
4. the controller files each score (``controller_s_per_sample``); with the step complete it hands the
   batch over (``controller_s_per_step``; Redis: one op);
5. each actor rank reads its share of the trajectories (Redis GETs, then the client's decode), trains
   it in micro-batches (compute, or the FSDP all-gathers of the frozen weights when they take longer:
   prefetch overlaps the two), reduce-scatters the LoRA gradients; rank 0 syncs the weights to every
   rollout replica (`comm.WeightSync`), then reports (Redis: one op; controller ``controller_s_per_step``).

Modes (`spec.pipeline.mode`): ``sync`` and ``async-reward`` publish step n + 1 after step n's
TrainDone; ``fully-async`` publishes it right after step n is handed over, so rollout of n + 1
overlaps training of n, and a sync waits for every replica to finish its current batch (the engine
drains between steps). Placement: ``split`` gives rollout replicas and actor ranks their own devices
(Kubernetes: one device per pod); ``colocated`` puts replica i and rank i on device i (``omnirl run
--share-gpus``). On a CPU host every piece of work — Redis's too — runs on one processor-sharing pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.scale.comm import NCCL_H100, Fabric, WeightSync, all_gather_s
from benchmarks.scale.des import Channel, Event, FifoServer, ProcessorSharing, Sim
from omnirl.rollout.admission import POLL_LIMIT, fair_share

MODES = ("sync", "async-reward", "fully-async")
CONTROL_OP = 0.05
"""A request or control message (GenerateRequest, TrainRequest, TrainDone) costs Redis this fraction of a
sample's commands (one XADD against a sample's ~20 commands)."""


def interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear through `points` (sorted by x), flat outside them."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


@dataclass(frozen=True)
class Job:
    """What one step of a job costs, per piece (seconds are on the job's device kind).

    Attributes:
        name: for the tables.
        samples_per_step: promptsPerStep × groupSize.
        group: groupSize.
        rollout_s_per_sample: device seconds per sample at full batch efficiency (all denoising steps).
        rollout_eff: (batch, efficiency) points; a batch of b samples takes
            b × rollout_s_per_sample / efficiency(b).
        max_batch: `roles.rollout.maxBatchSize`.
        trajectory_bytes, media_bytes: one sample's stored bytes (trajectory, image key).
        reward_s_per_sample: CPU seconds to score one sample; `reward_threads` per worker.
        reward_batch: `roles.reward.batchSize`.
        train_s_per_sample: device seconds of one sample's update (every window step) at micro-batch
            `micro_batch`; `micro_eff` (micro-batch, efficiency) for smaller ones.
        window: trained denoising steps per sample (the micro-steps of a micro-batch).
        model_bytes: bytes of the frozen weights FSDP gathers per forward or backward.
        gathers_per_micro: gathers per micro-step (θ forward, reference forward, backward).
        sync_bytes: bytes of one weight sync (LoRA adapters) and of the gradient reduce-scatter.
        controller_s_per_sample, controller_s_per_step: the controller's own work (one thread).
        devices_per_replica: devices one rollout replica drives (1).
    """

    name: str
    samples_per_step: int
    group: int
    rollout_s_per_sample: float
    rollout_eff: tuple[tuple[float, float], ...]
    max_batch: int
    trajectory_bytes: int
    media_bytes: int
    reward_s_per_sample: float
    reward_batch: int
    reward_threads: int
    train_s_per_sample: float
    micro_batch: int
    micro_eff: tuple[tuple[float, float], ...]
    window: int
    model_bytes: float
    gathers_per_micro: int
    sync_bytes: float
    controller_s_per_sample: float
    controller_s_per_step: float

    def batch_s(self, b: int) -> float:
        """Device seconds of a rollout batch of `b` samples."""
        return b * self.rollout_s_per_sample / interpolate(self.rollout_eff, b)


@dataclass(frozen=True)
class Redis:
    """Redis as one single-threaded server: a request costs `s_per_op` + `s_per_byte` × bytes it moves.

    `s_per_sample` is the load test's per-sample cost of the roles' commands (publish, claim, read,
    score, ack, trim, the actor's read and delete), `s_per_byte` its per-byte cost (a byte in and the
    same byte out again are two): `benchmarks.scale.jobs.redis_for`. Client seconds per byte (encode or
    decode and the socket, in the role's process) overlap other roles' work.

    With `by_reference` the payloads travel as files on the run's shared storage and Redis carries the
    metadata only: no per-byte Redis cost; the storage, when `storage_bps` > 0, is one shared server of
    that many bytes/s every write and read queues at (0: unlimited).
    """

    s_per_sample: float
    s_per_byte: float
    client_s_per_byte: float = 0.0
    by_reference: bool = False
    storage_bps: float = 0.0

    def _bytes(self, n: int) -> float:
        return 0.0 if self.by_reference else self.s_per_byte * n

    def publish_s(self, job: Job) -> float:
        """Server seconds of one sample's publish (half the per-sample ops, its bytes in)."""
        return 0.5 * self.s_per_sample + self._bytes(job.trajectory_bytes + job.media_bytes)

    def reward_s(self, job: Job) -> float:
        """Server seconds of one sample's reward traffic (claim, image out, score, ack: a quarter of the ops)."""
        return 0.25 * self.s_per_sample + self._bytes(job.media_bytes)

    def actor_s(self, job: Job) -> float:
        """Server seconds of one sample's actor read and delete (the last quarter of the ops, trajectory out)."""
        return 0.25 * self.s_per_sample + self._bytes(job.trajectory_bytes)


@dataclass(frozen=True)
class Cluster:
    """Where the job runs.

    Attributes:
        devices: accelerators (GPU) or, on a CPU host, role processes' devices are the CPU pool.
        rollout, actor: rollout replicas and actor ranks.
        reward_workers: reward processes (each on its own CPU cores with `Job.reward_threads`).
        placement: ``split`` or ``colocated`` (see the module docstring).
        cpu_cores: a CPU host: every piece of work shares this many cores (None: accelerators).
        cpu_background: endless jobs of other programs on that host (processor sharing).
        fabric: the actor ranks' collectives (NCCL on GPUs, gloo on a CPU host).
        admission: ``fair`` (the rollout role's: a replica takes one group, then at most its share of the
            groups not yet finished, `omnirl.rollout.admission.fair_share`, up to ``max_batch`` samples) or
            ``greedy`` (whole groups up to ``max_batch`` samples, as the role's ``consume(count=4)`` did
            before fair admission; the measured runs of ``--check`` were made with it).
        redis_shards: Redis servers the samples are spread over (by group; control messages on the first).
    """

    devices: int
    rollout: int
    actor: int
    reward_workers: int
    placement: str = "split"
    cpu_cores: float | None = None
    cpu_background: float = 0.0
    fabric: Fabric = NCCL_H100
    admission: str = "fair"
    redis_shards: int = 1

    def __post_init__(self) -> None:
        if self.placement not in ("split", "colocated"):
            raise ValueError(f"placement {self.placement!r}: expected split or colocated")
        if self.admission not in ("greedy", "fair"):
            raise ValueError(f"admission {self.admission!r}: expected greedy or fair")
        if self.redis_shards < 1:
            raise ValueError(f"redis_shards must be >= 1, got {self.redis_shards}")
        if min(self.rollout, self.actor, self.reward_workers) < 1:
            raise ValueError(f"rollout, actor and reward_workers must be >= 1, got {self}")


@dataclass
class Result:
    """What one simulated run predicts (means over the measured steps).

    Attributes:
        step_s: seconds between consecutive TrainDones.
        samples_per_s: samples_per_step / step_s.
        busy: device busy fraction (compute only: rollout batches and training micro-steps).
        redis_util, controller_util: fraction of the time Redis's thread (the busiest shard's) / the
            controller is busy.
        phases: seconds per step of rollout (requests → last sample published), reward_tail (→ last
            score filed), handover (→ the actor has the batch: controller, queue and load), train, sync.
        bottleneck: what limits the step (see `Simulation.bottleneck`).
    """

    step_s: float
    samples_per_s: float
    busy: float
    redis_util: float
    controller_util: float
    phases: dict[str, float]
    bottleneck: str
    events: int = 0
    extra: dict = field(default_factory=dict)


class _Serial:
    """One thread's FIFO (Redis, the controller): its own core, or the host's processor-sharing pool."""

    def __init__(self, sim: Sim, pool: ProcessorSharing | None, name: str):
        self.sim, self.pool = sim, pool
        self.server = FifoServer(sim, name)
        self._queue: list = []
        self._running = False

    @property
    def busy_s(self) -> float:
        return self.server.busy_s

    def serve(self, work: float) -> Event:
        if self.pool is None:
            return self.server.serve(work)
        ev = Event(self.sim)
        self._queue.append((work, ev))
        if not self._running:
            self._next()
        return ev

    def _next(self) -> None:
        if not self._queue:
            self._running = False
            return
        self._running = True
        work, ev = self._queue.pop(0)
        t0 = self.sim.now
        self.server.busy_s += work

        def done(_: Event) -> None:
            ev.succeed(self.sim.now - t0)
            self._next()

        self.pool.run(work).on(done)


class Simulation:
    """One job on one cluster in one mode, simulated for `steps` steps (the first `warmup` not measured)."""

    def __init__(self, job: Job, cluster: Cluster, redis: Redis, sync: WeightSync, mode: str = "async-reward",
                 steps: int = 4, warmup: int = 1):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {MODES}")
        if steps <= warmup:
            raise ValueError(f"steps ({steps}) must exceed warmup ({warmup})")
        self.job, self.cluster, self.redis_cost, self.sync, self.mode = job, cluster, redis, sync, mode
        self.steps, self.warmup = steps, warmup
        sim = self.sim = Sim()
        self.pool = (ProcessorSharing(sim, cluster.cpu_cores, cluster.cpu_background)
                     if cluster.cpu_cores is not None else None)
        self.shards = [_Serial(sim, self.pool, f"redis-{i}") for i in range(cluster.redis_shards)]
        self.redis = self.shards[0]
        self._next_shard = 0
        self.controller = _Serial(sim, self.pool, "controller")
        n_dev = cluster.rollout if cluster.placement == "colocated" else cluster.rollout + cluster.actor
        self.devices = [_Serial(sim, self.pool, f"device-{i}") for i in range(n_dev)]
        self.rollout_dev = self.devices[:cluster.rollout]
        self.actor_dev = (self.devices[:cluster.actor] if cluster.placement == "colocated"
                          else self.devices[cluster.rollout:])
        if cluster.placement == "colocated" and cluster.actor > cluster.rollout:
            raise ValueError("colocated placement needs actor ranks <= rollout replicas (one of each per device)")
        self.reward = [_Serial(sim, self.pool, f"reward-{i}") for i in range(cluster.reward_workers)]
        self.storage = FifoServer(sim, "storage")
        self.compute_s = 0.0
        self.requests: Channel = Channel(sim)
        self.groups_put = self.groups_done = 0  # requests published / finished (fair admission's in-flight count)
        self.samples: Channel = Channel(sim)
        self.scored = {n: 0 for n in range(steps)}
        self.generated = {n: 0 for n in range(steps)}
        self.step_scored = {n: Event(sim) for n in range(steps)}
        self.step_generated = {n: Event(sim) for n in range(steps)}
        self.t_publish: dict[int, float] = {}
        self.t_last_sample: dict[int, float] = {}
        self.t_scored: dict[int, float] = {}
        self.t_loaded: dict[int, float] = {}
        self.t_trained: dict[int, float] = {}
        self.t_done: dict[int, float] = {}
        self.running: list[Event | None] = [None] * cluster.rollout
        self.sync_gate: Event | None = None

    # ------------------------------------------------------------------ roles
    def _controller(self):
        job, sim = self.job, self.sim
        ahead = self.mode == "fully-async"
        yield from self._publish(0)
        for n in range(self.steps):
            yield self.step_scored[n]
            yield self.controller.serve(job.controller_s_per_step)
            yield self.redis.serve(self.redis_cost.s_per_sample * CONTROL_OP)  # the TrainRequest
            if ahead and n + 1 < self.steps:
                yield from self._publish(n + 1)
            yield sim.process(self._actor_step(n))
            yield self.redis.serve(self.redis_cost.s_per_sample * CONTROL_OP)  # the TrainDone
            yield self.controller.serve(job.controller_s_per_step)
            self.t_done[n] = sim.now
            if not ahead and n + 1 < self.steps:
                yield from self._publish(n + 1)

    def _publish(self, n: int):
        job = self.job
        groups = math.ceil(job.samples_per_step / job.group)
        self.t_publish[n] = self.sim.now
        yield self.redis.serve(groups * self.redis_cost.s_per_sample * CONTROL_OP)
        for g in range(groups):
            size = min(job.group, job.samples_per_step - g * job.group)
            self.requests.put((n, size))
            self.groups_put += 1

    def _rollout(self, i: int):
        job, sim = self.job, self.sim
        dev = self.rollout_dev[i]
        while True:
            first = yield self.requests.get()
            groups, size = [first], first[1]
            limit = math.inf
            if self.cluster.admission == "fair" and self.requests.items:
                # the role's rule (`omnirl.rollout.admission.fair_share`): its blocking read took `first`,
                # its next poll tops it up to its share of what is waiting or held by some replica
                waiting = len(self.requests.items)
                in_flight = self.groups_put - waiting - self.groups_done
                limit = 1 + fair_share(POLL_LIMIT, self.cluster.rollout, waiting, in_flight, held=1)
            while self.requests.items and size + self.requests.items[0][1] <= job.max_batch and len(groups) < limit:
                nxt = self.requests.items.popleft()
                groups.append(nxt)
                size += nxt[1]
            while self.sync_gate is not None:  # a weight sync is binding: the engine waits for it
                yield self.sync_gate
            work = job.batch_s(size)
            self.compute_s += work
            self.running[i] = dev.serve(work)
            yield self.running[i]
            self.running[i] = None
            for n, count in groups:
                sim.process(self._publish_samples(n, count))

    def _publish_samples(self, n: int, count: int):
        job = self.job
        nbytes = job.trajectory_bytes + job.media_bytes
        yield self.sim.timeout(count * nbytes * self.redis_cost.client_s_per_byte)  # encode + send
        yield from self._storage(count * nbytes)
        yield self._shard().serve(count * self.redis_cost.publish_s(job))
        self.generated[n] += count
        self.groups_done += 1  # the role acknowledges a request once all its samples are published
        self.t_last_sample[n] = self.sim.now
        for _ in range(count):
            self.samples.put(n)
        if self.generated[n] >= job.samples_per_step:
            self.step_generated[n].succeed()

    def _reward(self, w: int):
        job = self.job
        while True:
            first = yield self.samples.get()
            batch = [first, *self.samples.take(job.reward_batch - 1)]
            if self.mode == "sync":
                for n in sorted(set(batch)):
                    yield self.step_generated[n]
            yield self._shard().serve(len(batch) * self.redis_cost.reward_s(job))
            yield from self._storage(len(batch) * job.media_bytes)
            yield self.sim.timeout(len(batch) * job.media_bytes * self.redis_cost.client_s_per_byte)
            yield self.reward[w].serve(len(batch) * job.reward_s_per_sample / job.reward_threads)
            yield self.controller.serve(len(batch) * job.controller_s_per_sample)
            for n in batch:
                self.scored[n] += 1
                if self.scored[n] == job.samples_per_step:
                    self.t_scored[n] = self.sim.now
                    self.step_scored[n].succeed()

    def _actor_step(self, n: int):
        job, sim, a = self.job, self.sim, self.cluster.actor
        shares = [job.samples_per_step // a + (1 if r < job.samples_per_step % a else 0) for r in range(a)]
        loads = [sim.process(self._load(share)) for share in shares]
        yield sim.all_of(loads)
        self.t_loaded[n] = sim.now
        yield sim.all_of(self.actor_dev[r].serve(self._train_s(share)) for r, share in enumerate(shares))
        self.t_trained[n] = sim.now
        yield sim.process(self._sync())

    def _storage(self, nbytes: float):
        """The payload's share of the shared storage (by reference with a bounded bandwidth only)."""
        if self.redis_cost.by_reference and self.redis_cost.storage_bps > 0:
            yield self.storage.serve(nbytes / self.redis_cost.storage_bps)

    def _shard(self) -> _Serial:
        """The next Redis shard, round robin (one shard: always the one)."""
        self._next_shard = (self._next_shard + 1) % len(self.shards)
        return self.shards[self._next_shard]

    def _load(self, share: int):
        k = len(self.shards)
        yield self.sim.all_of(shard.serve(share / k * self.redis_cost.actor_s(self.job)) for shard in self.shards)
        yield from self._storage(share * self.job.trajectory_bytes)
        yield self.sim.timeout(share * self.job.trajectory_bytes * self.redis_cost.client_s_per_byte)

    def _train_s(self, share: int) -> float:
        """One rank's update of `share` samples: micro-steps of max(compute, FSDP gathers), then the
        gradient reduce-scatter. Its compute seconds are added to the busy total."""
        job, a, fabric = self.job, self.cluster.actor, self.cluster.fabric
        if share == 0:
            return all_gather_s(job.sync_bytes, a, fabric)
        m = min(job.micro_batch, share)
        micro = math.ceil(share / m)
        per_step = m * job.train_s_per_sample / job.window / interpolate(job.micro_eff, m)
        comm = job.gathers_per_micro * all_gather_s(job.model_bytes, a, fabric)
        self.compute_s += micro * job.window * per_step
        return micro * job.window * max(per_step, comm) + all_gather_s(job.sync_bytes, a, fabric)

    def _sync(self):
        sim = self.sim
        gate = self.sync_gate = Event(sim)
        yield sim.all_of(e for e in self.running if e is not None)  # each replica finishes its batch
        yield sim.timeout(self.sync.seconds(self.job.sync_bytes, self.cluster.rollout))
        self.sync_gate = None
        gate.succeed()

    # ------------------------------------------------------------------ run
    def run(self) -> Result:
        sim = self.sim
        sim.process(self._controller())
        for i in range(self.cluster.rollout):
            sim.process(self._rollout(i))
        for w in range(self.cluster.reward_workers):
            sim.process(self._reward(w))
        sim.run()
        if len(self.t_done) != self.steps:
            raise RuntimeError(f"simulation ended after {len(self.t_done)} of {self.steps} steps (a deadlock)")
        return self._result()

    def _result(self) -> Result:
        job, w = self.job, self.warmup
        measured = range(w, self.steps)
        t0 = self.t_done[w - 1] if w > 0 else 0.0
        elapsed = self.t_done[self.steps - 1] - t0
        step_s = elapsed / len(measured)
        total = self.sim.now
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        phases = {
            "rollout": mean([self.t_last_sample[n] - self.t_publish[n] for n in measured]),
            "reward_tail": mean([self.t_scored[n] - self.t_last_sample[n] for n in measured]),
            "handover": mean([self.t_loaded[n] - self.t_scored[n] for n in measured]),
            "train": mean([self.t_trained[n] - self.t_loaded[n] for n in measured]),
            "sync": mean([self.t_done[n] - self.t_trained[n] for n in measured]),
        }
        # utilisations over the whole run (the measured steps dominate; the warm-up step is alike)
        devices = len(self.devices)
        busy = self.compute_s / (devices * total)
        redis_util = max(shard.busy_s for shard in self.shards) / total
        ctl_util = self.controller.busy_s / total
        return Result(step_s, job.samples_per_step / step_s, busy, redis_util, ctl_util, phases,
                      self.bottleneck(phases, redis_util, ctl_util), self.sim.events)

    def bottleneck(self, phases: dict[str, float], redis_util: float, ctl_util: float) -> str:
        """``redis`` or ``controller`` when that thread is busy > 80% of the time; else the longest phase."""
        if redis_util > 0.8:
            return "redis"
        if ctl_util > 0.8:
            return "controller"
        return max(phases, key=phases.get)
