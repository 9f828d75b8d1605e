"""The scale simulation's queueing and collective math on cases with closed-form answers."""

from __future__ import annotations

import math

import pytest
from benchmarks.scale.comm import NCCL_H100, WeightSync, all_gather_s, all_reduce_s, broadcast_s, tree_depth
from benchmarks.scale.des import Channel, FifoServer, ProcessorSharing, Sim
from benchmarks.scale.model import CONTROL_OP, Cluster, Job, Redis, Simulation, interpolate


def test_one_fifo_server_with_deterministic_service_serves_one_job_per_service_time() -> None:
    sim, done = Sim(), []
    server = FifoServer(sim, "redis")
    for _ in range(50):  # all arrive at 0: the k-th leaves at k·s
        server.serve(0.004).on(lambda _e: done.append(sim.now))
    sim.run()
    assert done == pytest.approx([0.004 * k for k in range(1, 51)])
    assert len(done) / sim.now == pytest.approx(1 / 0.004)  # throughput = 1 / service time
    assert server.busy_s == pytest.approx(sim.now)


def test_a_tandem_pipeline_runs_at_its_slowest_stage() -> None:
    sim = Sim()
    a, b = FifoServer(sim, "a"), FifoServer(sim, "b")
    done: list[float] = []

    def job():
        yield a.serve(0.002)
        yield b.serve(0.005)
        done.append(sim.now)

    for _ in range(100):
        sim.process(job())
    sim.run()
    gaps = [y - x for x, y in zip(done, done[1:], strict=False)]
    assert gaps == pytest.approx([0.005] * 99)  # 1 / max(s_a, s_b)
    assert done[0] == pytest.approx(0.007)


def test_processor_sharing_splits_the_cores_among_jobs_and_background() -> None:
    sim = Sim()
    pool = ProcessorSharing(sim, cores=1)
    ends: list[float] = []
    for work in (1.0, 1.0):
        pool.run(work).on(lambda _e: ends.append(sim.now))
    sim.run()
    assert ends == pytest.approx([2.0, 2.0])  # two jobs on one core: each at half speed

    sim = Sim()
    pool = ProcessorSharing(sim, cores=2, background=1)
    ends = []
    for work in (1.0, 2.0, 3.0):
        pool.run(work).on(lambda _e: ends.append(sim.now))
    sim.run()
    # 3 jobs + 1 background on 2 cores: rate 1/2 until 1.0 of work (t=2); then 2 + 1 on 2 cores: rate 2/3
    # until the second has its last 1.0 done (t=3.5); then 1 + 1: rate 1, the last 1.0 at t=4.5
    assert ends == pytest.approx([2.0, 3.5, 4.5])
    assert pool.busy_s == pytest.approx(6.0)

    sim = Sim()
    pool = ProcessorSharing(sim, cores=4)
    pool.run(3.0).on(lambda _e: ends.append(sim.now))
    sim.run()
    assert ends[-1] == pytest.approx(3.0)  # one thread never runs faster than one core


def test_channel_hands_items_in_order_to_waiting_getters() -> None:
    sim, got = Sim(), []
    ch = Channel(sim)

    def getter():
        for _ in range(3):
            got.append((yield ch.get()))

    sim.process(getter())
    sim.run()
    for item in "abc":
        ch.put(item)
    sim.run()
    assert got == ["a", "b", "c"]


def test_tree_depth_is_the_binary_logarithm() -> None:
    assert [tree_depth(n) for n in (0, 1, 2, 3, 6, 7, 14, 1023, 1024)] == [0, 1, 1, 2, 2, 3, 3, 10, 10]
    for n in range(1, 2000):
        assert tree_depth(n) == math.ceil(math.log2(n + 2)) - 1
    assert tree_depth(12, fanout=3) == 2  # 1 + 3 + 9 = 13 nodes
    with pytest.raises(ValueError, match="fanout"):
        tree_depth(5, fanout=1)


def test_collectives_follow_the_nccl_tests_formulas() -> None:
    s = 1e9
    # one node: bandwidth term S/B (broadcast), S(n-1)/(nB) (all-gather), 2S(n-1)/(nB) (all-reduce)
    b = NCCL_H100.busbw_node
    lat = lambda steps: NCCL_H100.base_s + steps * NCCL_H100.hop_node_s  # noqa: E731
    assert broadcast_s(s, 8) == pytest.approx(s / b + lat(8))
    assert all_gather_s(s, 8) == pytest.approx(s * 7 / (8 * b) + lat(7))
    assert all_reduce_s(s, 8) == pytest.approx(2 * s * 7 / (8 * b) + lat(14))
    assert broadcast_s(s, 1) == all_gather_s(s, 1) == all_reduce_s(s, 1) == 0.0
    # across nodes the network's bandwidth and one network hop per node boundary
    nine = broadcast_s(s, 9)
    assert nine == pytest.approx(s / NCCL_H100.busbw_net + NCCL_H100.base_s + 8 * NCCL_H100.hop_node_s
                                 + NCCL_H100.hop_net_s)


def test_weight_sync_store_work_grows_with_receivers_unless_batched() -> None:
    ring = WeightSync(fixed_s=0.3, store_rtt_s=1e-4)
    batched = WeightSync(fixed_s=0.3, store_rtt_s=1e-4, mode="ring-batched")
    tree = WeightSync(fixed_s=0.3, store_rtt_s=1e-4, mode="tree")
    nbytes = 48e6
    assert ring.seconds(nbytes, 1000) - ring.seconds(nbytes, 500) == pytest.approx(
        7 * 500 * 1e-4 + broadcast_s(nbytes, 1001) - broadcast_s(nbytes, 501))
    assert batched.seconds(nbytes, 1000) == pytest.approx(0.3 + 7e-4 + broadcast_s(nbytes, 1001))
    assert tree.seconds(nbytes, 1023) == pytest.approx(0.3 + 10 * (7e-4 + nbytes / 50e9 + NCCL_H100.hop_net_s))
    assert ring.seconds(nbytes, 0) == 0.0
    with pytest.raises(ValueError, match="mode"):
        WeightSync(fixed_s=0.3, store_rtt_s=1e-4, mode="star")


def _job(**kw) -> Job:
    base = dict(name="t", samples_per_step=64, group=8, rollout_s_per_sample=0.05, rollout_eff=((1, 1.0),),
                max_batch=32, trajectory_bytes=0, media_bytes=0, reward_s_per_sample=0.0, reward_batch=16,
                reward_threads=1, train_s_per_sample=0.1, micro_batch=8, micro_eff=((1, 1.0),), window=1,
                model_bytes=0.0, gathers_per_micro=0, sync_bytes=0.0, controller_s_per_sample=0.0,
                controller_s_per_step=0.0)
    return Job(**{**base, **kw})


FREE_REDIS = Redis(s_per_sample=0.0, s_per_byte=0.0)
SYNC = WeightSync(fixed_s=0.25, store_rtt_s=0.0)


def test_sync_mode_step_is_the_sum_of_its_phases() -> None:
    # one replica: 64 samples = 2 batches of 32 × 0.05 s; reward 0.01 s each after all are generated
    # (batches of 16, one worker); one rank trains 64 × 0.1 s; sync 0.25 s to one receiver
    job = _job(reward_s_per_sample=0.01)
    one = Cluster(devices=2, rollout=1, actor=1, reward_workers=1)
    r = Simulation(job, one, FREE_REDIS, SYNC, "sync", steps=3).run()
    sync = SYNC.seconds(0, 1)  # 0.25 s + one ring step's latency
    assert r.step_s == pytest.approx(2 * 32 * 0.05 + 64 * 0.01 + 64 * 0.1 + sync)
    assert r.phases["train"] == pytest.approx(6.4) and r.phases["sync"] == pytest.approx(sync)
    assert r.samples_per_s == pytest.approx(64 / r.step_s)
    # async-reward: the first batch is scored while the second is generated; only the last batch's 32
    # samples (two reward batches of 16) stay on the path
    r = Simulation(job, one, FREE_REDIS, SYNC, "async-reward", steps=3).run()
    assert r.step_s == pytest.approx(2 * 32 * 0.05 + 32 * 0.01 + 64 * 0.1 + sync)


def test_fully_async_step_is_the_slower_side() -> None:
    # 32 samples: rollout one batch of 32 × 0.05 = 1.6 s; training 32 × 0.1 = 3.2 s, then the sync. In
    # sync mode they add up; fully-async generates step n + 1 during training of n, so a step costs the
    # actor's side alone (its replica is idle when the sync comes: nothing waits for a batch)
    job = _job(samples_per_step=32)
    one = Cluster(devices=2, rollout=1, actor=1, reward_workers=1)
    sync = SYNC.seconds(0, 1)
    assert Simulation(job, one, FREE_REDIS, SYNC, "sync", steps=3).run().step_s == pytest.approx(1.6 + 3.2 + sync)
    r = Simulation(job, one, FREE_REDIS, SYNC, "fully-async", steps=6, warmup=2).run()
    assert r.step_s == pytest.approx(3.2 + sync)


def test_redis_as_one_server_caps_the_throughput() -> None:
    # 16 replicas each generate one batch of 32 in 1.6 s; then Redis alone: 512 samples × 20 ms (publish
    # 10 ms, the reward's read 5 ms, the actor's 5 ms) back to back, the requests' and the control
    # messages' small ops, and the sync. The replicas could make 320 samples/s; Redis carries 1/0.02.
    job = _job(rollout_s_per_sample=0.05, train_s_per_sample=0.0, samples_per_step=512)
    slow = Redis(s_per_sample=0.02, s_per_byte=0.0)
    many = Cluster(devices=17, rollout=16, actor=1, reward_workers=4)
    r = Simulation(job, many, slow, SYNC, "async-reward", steps=3).run()
    control = (64 + 2) * CONTROL_OP * 0.02
    assert r.step_s == pytest.approx(1.6 + 512 * 0.02 + control + SYNC.seconds(0, 16))
    assert r.bottleneck == "redis" and r.samples_per_s < 1 / 0.02


def test_interpolate_is_piecewise_linear_and_flat_outside() -> None:
    pts = ((1, 0.2), (4, 0.8), (8, 1.0))
    assert [interpolate(pts, x) for x in (0, 1, 2.5, 4, 6, 8, 64)] == pytest.approx([0.2, 0.2, 0.5, 0.8, 0.9, 1.0, 1.0])


def test_fair_admission_spreads_groups_over_replicas() -> None:
    # 8 groups of 8 arrive at once at 4 idle replicas: greedy, the first two take 4 groups each (32 samples:
    # 1.6 s) while the others wait with nothing; fair, each takes 2 (16 samples: 0.8 s)
    job = _job(train_s_per_sample=0.0)
    four = dict(devices=5, rollout=4, actor=1, reward_workers=1)
    greedy = Simulation(job, Cluster(**four, admission="greedy"), FREE_REDIS, SYNC, "sync", steps=3).run()
    fair = Simulation(job, Cluster(**four), FREE_REDIS, SYNC, "sync", steps=3).run()  # the role's, the default
    assert greedy.phases["rollout"] == pytest.approx(1.6) and fair.phases["rollout"] == pytest.approx(0.8)


def test_fair_admission_counts_groups_in_flight_until_published() -> None:
    # the role's rule (`fair_share`: a replica tops itself up to ⌈(waiting + in flight) / replicas⌉): every
    # published group is counted in flight until its samples are published; one replica takes what greedy takes
    job = _job(train_s_per_sample=0.0)
    fair = Simulation(job, Cluster(devices=5, rollout=4, actor=1, reward_workers=1), FREE_REDIS, SYNC, "sync",
                      steps=3)
    fair.run()
    assert fair.groups_put == fair.groups_done == 3 * 8
    one = dict(devices=2, rollout=1, actor=1, reward_workers=1)
    assert (Simulation(job, Cluster(**one), FREE_REDIS, SYNC, "sync", steps=3).run().step_s
            == Simulation(job, Cluster(**one, admission="greedy"), FREE_REDIS, SYNC, "sync", steps=3).run().step_s)


def test_redis_shards_and_payloads_by_reference_lift_the_redis_cap() -> None:
    job = _job(rollout_s_per_sample=0.05, train_s_per_sample=0.0, samples_per_step=512, trajectory_bytes=10**6,
               media_bytes=10**6)
    heavy = Redis(s_per_sample=0.002, s_per_byte=5e-9)  # 2 ms of commands + 4 MB moved × 5 ns: 22 ms a sample
    many = dict(devices=17, rollout=16, actor=1, reward_workers=4)
    one = Simulation(job, Cluster(**many), heavy, SYNC, "async-reward", steps=3).run()
    two = Simulation(job, Cluster(**many, redis_shards=2), heavy, SYNC, "async-reward", steps=3).run()
    meta = Simulation(job, Cluster(**many), Redis(s_per_sample=0.002, s_per_byte=5e-9, by_reference=True), SYNC,
                      "async-reward", steps=3).run()
    # after the replicas' 1.6 s batch, Redis alone: 512 × 22 ms on one server, 512 × 2 ms by reference (plus
    # the requests' and control messages' small ops and the sync); two shards share the 22 ms about evenly
    control, sync = (64 + 2) * CONTROL_OP * 0.002, SYNC.seconds(0, 16)
    assert one.bottleneck == "redis" and one.step_s == pytest.approx(1.6 + 512 * 0.022 + control + sync)
    assert meta.step_s == pytest.approx(1.6 + 512 * 0.002 + control + sync)
    assert two.step_s < 0.6 * one.step_s and meta.redis_util < one.redis_util


def test_cluster_predictions_read_the_idle_16_core_load_test_and_the_check_this_hosts():
    """Predictions for GPU clusters take Redis's costs from the load test on 16 idle cores (Redis saturated there);
    `--check` of the runs made on the 2-core host takes that host's own load test (docs/scale.md §1)."""
    from benchmarks.scale import jobs

    gpu_name, gpu = jobs.load_test("gpu")
    this_name, this = jobs.load_test("this")
    assert gpu_name.endswith("-cpu16-transfer-load.json") and gpu["machine"]["cpus"] == 16
    assert this_name.endswith("-cpu-transfer-load.json") and this_name != gpu_name
    tiny = sorted(r["redis_cpu_s_per_sample"] for r in gpu["rows"] if r["kind"] == "tiny")
    assert jobs.redis_for("tiny").s_per_sample == tiny[len(tiny) // 2]
    assert jobs.redis_for("tiny", host="this").s_per_sample > jobs.redis_for("tiny").s_per_sample
