"""`omnirl run`'s judge servers (`reward[].server`, reward/servers.py) as real local processes:
the port reaches the server, a dead or deaf server is named with the fix, and each one stops."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import omnirl.reward.servers as servers
from omnirl.api.exits import CONFIG_ERROR_EXIT
from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.spec import RLJob
from omnirl.reward.servers import JudgeFailed, check_local, check_served_judges, start_judges, stop_judges

ROOT = Path(__file__).resolve().parents[2]

# listens on the port in its environment, as a pod's server reading $(OMNIRL_JUDGE_PORT) does
ENV_PORT_SERVER = ("import http.server, os; http.server.HTTPServer(('127.0.0.1', int(os.environ['OMNIRL_JUDGE_PORT'])), "
                   "http.server.BaseHTTPRequestHandler).serve_forever()")


def job_with(tmp_path: Path, server: dict) -> RLJob:
    """The NFT example plus an http judge the job runs with `server`."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    doc["spec"]["reward"].append({"name": "judge", "kind": "http", "server": {"urlPath": "/v1/score", **server}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_rljob(str(path))


def test_a_judge_reading_the_port_from_its_environment_is_started_wired_and_stopped(tmp_path):
    job = job_with(tmp_path, {"command": [sys.executable, "-c", ENV_PORT_SERVER]})
    judges, wired = start_judges(job, tmp_path / "logs")
    try:
        (j,) = judges
        assert wired.spec.reward[1].url == f"http://127.0.0.1:{j.port}/v1/score" and wired.spec.reward[1].server is None
        assert j.answers()
    finally:
        stop_judges(judges)
    assert j.proc.returncode is not None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", j.port)) != 0


KILLED_LAUNCHER = """
import sys, time
from omnirl.api.loader import load_rljob
from omnirl.reward.servers import start_judges
judges, _ = start_judges(load_rljob(sys.argv[1]), __import__("pathlib").Path(sys.argv[2]))
print("judge pid", judges[0].proc.pid, flush=True)
time.sleep(120)
"""


def test_a_judge_dies_with_a_sigkilled_launcher(tmp_path):
    """`kill -9` of `omnirl run` (or an OOM kill) takes its judge servers with it, as its Redis and role
    processes (docs/reliability.md): a judge holds a GPU and a port. Found by hand: the tiny job
    with `omnirl scorer serve` as its judge, the launcher SIGKILLed after step 1, and the judge ran on with
    parent 1. Here the launcher's own `start_judges` in a process that is SIGKILLed."""
    import os
    import signal
    import time

    job_with(tmp_path, {"command": [sys.executable, "-c", ENV_PORT_SERVER]})  # writes tmp_path/job.yaml
    launcher = subprocess.Popen([sys.executable, "-c", KILLED_LAUNCHER, str(tmp_path / "job.yaml"),
                                 str(tmp_path / "logs")], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(next(line for line in launcher.stdout if line.startswith("judge pid")).split()[-1])  # it answers
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline, f"the judge (pid {pid}) outlived its SIGKILLed launcher"
            time.sleep(0.05)
    finally:
        launcher.kill()
        if pid is not None and os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)


def test_a_judge_that_exits_is_named_at_once_with_its_exit_code_and_log(tmp_path):
    job = job_with(tmp_path, {"command": [sys.executable, "-c", "print('no GPU here'); raise SystemExit(3)"],
                              "startupSeconds": 15})  # a bound a broken fix would wait out, failing the test
    t0 = time.monotonic()
    with pytest.raises(JudgeFailed) as err:
        start_judges(job, tmp_path / "logs")
    assert time.monotonic() - t0 < 10  # not its startupSeconds (900)
    log = tmp_path / "logs" / "judge-judge.log"
    assert re.fullmatch(
        rf"spec\.reward\[1\]\.server: judge judge exited 3 \d+\.\d s after it started, before it answered on port "
        rf"\d+; its log {re.escape(str(log))} ends: 'no GPU here'; fix the judge's command or model "
        r"\(spec\.reward\[1\]\.server\), or run the judge yourself and give spec\.reward\[1\]\.url instead of server",
        str(err.value)), err.value
    assert err.value.tail == ["no GPU here"] and err.value.log == log


def test_a_judge_that_never_listens_is_given_its_startup_seconds_and_says_it_waits(tmp_path, monkeypatch, capsys):
    # a judge that sleeps without listening kept `omnirl run` waiting 600 s (a constant) before any word
    monkeypatch.setattr(servers, "WAIT_NOTE_S", 0.5)
    job = job_with(tmp_path, {"command": [sys.executable, "-c", "print('loading', flush=True); "
                                                                "import time; time.sleep(60)"], "startupSeconds": 2})
    t0 = time.monotonic()
    with pytest.raises(JudgeFailed) as err:
        start_judges(job, tmp_path / "logs")
    assert 2 <= time.monotonic() - t0 < 10
    port = re.search(r"on port (\d+)", str(err.value))[1]
    log = tmp_path / "logs" / "judge-judge.log"
    assert str(err.value) == (
        f"spec.reward[1].server: judge judge did not answer on port {port} within spec.reward[1].server.startupSeconds "
        f"(2 s) and is still running; its log {log} ends: 'loading'; its command must listen on that port: pass it "
        "'{port}' (e.g. args: [--port, '{port}']) or read $OMNIRL_JUDGE_PORT; if it only loads for longer, raise "
        "spec.reward[1].server.startupSeconds")
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(rf"omnirl: judge judge starting on port {port} \(pid \d+; it has spec\.reward\[1\]\.server\."
                        r"startupSeconds, 2 s, to answer\): .*", out[0]), out
    assert out[1:] and all(re.fullmatch(
        rf"omnirl: judge judge not answering on port {port} yet \(\d s of its startupSeconds 2; omnirl run stops at "
        r"once if it exits\); its log ends: 'loading'", line) for line in out[1:]), out


def test_a_judge_that_exits_while_another_loads_is_named_at_once(tmp_path):
    # the launcher waited for the judges one after another: the second one's exit was seen only once the first
    # answered, or after the first one's whole bound
    job = _two_judges([sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(7)"],
                      first={"command": [sys.executable, "-c", "import time; time.sleep(60)"], "startupSeconds": 15})
    t0 = time.monotonic()
    with pytest.raises(JudgeFailed) as err:
        start_judges(job, tmp_path / "logs")
    assert time.monotonic() - t0 < 10
    assert str(err.value).startswith("spec.reward[2].server: judge other exited 7 "), err.value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# an HTTP server answering 200 on every GET, on the port the first argument names (a number, or an environment
# variable's name)
ANY_PORT_SERVER = ("import http.server, os, sys\n"
                   "class H(http.server.BaseHTTPRequestHandler):\n"
                   "    def do_GET(self): self.send_response(200); self.end_headers()\n"
                   "p = sys.argv[1]\n"
                   "print('loading', flush=True)\n"
                   "http.server.HTTPServer(('127.0.0.1', int(os.environ.get(p, p))), H).serve_forever()")


def test_a_judge_listening_on_a_port_written_into_its_command_is_named_at_once(tmp_path):
    """A judge command that ignores `{port}` and listens on a port of its own: `omnirl run` waited the whole
    `startupSeconds` (900 s by default) for an answer on the port it gave, then said only that nothing answered
    there. Now the port the judge's process listens on is read (/proc) and named at once with the fix."""
    hard = _free_port()
    job = job_with(tmp_path, {"command": [sys.executable, "-c", ANY_PORT_SERVER, str(hard)], "startupSeconds": 120})
    t0 = time.monotonic()
    with pytest.raises(JudgeFailed) as err:
        start_judges(job, tmp_path / "logs")
    assert time.monotonic() - t0 < 20  # not its startupSeconds (120), which a broken detection would wait out
    given = int(re.search(r"not on port (\d+) it was given", str(err.value))[1])
    assert given != hard
    log = tmp_path / "logs" / "judge-judge.log"
    assert re.fullmatch(
        rf"spec\.reward\[1\]\.server: judge judge listens on port {hard}, not on port {given} it was given "
        r"\d+\.\d s after it started \(a port written into its command\); its log "
        rf"{re.escape(str(log))} ends: 'loading'; its command must listen on the port omnirl run gives it: write "
        rf"'{{port}}' where it has {hard} \(e\.g\. args: \[--port, '{{port}}'\]\) or read \$OMNIRL_JUDGE_PORT; "
        r"on Kubernetes '\{port\}' becomes spec\.reward\[1\]\.server\.port \(8000\), the pod's port",
        str(err.value)), err.value
    with socket.socket() as s:  # the judge was stopped
        assert s.connect_ex(("127.0.0.1", hard)) != 0


def _pod_port(job: RLJob, explicit: bool) -> int:
    """A free port as judge 1's `server.port`: set in the manifest (`explicit`), or standing for the default 8000
    the user never wrote (8000 itself may be taken on a shared machine; `model_fields_set` stays without it)."""
    port = _free_port()
    server = job.spec.reward[1].server
    if explicit:
        server.port = port
        assert "port" in server.model_fields_set
    else:
        server.__dict__["port"] = port
        assert "port" not in server.model_fields_set
    return port


def _port_refusal(job: RLJob, tmp_path: Path) -> tuple[str, int]:
    """start_judges' JudgeFailed text for `job` (named at once, not after its startupSeconds) and the port given."""
    t0 = time.monotonic()
    with pytest.raises(JudgeFailed) as err:
        start_judges(job, tmp_path / "logs")
    assert time.monotonic() - t0 < 20, err.value
    text = re.sub(r"it was given \d+\.\d s after", "it was given T s after", str(err.value))
    return text, int(re.search(r"not on port (\d+) it was given", text)[1])


def test_a_judge_hard_coding_the_default_pod_port_is_told_to_write_port_there_not_sent_to_server_port(tmp_path):
    """`--port 8000` written into the judge's command, `server.port` left at its default 8000: the reason given was
    "(spec.reward[1].server.port, the pod's port)", a field the user never set, as if changing it were the fix."""
    job = job_with(tmp_path, {"command": [sys.executable, "-c", ANY_PORT_SERVER, "PLACEHOLDER"], "startupSeconds": 120})
    pod = _pod_port(job, explicit=False)
    job.spec.reward[1].server.command[-1] = str(pod)  # the pod port, hard-coded
    text, given = _port_refusal(job, tmp_path)
    assert text == (
        f"spec.reward[1].server: judge judge listens on port {pod}, not on port {given} it was given T s after it "
        f"started (a port written into its command; {pod} is also the default of spec.reward[1].server.port, the "
        f"pod's port); its log {tmp_path / 'logs' / 'judge-judge.log'} ends: 'loading'; its command must listen on "
        f"the port omnirl run gives it: write '{{port}}' where it has {pod} (e.g. args: [--port, '{{port}}']) or read "
        f"$OMNIRL_JUDGE_PORT; on Kubernetes '{{port}}' becomes spec.reward[1].server.port ({pod}), the pod's port")


@pytest.mark.parametrize("explicit", [False, True], ids=["default-server-port", "server-port-set"])
def test_a_judge_on_its_programs_own_default_port_is_told_to_pass_port_not_to_write_it_where_it_has_none(
        tmp_path, monkeypatch, explicit):
    """A command given no port at all (as `vllm serve MODEL`, whose own default is 8000, `server.port`'s too):
    the fix said "write '{port}' where it has 8000", and its command has no 8000 anywhere."""
    job = job_with(tmp_path, {"command": [sys.executable, "-c", ANY_PORT_SERVER, "JUDGE_TEST_PORT"],
                              "startupSeconds": 120})
    pod = _pod_port(job, explicit)
    monkeypatch.setenv("JUDGE_TEST_PORT", str(pod))  # the program's own default, nowhere in the command
    text, given = _port_refusal(job, tmp_path)
    field = "spec.reward[1].server.port, the pod's port" if explicit else \
        "the default of spec.reward[1].server.port, the pod's port"
    assert text == (
        f"spec.reward[1].server: judge judge listens on port {pod}, not on port {given} it was given T s after it "
        f"started ({field}; {pod} is nowhere in its command, so it is its program's own default port); its log "
        f"{tmp_path / 'logs' / 'judge-judge.log'} ends: 'loading'; its command must listen on the port omnirl run "
        "gives it: pass it '{port}' (e.g. args: [--port, '{port}']) or read $OMNIRL_JUDGE_PORT; on Kubernetes "
        f"'{{port}}' becomes spec.reward[1].server.port ({pod}), the pod's port")


# a judge as tritonserver: its own gRPC port (written into its args) opened first, then, loaded, its HTTP port
SIDE_PORT_SERVER = ("import http.server, socket, sys, time\n"
                    "a = dict(zip(sys.argv[1::2], sys.argv[2::2]))\n"
                    "g = socket.socket(); g.bind(('127.0.0.1', int(a['--grpc-port']))); g.listen()\n"
                    "print('grpc up, loading', flush=True); time.sleep(2.5)\n"
                    "http.server.HTTPServer(('127.0.0.1', int(a['--http-port'])), http.server.BaseHTTPRequestHandler)"
                    ".serve_forever()")


@pytest.mark.parametrize("port_arg", ["{port}", "$OMNIRL_JUDGE_PORT"])
def test_a_judge_given_its_port_that_first_listens_on_another_port_written_into_its_args_is_waited_for(
        tmp_path, port_arg):
    """`--http-port {port} --grpc-port 8001`: the written 8001 is the judge's own second port, not a hard-coded
    judge port. It was exit 4 ('listens on port 8001 … (a port written into its command)') one second after
    the start, for a judge that answers on its port 2.5 s later."""
    side = _free_port()
    script = tmp_path / "triton.py"
    script.write_text(SIDE_PORT_SERVER)
    command = ["sh", "-c", f"exec {sys.executable} {script} --http-port {port_arg} --grpc-port {side}"]
    job = job_with(tmp_path, {"command": command, "startupSeconds": 60})
    judges, wired = start_judges(job, tmp_path / "logs")
    try:
        (j,) = judges
        assert j.port != side and j.answers()
        assert wired.spec.reward[1].url == f"http://127.0.0.1:{j.port}/v1/score"
        assert servers.listening_ports(j.proc.pid) == {side, j.port}
    finally:
        stop_judges(judges)


def test_a_judge_given_its_port_whose_side_port_written_into_its_args_is_the_pod_port_is_waited_for(tmp_path):
    """`--http-port {port} --grpc-port 8000` with `server.port` at its default 8000: the side port was taken for
    the pod's port (exit 4, 'listens on port 8000 … (spec.reward[1].server.port, the pod's port)') one second
    after the start, for a judge that answers on its port 2.5 s later."""
    script = tmp_path / "triton.py"
    script.write_text(SIDE_PORT_SERVER)
    job = job_with(tmp_path, {"command": [sys.executable, str(script), "--http-port", "{port}", "--grpc-port", "X"],
                              "startupSeconds": 60})
    side = _pod_port(job, explicit=False)
    job.spec.reward[1].server.command[-1] = str(side)
    judges, _ = start_judges(job, tmp_path / "logs")
    try:
        (j,) = judges
        assert j.answers() and servers.listening_ports(j.proc.pid) == {side, j.port}
    finally:
        stop_judges(judges)


def test_a_judge_answering_its_health_path_on_another_port_is_named_even_behind_a_shell(tmp_path, monkeypatch):
    # the port is nowhere in the command (an environment variable the judge reads), and the listener is the
    # shell's child: its answer to healthPath on that port says it is ready there
    other = _free_port()
    monkeypatch.setenv("JUDGE_TEST_PORT", str(other))
    script = tmp_path / "judge.py"
    script.write_text(ANY_PORT_SERVER)
    job = job_with(tmp_path, {"command": ["sh", "-c", f"{sys.executable} {script} JUDGE_TEST_PORT; exit 0"],
                              "healthPath": "/health", "startupSeconds": 120})
    t0 = time.monotonic()
    with pytest.raises(JudgeFailed) as err:
        start_judges(job, tmp_path / "logs")
    assert time.monotonic() - t0 < 20
    assert re.match(rf"spec\.reward\[1\]\.server: judge judge listens on port {other}, not on port \d+ it was given "
                    r"[\d.]+ s after it started \(it answers its healthPath /health there\); ", str(err.value)), err.value


def test_a_judge_listening_elsewhere_without_a_sign_it_is_the_judges_port_is_named_while_it_waits(
        tmp_path, monkeypatch, capsys):
    # a loading server may listen on ports of its own (a torch store): not failed for it, but named
    monkeypatch.setattr(servers, "WAIT_NOTE_S", 0.8)
    other = _free_port()
    monkeypatch.setenv("JUDGE_TEST_PORT", str(other))
    job = job_with(tmp_path, {"command": [sys.executable, "-c", ANY_PORT_SERVER, "JUDGE_TEST_PORT"],
                              "startupSeconds": 3})
    with pytest.raises(JudgeFailed) as err:
        start_judges(job, tmp_path / "logs")
    assert "did not answer on port" in str(err.value)
    notes = [line for line in capsys.readouterr().out.splitlines() if "not answering on port" in line]
    assert notes and all(re.search(rf"; it listens on port {other} \(its command must listen on \d+: '\{{port\}}' or "
                                   r"\$OMNIRL_JUDGE_PORT\); its log ends: 'loading'$", line) for line in notes[1:]), notes


JUDGE_EXITS = [sys.executable, "-c", "print('loading'); print('CUDA out of memory'); raise SystemExit(3)"]
JUDGE_DEAF = [sys.executable, "-c", "import time; print('loading'); print('CUDA out of memory', flush=True); "
              "time.sleep(120)"]  # never listens on its port
HARD_PORT = _free_port()
JUDGE_HARD_PORT = [sys.executable, "-c", "import http.server; print('loading'); print('CUDA out of memory', flush=True); "
                   f"http.server.HTTPServer(('127.0.0.1', {HARD_PORT}), http.server.BaseHTTPRequestHandler)"
                   ".serve_forever()"]  # listens on a port written into it, not on {port}


@pytest.mark.parametrize("command,startup,what", [
    (JUDGE_EXITS, 20, r"exited 3 [\d.]+ s after it started, before it answered on port \d+"),
    (JUDGE_DEAF, 2, r"did not answer on port \d+ within spec\.reward\[1\]\.server\.startupSeconds \(2 s\) and is "
                    r"still running"),
    (JUDGE_HARD_PORT, 900, rf"listens on port {HARD_PORT}, not on port \d+ it was given [\d.]+ s after it started "
                           r"\(a port written into its command\)")], ids=["exits", "never-listens", "hard-coded-port"])
def test_omnirl_run_with_a_judge_that_fails_to_start_prints_its_log_and_exits_4(tmp_path, command, startup, what):
    """A judge of `reward[].server` that exits at once or never listens is a setting the job cannot start with:
    exit 4 (`CONFIG_ERROR_EXIT`, docs/reference/exit-codes.md, `omnirl run`), as a role's configuration error and as
    the operator's `JudgeFailed`, not restarted. It was exit 1, the code of a crash."""
    job_with(tmp_path, {"command": command, "startupSeconds": startup})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                           "--device", "cpu", "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert time.monotonic() - t0 < 60 and done.returncode == CONFIG_ERROR_EXIT, done.stdout + done.stderr
    log = tmp_path / "o" / "logs" / "judge-judge.log"
    lines = done.stdout.splitlines()
    at = lines.index(f"omnirl: judge judge: the last lines of {log}:")
    assert lines[at + 1:at + 3] == ["  loading", "  CUDA out of memory"]
    assert re.fullmatch(
        rf"omnirl: the job did not finish \(exit 4\): spec\.reward\[1\]\.server: judge judge {what}; its log "
        rf"{re.escape(str(log))} ends: 'CUDA out of memory'; .*", lines[-1]), done.stdout


def _two_judges(second: list[str], first: dict | None = None) -> RLJob:
    """The NFT example plus two judges: `judge` (`first`, its server; default one that answers) and `other`
    (command `second`)."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-nft.yaml").read_text())
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    doc["spec"]["reward"] += [
        {"name": "judge", "kind": "http", "server": first or {"command": [sys.executable, "-c", ENV_PORT_SERVER]}},
        {"name": "other", "kind": "http", "server": {"command": second}}]
    return RLJob.model_validate(doc)


def test_a_judge_command_not_on_this_machine_is_refused_before_anything_starts(tmp_path):
    # `omnirl scorer serve` from a venv that is not activated: Popen's FileNotFoundError reached the user as
    # "omnirl run: [Errno 2] No such file or directory: 'omnirl" (no field, no fix); then the field, but only
    # once Redis, Ray and the placement were up (17 s with Ray), leaving job.yaml and redis/ in --out
    job = _two_judges(["no-such-judge-b3", "--port", "{port}"])
    with pytest.raises(ValueError) as err:
        check_local(job)
    assert str(err.value) == (
        "spec.reward[2].server.command: 'no-such-judge-b3' cannot be started on this machine (not found on PATH, "
        "or not an executable file); `omnirl run` runs the judge's command here (its image is ignored): install "
        "it, put it on PATH or give its full path")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(dump_rljob(job)))
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(path), "--no-ray", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr == f"omnirl run: {err.value}\n"
    assert not (tmp_path / "out").exists()


def test_a_judge_command_that_cannot_be_executed_names_the_field_and_stops_the_judges_started(tmp_path, monkeypatch):
    # on PATH and executable, but not a program the kernel runs: Popen's OSError, after the first judge started
    bogus = tmp_path / "not-a-program"
    bogus.write_bytes(b"\x00\x01 not an executable format")
    bogus.chmod(0o755)
    job = _two_judges([str(bogus), "--port", "{port}"])
    started: list[servers.JudgeProcess] = []
    real = servers.JudgeProcess
    monkeypatch.setattr(servers, "JudgeProcess", lambda *a: started.append(real(*a)) or started[-1])
    with pytest.raises(ValueError) as err:
        start_judges(job, tmp_path / "logs")
    assert str(err.value) == (
        f"spec.reward[2].server.command: '{bogus}' cannot be started on this machine (OSError: Exec format error); "
        "`omnirl run` runs the judge's command here (its image is ignored): install it, put it on PATH or give its "
        "full path")
    (first,) = started
    assert first.proc.returncode is not None  # the judge started before it was stopped, not left behind


def test_a_served_judge_at_the_wrong_path_names_server_url_path(tmp_path):
    # the user wrote no url: the one the pre-flight refused was wired from server.urlPath (default "/")
    scorer = ("import sys; from omnirl.cli import main; sys.exit(main(['scorer', 'serve', '--reward', 'jpeg', "
              "'--protocol', 'http', '--host', '127.0.0.1', '--port', sys.argv[1]]))")
    job = job_with(tmp_path, {"command": [sys.executable, "-c", scorer, "{port}"], "urlPath": "/"})
    judges, wired = start_judges(job, tmp_path / "logs")
    try:
        with pytest.raises(ValueError) as err:
            check_served_judges(wired, judges)
    finally:
        stop_judges(judges)
    assert str(err.value).startswith(f"spec.reward[1].url: http://127.0.0.1:{judges[0].port}/ answered HTTP 404")
    assert str(err.value).endswith("[this url is the judge omnirl run started from spec.reward[1].server: fix "
                                   "spec.reward[1].server.urlPath ('/') or the server's command]")
