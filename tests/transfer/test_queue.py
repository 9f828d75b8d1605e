"""Service tests of the TransferQueue against a real redis-server (fixtures in conftest.py)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis
import torch
from tests.helpers import wait_until

from omnirl.api.spec import TransferQueueSpec
from omnirl.transfer import BackpressureTimeout, MissingTensors, TransferQueue, image_key
from omnirl.transfer.codec import decode_tensors, encode_tensors


def _queue(client: redis.Redis, job: str = "test-job", **kwargs) -> TransferQueue:
    return TransferQueue(client, job, **kwargs)


def _publish_n(q: TransferQueue, n: int, *, tensors: bool = False, start: int = 0) -> list[str]:
    ids = []
    for i in range(start, start + n):
        meta = {"sample_id": f"0:{i}:0", "index": i}
        payload = {"x": torch.full((2,), float(i))} if tensors else None
        ids.append(q.publish(q.streams.samples, meta, payload))
    return ids


def test_publish_consume_load_round_trip(redis_client: redis.Redis) -> None:
    q = _queue(redis_client)
    s = q.streams.samples
    q.ensure_group(s, "reward")
    q.ensure_group(s, "reward")  # BUSYGROUP is tolerated
    latents = torch.randn(3, 4, 8, 8)
    entry_id = q.publish(s, {"sample_id": "2:5:1", "policy_version": 3}, {"latents": latents})
    [msg] = q.consume(s, "reward", "w0", block_ms=0)
    assert msg.id == entry_id and msg.stream == s and msg.delivery_count == 1
    assert msg.meta == {"sample_id": "2:5:1", "policy_version": 3} and msg.sample_id == "2:5:1"
    assert msg.tensor_key == "omnirl:test-job:tensors:2:5:1"
    assert torch.equal(q.load_tensors(msg)["latents"], latents)
    assert torch.equal(q.load_tensors(msg.tensor_key)["latents"], latents)
    assert q.consume(s, "reward", "w0", block_ms=0) == []


def test_image_and_trajectory_live_under_separate_keys(redis_client: redis.Redis) -> None:
    q = _queue(redis_client, tensor_ttl_s=60)
    s = q.streams.samples
    image = torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    trajectory = {"latents": torch.randn(3, 4, 16, 16), "log_probs": torch.randn(2), "x0": torch.randn(4, 16, 16)}
    q.publish(s, {"sample_id": "1:0:2"}, trajectory, image=image, done_kind="rollout")
    [msg] = q.consume(s, "reward", "w", block_ms=0)
    assert (msg.tensor_key, image_key(msg.tensor_key)) == ("omnirl:test-job:tensors:1:0:2", "omnirl:test-job:images:1:0:2")
    # the image key holds the image alone: what a scorer fetches is 16·16·3 bytes plus one header
    stored = redis_client.get(image_key(msg.tensor_key))
    assert stored == encode_tensors({"image": image}) and set(decode_tensors(stored)) == {"image"}
    assert len(stored) < 768 + 256
    assert len(redis_client.get(msg.tensor_key)) == len(encode_tensors(trajectory)) > 10 * len(stored)
    assert torch.equal(q.load_image(msg), image) and torch.equal(q.load_image(msg.tensor_key), image)
    got = q.load_tensors(msg)
    assert set(got) == set(trajectory) and all(torch.equal(got[k], trajectory[k]) for k in trajectory)
    # one TTL for both; a duplicate publish writes neither; delete_tensors removes both
    assert 50_000 < redis_client.pttl(image_key(msg.tensor_key)) <= 60_000
    assert 50_000 < redis_client.pttl(msg.tensor_key) <= 60_000
    assert q.publish(s, {"sample_id": "1:0:2"}, {"x": torch.ones(1)}, image=torch.zeros(1), done_kind="rollout") is None
    assert torch.equal(q.load_image(msg), image)
    assert q.delete_tensors(msg.tensor_key) == 2
    with pytest.raises(MissingTensors, match="images:1:0:2"):
        q.load_image(msg)
    with pytest.raises(ValueError, match="needs the sample's tensors"):
        q.publish(s, {"sample_id": "1:0:3"}, image=image)
    with pytest.raises(ValueError, match="not under omnirl:test-job:tensors:"):
        q.load_image("omnirl:test-job:kv:x")


def test_cleanup_removes_images_too(redis_client: redis.Redis) -> None:
    q = _queue(redis_client)
    q.publish(q.streams.samples, {"sample_id": "0:0:0"}, {"x": torch.ones(1)}, image=torch.zeros(2, 2, 3))
    assert redis_client.exists("omnirl:test-job:images:0:0:0", "omnirl:test-job:tensors:0:0:0") == 2
    assert q.cleanup() == 3  # stream, trajectory, image
    assert redis_client.keys("omnirl:test-job:*") == []


def test_meta_only_entries_and_explicit_tensor_key(redis_client: redis.Redis) -> None:
    q = _queue(redis_client)
    key = "omnirl:test-job:tensors:custom"
    q.publish(q.streams.samples, {"sample_id": "a"}, {"t": torch.ones(1)}, tensor_key=key)
    q.publish(q.streams.scores, {"sample_id": "a", "reward": 0.5}, tensor_key=key)  # points at it
    q.publish(q.streams.scores, {"sample_id": "b", "reward": 0.25})
    msgs = q.consume(q.streams.scores, "controller", "c", block_ms=0)
    assert [m.meta["reward"] for m in msgs] == [0.5, 0.25]
    assert msgs[0].tensor_key == key and msgs[1].tensor_key is None
    assert torch.equal(q.load_tensors(msgs[0])["t"], torch.ones(1))
    with pytest.raises(ValueError, match="carries no tensors"):
        q.load_tensors(msgs[1])


def test_bad_input_is_refused(redis_client: redis.Redis) -> None:
    q = _queue(redis_client)
    with pytest.raises(ValueError, match="not a key of job"):
        q.publish("omnirl:other:samples", {"sample_id": "1"})
    with pytest.raises(ValueError, match=r"meta\['sample_id'\]"):
        q.publish(q.streams.samples, {"index": 1}, {"x": torch.ones(1)})
    with pytest.raises(TypeError, match=r"meta\['log_prob'\]"):
        q.publish(q.streams.samples, {"sample_id": "1", "log_prob": torch.ones(1)})
    with pytest.raises(ValueError, match="decode_responses=False"):
        TransferQueue(redis.Redis(decode_responses=True), "j")
    with pytest.raises(ValueError, match="max_stream_length"):
        TransferQueue(redis_client, "j", max_stream_length=0)
    with pytest.raises(ValueError, match="invalid job name"):
        TransferQueue(redis_client, "bad:job")
    assert redis_client.dbsize() == 0  # nothing half-written


def test_two_consumers_get_every_sample_exactly_once(redis_client: redis.Redis) -> None:
    q = _queue(redis_client)
    s = q.streams.samples
    q.ensure_group(s, "reward")
    sent = {q.publish(s, {"sample_id": f"0:{i}:0"}) for i in range(100)}
    assert q.stream_length(s) == 100 and q.lag(s, "reward") == 100
    seen: dict[str, list[str]] = {"w0": [], "w1": []}
    while True:
        batch = [(w, m) for w in ("w0", "w1") for m in q.consume(s, "reward", w, count=7, block_ms=0)]
        if not batch:
            break
        for worker, msg in batch:
            seen[worker].append(msg.id)
        assert q.pending_count(s, "reward") == len(batch)
        for worker in ("w0", "w1"):
            q.ack(s, "reward", [m.id for w, m in batch if w == worker])
    delivered = seen["w0"] + seen["w1"]
    assert len(delivered) == 100 and set(delivered) == sent
    assert (len(seen["w0"]), len(seen["w1"])) == (51, 49)  # 7 rounds of 7 + 7, then w0 reads the last 2
    assert q.pending_count(s, "reward") == 0 and q.lag(s, "reward") == 0
    assert q.stream_length(s) == 0  # fully acknowledged entries are trimmed


def test_dead_consumer_entries_are_reclaimed(redis_client: redis.Redis) -> None:
    q = _queue(redis_client, claim_idle_s=2.0)
    s = q.streams.samples
    q.ensure_group(s, "reward")
    _publish_n(q, 8)
    dead = q.consume(s, "reward", "dead", count=5, block_ms=0)  # reads 5, dies without acking
    assert len(dead) == 5 and q.pending_count(s, "reward") == 5
    fresh = q.consume(s, "reward", "alive", count=10, block_ms=0)  # not idle yet: only the new 3
    assert [m.delivery_count for m in fresh] == [1, 1, 1]
    q.ack(s, "reward", [m.id for m in fresh])
    assert q.stream_length(s) == 8  # the dead consumer's pending entries block trimming
    reclaimed = wait_until(lambda: q.consume(s, "reward", "alive", count=10, block_ms=0),
                           "the dead consumer's entries to be reclaimed once idle for 2 s")
    assert [m.id for m in reclaimed] == [m.id for m in dead]
    assert [m.meta for m in reclaimed] == [m.meta for m in dead]
    assert all(m.delivery_count == 2 for m in reclaimed)
    q.ack(s, "reward", [m.id for m in reclaimed])
    assert q.pending_count(s, "reward") == 0 and q.stream_length(s) == 0


def test_publish_with_done_kind_is_exactly_once(redis_client: redis.Redis) -> None:
    q = _queue(redis_client)
    s = q.streams.scores
    first = q.publish(s, {"sample_id": "0:0:0", "reward": 1.0}, {"r": torch.ones(1)}, done_kind="reward")
    again = q.publish(s, {"sample_id": "0:0:0", "reward": 2.0}, {"r": torch.zeros(1)}, done_kind="reward")
    assert first is not None and again is None
    assert q.stream_length(s) == 1 and q.is_done("reward", "0:0:0")
    assert torch.equal(q.load_tensors("omnirl:test-job:tensors:0:0:0")["r"], torch.ones(1))


def test_count_key_counts_each_published_result_once_in_the_same_atomic_step(redis_client: redis.Redis) -> None:
    """The sync-mode `generated:{step}` count: one INCR per new result, none for a duplicate, and
    with image and trajectory keys in the same call (the script's key positions shift)."""
    q = _queue(redis_client)
    s, count = q.streams.samples, "omnirl:test-job:kv:generated:7"
    for i in range(3):
        q.publish(s, {"sample_id": f"7:0:{i}"}, {"x": torch.ones(2)}, image=torch.zeros(2), done_kind="rollout",
                  count_key=count)
    assert q.publish(s, {"sample_id": "7:0:1"}, {"x": torch.ones(2)}, image=torch.zeros(2), done_kind="rollout",
                     count_key=count) is None  # redelivered: already published and counted
    q.publish(s, {"sample_id": "7:0:9"}, {"x": torch.ones(2)}, count_key=count)  # no marker, no image
    assert int(redis_client.get(count)) == 4 and q.stream_length(s) == 4
    assert torch.equal(q.load_image("omnirl:test-job:tensors:7:0:2"), torch.zeros(2))
    with pytest.raises(ValueError, match="count key 'other:generated:7' is not a key of job 'test-job'"):
        q.publish(s, {"sample_id": "7:0:3"}, {"x": torch.ones(2)}, count_key="other:generated:7")


def test_backpressure_times_out_without_consumer(redis_client: redis.Redis) -> None:
    q = _queue(redis_client, max_stream_length=5, backpressure_timeout_s=0.3)
    q.ensure_group(q.streams.samples, "reward")  # a group that never reads
    _publish_n(q, 5)
    start = time.monotonic()
    with pytest.raises(BackpressureTimeout, match="still holds 5 entries") as info:
        _publish_n(q, 1, start=5)
    assert time.monotonic() - start >= 0.3  # it waited the timeout out before giving up
    assert info.value.length == 5 and info.value.max_length == 5
    assert q.stream_length(q.streams.samples) == 5


def test_backpressure_releases_when_a_consumer_drains(redis_client: redis.Redis) -> None:
    q = _queue(redis_client, max_stream_length=5, backpressure_timeout_s=10)
    s = q.streams.samples
    q.ensure_group(s, "reward")
    received: list[int] = []
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            msgs = q.consume(s, "reward", "d", count=2, block_ms=50)
            received.extend(m.meta["index"] for m in msgs)
            q.ack(s, "reward", [m.id for m in msgs])

    thread = threading.Thread(target=drain)
    thread.start()
    max_len = 0
    try:
        for i in range(40):
            q.publish(s, {"sample_id": f"0:{i}:0", "index": i})
            max_len = max(max_len, q.stream_length(s))
        wait_until(lambda: len(received) >= 40, "the drain thread to receive all 40 entries")
    finally:
        stop.set()
        thread.join()
    assert sorted(received) == list(range(40))
    assert max_len <= 5


def test_trimming_keeps_the_stream_bounded(redis_client: redis.Redis) -> None:
    q = _queue(redis_client, max_stream_length=50, backpressure_timeout_s=10)
    s = q.streams.samples
    q.ensure_group(s, "reward")
    q.ensure_group(s, "audit")  # a second group: trimming waits for both
    done = threading.Event()
    max_len = [0]

    def produce() -> None:
        for i in range(1000):
            q.publish(s, {"sample_id": f"0:{i}:0"})
            max_len[0] = max(max_len[0], q.stream_length(s))
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    counts = {"reward": 0, "audit": 0}
    deadline = time.monotonic() + 120  # only a hang reaches it
    while (not done.is_set() or sum(counts.values()) < 2000) and time.monotonic() < deadline:
        for group in counts:
            msgs = q.consume(s, group, "c", count=20, block_ms=10)
            counts[group] += len(msgs)
            q.ack(s, group, [m.id for m in msgs])
    producer.join()
    assert counts == {"reward": 1000, "audit": 1000}
    assert max_len[0] <= 50
    assert q.stream_length(s) == 0
    assert q.pending_count(s, "reward") == 0 and q.lag(s, "audit") == 0


def test_tensor_keys_have_a_ttl_and_missing_ones_raise(redis_client: redis.Redis) -> None:
    q = _queue(redis_client, tensor_ttl_s=60)
    s = q.streams.samples
    _publish_n(q, 1, tensors=True)
    _queue(redis_client, tensor_ttl_s=0.2).publish(s, {"sample_id": "short"}, {"x": torch.ones(1)})
    [m0, m1] = q.consume(s, "reward", "w", block_ms=0)
    assert 50_000 < redis_client.pttl(m0.tensor_key) <= 60_000
    assert q.delete_tensors([m0.tensor_key]) == 1
    with pytest.raises(MissingTensors, match="tensors:0:0:0") as info:
        q.load_tensors(m0)
    assert info.value.key == m0.tensor_key
    wait_until(lambda: not redis_client.exists(m1.tensor_key), "the 0.2 s tensor TTL to expire")
    with pytest.raises(MissingTensors, match="tensors:short"):
        q.load_tensors(m1)


def test_kv_json(redis_client: redis.Redis) -> None:
    q = _queue(redis_client)
    assert q.get_json("policy_version") is None
    q.set_json("policy_version", 4)
    q.set_json("stop", {"reason": "done", "step": 10}, ttl_s=60)
    assert q.get_json("policy_version") == 4
    assert q.get_json("stop") == {"reason": "done", "step": 10}
    assert 0 < redis_client.pttl("omnirl:test-job:kv:stop") <= 60_000
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        q.set_json("bad", float("nan"))


def test_cleanup_removes_only_this_job(redis_client: redis.Redis) -> None:
    a, b = _queue(redis_client, "job-a"), _queue(redis_client, "job-a2")
    for q in (a, b):
        q.ensure_group(q.streams.requests, "rollout")
        _publish_n(q, 3, tensors=True)
        q.publish(q.streams.scores, {"sample_id": "0:0:0"}, done_kind="reward")
        q.set_json("policy_version", 1)
    redis_client.set(b"unrelated", b"1")
    keys_b = set(redis_client.keys("omnirl:job-a2:*"))
    assert len(keys_b) == 1 + 1 + 1 + 3 + 1 + 1  # requests, samples, scores, 3 tensors, done, kv
    assert a.cleanup() == 8
    assert redis_client.keys("omnirl:job-a:*") == []
    assert set(redis_client.keys("omnirl:job-a2:*")) == keys_b and redis_client.exists(b"unrelated")
    # the queue still works after cleanup (groups are re-created on demand)
    _publish_n(a, 1)
    assert len(a.consume(a.streams.samples, "reward", "w", block_ms=0)) == 1


def test_from_url_owns_its_client(redis_url: str, redis_client: redis.Redis) -> None:
    with TransferQueue.from_url(redis_url, "url-job") as q:
        q.set_json("x", [1, 2])
        assert q.get_json("x") == [1, 2]


def test_for_job_takes_the_bounds_from_the_spec(redis_url: str) -> None:
    settings = TransferQueueSpec(maxStreamLength=7, tensorTtlSeconds=72.5, claimIdleSeconds=3.0)
    with TransferQueue.for_job("spec-job", settings, redis_url) as q:
        assert (q.job, q.max_stream_length, q.tensor_ttl_s, q.claim_idle_s) == ("spec-job", 7, 72.5, 3.0)
        assert q.redis.connection_pool.connection_kwargs["port"] == int(redis_url.rsplit(":", 1)[1].split("/")[0])


def test_lag_counts_undelivered_entries_with_and_without_xinfo_lag(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _queue(redis_client)
    s = q.streams.samples
    q.ensure_group(s, "reward")
    _publish_n(q, 10)
    msgs = q.consume(s, "reward", "w", count=4, block_ms=0)
    q.ack(s, "reward", [m.id for m in msgs[:3]])  # trims 3; one stays pending
    assert (q.stream_length(s), q.pending_count(s, "reward"), q.lag(s, "reward")) == (7, 1, 6)
    real = redis_client.xinfo_groups
    monkeypatch.setattr(redis_client, "xinfo_groups", lambda name: [
        {k: v for k, v in g.items() if k != "lag"} for g in real(name)
    ])  # Redis < 7 has no 'lag' field: the XRANGE count must agree
    assert q.lag(s, "reward") == 6
    with pytest.raises(ValueError, match="no consumer group 'nobody'"):
        q.pending_count(s, "nobody")
    with pytest.raises(ValueError, match="does not exist"):
        q.lag(q.streams.control, "reward")


def test_touch_renews_the_lease_of_work_in_progress(redis_client):
    from omnirl.transfer import TransferQueue

    q = TransferQueue(redis_client, "lease", claim_idle_s=1.0)
    stream = q.streams.requests
    q.ensure_group(stream, "g")
    q.publish(stream, {"sample_id": "0:0:0"})
    (msg,) = q.consume(stream, "g", "alive", count=1, block_ms=0)
    for _ in range(4):  # the owner keeps renewing (1.6 s > claim_idle in all): nobody else may take it
        time.sleep(0.4)
        q.touch(stream, "g", "alive", [msg.id])
        assert q.consume(stream, "g", "other", count=1, block_ms=0) == []
    # the owner stopped renewing (died): it is reclaimed once idle for 1 s
    (again,) = wait_until(lambda: q.consume(stream, "g", "other", count=1, block_ms=0), "the lapsed lease's reclaim")
    assert again.id == msg.id and again.delivery_count >= 2


def test_touch_leaves_an_entry_another_consumer_reclaimed_with_it(redis_client):
    """A consumer whose renewals lapsed does not take its entry back: a blind XCLAIM did, and both worked on it."""
    q = TransferQueue(redis_client, "lease", claim_idle_s=1.0)
    stream = q.streams.requests
    q.publish(stream, {"sample_id": "0:0:0"})
    q.publish(stream, {"sample_id": "0:0:1"})
    first, second = q.consume(stream, "g", "slow", count=2, block_ms=0)
    time.sleep(1.1)
    q.touch(stream, "g", "slow", [second.id])
    (taken,) = q.consume(stream, "g", "other", count=2, block_ms=0)
    assert taken.id == first.id
    assert q.touch(stream, "g", "slow", [first.id, second.id]) == [second.id]
    owners = {e["message_id"].decode(): e["consumer"].decode() for e in redis_client.xpending_range(stream, "g", "-", "+", 10)}
    assert owners == {first.id: "other", second.id: "slow"}
    q.ack(stream, "g", [second.id])
    assert q.touch(stream, "g", "slow", [second.id]) == [] and q.pending_count(stream, "g") == 1


def test_holding_renews_a_claim_while_live_and_lets_it_lapse_once_not(redis_client):
    from omnirl.transfer.lease import holding

    q = TransferQueue(redis_client, "lease", claim_idle_s=1.0)
    stream = q.streams.samples
    q.publish(stream, {"sample_id": "0:0:0"})
    (msg,) = q.consume(stream, "reward", "a", count=1, block_ms=0)
    live = [True]
    with holding(q, stream, "reward", "a", [msg.id], alive=lambda: live[0]):
        for _ in range(6):  # 2.4 s > claim_idle_s: renewed every 1/3 s
            time.sleep(0.4)
            assert q.consume(stream, "reward", "b", count=1, block_ms=0) == []
        live[0] = False  # stuck: its claim lapses claim_idle_s after the last renewal
        (again,) = wait_until(lambda: q.consume(stream, "reward", "b", count=1, block_ms=0), "the lapsed claim")
    assert again.id == msg.id and again.delivery_count == 2


class _ReplyDropper:
    """A real TCP proxy to Redis that forwards everything but, once armed, drops the connection right
    after forwarding a script call (EVALSHA) and before its reply: what a Redis restart does to a
    publish that the server executed (and its AOF kept) but whose reply the client never read."""

    def __init__(self, port: int) -> None:
        self.port, self.armed, self.dropped, self._pending = port, False, 0, False
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.server.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, to_redis: bool) -> None:
        try:
            while data := src.recv(65536):
                if not to_redis and self._pending:  # the script ran; its reply never arrives
                    self._pending, self.armed, self.dropped = False, False, self.dropped + 1
                    src.close()
                    dst.close()
                    return
                if to_redis and self.armed and b"EVALSHA" in data:
                    self._pending = True
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()


def test_a_retried_publish_whose_reply_was_lost_reports_its_own_entry(redis_server) -> None:
    """The reward role writes its ledger line only when `publish` returns an entry id. A Redis restart
    between the script's execution and its reply made redis-py retry the call; the retry found the
    marker its own first attempt had set and returned None, so a published score had no ledger line
    (`make chaos`: "trained but never scored", lost=1). The retry now gets its entry id; a duplicate
    from another call still gets None, and the stream holds one entry."""
    proxy = _ReplyDropper(int(redis_server.url.rsplit(":", 1)[1].split("/")[0]))
    q = TransferQueue.from_url(proxy.url, "retry-job", reconnect_s=10)
    try:
        s = q.streams.scores
        q.publish(s, {"sample_id": "3:30:0"}, tensor_key="omnirl:retry-job:tensors:3:30:0", done_kind="reward")
        proxy.armed = True  # the script is loaded now: the next EVALSHA runs it
        entry = q.publish(s, {"sample_id": "3:31:0"}, tensor_key="omnirl:retry-job:tensors:3:31:0", done_kind="reward")
        assert proxy.dropped == 1  # the first reply was lost: the id came from the retry
        assert entry is not None and q.stream_length(s) == 2
        assert q.publish(s, {"sample_id": "3:31:0"}, tensor_key="omnirl:retry-job:tensors:3:31:0",
                         done_kind="reward") is None  # another call: a true duplicate
        assert q.stream_length(s) == 2
    finally:
        q.cleanup()
        q.close()
        proxy.close()
