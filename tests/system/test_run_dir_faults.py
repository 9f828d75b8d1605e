"""A run directory that cannot be written, and a stop while `omnirl run` is still starting.

Real parts: `omnirl run` as a subprocess, real role-like processes under the real Supervisor, a real
read-only or full file system where this machine lets the test mount one (root and `mount`: a tmpfs;
otherwise `chmod 0555` for the read-only case, and the full-disk case is skipped with the reason).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from tests.helpers import supervise_scripts, without_file_permission_override

from omnirl.api.exits import INTERRUPTED_EXIT, STORAGE_ERROR_EXIT, USAGE_EXIT
from omnirl.system import disk

REPO = Path(__file__).resolve().parents[2]


def _mount_tmpfs(where: Path, *options: str) -> bool:
    """Mount a 256 KiB tmpfs on `where` (root only); False when this machine does not allow it."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=256k", *options)), "tmpfs", str(where)],
                          capture_output=True)
    return done.returncode == 0


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory no write reaches: a read-only tmpfs (root), else one chmod 0555 (another user)."""
    where = tmp_path / "ro"
    if _mount_tmpfs(where, "ro"):
        yield where
        _umount(where)
        return
    if os.geteuid() == 0:
        pytest.skip("root without mount: chmod does not stop root, and no read-only file system can be made")
    where.chmod(0o555)
    yield where
    where.chmod(0o755)


@pytest.fixture
def small_fs(tmp_path):
    """A directory on its own 256 KiB tmpfs (root with mount only): a role can fill it for real."""
    where = tmp_path / "small"
    if not _mount_tmpfs(where):
        pytest.skip("a full file system needs a tmpfs mount (root with mount)")
    yield where
    _umount(where)


def _file_size_limited(cmd: list[str], limit: int) -> list[str]:
    """``cmd`` under RLIMIT_FSIZE ``limit`` bytes, set after exec (a `preexec_fn` runs Python between fork
    and exec, which can deadlock the child of a multi-threaded process: see `omnirl.system.child`)."""
    script = ("import os, resource, signal, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
              "signal.signal(signal.SIGXFSZ, signal.SIG_DFL); os.execv(sys.argv[2], sys.argv[2:])")
    return [sys.executable, "-c", script, str(limit), *cmd]


def _run(*args: str, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "omnirl.cli", "run", "examples/ocr-awm.yaml", "--device", "cpu", "--steps", "1",
           "--no-ray", *args]
    if file_size_limit is not None:
        cmd = _file_size_limited(cmd, file_size_limit)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_an_out_that_cannot_be_written_is_one_line_naming_out_and_the_fix(tmp_path, read_only_dir):
    """`--out` under a file, in a read-only directory, or a read-only directory itself: exit 2, one
    line naming --out, the path, the errno text and the fix; nothing started, nothing created. It was a
    traceback (`OSError: [Errno 30] Read-only file system` from the launcher's mkdir)."""
    (tmp_path / "a_file").write_text("x")
    refused = (f"[Errno {errno.EROFS}] Read-only file system); make it writable" if os.geteuid() == 0 else
               f"[Errno {errno.EACCES}] Permission denied); make it writable")
    cases = {
        tmp_path / "a_file" / "sub": f"{tmp_path / 'a_file'} is a file, not a directory; choose a directory for the "
                                     "run's outputs",
        read_only_dir / "run": f"{read_only_dir} cannot be written ({refused} or choose another --out",
        read_only_dir: f"{read_only_dir} cannot be written ({refused} or choose another --out",
    }
    for out, expected in cases.items():
        proc = _run("--out", str(out))
        assert proc.returncode == USAGE_EXIT, proc.stderr
        assert proc.stderr.splitlines() == [f"omnirl run: --out {out}: {expected}"]
        assert proc.stdout == ""
    # omnirl eval checks its --out before minutes of sampling, not at the end
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "eval", "examples/ocr-awm.yaml", "--out",
                           str(read_only_dir / "eval")], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == USAGE_EXIT and proc.stderr.splitlines() == [
        f"omnirl eval: --out {read_only_dir / 'eval'}: {read_only_dir} cannot be written ({refused} or choose "
        "another --out"], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "ro"]


def test_a_launcher_write_refused_after_the_probe_ends_with_the_storage_verdict(tmp_path):
    """The probe's byte fits but the launcher's job.yaml does not (RLIMIT_FSIZE 512 bytes: EFBIG, as a
    disk with a few bytes left): exit 5 and the storage verdict naming the file, the errno text, the
    fix and the command that continues; no traceback. Before, an OSError traceback."""
    out = tmp_path / "out"
    proc = _run("--out", str(out), file_size_limit=512)
    assert proc.returncode == STORAGE_ERROR_EXIT, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines() == [
        f"omnirl: the job did not finish (exit 5): cannot write {out} ([Errno 27] File too large); "
        f"raise the file-size limit (ulimit -f), then continue with: omnirl run examples/ocr-awm.yaml --out {out} "
        "--steps 1 --no-ray --device cpu"], proc.stdout


def test_the_probe_sees_a_write_the_file_system_refuses_and_names_the_errno(small_fs):
    """A full tmpfs still creates an empty file; the probe's byte is what it refuses (ENOSPC)."""
    assert disk.unwritable(small_fs) is None
    with (small_fs / "filler").open("wb") as f, pytest.raises(OSError) as raised:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    assert raised.value.errno == errno.ENOSPC
    err = disk.unwritable(small_fs)
    assert err is not None and disk.describe(err) == "[Errno 28] No space left on device"
    assert disk.fix(err) == "free space there"


_ROLE_FAILS = """
import argparse, os, sys
import omnirl.launch.roles as roles
op, path = sys.argv[1], sys.argv[2]
def run_role(role, job, env):
    if op == "read":
        open(path, "rb").close()
    elif op == "append":
        open(path, "ab").close()
    else:
        open(path, "xb").close()
roles.run_role = run_role
sys.exit(roles.main(argparse.Namespace(role="actor", job="job.yaml", out=None)))
"""


def test_a_role_says_whether_a_read_or_a_write_was_refused_with_the_path_and_the_fix(tmp_path):
    """EACCES/EPERM stop a role with exit 5 whether it read or wrote: the line says which, on the
    path that failed, with the fix for that. Before, every one read "cannot write ... make it
    writable", also for a model file or checkpoint the role could not read."""
    unreadable, locked, read_only = tmp_path / "model.safetensors", tmp_path / "locked", tmp_path / "ro.jsonl"
    unreadable.write_bytes(b"x")
    unreadable.chmod(0)
    locked.mkdir()
    (locked / "config.json").write_text("{}")
    read_only.write_text("{}\n")
    read_only.chmod(0o444)
    no_write = tmp_path / "no-write"
    no_write.mkdir()
    no_write.chmod(0o555)
    locked.chmod(0)
    uid = os.getuid()
    access = "its owner or mode; in a pod, uid 1000: give the volume an fsGroup or chown it"
    denied = "([Errno 13] Permission denied)"
    cases = {
        ("read", unreadable): f"cannot read {unreadable} {denied}; make it readable by uid {uid} ({access})",
        ("read", locked / "config.json"): f"cannot reach {locked / 'config.json'} {denied}; make it reachable "
                                          f"(search permission on every directory above it) by uid {uid} ({access})",
        ("append", read_only): f"cannot write {read_only} {denied}; make it writable by uid {uid} ({access})",
        ("create", no_write / "step"): f"cannot write {no_write / 'step'} {denied}; make it writable by uid {uid} "
                                       f"({access})",
    }
    env = {**os.environ, "OMNIRL_JOB_NAME": "j", "OMNIRL_REDIS_URL": "redis://127.0.0.1:1/0"}
    try:
        for (op, path), expected in cases.items():
            cmd = without_file_permission_override([sys.executable, "-c", _ROLE_FAILS, op, str(path)])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
            assert (done.returncode, done.stderr.splitlines()[-1:]) == (5, [f"omnirl role actor: {expected}"]), \
                done.stderr
    finally:
        locked.chmod(0o755)
        no_write.chmod(0o755)


def test_storage_errors_are_recognised_behind_a_library_or_a_chain():
    """An OSError's errno, a cause's, or a native writer's text (safetensors raises its own type
    with the system's text); other errors are not storage faults."""
    assert disk.storage_error(OSError(errno.ENOSPC, "No space left on device", "/x")).filename == "/x"
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as inner:
            raise RuntimeError("could not save") from inner
    except RuntimeError as outer:
        assert disk.storage_error(outer).errno == errno.EROFS

    class SafetensorError(Exception):
        pass

    native = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                             'message: "No space left on device" })')
    assert disk.storage_error(native).errno == errno.ENOSPC
    assert disk.storage_error(OSError(errno.ENOENT, "No such file or directory")) is None
    assert disk.storage_error(ValueError("bad")) is None


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(c) for c in (task / "children").read_text().split())
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""  # gone since it was listed


def _ctrl_c_while_redis_starts(tmp_path: Path, out: Path, *flags: str) -> tuple[int, str, str, bool]:
    """`omnirl run examples/ocr-awm.yaml --out OUT FLAGS` with a `redis-server` on PATH that never answers
    (and ignores SIGTERM), SIGINTed once the launcher started it. Returns (exit code, stdout, stderr,
    whether the fake server outlived the launcher)."""
    fake = tmp_path / "bin" / "redis-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ntrap '' TERM\nexec sleep 300\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "PYTHONFAULTHANDLER": "1"}
    # a test run started in the background by a shell without job control (CI's `cmd &`) inherits SIGINT
    # *ignored*, and so would the launcher (Python then installs no KeyboardInterrupt handler): a handled
    # SIGINT here is reset to the default across exec, so the launcher gets a terminal's Ctrl-C
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "run", "examples/ocr-awm.yaml", "--device",
                                 "cpu", *flags, "--no-ray", "--out", str(out)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, ignored)
    server = set()
    left = False
    try:
        while not server and proc.poll() is None:  # the launcher started its (fake) Redis: it waits for PING
            server = {pid for pid in _children(proc.pid) if b"sleep" in _cmdline(pid)}  # exec'd: not in Popen
            time.sleep(0.1)
        assert server, proc.communicate()
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: the launcher prints where it is stuck
            stdout, stderr = proc.communicate(timeout=30)
            raise AssertionError(f"the launcher did not stop within 120 s of Ctrl-C:\n{stdout}\n{stderr}") from None
    finally:
        proc.kill()
        for pid in server:  # the fake server, if the launcher left it (it ignores SIGTERM)
            try:
                os.kill(pid, signal.SIGKILL)
                left = True
            except ProcessLookupError:
                pass
    return proc.returncode, stdout, stderr, left


def test_ctrl_c_while_redis_starts_prints_the_interrupt_verdict_and_leaves_nothing(tmp_path):
    """SIGINT while the launcher waits for its Redis to answer (a `redis-server` on PATH that never
    does, and ignores SIGTERM): exit 130, the launcher's usual last line, no traceback, and the
    server process is gone. It was a KeyboardInterrupt traceback, and the server outlived the
    launcher (its parent-death signal is a SIGTERM)."""
    out = tmp_path / "out"
    code, stdout, stderr, left = _ctrl_c_while_redis_starts(tmp_path, out, "--steps", "1")
    assert code == INTERRUPTED_EXIT, stdout + stderr
    assert "Traceback" not in stdout + stderr, stdout + stderr
    assert stdout.strip().splitlines()[-2:] == [
        "omnirl: interrupted before the roles started — stopping what was started (nothing to checkpoint)",
        f"omnirl: interrupted (exit 130); continue with: omnirl run examples/ocr-awm.yaml --out {out} --steps 1 "
        "--no-ray --device cpu"], stdout
    assert not left, "the redis-server the launcher started outlived it"


def test_ctrl_c_of_a_resumed_finished_run_is_not_after_the_job_had_finished(tmp_path):
    """`--resume --steps 2` of a run that finished after 1 step, interrupted before its controller
    started (here: while Redis starts; the user's case was a restart-job loop): the job asked for has not
    finished, so the last line is how to continue it. It said "after the job had finished: nothing to
    continue", read from the earlier run's final record."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"event": "start"}\n{"event": "step", "step": 0}\n{"event": "finish"}\n')
    code, stdout, stderr, left = _ctrl_c_while_redis_starts(tmp_path, out, "--steps", "2", "--resume")
    assert code == INTERRUPTED_EXIT, stdout + stderr
    assert stdout.strip().splitlines()[-1] == (
        f"omnirl: interrupted (exit 130); continue with: omnirl run examples/ocr-awm.yaml --out {out} --steps 2 "
        "--no-ray --device cpu --resume"), stdout
    assert not left, "the redis-server the launcher started outlived it"


def _supervise_filler(tmp_path: Path, redis_url: str, script: str, embedded=None,
                      beats: int = 600) -> tuple[int, int, list[dict], str]:
    """The Supervisor over a rollout process running `script` and a controller that beats `beats`
    times (every 0.2 s) then exits 0; restart-role with maxRestarts 2; `embedded`: the RedisServer
    it watches as its own. Returns (exit code, rollout starts, events, failure)."""
    from omnirl.api.loader import load_rljob

    job = load_rljob(str(REPO / "examples/ocr-awm.yaml"))
    job = job.model_copy(update={"spec": job.spec.model_copy(update={
        "failurePolicy": job.spec.failurePolicy.model_copy(update={"maxRestarts": 2, "rollout": "restart-role"})})})
    code, supervisor = supervise_scripts(job, script, redis_url, tmp_path, f"full-{uuid.uuid4().hex[:8]}", beats=beats,
                                         redis=embedded)
    starts = [p for p in supervisor.procs.values() if p.role == "rollout"]
    events_file = tmp_path / "events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
    return code, len(starts) + sum(e["action"] == "restart-role" for e in events), events, supervisor.failure


@pytest.mark.parametrize("line,action", [
    ("omnirl role rollout: cannot write /run/x ([Errno 28] No space left on device); free space there",
     "stop-job (the run directory cannot be written: not restarted)"),
    # a model file it may not read: the run directory is not at fault (it said so for any exit 5)
    ("omnirl role rollout: cannot read /models/m/config.json ([Errno 13] Permission denied); make it readable by "
     "uid 0 (its owner or mode; in a pod, uid 1000: give the volume an fsGroup or chown it)",
     "stop-job (a file cannot be read: not restarted)"),
])
def test_a_role_that_reports_a_storage_error_stops_the_job_without_a_restart(tmp_path, redis_url, line, action):
    """Exit STORAGE_ERROR_EXIT (5): the job stops with 5 at once, no restart spent, the role's line
    is the reason, and the event says what could not be done (read a file, or write the run directory)."""

    code, starts, events, failure = _supervise_filler(
        tmp_path, redis_url, f"import sys; print({line!r}, file=sys.stderr, flush=True); raise SystemExit({STORAGE_ERROR_EXIT})")
    assert (code, starts) == (STORAGE_ERROR_EXIT, 1)
    assert failure == f"role rollout-0 failed: {line}"
    assert [e["action"] for e in events] == [action]


def test_a_redis_killed_for_a_file_too_large_is_not_restarted_and_stops_the_job(tmp_path, redis_url):
    """The embedded redis-server killed by SIGXFSZ (its AOF past RLIMIT_FSIZE; unlike Python it does
    not ignore the signal): a restart would die at its next append, so the watchdog stops the job
    with STORAGE_ERROR_EXIT naming the errno text and the fix. Before, it restarted Redis and the
    job went on (here: the controller finishes after 60 s and the run returns 0)."""
    from omnirl.transfer import start_redis_server

    embedded = start_redis_server(dir=str(tmp_path / "redis"), aof=True)
    try:
        kill = f"import os, signal; os.kill({embedded.pid}, signal.SIGXFSZ)\nimport time; time.sleep(60)"
        code, starts, events, failure = _supervise_filler(tmp_path, redis_url, kill, embedded=embedded, beats=300)
    finally:
        embedded.stop()
    assert (code, starts) == (STORAGE_ERROR_EXIT, 1), failure
    assert failure == (f"{tmp_path} cannot be written ([Errno 27] File too large); redis: redis-server exited "
                       "(signal SIGXFSZ); raise the file-size limit (ulimit -f)")
    assert [e["action"] for e in events] == ["stop-job (the run directory cannot be written: not restarted)"]


def test_a_crash_on_a_full_run_directory_stops_the_job_instead_of_restarting(small_fs, redis_url):
    """A role fills the run directory's file system and dies of something else (exit 1, as a role
    whose Redis died of the full disk): the supervisor's probe write fails, so the job stops with
    STORAGE_ERROR_EXIT naming the directory and the errno text instead of restarting the role twice.
    The launcher's own writes to the full disk (the role's log, events.jsonl) do not raise."""

    # it fills the disk only once the supervisor wrote roles.json (its last write before it watches)
    fill = (f"import os, time\nwhile not os.path.exists({str(small_fs / 'roles.json')!r}): time.sleep(0.05)\n"
            f"f = open({str(small_fs / 'filler')!r}, 'wb')\ntry:\n    while True: f.write(b'0' * 65536); f.flush()\n"
            "except OSError as err: print('filled', err.errno, flush=True)\nraise SystemExit(1)")
    code, starts, _, failure = _supervise_filler(small_fs, redis_url, fill)
    assert (code, starts) == (STORAGE_ERROR_EXIT, 1), failure
    assert failure.startswith(f"{small_fs} cannot be written ([Errno 28] No space left on device); rollout-0: exit 1")
    assert failure.endswith("; free space there")


@pytest.mark.slow
def test_a_write_the_run_directory_refuses_stops_the_job_and_resume_finishes_it_with_nothing_lost(tmp_path):
    """A real job whose processes may not write a file past 4 MB (RLIMIT_FSIZE, inherited by every
    role and Redis: EFBIG, the same path through the code as a full disk): the actor's first
    checkpoint (7.5 MB of policy weights, safetensors' own error type) fails, the job stops with
    exit 5 after no restart, its last line naming the errno text, the fix and the resume command;
    `--resume` without the limit finishes the job, and the ledger shows every sample generated,
    scored and trained once. Before, the role crashed (exit 1) and was restarted
    `failurePolicy.maxRestarts` times, each failing the same way."""

    from e2e.chaos import chaos_job

    from omnirl.evaluation.ledger import check_ledger

    job, out, steps = chaos_job(tmp_path, "full-disk", steps=4), tmp_path / "out", 4
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["failurePolicy"]["maxRestarts"] = 2  # the chaos job's 100 would make a regression slow to show
    job.write_text(yaml.safe_dump(doc))
    command = [sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu", "--out", str(out)]

    first = subprocess.run(_file_size_limited(command, 4 << 20), capture_output=True, text=True, timeout=600,
                           cwd=REPO)
    assert first.returncode == STORAGE_ERROR_EXIT, first.stdout[-3000:] + first.stderr[-3000:]
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith("omnirl: the job did not finish (exit 5): role "), last
    assert "[Errno 27] File too large" in last and last.endswith(
        f"raise the file-size limit (ulimit -f), then continue with: omnirl run {job} --out {out} --no-ray "
        "--device cpu --resume"), last
    actions = [json.loads(line)["action"] for line in (out / "events.jsonl").read_text().splitlines()]
    # the actor's failure is never restarted (a rollout worker whose broadcast broke with it might be, in theory)
    assert actions[-1] == "stop-job (the run directory cannot be written: not restarted)", actions
    assert "restart-job" not in actions, actions
    assert "Traceback" not in first.stdout + first.stderr

    second = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    counts = check_ledger(out, steps, group_size=3, prompts_per_step=2)
    assert (counts.trained, counts.lost, counts.duplicated, counts.problems) == (steps * 6, 0, 0, []), counts


def test_a_line_a_full_disk_cut_short_is_dropped_before_the_next_append_and_skipped_by_the_reader(tmp_path):
    """A write that failed for want of space can leave part of a JSON line: `omnirl run --resume`
    read it as a corrupt record (JSONDecodeError), and a resumed role appending after it made one
    corrupt line in the middle. The reader skips an unterminated last line; the appender drops it."""
    from omnirl.api.ledger import Ledger
    from omnirl.api.run_dir import METRICS_FILE, read_metrics
    from omnirl.system.disk import append_lines

    metrics = tmp_path / METRICS_FILE
    metrics.write_text('{"event": "start"}\n{"event": "step", "step": 0}\n{"event": "st')
    assert read_metrics(tmp_path) == [{"event": "start"}, {"event": "step", "step": 0}]
    with append_lines(metrics) as f:
        f.write('{"event": "step", "step": 1}\n')
    assert metrics.read_text() == '{"event": "start"}\n{"event": "step", "step": 0}\n{"event": "step", "step": 1}\n'
    assert [r.get("step") for r in read_metrics(tmp_path)] == [None, 0, 1]

    (tmp_path / "ledger").mkdir()
    cut = tmp_path / "ledger" / "reward-reward-0.jsonl"
    cut.write_text('{"sample_id": "s0"}\n{"sample_id": "s')  # the worker died on its second line
    ledger = Ledger(tmp_path, "reward", "reward-0")
    ledger.record("s1", published=True)
    ledger.record("s0", published=False)  # a duplicate publish: its line is there already
    ledger.close()
    assert cut.read_text() == '{"sample_id": "s0"}\n{"sample_id": "s1"}\n'
    fresh = tmp_path / "ledger" / "empty.jsonl"
    append_lines(fresh).close()
    assert fresh.read_text() == ""


_CHECKPOINT_SCRIPT = """
import json, sys
import torch
from omnirl.actor.checkpoint import load_checkpoint, save_checkpoint
from omnirl.system import disk

root, big = sys.argv[1], int(sys.argv[2])

def save(step, numel):
    t = {"w": torch.full((numel,), float(step))}
    return save_checkpoint(root, step, policy=t, trained=t, old=None, optimizer=(t, {"param_groups": [], "scalars": {}}),
                           state={"step": step}, keep=2)

save(1, 256)
try:
    save(2, big)
except Exception as exc:
    err = disk.storage_error(exc)
    print(json.dumps({"errno": err.errno if err else repr(exc), "resumed": load_checkpoint(root + "/latest")["state"]}))
"""


def _checkpoint_refused(root: Path, big: int, file_size_limit: int | None = None) -> dict:
    cmd = [sys.executable, "-c", _CHECKPOINT_SCRIPT, str(root), str(big)]
    if file_size_limit is not None:
        cmd = _file_size_limited(cmd, file_size_limit)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip(), done.stdout + done.stderr
    return json.loads(done.stdout)


def test_a_checkpoint_the_file_system_refuses_leaves_nothing_half_written(tmp_path):
    """The actor's checkpoint write refused part way (RLIMIT_FSIZE 64 KiB: EFBIG, the path a full disk
    takes through safetensors' writer): the error is a storage error, `latest` still names the last
    complete checkpoint, which is what a resume loads, and no half-written `.tmp-step-*` directory is
    left holding the space the error asks to free (before, it stayed until the next save)."""
    root = tmp_path / "checkpoints"
    seen = _checkpoint_refused(root, 1 << 15, file_size_limit=64 << 10)  # 128 KiB of fp32 per file
    assert seen == {"errno": errno.EFBIG, "resumed": {"step": 1}}
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001"]
    assert os.readlink(root / "latest") == "step-000001"


def test_a_checkpoint_that_fills_the_disk_frees_it_again(small_fs):
    """A real full disk (a 256 KiB tmpfs, root only): the second checkpoint (3 × 160 KiB) gets ENOSPC;
    the last complete one stays `latest`, and the file system takes a write again at once (the
    half-written files are gone), so the verdict's "free space there" is about the user's data."""
    root = small_fs / "checkpoints"
    assert _checkpoint_refused(root, 40 << 10) == {"errno": errno.ENOSPC, "resumed": {"step": 1}}
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001"]
    assert disk.unwritable(small_fs) is None


@pytest.fixture
def no_permission_dir(tmp_path):
    """A directory that refuses writes for want of permission: immutable (`chattr +i`, EPERM: it
    stops root too) as root, else mode 0555 (EACCES)."""
    where = tmp_path / "out" / "checkpoints"
    where.mkdir(parents=True)
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(where)], capture_output=True).returncode != 0:
            pytest.skip("root without chattr +i on this file system: no write can be refused for permission")
        yield where, errno.EPERM
        subprocess.run(["chattr", "-i", str(where)], check=True)
        return
    where.chmod(0o555)
    yield where, errno.EACCES
    where.chmod(0o755)


@pytest.mark.slow
def test_a_checkpoint_directory_without_write_permission_stops_the_job_once(tmp_path, no_permission_dir):
    """The actor's checkpoint directory refuses its write for permission (a pod's volume not owned by
    uid 1000; here immutable or 0555): measured before, `PermissionError: [Errno 1]`, exit 1 and the
    job restarted until `failurePolicy.maxRestarts`, each start failing the same way. Now the actor
    exits 5 at once with one line naming the path, the errno and the fix; nothing is restarted."""
    from e2e.chaos import chaos_job


    where, code = no_permission_dir
    job, out = chaos_job(tmp_path, "no-permission", steps=2), where.parent
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["failurePolicy"]["maxRestarts"] = 2
    doc["spec"]["checkpoint"] = {"everySteps": 1, "keep": 2}
    job.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == STORAGE_ERROR_EXIT, done.stdout[-3000:] + done.stderr[-3000:]
    actor = [line for line in done.stdout.splitlines() if line.startswith("[actor-0] omnirl role actor: ")]
    assert len(actor) == 1, done.stdout[-3000:]
    assert actor[0].startswith(f"[actor-0] omnirl role actor: cannot write {where}/.tmp-step-"), actor
    assert f"([Errno {code}] {os.strerror(code)}); make it writable" in actor[0], actor
    actions = [json.loads(line)["action"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert actions[-1] == "stop-job (the run directory cannot be written: not restarted)", actions
    assert "restart-job" not in actions, actions
