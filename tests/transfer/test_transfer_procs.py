"""The TransferQueue across real OS processes, and the embedded redis-server launcher."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import socket
import sys
import threading
import time

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


def _start_role_child(tmp_path):
    from omnirl.launch.procs import _Child

    child = _Child([sys.executable, "-c", "print('role up')"], {}, str(tmp_path / "role.log"), die_with_parent=True)
    assert child.proc.wait(timeout=30) == 0 and child.poll() == 0
    return "".join(child.tail)


def _start_server(tmp_path):
    with start_redis_server(dir=str(tmp_path), die_with_parent=False) as server:
        return redis.Redis.from_url(server.url).ping()


@pytest.mark.parametrize("start, expected", [(_start_server, True), (_start_role_child, "role up\n")],
                         ids=["redis-server", "role"])
def test_children_start_from_a_thread_while_another_thread_holds_a_lock_its_locals_need(tmp_path, start, expected):
    """The launcher restarts Redis from its watchdog thread and roles while reader threads run. With a
    `preexec_fn`, Python ran in the forked child, which first clears the other threads' states: a
    thread-local whose destructor takes a lock held at the fork then blocks the child before exec, and
    `Popen` waits on it forever (CI: a torch thread-local holding a gloo group, `~ProcessGroupGloo`
    stuck in `pthread_cond_destroy`). Children now run no Python between fork and exec."""
    held, ready, release = threading.Lock(), threading.Event(), threading.Event()
    local = threading.local()

    class NeedsTheLock:
        def __del__(self):
            with held:
                pass

    def holder():
        local.value = NeedsTheLock()
        with held:
            ready.set()
            release.wait(60)

    threading.Thread(target=holder, daemon=True).start()
    assert ready.wait(10)
    result: list = []
    starter = threading.Thread(target=lambda: result.append(start(tmp_path)), daemon=True)
    try:
        starter.start()
        starter.join(30)
        assert result == [expected], "the child never exec'd: Popen still waits for it"
    finally:
        release.set()


def test_a_guarded_child_gets_its_signal_when_its_parent_is_killed(tmp_path):
    """`guarded(cmd, SIGTERM)`: the kernel sends SIGTERM to the command when the process that started it
    dies (a SIGKILLed launcher leaves no Redis behind); the command keeps its pid through the guard's exec."""
    import os
    import subprocess

    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "from omnirl.system.child import guarded\n"
         "p = subprocess.Popen(guarded(['sleep', '120'], 15))\n"
         "print(p.pid, flush=True)\ntime.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while open(f"/proc/{pid}/comm").read().strip() != "sleep":  # the guard exec'd the command
            assert time.monotonic() < deadline
            time.sleep(0.02)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline, "the child outlived its killed parent"
            time.sleep(0.05)
    finally:
        parent.kill()
