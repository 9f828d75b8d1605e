"""Local launcher: planning (pure parts: placement on accelerators, threads, the role environment)
and the supervisor's restart policy on real processes (a configuration error is never restarted)."""

from __future__ import annotations

import json
import sys

import pytest
from tests.helpers import supervise_scripts

from omnirl.api.exits import CONFIG_ERROR_EXIT, FAILED, INTERRUPTED_EXIT
from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.runtime import sync_backend
from omnirl.launch.local import role_env
from omnirl.launch.placement import cpu_role_threads, describe, n_threads, place, role_plan, weight_sync_backend
from omnirl.launch.roles import resolve_device


def _gpu_job(tmp_path, rollout=1, actor=1, reward_type="cpu"):
    """examples/ocr-nft.yaml with rollout and actor on NVIDIA GPUs."""
    import yaml

    doc = yaml.safe_load(open("examples/ocr-nft.yaml"))
    roles = doc["spec"].setdefault("roles", {})
    roles["rollout"] = {"replicas": rollout, "accelerator": {"type": "nvidia", "count": 1}}
    roles["actor"] = {"replicas": actor, "accelerator": {"type": "nvidia", "count": 1}}
    roles["reward"] = {"replicas": 2, "accelerator": {"type": reward_type}}
    doc["spec"]["data"] = {k: str((__import__("pathlib").Path("examples") / v).resolve())
                           for k, v in doc["spec"]["data"].items()}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_rljob(path)


def test_threads_split_the_cores_only_when_rollout_and_training_overlap():
    assert cpu_role_threads("rollout", "async-reward", 2) == 2 and cpu_role_threads("actor", "sync", 8) == 8
    assert cpu_role_threads("rollout", "fully-async", 2) == 1 and cpu_role_threads("actor", "fully-async", 8) == 4
    assert cpu_role_threads("reward", "fully-async", 8) == 1 and cpu_role_threads("controller", "sync", 1) == 1


def test_the_placement_table_says_1_thread_not_1_threads():
    placements = place(load_rljob("examples/ocr-nft.yaml"), cores=2)
    assert describe(placements, "gloo").splitlines() == [
        "omnirl: placement",
        "  rollout-0      cpu                      2 threads",
        "  reward-0       cpu                      1 thread",
        "  actor-0        cpu                      2 threads",
        "  controller-0   cpu                      1 thread",
        "  weight sync: gloo"]
    assert (n_threads(0), n_threads(1), n_threads(12)) == ("0 threads", "1 thread", "12 threads")


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_run_pinned_to_one_core_places_its_roles_as_on_a_one_core_machine(monkeypatch):
    """`taskset -c 0 omnirl run …` (the by-minute benchmark pins each job to its own cores): the roles' threads
    follow the cores this process may use, not the machine's, so no thread spins on a core it cannot run on."""
    import os

    from omnirl.api.runtime import usable_cores

    monkeypatch.delenv("OMNIRL_LOCAL_THREADS", raising=False)
    job = load_rljob("examples/ocr-nft.yaml")
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        assert usable_cores() == 1
        assert [p.threads for p in place(job)] == [1, 1, 1, 1]
    finally:
        os.sched_setaffinity(0, before)
    assert usable_cores() == len(before)
    assert [p.threads for p in place(job)][0] == max(1, len(before))


def test_every_role_gets_the_process_contract(tmp_path):
    job = load_rljob("examples/ocr-nft.yaml")
    plan = role_plan(job)
    assert plan[-1] == ("controller", 0) and ("actor", 0) in plan and len(plan) == 4
    placements = place(job, cores=2)
    assert [p.device for p in placements] == ["cpu"] * 4 and [p.threads for p in placements] == [2, 1, 2, 1]
    env = role_env(job, placements[0], redis_url="redis://127.0.0.1:1/0", sync_port=29500, out=tmp_path,
                   resume="0", steps=3, sync_backend=weight_sync_backend(placements))
    assert env["OMNIRL_JOB_NAME"] == "ocr-nft" and env["OMNIRL_WEIGHT_SYNC_ADDR"] == "127.0.0.1:29500"
    assert env["OMNIRL_WORKER_ID"] == "rollout-0" and env["OMNIRL_STEPS"] == "3" and env["OMNIRL_RESUME"] == "0"
    assert env["OMNIRL_DEVICE"] == "cpu" and env["OMNIRL_THREADS"] == "2" and env["OMNIRL_WEIGHT_SYNC_BACKEND"] == "gloo"
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_gpu_roles_get_a_device_each_and_the_scorers_get_the_spare_cores(tmp_path):
    job = _gpu_job(tmp_path, rollout=2, actor=2)
    by_name = {p.name: p for p in place(job, cores=16, available={"nvidia": ["0", "1", "2", "3"]})}
    # actor ranks first, then the rollout workers; each sees one GPU as cuda:0
    assert by_name["actor-0"].visible == ("0",) and by_name["actor-1"].visible == ("1",)
    assert by_name["rollout-0"].visible == ("2",) and by_name["rollout-1"].visible == ("3",)
    assert by_name["rollout-0"].device == "cuda:0" and by_name["rollout-0"].environ()["CUDA_VISIBLE_DEVICES"] == "2"
    # 16 cores - 4 GPU processes × 2 - controller 1 = 7, split over 2 reward workers
    assert by_name["reward-0"].threads == 3 and by_name["controller-0"].threads == 1
    assert weight_sync_backend(list(by_name.values())) == ""  # NCCL across GPUs


def test_more_gpus_than_the_machine_has_is_refused_with_the_numbers(tmp_path):
    job = _gpu_job(tmp_path)
    with pytest.raises(ValueError, match=r"asks for 2 NVIDIA GPUs \(rollout 1×1, actor 1×1\); this machine has 1: "
                                         r"pass --share-gpus"):
        place(job, available={"nvidia": ["0"]})
    with pytest.raises(ValueError, match="this machine has none: run it with --device cpu"):
        place(job, available={"nvidia": []})


def test_shared_gpu_syncs_over_cuda_ipc_and_cpu_override(tmp_path):
    job = _gpu_job(tmp_path)
    shared = place(job, share=True, cores=4, available={"nvidia": ["3"]})
    assert {p.name: p.visible for p in shared if p.kind == "nvidia"} == {"actor-0": ("3",), "rollout-0": ("3",)}
    assert weight_sync_backend(shared) == "cuda-ipc"
    # 2 GPUs for actor + 2 rollouts: rollout-1 wraps onto the actor's GPU, rollout-0 has its own → gloo
    partly = place(_gpu_job(tmp_path, rollout=2), share=True, cores=4, available={"nvidia": ["0", "1"]})
    assert [p.visible for p in partly if p.kind == "nvidia"] == [("1",), ("0",), ("0",)]
    assert weight_sync_backend(partly) == "gloo"
    on_cpu = place(job, device="cpu", cores=2, available={"nvidia": []})
    assert {p.device for p in on_cpu} == {"cpu"} and weight_sync_backend(on_cpu) == "gloo"
    with pytest.raises(ValueError, match=r"roles.actor: 2 ranks × 1 NVIDIA GPUs need a device each"):
        place(_gpu_job(tmp_path, actor=2), share=True, available={"nvidia": ["0"]})


def test_sync_backend_by_where_the_members_are():
    assert sync_backend("nvidia", ["nvidia", "nvidia"]) == ""
    assert sync_backend("nvidia", ["nvidia"], shared_device=True) == "gloo"
    assert sync_backend("nvidia", ["nvidia"], shared_device=True, all_shared=True) == "cuda-ipc"
    assert sync_backend("ascend", ["ascend"], shared_device=True, all_shared=True) == "gloo"
    assert sync_backend("nvidia", ["cpu"]) == "gloo" and sync_backend("cpu", ["nvidia"]) == "gloo"
    assert sync_backend("ascend", ["ascend"]) == ""


def test_role_device_gets_an_index():
    assert resolve_device("cuda", {}) == "cuda:0" and resolve_device("cuda", {"LOCAL_RANK": "3"}) == "cuda:3"
    assert resolve_device("cuda:1", {"LOCAL_RANK": "3"}) == "cuda:1" and resolve_device("cpu", {}) == "cpu"
    assert resolve_device("npu", {}) == "npu:0"
    with pytest.raises(ValueError, match="OMNIRL_DEVICE='tpu': expected cpu, cuda"):
        resolve_device("tpu", {})


def _supervise(tmp_path, redis_url, rollout_exit: int | None, **policy) -> tuple[int, int]:
    """A Supervisor over two real processes: a rollout that prints `started` and exits with
    `rollout_exit` (None: SIGSTOPs itself before any heartbeat, as if frozen while loading), and a
    controller that beats for 120 s. `policy` updates `failurePolicy` (maxRestarts 2 by default). Returns
    (launcher exit code, rollout starts)."""
    from pathlib import Path

    job = _gpu_job(tmp_path)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={
        "failurePolicy": job.spec.failurePolicy.model_copy(update={"maxRestarts": 2, **policy})})})
    end = ("import os, signal; os.kill(os.getpid(), signal.SIGSTOP)" if rollout_exit is None
           else f"raise SystemExit({rollout_exit})")
    code, _ = supervise_scripts(job, end, redis_url, Path(tmp_path), f"sup-{rollout_exit or 'frozen'}")
    return code, (tmp_path / "logs" / "rollout-0.log").read_text().count("started")


@pytest.mark.parametrize("exit_code,expected", [(1, (1, 3)), (4, (4, 1))])
def test_a_crash_is_restarted_a_configuration_error_is_not(tmp_path, redis_url, exit_code, expected):
    """Exit 1 (a crash) is restarted maxRestarts = 2 times, then fails the job: 3 starts. Exit
    CONFIG_ERROR_EXIT (4) fails the job at once with that code: 1 start."""

    assert CONFIG_ERROR_EXIT == 4
    assert _supervise(tmp_path, redis_url, exit_code) == expected


@pytest.mark.parametrize("actor_exit,lag_s", [(4, 1.5), (5, 1.5), (4, -0.3)],
                         ids=["config-after-controller", "storage-after-controller", "config-before-controller"])
def test_an_actors_permanent_exit_decides_when_the_controller_fails_with_it(tmp_path, redis_url, actor_exit, lag_s):
    """An actor that fails after start-up publishes a RoleFailure, the controller raises it and exits 1, and
    the actor exits with its own code (`omnirl run` with an actor ConfigError at its first step: the
    controller's exit 1 was read first, the job restarted until maxRestarts, exit 1). Two real processes
    that do so (the actor `lag_s` after the controller): the actor's permanent code and line decide, once."""
    import sys
    from pathlib import Path

    from omnirl.launch.procs import RoleProcess, _Child
    from omnirl.launch.supervise import Supervisor
    from omnirl.transfer import TransferQueue

    job = _gpu_job(tmp_path)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={
        "failurePolicy": job.spec.failurePolicy.model_copy(update={"maxRestarts": 2})})})
    actor_line = {4: "omnirl role actor: configuration error: spec.model.lora.targetModules: ['x'] matched no module",
                  5: "omnirl role actor: cannot write /run (Errno 28) No space left on device); free space there"}
    said = actor_line[actor_exit]
    reported = f"omnirl role controller: actor actor-0 failed: {said.split(': ', 1)[1]}"  # `roles.main`'s line
    scripts = {"actor": f"import time; print('started', flush=True); time.sleep({max(lag_s, 0) + 0.5}); "
                        f"print({said!r}, flush=True); raise SystemExit({actor_exit})",
               "controller": f"import time; print('started', flush=True); time.sleep({max(-lag_s, 0) + 0.5}); "
                             f"print({reported!r}, flush=True); raise SystemExit(1)"}

    def start(role: str, index: int, resume: str) -> RoleProcess:
        return RoleProcess(role, index, _Child([sys.executable, "-c", scripts[role]], {}, str(tmp_path / "logs" /
                                                                                           f"{role}-{index}.log")))

    queue = TransferQueue.for_job(f"sup-die-together-{actor_exit}", job.spec.transferQueue, redis_url)
    supervisor = Supervisor(job, [("actor", 0), ("controller", 0)], start, queue, Path(tmp_path), 1)
    try:
        code = supervisor.run()
    finally:
        supervisor.stop_all(grace_s=1.0)
        supervisor.close()
        queue.close()
    assert (code, supervisor.failure) == (actor_exit, f"role actor-0 failed: {said}")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["reason"], e["restarts"]) for e in events] == [("actor-0", f"exit {actor_exit}: {said}", 0)]
    assert [(tmp_path / "logs" / f"{r}-0.log").read_text().count("started") for r in ("actor", "controller")] == [1, 1]


def test_a_process_frozen_before_its_first_heartbeat_is_replaced_after_the_deadline(tmp_path, redis_url):
    """A rollout SIGSTOPped before it ever beat (`make chaos` froze one while it loaded) is killed
    progressDeadlineSeconds after it was first seen and restarted (restart-role), maxRestarts = 1
    time, then fails the job (137): 2 starts. It used to count as "still starting" forever."""
    code, starts = _supervise(tmp_path, redis_url, None, progressDeadlineSeconds=3.0, maxRestarts=1)
    assert (code, starts) == (137, 2)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["role"] for e in events] == ["rollout-0"]
    assert events[0]["reason"].startswith("no progress for ") and events[0]["action"] == "restart-role"


@pytest.mark.parametrize("startup", [True, False])
def test_a_role_stale_after_its_startup_beats_names_the_startup_deadline(tmp_path, redis_url, startup):
    """A rollout whose start-up (or torch.compile) outlasts startupDeadlineSeconds: its covering thread
    stops beating and it is killed progressDeadlineSeconds later. The reason named only
    progressDeadlineSeconds (`omnirl run` of the OCR example with model.compile, startupDeadlineSeconds 3,
    progressDeadlineSeconds 5: `rollout-0: no progress for 5 s (progressDeadlineSeconds=5)`), so a user
    raised the wrong one. A main loop that beat and then hung names only progressDeadlineSeconds."""
    from pathlib import Path

    job = _gpu_job(tmp_path)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={
        "failurePolicy": job.spec.failurePolicy.model_copy(update={
            "maxRestarts": 0, "progressDeadlineSeconds": 3.0, "startupDeadlineSeconds": 1.0})})})
    beats = ("beat.start_covering(1.0, startup=True)" if startup else "beat.beat()")
    script = ("import time, redis; from omnirl.transfer.heartbeat import Heartbeat\n"
              f"beat = Heartbeat(redis.Redis.from_url({redis_url!r}), {job.metadata.name!r}, 'rollout', 'rollout-0', "
              f"every_s=0.2)\n{beats}\ntime.sleep(120)")
    code, supervisor = supervise_scripts(job, script, redis_url, Path(tmp_path), f"sup-startup-{str(startup).lower()}")
    assert code == 137
    named = ("after its start-up or a torch.compile ran past failurePolicy.startupDeadlineSeconds=1 (raise it if "
             "loading or compiling takes longer)")
    assert supervisor.failure.startswith("role rollout-0 failed (no progress for "), supervisor.failure
    assert (named in supervisor.failure) is startup, supervisor.failure


def test_a_role_killed_by_a_signal_has_its_last_log_line_labelled_not_taken_for_the_reason(tmp_path, redis_url):
    """A SIGKILLed role prints no reason; the event said `exit signal SIGKILL: <its last line>`, an INFO
    line read as the cause (`exit signal SIGKILL: … weight sync v3 … in 0.179 s`). Now the line is labelled."""
    from pathlib import Path

    job = _gpu_job(tmp_path)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={
        "failurePolicy": job.spec.failurePolicy.model_copy(update={"maxRestarts": 1})})})
    killed = "import os, signal; print('weights bound v3', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    code, supervisor = supervise_scripts(job, killed, redis_url, Path(tmp_path), "sup-sigkill")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert code == 137 and [e["reason"] for e in events] == ["exit signal SIGKILL (last log line: weights bound v3)"]
    assert supervisor.failure == ("role rollout-0 failed (exit signal SIGKILL (last log line: weights bound v3)); "
                                  "rollout-0 restarted 1 times already (failurePolicy.maxRestarts=1)")


@pytest.mark.parametrize("freed", [False, True], ids=["port-kept", "port-freed"])
def test_a_redis_that_cannot_start_again_on_its_port_stops_the_job_with_the_reason(tmp_path, monkeypatch, freed):
    """The embedded Redis is SIGKILLed and another process takes its port (the roles know only that one).
    Before, the watchdog thread died with a traceback and the launcher hung (0/4 steps after 400 s, and a
    Ctrl-C took over a minute). Now a refused restart is retried every 2 s for REDIS_RESTART_S, then the
    job stops with one line naming the port, the log's reason and the fix; a port freed in time is used."""
    import signal
    import socket
    import time

    from omnirl.launch import supervise
    from omnirl.transfer import TransferQueue, start_redis_server

    monkeypatch.setattr(supervise, "REDIS_RESTART_S", 4.0)
    server = start_redis_server(dir=str(tmp_path / "redis"), aof=True)
    job = _gpu_job(tmp_path)
    queue = TransferQueue.for_job("sup-redis-port", job.spec.transferQueue, server.url)
    sup = supervise.Supervisor(job, [], lambda *a: None, queue, tmp_path, 1, redis=server)
    thief = socket.socket()
    try:
        port = server.port
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        thief.bind(("127.0.0.1", port))
        thief.listen()
        deadline = time.monotonic() + 30
        while "Address already in use" not in (tmp_path / "redis" / f"redis-{port}.log").read_text():
            assert time.monotonic() < deadline, "no restart was tried"
            time.sleep(0.05)
        if freed:
            thief.close()
        while sup._verdict is None and not (sup.redis.alive() and sup.redis is not server):
            assert time.monotonic() < deadline, "the watchdog neither restarted Redis nor stopped the job"
            time.sleep(0.05)
        if freed:
            assert sup._verdict is None and sup.redis.port == port and sup.redis.alive()
        else:
            assert sup._verdict.code == FAILED and sup._verdict.reason == (
                f"the embedded Redis exited and could not be started again on 127.0.0.1:{port} for 4 s (Warning: "
                f"Could not create server TCP listening socket 127.0.0.1:{port}: bind: Address already in use); free the port (e.g. `ss -ltnp | grep {port}`), then "
                "continue with --resume")
    finally:
        thief.close()
        sup.close()
        queue.close()
        sup.redis.stop()


def test_run_with_a_truncated_weights_file_fails_once_with_the_message(tmp_path):
    """`omnirl run` (real role processes) on a model directory whose model.safetensors was cut short
    (pre-flight checks only that it exists): the rollout and actor exit CONFIG_ERROR_EXIT with one
    line naming spec.model.path and the file, the launcher stops the job with exit 4, no role was
    started twice, and the launcher's own lines carry the reason twice: its event line and its last
    line, the verdict (a third, "omnirl: role … failed: …", said what the verdict says)."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    model = tmp_path / "model"
    shutil.copytree(Path("services/omnirl/models/digits/weights"), model)
    weights = model / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    doc = yaml.safe_load(open("examples/ocr-nft.yaml"))
    doc["spec"]["model"]["path"] = str(model)
    doc["spec"]["data"] = {"trainPrompts": str(Path("examples/prompts/ocr-train.txt").resolve())}
    doc["spec"]["failurePolicy"] = {"maxRestarts": 3}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stdout + proc.stderr
    reason = f"configuration error: spec.model.path: {weights} is unreadable (truncated or not a safetensors file: "
    launcher = [line for line in proc.stdout.splitlines() if line.startswith("omnirl: ")]
    mentions = [line for line in launcher if reason in line]
    assert len(mentions) == 2 and " → fail-job (configuration error: not restarted)" in mentions[0], proc.stdout
    # the console's last line is the verdict, not the closing table of a run that reads as finished
    assert mentions[1] == proc.stdout.splitlines()[-1], proc.stdout
    assert mentions[1].startswith("omnirl: the job did not finish (exit 4): role "), proc.stdout
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["action"] for e in events] == ["fail-job (configuration error: not restarted)"]
    for role in ("rollout", "actor", "reward", "controller"):
        assert (out / "logs" / f"{role}-0.log").read_text().count(f"omnirl: {role} on cpu") <= 1, role
    assert (out / "logs" / "rollout-0.log").read_text().count("configuration error") <= 1
    # nothing ran: the same command, run again after the fix, starts afresh (test_an_out_whose_run_never_started…)
    assert not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").read_text() == ""


def test_an_out_whose_run_never_started_is_started_afresh_by_the_same_command(tmp_path):
    """A configuration error at start-up (exit 4: a truncated weights file, OMNIRL_METRICS_PORT in use) leaves
    an empty metrics.jsonl: the controller opens it and writes its `start` line only once the actor is ready.
    Run again after the fix, the same command was refused — "omnirl run: OUT already holds a run: pass
    --resume to continue it" — for a run that trained nothing. Found by hand with the README's truncated
    weights file. A real launcher and Redis; the role processes are stand-ins."""
    import subprocess
    import sys

    import yaml

    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(load_rljob("examples/ocr-awm.yaml"))))
    proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=5)  # waits until every role started
    try:
        text = _interrupt(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, text
    # still nothing to continue: the same command again, not --resume
    assert text.strip().splitlines()[-1] == (f"omnirl: interrupted (exit 130); continue with: omnirl run "
                                             f"{tmp_path / 'job.yaml'} --out {out} --steps 1 --no-ray --device cpu"), text
    (out / "metrics.jsonl").write_text('{"event": "start", "start_step": 0}\n')  # a run that started: refused
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, f"omnirl run: {out} already holds a run: pass --resume to continue "
                                                 "it, or choose another --out\n"), done.stderr


@pytest.mark.slow  # 20-70 s on 2 cores: make test-slow
def test_a_metrics_port_in_use_stops_the_run_once_naming_the_variable(tmp_path):
    """`omnirl run` with OMNIRL_METRICS_PORT on a port another process serves (a second run in the same
    shell): the controller exits 4 with one line naming the variable and the fix, started once, and the
    verdict says so (was: a bind traceback, the whole job restarted maxRestarts times, exit 1)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    doc = yaml.safe_load(open("examples/ocr-nft.yaml"))
    doc["spec"]["data"] = {"trainPrompts": str(Path("examples/prompts/ocr-train.txt").resolve())}
    doc["spec"]["failurePolicy"] = {"maxRestarts": 2}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                               "--out", str(out)], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMNIRL_METRICS_PORT": str(port)})
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("omnirl: the job did not finish (exit 4): role controller failed: "), proc.stdout
    assert f"configuration error: OMNIRL_METRICS_PORT {port}: " in last and "set OMNIRL_METRICS_PORT to a free" in last
    log = (out / "logs" / "controller-0.log").read_text()
    assert log.count("omnirl: controller on cpu") == 1 and "Traceback" not in log, log


def test_a_health_port_in_use_is_a_configuration_error_of_the_role(tmp_path, redis_url):
    """`omnirl role` (a pod's entrypoint) with OMNIRL_HEALTH_PORT on a port another process holds: it crashed
    with grpc's `RuntimeError: Failed to bind to address [::]:N; set GRPC_VERBOSITY=debug ...` traceback, exit
    1, so the kubelet restarted it into the same error. Now exit 4 (never restarted), one line naming the
    variable and the fix, before the role's model loads."""
    import os
    import socket
    import subprocess
    import sys

    env = {**os.environ, "OMNIRL_JOB_NAME": "health-port", "OMNIRL_REDIS_URL": redis_url, "OMNIRL_OUT": str(tmp_path)}
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "omnirl.cli", "role", "reward", "--job", "examples/ocr-nft.yaml"],
                              capture_output=True, text=True, timeout=300, env={**env, "OMNIRL_HEALTH_PORT": str(port)})
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"omnirl role reward: configuration error: OMNIRL_HEALTH_PORT {port}: cannot listen on [::]:{port} (taken by "
        "another process, or below 1024 without the privilege); set OMNIRL_HEALTH_PORT to a free port (or unset it: "
        "no gRPC health probes)"), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_the_interrupt_verdict_repeats_the_runs_flags(tmp_path):
    """`continue with:` must continue what was asked: a `--steps 3 --device cpu` run resumed without
    them would train to spec.algorithm.steps (80) and place its roles on the GPUs; and a run stopped
    before its controller started (no metrics.jsonl) is started again without --resume, which refuses it."""
    from omnirl.cli import build_parser
    from omnirl.launch.local import resume_command

    args = build_parser().parse_args(["run", "examples/ocr-awm.yaml", "--steps", "3", "--device", "cpu",
                                      "--no-ray", "--share-gpus", "--resume"])
    (tmp_path / "metrics.jsonl").write_text('{"event": "start"}\n')
    assert resume_command(args, tmp_path) == (f"omnirl run examples/ocr-awm.yaml --out {tmp_path} --steps 3 "
                                              "--no-ray --device cpu --share-gpus --resume")
    (tmp_path / "metrics.jsonl").unlink()
    plain = build_parser().parse_args(["run", "job.yaml"])
    assert resume_command(plain, tmp_path) == f"omnirl run job.yaml --out {tmp_path}"
    (tmp_path / "metrics.jsonl").write_text('{"event": "start"}\n')
    assert resume_command(plain, tmp_path) == f"omnirl run job.yaml --out {tmp_path} --resume"


def test_the_interrupt_verdict_is_a_command_a_shell_runs_with_spaces_in_the_paths(tmp_path):
    """`omnirl run "my job.yaml" --out "runs/my run"`, Ctrl-C: the `continue with:` line read `omnirl run my
    job.yaml --out …/my run --steps 30 --no-ray --resume`, which, pasted, failed with "unrecognized arguments:
    job.yaml run". Split as a shell splits it, it gives back the run's own arguments."""
    import shlex

    from omnirl.cli import build_parser
    from omnirl.launch.local import resume_command

    out = tmp_path / "my run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"event": "start"}\n')
    args = build_parser().parse_args(["run", "my job.yaml", "--out", str(out), "--steps", "30", "--no-ray"])
    command = resume_command(args, out)
    assert command == f"omnirl run 'my job.yaml' --out '{out}' --steps 30 --no-ray --resume"
    again = build_parser().parse_args(shlex.split(command)[1:])
    assert (again.job, again.out, again.steps, again.no_ray, again.resume) == ("my job.yaml", str(out), 30, True, True)


def test_the_interrupt_verdict_starts_with_the_program_the_shell_finds(tmp_path, monkeypatch):
    """`make demo` runs `.venv/bin/omnirl` with no venv activated; its Ctrl-C verdict said `continue with:
    omnirl run examples/ocr-awm.yaml …`, which, pasted, failed with "omnirl: command not found"."""
    from omnirl.cli import build_parser
    from omnirl.launch.local import invoked_as, resume_command

    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    program = venv_bin / "omnirl"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")  # no omnirl on PATH, as after `make demo`
    monkeypatch.setattr(sys, "argv", ["venv/bin/omnirl", "run", "job.yaml"])
    args = build_parser().parse_args(["run", "job.yaml"])
    assert resume_command(args, tmp_path / "out") == f"venv/bin/omnirl run job.yaml --out {tmp_path / 'out'}"
    assert invoked_as("runs/my venv/bin/omnirl") == "'runs/my venv/bin/omnirl'"
    monkeypatch.setenv("PATH", str(venv_bin))  # an activated venv: the name alone finds the same program
    assert resume_command(args, tmp_path / "out") == f"omnirl run job.yaml --out {tmp_path / 'out'}"
    assert invoked_as("omnirl") == invoked_as("/usr/lib/python3/omnirl/cli.py") == "omnirl"


def test_an_interrupt_after_the_job_finished_says_nothing_is_left(tmp_path):
    """Ctrl-C while the launcher stops the roles of a finished job: it said "continue with: … --resume",
    and that resume answered "nothing to do"."""
    from omnirl.cli import build_parser
    from omnirl.launch.local import verdict

    args = build_parser().parse_args(["run", "job.yaml", "--no-ray"])
    (tmp_path / "metrics.jsonl").write_text('{"event": "start"}\n{"event": "step", "step": 0}\n')
    assert verdict(INTERRUPTED_EXIT, "", args, tmp_path) == (f"omnirl: interrupted (exit 130); continue with: omnirl run job.yaml "
                                                f"--out {tmp_path} --no-ray --resume")
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"event": "finish"}\n')
    assert verdict(INTERRUPTED_EXIT, "", args, tmp_path, since=0) == (
        "omnirl: interrupted (exit 130) after the job had finished: nothing to continue")
    # the finish is the earlier run's (the 3 records were there before this launcher started the roles) or
    # this launcher started none: the job it was asked for goes on with --resume
    resume = f"omnirl: interrupted (exit 130); continue with: omnirl run job.yaml --out {tmp_path} --no-ray --resume"
    assert verdict(INTERRUPTED_EXIT, "", args, tmp_path, since=3) == resume
    assert verdict(INTERRUPTED_EXIT, "", args, tmp_path) == resume
    assert verdict(4, "role actor-0 failed: x", args, tmp_path) == "omnirl: the job did not finish (exit 4): role actor-0 failed: x"


RAY_AND_SIGTERM = """
import os, signal, sys, threading, time
def stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)  # what omnirl run's main installs before anything starts
if sys.argv[1] == "during":  # once ray.init has put its own handler in (its first step), before it returns
    def kill_when_replaced():
        while signal.getsignal(signal.SIGTERM) is stop:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=kill_when_replaced, daemon=True).start()
from omnirl.launch.procs import init_ray
import ray
try:
    init_ray(None)
    if sys.argv[1] == "after":
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
    print("SIGTERM ignored")
except KeyboardInterrupt:
    print("SIGTERM stopped the launcher")
finally:
    ray.shutdown()
"""


@pytest.mark.parametrize("when", ["after", "during"])
def test_sigterm_during_or_after_ray_init_reaches_the_launchers_handler(when):
    """`omnirl run` (with Ray, the default) SIGTERMed mid-run died with exit 134 — "*** SIGTERM received"
    from Ray's C++ handler, no held-out table, no `continue with` line — and with exit 15 while Ray started:
    ray.init replaces the driver's SIGTERM handler with its own (sys.exit, chained to an aborting one).
    A real local Ray instance here."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", RAY_AND_SIGTERM, when], capture_output=True, text=True, timeout=240)
    assert (done.returncode, done.stdout.strip()) == (0, "SIGTERM stopped the launcher"), done.stderr[-2000:]


SLOW_TO_STOP = """
import sys
from omnirl.launch import local, procs

ROLE = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('started', flush=True); "
        "time.sleep(600)")  # a role that takes its time to stop (an actor writing a big checkpoint)

def start_role(role, index, job_file, env, log_dir, *, use_ray):
    child = procs._Child([sys.executable, "-c", ROLE], env, str(log_dir / f"{role}-{index}.log"), die_with_parent=True)
    return procs.RoleProcess(role, index, child)

local.start_role = start_role
from omnirl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _interrupt(proc, lines: list[str]) -> str:
    """Ctrl-C (SIGINT) the launcher and wait for it to end; returns everything it printed."""
    import signal

    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    return "".join(lines) + rest


def _launch_stand_ins(tmp_path, grace_s: int = 60, redis_url: str | None = None, steps: int = 1,
                      judge: dict | None = None, reward_role: dict | None = None):
    """`omnirl run` (a real launcher process, real embedded Redis — or the manifest's `redis_url` —,
    `--no-ray`) of examples/ocr-awm.yaml whose role processes are stand-ins that print `started` and
    ignore SIGTERM; `judge`: a `reward[]` entry appended (a real judge server the launcher starts);
    `reward_role`: fields set in `roles.reward`.
    Returns (the process, its output lines so far, a function reading lines until one holds a text, the
    run directory), once every role runs."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((repo / "examples/ocr-awm.yaml").read_text())
    for field in ("trainPrompts", "validationPrompts"):
        doc["spec"]["data"][field] = str(repo / "examples" / doc["spec"]["data"][field])
    doc["spec"]["failurePolicy"] = {"terminationGracePeriodSeconds": grace_s}
    if redis_url:
        doc["spec"]["transferQueue"] = {"redisUrl": redis_url}
    if judge:
        doc["spec"]["reward"].append(judge)
    if reward_role:
        doc["spec"]["roles"]["reward"].update(reward_role)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    # started by a shell without job control, pytest (and so the launcher) would inherit SIGINT ignored
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_TO_STOP, "run", str(tmp_path / "job.yaml"), "--no-ray",
                                 "--device", "cpu", "--steps", str(steps), "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        signal.signal(signal.SIGINT, ignored)
    lines: list[str] = []

    def wait_for(text: str) -> None:
        while not any(text in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)

    try:
        wait_for("[controller-0] started")  # every role runs (the controller starts last); no metrics.jsonl
    except BaseException:
        proc.kill()
        raise
    return proc, lines, wait_for, out


ROLES = ("rollout-0", "reward-0", "actor-0", "controller-0")  # the stand-in job's roles, in the launcher's order


def _killed(text: str, before: str, after: str) -> list[str]:
    """The roles a launcher line names as killed: the comma-separated names between `before` and `after`."""
    (line,) = [x for x in text.splitlines() if before in x and after in x.split(before, 1)[1]]
    return line.split(before, 1)[1].split(after, 1)[0].split(", ")


def _ignored_sigterm(out) -> set[str]:
    """The stand-in roles that had put in their SIGTERM-ignoring handler (they print `started` after it, into their
    log): those cannot end on the launcher's SIGTERM, only by its SIGKILL. One that had not yet (its interpreter
    still starting, on a loaded machine) ends on the SIGTERM by itself within its grace, and is rightly not named
    as killed."""
    return {name for name in ROLES
            if (out / "logs" / f"{name}.log").exists() and "started" in (out / "logs" / f"{name}.log").read_text()}


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_roles_json_names_the_judge_servers_the_launcher_started(tmp_path):
    """`OUT/roles.json` named the roles and the Redis but not the judge server `reward[].server` started
    (found by hand: `{"rollout-0": …, "controller-0": …, "redis": …}` while the judge ran as its own pid,
    holding a port). Its entry is `judge-<reward name>`: the pid the launcher's line printed, a live
    `omnirl scorer serve`, gone with a SIGKILLed launcher as every other entry."""
    import re
    import sys
    import time

    server = {"command": [sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "ocr", "--protocol", "http",
                          "--host", "127.0.0.1", "--port", "{port}"], "urlPath": "/v1/score", "healthPath": "/healthz"}
    proc, lines, wait_for, out = _launch_stand_ins(
        tmp_path, judge={"name": "critic", "kind": "http", "weight": 0.5, "server": server})
    try:
        pids = json.loads((out / "roles.json").read_text())
    finally:
        proc.kill()
        proc.wait(timeout=60)
    printed = int(re.search(r"judge critic starting on port \d+ \(pid (\d+)", "".join(lines)).group(1))
    assert pids["judge-critic"] == printed
    assert set(pids) == {"rollout-0", "reward-0", "actor-0", "controller-0", "redis", "judge-critic"}
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {name: pid for name, pid in pids.items() if _alive(pid)} == {}


@pytest.mark.slow  # a whole run for one printed line (~15 s)
def test_a_local_run_says_at_start_that_it_keeps_replicas_instead_of_autoscaling(tmp_path):
    """`omnirl run` of a job with `roles.reward.autoscale` ignored it without a word (docs/local.md says local
    runs keep `replicas`): a user saw 2 reward workers from start to end and no reason. One line now."""
    proc, lines, _, out = _launch_stand_ins(
        tmp_path, reward_role={"replicas": 2, "autoscale": {"minReplicas": 1, "maxReplicas": 6}})
    try:
        text = "".join(lines)
        pids = json.loads((out / "roles.json").read_text())
    finally:
        proc.kill()
        proc.wait(timeout=60)
    notes = [line for line in text.splitlines() if "autoscale" in line]
    assert notes == ["omnirl: roles.reward.autoscale (1–6 workers by the samples backlog) is for Kubernetes, where "
                     "the operator scales the reward Deployment; this local run keeps roles.reward.replicas: "
                     "2 reward workers throughout"], text
    assert {name for name in pids if name.startswith("reward-")} == {"reward-0", "reward-1"}  # as it says


def test_a_redis_the_watchdog_restarted_dies_with_a_sigkilled_launcher(tmp_path):
    """`kill -9` of the embedded Redis (docs/local.md: "`kill -9` one to try the failure policy"), restarted by
    the watchdog, then `kill -9` of `omnirl run`: the restarted server goes too, as the first one would
    (docs/reliability.md). It was restarted without a parent-death signal and outlived the
    launcher (parent 1, the job's data in memory), found by hand on the tiny example."""
    import os
    import signal
    import time

    proc, lines, wait_for, out = _launch_stand_ins(tmp_path)
    restarted = None
    try:
        first = json.loads((out / "roles.json").read_text())["redis"]
        os.kill(first, signal.SIGKILL)
        wait_for("→ restart-redis")
        deadline = time.monotonic() + 60
        while restarted in (None, first) and time.monotonic() < deadline:
            time.sleep(0.2)  # roles.json is rewritten once the new server answers
            restarted = json.loads((out / "roles.json").read_text())["redis"]
        assert restarted != first, "".join(lines)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while _alive(restarted) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(restarted), f"the restarted redis-server (pid {restarted}) outlived the SIGKILLed launcher"
    finally:
        proc.kill()
        if restarted is not None and _alive(restarted):
            os.kill(restarted, signal.SIGKILL)


def test_a_second_ctrl_c_kills_the_roles_at_once_and_leaves_no_redis_behind(tmp_path):
    """Ctrl-C, then Ctrl-C again while the roles stop (the actor may take `terminationGracePeriodSeconds`
    to write its checkpoint): the launcher kills what is left at once, says so, and still stops its Redis.
    The second KeyboardInterrupt used to escape the launcher's cleanup: the Redis watchdog was never
    stopped, restarted the embedded `redis-server` when the launcher's exit took it down, and that server
    outlived `omnirl run` (found by hand: `redis-server 127.0.0.1:44683`, parent 1, after exit 130).
    A real launcher process, real Redis; the role processes are stand-ins that ignore SIGTERM."""
    import os
    import signal
    import socket
    import time

    proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=300)
    try:
        pids = json.loads((out / "roles.json").read_text())
        proc.send_signal(signal.SIGINT)
        wait_for("interrupted while the roles were loading — stopping them")
        time.sleep(1.0)
        second = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        took = time.monotonic() - second
    finally:
        proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == INTERRUPTED_EXIT, text
    time.sleep(2.0)  # the watchdog restarted the server within 0.2 s of the launcher's exit taking it down
    port = int(text.split("(redis redis://127.0.0.1:")[1].split("/")[0])  # the launcher's first line names it
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert "restart-redis" not in (out / "events.jsonl").read_text()
    for name, pid in pids.items():
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"{name} (pid {pid}) outlived the launcher")
    assert took < 30, f"{took:.0f} s after the second Ctrl-C: it waited out the grace period\n{text}"
    # the roles still running at the second Ctrl-C, named in the launcher's order: every one that ignored its
    # SIGTERM (the controller always had, and none had the 3 s of a non-actor's grace); a stand-in SIGTERMed before
    # its handler was in (a loaded machine) ended by itself, and is not named
    killed = _killed(text, "omnirl: interrupted again — killed ", " before they stopped")
    assert killed == [name for name in ROLES if name in killed], text
    assert _ignored_sigterm(out) <= set(killed) and "controller-0" in killed, (_ignored_sigterm(out), text)
    assert "Traceback" not in text, text
    assert text.strip().splitlines()[-1] == (f"omnirl: interrupted (exit 130); continue with: omnirl run "
                                             f"{tmp_path / 'job.yaml'} --out {out} --steps 1 --no-ray --device cpu"), text


START = {"event": "start", "time": 1000.0, "total_steps": 3, "start_step": 0}
STEPS = [{"event": "step", "step": s, "policy_version": s + 1, "reward_mean": 0.5 + s / 10, "reward_std": 0.1}
         for s in range(3)]
FINISH = {"event": "finish", "time": 1012.4, "total_steps": 3, "start_step": 0, "last_checkpoint": "CKPT",
          "last_export": "EXPORT", "validation": None}


@pytest.mark.parametrize("phase,records,said", [
    ("loading", [], "omnirl: interrupted while the roles were loading — stopping them (nothing trained yet: nothing "
                    "to checkpoint)"),
    pytest.param("training", [START, *STEPS[:2]],
                 "omnirl: interrupted after 2 of 3 training steps — stopping every role (the actor checkpoints the "
                 "steps it trained since its last checkpoint, if any; --resume continues)",
                 marks=pytest.mark.slow),  # make test keeps one phase (~15 s a phase)
    pytest.param("finished", [START, *STEPS, FINISH],
                 "omnirl: interrupted after the job had finished — stopping its roles (nothing left to checkpoint)",
                 marks=pytest.mark.slow)],
    ids=["loading", "training", "finished"])
def test_ctrl_c_says_what_the_stop_does_in_each_phase(tmp_path, phase, records, said):
    """Ctrl-C printed "the actor writes a checkpoint; --resume continues" in every phase, also while the roles
    loaded and nothing was trained (found by hand: a Ctrl-C 1 s after the placement table of the tiny job).
    A real launcher; the roles are stand-ins, and the controller's records are written by the test."""

    proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=1, steps=3)
    try:
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        text = _interrupt(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, text
    assert [line for line in text.splitlines() if line.startswith("omnirl: interrupted")][0] == said, text
    assert "writes a checkpoint" not in text, text
    assert text.strip().splitlines()[-1] == {
        "loading": f"omnirl: interrupted (exit 130); continue with: omnirl run {tmp_path / 'job.yaml'} --out {out} "
                   "--steps 3 --no-ray --device cpu",
        "training": f"omnirl: interrupted (exit 130); continue with: omnirl run {tmp_path / 'job.yaml'} --out {out} "
                    "--steps 3 --no-ray --device cpu --resume",
        "finished": "omnirl: interrupted (exit 130) after the job had finished: nothing to continue"}[phase], text
    if phase == "finished":  # the finish record, readably (it was one raw JSON line from the controller)
        at = text.splitlines().index("omnirl: job ocr-awm finished")
        assert text.splitlines()[at + 1:at + 6] == [
            "  training steps  3 in 12 s",
            "  train reward    0.500 at step 0 → 0.700 at step 2",
            "  checkpoint      CKPT",
            "  export          EXPORT",
            f"  record          {out / 'metrics.jsonl'} (its 'finish' line)"], text


def test_ctrl_c_with_the_manifests_redis_gone_returns_at_once_naming_what_is_left(tmp_path):
    """The manifest's Redis (spec.transferQueue.redisUrl) goes down mid-run, then Ctrl-C: the roles sit in their
    Redis clients' retries (about 2 min) and cannot act on SIGTERM, so the launcher waited out the actor's
    terminationGracePeriodSeconds (60 s here) before its SIGKILL: 64 s measured by hand on the tiny job with real
    roles. Now it asks Redis (2 s), gives every role the short grace, and names in one line what it could not clean
    up. A real launcher and a real redis-server (this test's own: it is killed); the roles are stand-ins that
    ignore SIGTERM, as a role stuck in Redis retries does."""
    import os
    import signal
    import time

    from omnirl.transfer import start_redis_server

    server = start_redis_server(dir=str(tmp_path / "redis"))
    proc = None
    try:
        proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=60, redis_url=server.url, steps=3)
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (START, STEPS[0])))
        server.process.kill()  # the Redis goes away mid-run
        server.process.wait(10)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc is not None:
            proc.kill()
        server.stop()
    text = "".join(lines) + rest
    assert proc.returncode == INTERRUPTED_EXIT, text
    assert took < 15, f"{took:.0f} s from Ctrl-C to exit: it waited out the grace period\n{text}"
    port = server.port
    pids = json.loads((out / "roles.json").read_text())
    left = {name: pid for name, pid in pids.items() if _alive(pid)}
    for pid in left.values():
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{sorted(left)} outlived the launcher\n{text}"
    (line,) = [x for x in text.splitlines() if x.startswith("omnirl: not cleaned up: ")]
    # killed: the roles that ignored their SIGTERM (the controller always had); one SIGTERMed before its handler was
    # in (a loaded machine) ended by itself within its grace, and is not named
    killed = _killed(text, "(its roles' last beats there count as a live run for 30 s); ", " killed after 3 s")
    assert killed == [name for name in ROLES if name in killed], text
    assert _ignored_sigterm(out) <= set(killed) and "controller-0" in killed, (_ignored_sigterm(out), text)
    assert line == (
        f"omnirl: not cleaned up: 127.0.0.1:{port} (spec.transferQueue.redisUrl) does not answer (ConnectionError: "
        f"Error 111 connecting to 127.0.0.1:{port}. Connection refused.), so job 'ocr-awm' is not marked stopped there "
        f"(its roles' last beats there count as a live run for 30 s); {', '.join(killed)} killed after 3 s, waiting on "
        "it" + (" (no stop checkpoint: --resume continues from the last complete one)" if "actor-0" in killed else "")
    ), text
    assert text.strip().splitlines()[-1] == (
        f"omnirl: interrupted (exit 130); continue with: omnirl run {tmp_path / 'job.yaml'} --out {out} --steps 3 "
        "--no-ray --device cpu --resume"), text


def _run_with_path(tmp_path, bin_dir, *flags: str):
    """`omnirl run examples/ocr-awm.yaml --no-ray --device cpu --steps 1 --out OUT FLAGS` with `bin_dir`
    first on PATH; returns (the finished process, OUT)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", "examples/ocr-awm.yaml", "--no-ray", "--device",
                           "cpu", "--steps", "1", "--out", str(out), *flags], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    return done, out


def test_a_machine_without_redis_server_is_refused_before_anything_starts(tmp_path):
    """No `redis-server` on PATH (omnirl installed with pip, not `make install`): `omnirl run` ended in a
    RedisServerError traceback, after job.yaml and the lock were written into --out. Now one line, exit 2,
    naming the program, its install and spec.transferQueue.redisUrl; --out is not created."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    path = [d for d in os.environ["PATH"].split(":") if d and not shutil.which("redis-server", path=d)]
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", "examples/ocr-awm.yaml", "--no-ray", "--device",
                           "cpu", "--steps", "1", "--out", str(out)], cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "PATH": ":".join(path)}, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr == ("omnirl run: redis-server is not on PATH: omnirl run starts one for the job's TransferQueue "
                           "when spec.transferQueue.redisUrl is unset; install it (Debian/Ubuntu: apt-get install "
                           "redis-server, macOS: brew install redis), or set spec.transferQueue.redisUrl to a Redis you "
                           "run\n"), done.stderr
    assert not out.exists()


def test_an_embedded_redis_that_exits_at_start_is_the_verdict_not_a_traceback(tmp_path):
    """A `redis-server` that exits at once (here a stand-in printing Redis's own refusal of a bad AOF):
    `omnirl run` printed a RedisServerError traceback; now the server's log tail and the launcher's last
    line, `omnirl: the job did not finish (exit 1): the embedded Redis did not start: …`."""
    fake = tmp_path / "bin" / "redis-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Bad file format reading the append only file' >&2\nexit 1\n")
    fake.chmod(0o755)
    done, out = _run_with_path(tmp_path, fake.parent)
    assert done.returncode == FAILED, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "Bad file format reading the append only file" in done.stdout, done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("omnirl: the job did not finish (exit 1): the embedded Redis did not start: redis-server "
                           "exited with code 1 before answering PING; log "), last


def test_a_job_running_on_the_manifests_redis_is_not_started_there_again(tmp_path, redis_client, redis_url):
    """Two `omnirl run`s of one job on one external Redis (spec.transferQueue.redisUrl), in two --out
    directories: the second one's fresh start deleted the first one's keys (its rollout, reward and
    controller failed on "UNBLOCKED the stream key no longer exists" and it spent a restart-job) and then
    refused to start itself (exit 4, "the checkpoint directory was lost or belongs to another run").
    Found by hand on the tiny example; here the first run is its roles' heartbeats in a real Redis."""
    import json as json_lib
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    from omnirl.launch.preflight import LIVE_BEAT_S, check_not_running_elsewhere
    from omnirl.transfer.heartbeat import Heartbeat
    from omnirl.transfer.keys import kv_key

    repo = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((repo / "examples/ocr-awm.yaml").read_text())
    for field in ("trainPrompts", "validationPrompts"):
        doc["spec"]["data"][field] = str(repo / "examples" / doc["spec"]["data"][field])
    doc["spec"]["transferQueue"] = {"redisUrl": redis_url}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    for worker in ("rollout-0", "controller-0"):
        Heartbeat(redis_client, "ocr-awm", worker.split("-")[0], worker).beat()
    redis_client.set(kv_key("ocr-awm", "requests-of-the-other-run"), b"1")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                           "--device", "cpu", "--steps", "1", "--out", str(out)], cwd=repo, capture_output=True,
                          text=True, timeout=300)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    assert done.stderr.startswith(f"omnirl run: metadata.name: job 'ocr-awm' is running on 127.0.0.1:{port} "
                                  "(spec.transferQueue.redisUrl; last heartbeats: "), done.stderr
    assert "give this run another metadata.name" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert redis_client.get(kv_key("ocr-awm", "requests-of-the-other-run")) == b"1"  # nothing of it deleted
    assert not out.exists()
    job = load_rljob(str(tmp_path / "job.yaml"))
    redis_client.set(kv_key("ocr-awm", "stop"), b"true")  # that run ended (its launcher sets stop)
    check_not_running_elsewhere(redis_url, job)
    redis_client.delete(kv_key("ocr-awm", "stop"))
    for key in redis_client.scan_iter(match=kv_key("ocr-awm", "heartbeat:*")):  # a run killed a while ago
        beat = json_lib.loads(redis_client.get(key))
        redis_client.set(key, json_lib.dumps({**beat, "t": time.time() - LIVE_BEAT_S - 1}).encode())
    check_not_running_elsewhere(redis_url, job)


def test_the_resume_printed_after_a_ctrl_c_on_the_manifests_redis_is_not_refused_as_running(tmp_path, redis_client,
                                                                                          redis_url):
    """Ctrl-C of `omnirl run` on an external Redis (spec.transferQueue.redisUrl), then the command it printed,
    `… --resume`, at once: refused for 30 s, exit 2, "metadata.name: job 'ext-awm' is running on 127.0.0.1:16399
    (…; last heartbeats: actor-0 25 s ago, …); another omnirl run or RLJob of that name uses this Redis …" —
    the beats of the run's own stopped roles, since only a finished run set `stop`. Found by hand on a 6-step
    copy of the AWM example. A real launcher and Redis; the roles are stand-ins whose beats the test writes."""

    from omnirl.launch.preflight import check_not_running_elsewhere
    from omnirl.transfer.heartbeat import Heartbeat
    from omnirl.transfer.keys import kv_key

    proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=5, redis_url=redis_url)
    try:
        for worker in ("rollout-0", "reward-0", "actor-0", "controller-0"):  # they beat while they run
            Heartbeat(redis_client, "ocr-awm", worker.split("-")[0], worker).beat()
        assert redis_client.get(kv_key("ocr-awm", "stop")) is None
        text = _interrupt(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, text
    assert text.strip().splitlines()[-1] == (f"omnirl: interrupted (exit 130); continue with: omnirl run "
                                             f"{tmp_path / 'job.yaml'} --out {out} --steps 1 --no-ray --device cpu"), text
    # nothing ran (no controller): the launcher deleted the job's keys, the stand-ins' beats with them
    assert list(redis_client.scan_iter(match=kv_key("ocr-awm", "*"))) == [], text
    check_not_running_elsewhere(redis_url, load_rljob(str(tmp_path / "job.yaml")))  # the resume's pre-flight passes


def test_a_fresh_run_from_another_out_keeps_a_stopped_runs_work_on_the_manifests_redis(tmp_path, redis_client,
                                                                                        redis_url):
    """Two --out directories, one job name, one external Redis: run A stopped by Ctrl-C after some steps, then a
    fresh run B. B's start deleted the job's keys — A's pending work — and A's `--resume` (the command A printed)
    then failed after its roles loaded: exit 4, "omnirl role actor: configuration error: checkpoint …/A/checkpoints/
    latest: the job's actor had trained step 5, but it holds step 1, and no stored batch follows it: the checkpoint
    directory was lost or belongs to another run". Found by hand on a 6-step copy of the AWM example. Now B is
    refused before anything starts, naming A and its resume, and A's work stays. A real launcher and Redis; the
    roles are stand-ins, and the controller's `start` record is written by the test."""
    import socket
    import subprocess
    import sys

    from omnirl.launch.preflight import check_not_running_elsewhere, mark_stopped
    from omnirl.transfer.keys import kv_key

    proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=5, redis_url=redis_url)
    try:
        (out / "metrics.jsonl").write_text('{"event": "start", "start_step": 0}\n')  # the run started
        redis_client.set(kv_key("ocr-awm", "trainreqs"), b"A's batches")  # its pending work
        text = _interrupt(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT and text.strip().endswith(f"--out {out} --steps 1 --no-ray --device cpu --resume"), text
    other = tmp_path / "other"
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(tmp_path / "job.yaml"), "--no-ray",
                           "--device", "cpu", "--steps", "1", "--out", str(other)], capture_output=True, text=True,
                          timeout=120)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        f"omnirl run: metadata.name: job 'ocr-awm' on 127.0.0.1:{port} (spec.transferQueue.redisUrl) holds the pending "
        f"work of a run that was stopped before it finished ({socket.gethostname()}:{out}, 0 min ago), which a fresh "
        f"start here would delete: continue it with omnirl run JOB --out {out} --resume, or give this run another "
        f"metadata.name (to drop that work: redis-cli -h 127.0.0.1 -p {port} -n 0 --scan --pattern 'omnirl:ocr-awm:*' "
        f"| xargs -r redis-cli -h 127.0.0.1 -p {port} -n 0 unlink)\n")
    assert redis_client.get(kv_key("ocr-awm", "trainreqs")) == b"A's batches" and not other.exists()
    job = load_rljob(str(tmp_path / "job.yaml"))
    check_not_running_elsewhere(redis_url, job, None)  # A's own --resume is welcome
    check_not_running_elsewhere(redis_url, job, out)  # so is a fresh start in A's place (its directory removed)
    assert mark_stopped(redis_url, job, out, finished=True) == ""  # A resumed and finished: nothing left to keep
    check_not_running_elsewhere(redis_url, job, other)


def test_a_ctrl_c_after_the_job_finished_frees_its_name_on_the_manifests_redis(tmp_path, redis_client, redis_url):
    """Ctrl-C of `omnirl run` on an external Redis after its controller wrote the `finish` record (the roles
    stopping): it said "interrupted (exit 130) after the job had finished: nothing to continue", but left the job's
    keys, its `stop` flag, `kv:stopped_run` and its record marked stopped, so a fresh run of that name from another
    --out was refused ("holds the pending work of a run that was stopped before it finished …: continue it with
    omnirl run JOB --out OUT --resume"), and that --resume said "nothing to do" and left them too: a dead end but
    for redis-cli. Found by hand on a 2-step copy of the AWM example. Now it deletes them, as a run that finished."""

    from omnirl.launch.preflight import check_not_running_elsewhere
    from omnirl.transfer.keys import kv_key

    proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=5, redis_url=redis_url)
    try:
        (out / "metrics.jsonl").write_text('{"event": "start", "start_step": 0}\n'
                                           '{"event": "finish", "total_steps": 1, "start_step": 0}\n')
        redis_client.set(kv_key("ocr-awm", "actor_state"), b'{"step": 0}')  # what a finished run leaves
        text = _interrupt(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, text
    assert text.strip().splitlines()[-1] == "omnirl: interrupted (exit 130) after the job had finished: nothing to " \
        "continue", text
    assert list(redis_client.scan_iter(match=kv_key("ocr-awm", "*"))) == [], text
    check_not_running_elsewhere(redis_url, load_rljob(str(tmp_path / "job.yaml")), tmp_path / "other")


def test_a_resume_right_after_its_launcher_was_sigkilled_says_when_to_retry(tmp_path, redis_client, redis_url):
    """`omnirl run … --resume` of the --out whose launcher was just SIGKILLed (its roles gone with it): refused,
    as its roles' last beats count as live for 30 s, but it said "an omnirl run on host vm (--out /runs/m, pid
    18712) uses this Redis …: stop it", naming a pid that was gone and a run that was this one. Found by hand.
    It now says the last launcher of this --out was killed and in how many seconds to run it again."""
    import re

    from omnirl.launch.preflight import check_not_running_elsewhere
    from omnirl.transfer.heartbeat import Heartbeat
    from omnirl.transfer.owner import local_owner, write_owner

    job = load_rljob("examples/ocr-awm.yaml")
    job.spec.transferQueue.redisUrl = redis_url
    out = tmp_path / "m"
    write_owner(redis_client, "ocr-awm", {**local_owner(str(out)), "pid": 18712}, ttl_s=30)  # its lease
    Heartbeat(redis_client, "ocr-awm", "actor", "actor-0").beat()
    with pytest.raises(ValueError) as refused:
        check_not_running_elsewhere(redis_url, job, None, out)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    said = re.sub(r"in \d+ s$", "in N s", str(refused.value))
    assert said == (f"metadata.name: job 'ocr-awm' on 127.0.0.1:{port} (spec.transferQueue.redisUrl): the last launcher "
                    "of this --out (pid 18712) was killed without stopping its roles, whose last heartbeats (actor-0 0 s "
                    "ago) count as a live run for 30 s: run this again in N s")
    assert int(str(refused.value).rsplit(" ", 2)[1]) in (29, 30)


def test_a_resume_from_another_out_keeps_a_stopped_runs_work_and_place(tmp_path, redis_client, redis_url):
    """Run A of job 'ocr-awm' stopped (SIGTERM) on an external Redis after 3 steps; `omnirl run … --out B --resume`,
    B a finished run of that job made on another Redis: accepted, its roles loaded, and its actor exited 4 ("the
    job's actor had trained step 3, but it holds step 1 … the checkpoint directory was lost or belongs to another
    run"), after which the record and `kv:stopped_run` named B, so a third run was told to `--resume` B, not A.
    Found by hand with the real CLI. Now B's --resume is refused before anything starts (the launcher's pre-flight
    check and its claim), naming A, and A's record and place stay; A's own --resume is accepted."""
    import socket

    from omnirl.launch.preflight import check_not_running_elsewhere, claim_run, mark_stopped
    from omnirl.transfer.keys import kv_key
    from omnirl.transfer.owner import RUN_OWNER
    from omnirl.transfer.records import STOPPED_RUN

    job = load_rljob("examples/ocr-awm.yaml")
    job.spec.transferQueue.redisUrl = redis_url
    a, b = tmp_path / "a", tmp_path / "b"
    claim_run(redis_url, job, a).close()
    assert mark_stopped(redis_url, job, a, finished=False) == ""  # A's Ctrl-C
    before = {key: redis_client.get(kv_key("ocr-awm", key)) for key in (RUN_OWNER, STOPPED_RUN)}
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    said = (f"metadata.name: job 'ocr-awm' on 127.0.0.1:{port} (spec.transferQueue.redisUrl) holds the pending work "
            f"of a run that was stopped before it finished ({socket.gethostname()}:{a}, 0 min ago), which a --resume "
            f"of {b} would take over (its actor cannot continue another run's steps): continue it with omnirl run JOB "
            f"--out {a} --resume, or give this run another metadata.name (to drop that work: redis-cli -h 127.0.0.1 -p "
            f"{port} -n 0 --scan --pattern 'omnirl:ocr-awm:*' | xargs -r redis-cli -h 127.0.0.1 -p {port} -n 0 unlink)")
    with pytest.raises(ValueError) as refused:
        check_not_running_elsewhere(redis_url, job, None, b)  # B's --resume: pre-flight
    assert str(refused.value) == said
    with pytest.raises(ValueError) as refused:
        claim_run(redis_url, job, b, resume=True)  # and the atomic claim
    assert str(refused.value) == said
    after = {key: redis_client.get(kv_key("ocr-awm", key)) for key in (RUN_OWNER, STOPPED_RUN)}
    assert after == before and json.loads(after[STOPPED_RUN])["out"] == str(a)
    check_not_running_elsewhere(redis_url, job, None, a)  # A's own --resume is welcome
    claim_run(redis_url, job, a, resume=True).close()
    assert json.loads(redis_client.get(kv_key("ocr-awm", RUN_OWNER)))["out"] == str(a)



@pytest.mark.parametrize("phase", ["loading", pytest.param("training", marks=pytest.mark.slow)])  # ~19 s each
def test_a_run_whose_name_was_taken_leaves_the_other_runs_keys_as_they_are_when_it_stops(tmp_path, redis_client,
                                                                                         redis_url, phase):
    """`omnirl run` on an external Redis whose claim was taken meanwhile (its lease lapsed while its launcher did
    not renew it, and an RLJob of that name claimed the name: the record names that RLJob), then Ctrl-C: its
    `mark_stopped` wrote the `stop` flag (which ends the other run's roles) and its own place into the other run's
    keys, or, stopped while loading (nothing to continue), deleted every key of that name, the RLJob's record and
    pending work with them. Found by hand with the stand-in launcher. Now it touches none of them and says so."""
    import socket

    from omnirl.transfer.keys import kv_key
    from omnirl.transfer.owner import RUN_OWNER, rljob_owner, write_owner

    proc, lines, wait_for, out = _launch_stand_ins(tmp_path, grace_s=1, redis_url=redis_url)
    try:
        if phase == "training":
            (out / "metrics.jsonl").write_text('{"event": "start", "start_step": 0}\n')
        rljob = rljob_owner("team-a", "ocr-awm", "uid-1")
        write_owner(redis_client, "ocr-awm", rljob, ttl_s=120)  # the RLJob's claim, after this run's lapsed
        redis_client.set(kv_key("ocr-awm", "actor_state"), b'{"step": 7}')  # the RLJob's pending work
        wait_for("was taken by RLJob team-a/ocr-awm (uid uid-1)")  # its renewal thread sees it within 5 s
        text = _interrupt(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, text
    keys = sorted(k.decode() for k in redis_client.scan_iter(match=kv_key("ocr-awm", "*")))
    assert keys == [kv_key("ocr-awm", "actor_state"), kv_key("ocr-awm", RUN_OWNER)], (keys, text)
    assert json.loads(redis_client.get(kv_key("ocr-awm", RUN_OWNER))) == rljob
    assert redis_client.get(kv_key("ocr-awm", "actor_state")) == b'{"step": 7}'
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    (said,) = [line for line in text.splitlines() if "not this run" in line]
    assert said == (
        f"omnirl: job 'ocr-awm' on 127.0.0.1:{port} is held by RLJob team-a/ocr-awm (uid uid-1), not this run (its "
        "claim was taken while this launcher did not renew it): this run "
        + ("set no stop flag and left no place there" if phase == "training" else "deleted no keys there")
        + ", as its keys are that run's now (the two runs may have shared them meanwhile)"), text
    assert socket.gethostname() not in said


# loaded by the actor process (sitecustomize on PYTHONPATH): its first training step meets a configuration
# error, as a LoRA whose targetModules match nothing once the first batch trains
ACTOR_CONFIG_ERROR_AT_FIRST_STEP = '''
import importlib.abc, importlib.util, sys
if "role" in sys.argv and "actor" in sys.argv:
    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "omnirl.actor.service":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                from omnirl.api.errors import ConfigError
                def _train(self, req, replay=False):
                    raise ConfigError("spec.model.lora.targetModules: ['x'] matched no module")
                module.ActorService._train = _train
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Hook())
'''


@pytest.mark.slow
def test_a_roles_configuration_error_is_one_line_without_the_controllers_traceback(tmp_path):
    """`omnirl run` whose actor meets a configuration error at its first step: the actor's one line
    and exit 4 decide, and the controller, which relays it (`RoleFailed`), says so in one line too.
    Before, the controller printed a Python traceback (`omnirl.controller.loop.RoleFailed: …`, 20
    lines of its own stack) before the configuration error's one clear line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from e2e.chaos import chaos_job


    repo = Path(__file__).resolve().parents[2]
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(ACTOR_CONFIG_ERROR_AT_FIRST_STEP)
    job, out = chaos_job(tmp_path, "config-at-first-step", steps=2), tmp_path / "out"
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["failurePolicy"]["maxRestarts"] = 2
    job.write_text(yaml.safe_dump(doc))
    paths = [str(hook), str(repo / "services"), str(repo / "operator"), str(repo)]
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "run", str(job), "--no-ray", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=repo,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
    console = done.stdout + done.stderr
    assert done.returncode == CONFIG_ERROR_EXIT, console[-3000:]
    said = "spec.model.lora.targetModules: ['x'] matched no module"
    assert "Traceback" not in console, console[-3000:]
    failed = [line for line in done.stdout.splitlines() if line.startswith("[") and "] omnirl role " in line
              and "stopped by SIGTERM" not in line]
    assert failed == [f"[actor-0] omnirl role actor: configuration error: {said}",
                      f"[controller-0] omnirl role controller: actor actor-0 failed: ConfigError: {said}"], console[-3000:]
    assert (f"omnirl: the job did not finish (exit 4): role actor-0 failed: omnirl role actor: configuration error: "
            f"{said}") in done.stdout.splitlines()
    assert (out / "logs" / "controller-0.log").read_text().splitlines()[-1] == \
        f"omnirl role controller: actor actor-0 failed: ConfigError: {said}"
