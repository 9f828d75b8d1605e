"""The TransferQueue across real OS processes, and the embedded redis-server launcher."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import socket

import pytest
import redis
import torch

from omnirl.transfer import RedisServerError, TransferQueue, start_redis_server

N_SAMPLES = 200
JOB = "proc-job"


def _producer(url: str) -> None:
    """Publish N_SAMPLES samples with tensors whose values encode the index."""
    torch.set_num_threads(1)
    with TransferQueue.from_url(url, JOB, max_stream_length=32, backpressure_timeout_s=30) as q:
        for i in range(N_SAMPLES):
            sample_id = f"0:{i // 4}:{i % 4}"
            q.publish(q.streams.samples, {"sample_id": sample_id, "i": i}, {"x": torch.full((4, 4), float(i))})


def _consumer(url: str, result: mp.Queue) -> None:
    """Read until N_SAMPLES distinct ids arrived; check each tensor; report the ids."""
    torch.set_num_threads(1)
    ids: list[str] = []
    with TransferQueue.from_url(url, JOB) as q:
        s = q.streams.samples
        while len(set(ids)) < N_SAMPLES:
            msgs = q.consume(s, "reward", "proc", count=16, block_ms=2000)
            if not msgs:
                break  # the producer stalled: report what arrived
            for msg in msgs:
                x = q.load_tensors(msg)["x"]
                if not torch.equal(x, torch.full((4, 4), float(msg.meta["i"]))):
                    raise AssertionError(f"tensor of {msg.sample_id} corrupted")
                ids.append(msg.sample_id)
            q.delete_tensors([m.tensor_key for m in msgs])
            q.ack(s, "reward", [m.id for m in msgs])
    result.put(ids)


def test_producer_and_consumer_processes_exchange_every_sample(redis_url: str, redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, JOB)
    q.ensure_group(q.streams.samples, "reward")
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    consumer = ctx.Process(target=_consumer, args=(redis_url, result))
    producer = ctx.Process(target=_producer, args=(redis_url,))
    consumer.start()
    producer.start()
    try:
        ids = result.get(timeout=60)
    finally:
        producer.join(timeout=30)
        consumer.join(timeout=30)
        for proc in (producer, consumer):
            if proc.is_alive():
                proc.kill()
    assert producer.exitcode == 0 and consumer.exitcode == 0
    sent = {f"0:{i // 4}:{i % 4}" for i in range(N_SAMPLES)}
    assert len(ids) == N_SAMPLES and set(ids) == sent
    assert q.pending_count(q.streams.samples, "reward") == 0
    assert q.stream_length(q.streams.samples) == 0
    assert redis_client.keys(f"omnirl:{JOB}:tensors:*") == []


def test_start_redis_server_in_a_given_dir(tmp_path) -> None:
    with start_redis_server(dir=str(tmp_path)) as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        assert client.ping() is True
        assert client.config_get("save")["save"] == "" and client.config_get("appendonly")["appendonly"] == "no"
        client.close()
        assert server.log_path.parent == tmp_path and server.log_path.exists()
    assert not server.alive()
    server.stop()  # idempotent
    assert list(tmp_path.glob("*.rdb")) == []


def test_start_redis_server_temp_dir_is_removed() -> None:
    server = start_redis_server()
    workdir = server.dir
    assert workdir.exists()
    server.stop()
    assert not workdir.exists() and not server.alive()


def test_port_in_use_is_a_clear_error(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(RedisServerError, match="exited with code"):
            start_redis_server(port=port, dir=str(tmp_path), timeout_s=5)


def test_missing_binary_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RedisServerError, match="apt-get install redis-server"):
        start_redis_server()


def test_a_ctrl_c_inside_popen_stops_the_server_it_was_starting(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that arrives while `Popen` forks the server (a long window on a loaded machine) used
    to raise inside `Popen`: no process object, no pid, the server outlived the launcher. The stop
    signals are blocked around `Popen`, so it lands once the process is known, which is stopped.
    The server itself gets them unblocked (its mask is empty: `stop()`'s SIGTERM works)."""
    import signal
    import subprocess
    import threading

    from omnirl.transfer import redis_server

    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):
        started.append(real(*args, **kwargs))
        # the Ctrl-C arrives before Popen returns; aimed at this thread, as in the single-threaded launcher
        # (a process-directed one may go to another pytest thread, which does not block it)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        return started[-1]

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    monkeypatch.setattr(redis_server.subprocess, "Popen", popen_then_ctrl_c)
    # pytest started in the background by a shell without job control inherits SIGINT ignored (CI)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            start_redis_server(dir=str(tmp_path / "a"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(started) == 1 and started[0].poll() is not None  # stopped, not left running
    monkeypatch.setattr(redis_server.subprocess, "Popen", real)
    with start_redis_server(dir=str(tmp_path / "b")) as server:
        status = dict(line.split(":\t") for line in open(f"/proc/{server.process.pid}/status").read().splitlines()
                      if ":\t" in line)
        assert int(status["SigBlk"], 16) == 0
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == mask  # the launcher's mask is restored
