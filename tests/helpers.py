"""Shared test helpers: a small real digits model (random weights, every layer live) and requests for it."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from omnirl.api.loader import job_from_dict
from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.models.digits.adapter import DigitsAdapter
from omnirl.models.digits.model import DigitsConfig, DigitsDiT
from omnirl.rollout.types import SampleRequest

PROMPTS = ['A sign that says "123"', 'A sign that says "98765"', 'A sign that says "4071"']


def tiny_adapter(seed: int = 0, *, std: float = 0.05) -> DigitsAdapter:
    """The real digits DiT at a small width (d 32, depth 2) with random weights that compute something.

    The model zero-initialises its adaLN modulations and output projection (adaLN-Zero), so a
    freshly built one has velocity exactly 0 and no block or LoRA weight ever gets a gradient: a
    test on it passes whether the feature it names works or not. Here those layers are redrawn
    from N(0, std²) with a generator seeded by `seed`, so the velocity depends on x, σ and the
    prompt and every linear layer gets a gradient. The shipped checkpoint is untouched.
    """
    torch.manual_seed(seed)
    module = DigitsDiT(DigitsConfig(d_model=32, depth=2, heads=2, mlp_ratio=2))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in [b.modulation for b in module.blocks] + [module.modulation_out, module.out_proj]:
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * std)
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=g) * std)
    return DigitsAdapter(module)


def requests(adapter: DigitsAdapter, n_per_prompt: int = 3, *, num_steps: int = 6, window=(1, 2),
             prompts: list[str] = PROMPTS) -> list[SampleRequest]:
    """n requests per prompt with distinct seeds and a shared SDE window."""
    out = []
    for p, text in enumerate(prompts):
        ids = tuple(adapter.tokenize(text))
        for i in range(n_per_prompt):
            out.append(SampleRequest(sample_id=f"0:{p}:{i}", prompt=text, prompt_ids=ids, seed=1000 * p + i,
                                     num_steps=num_steps, window=tuple(window), noise_level=0.7))
    return out


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 60.0, poll_s: float = 0.05):
    """Poll `condition` until it returns a truthy value and return it; AssertionError naming `what`
    after `timeout_s` seconds (generous: the shared CI box may stall; only a hang reaches it)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(poll_s)
    return value


def jpeg_reward_job(name: str, redis_url: str, out_dir: Path) -> tuple[RLJob, RoleEnv]:
    """The OCR example renamed `name`, scored by the in-process JPEG scorer (no OCR model), and the
    role environment of its worker `reward-0` writing to `out_dir`."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["reward"] = [{"name": "jpeg", "kind": "jpeg", "params": {"quality": 90}}]
    env = RoleEnv(job_name=name, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=0,
                  worker_id="reward-0", out_dir=str(out_dir))
    return job_from_dict(doc), env


def supervise_scripts(job: RLJob, rollout_script: str, redis_url: str, out: Path, queue_name: str, *,
                      beats: int = 600, redis=None):
    """Run the local Supervisor to its end over two real processes: a rollout that prints `started`
    then runs `rollout_script`, and a controller that beats `beats` times (every 0.2 s) then exits 0.
    `redis`: a RedisServer it watches as its own. Returns (exit code, the supervisor, already
    stopped and closed); role logs are under `out/logs/`."""
    from omnirl.launch.procs import RoleProcess, _Child
    from omnirl.launch.supervise import Supervisor
    from omnirl.transfer import TransferQueue

    beating = ("import time, redis; from omnirl.transfer.heartbeat import Heartbeat; "
               f"beat = Heartbeat(redis.Redis.from_url({redis_url!r}), {job.metadata.name!r}, 'controller', "
               f"'controller-0', every_s=0.2)\nfor _ in range({beats}): beat.beat(); time.sleep(0.2)")
    scripts = {"rollout": f"print('started', flush=True)\n{rollout_script}", "controller": beating}

    def start(role: str, index: int, resume: str) -> RoleProcess:
        return RoleProcess(role, index, _Child([sys.executable, "-c", scripts[role]], {"PYTHONPATH": os.environ.get(
            "PYTHONPATH", "")}, str(out / "logs" / f"{role}-{index}.log")))

    queue = TransferQueue.for_job(queue_name, job.spec.transferQueue, redis_url)
    supervisor = Supervisor(job, [("rollout", 0), ("controller", 0)], start, queue, out, 1, redis=redis)
    try:
        code = supervisor.run()
    finally:
        supervisor.stop_all(grace_s=1.0)
        supervisor.close()
        queue.close()
    return code, supervisor


class Crash(BaseException):
    """The process dies here (a BaseException: no `except Exception` of the code under test runs)."""


FS_MUTATIONS = ("rename", "replace", "symlink", "unlink", "rmdir")
"""The `os` calls that change a directory's entries (pathlib and shutil.rmtree go through them)."""


def crash_at(monkeypatch, n: int) -> None:
    """Raise `Crash` instead of the `n`-th (1-based) directory change from now on: a kill between two
    steps of a write, as the files are left (a kill runs no cleanup; neither does a BaseException
    past handlers that only catch Exception or OSError)."""
    calls = [0]

    def armed(fn):
        def call(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                raise Crash(f"killed before {fn.__name__}{args}")
            return fn(*args, **kwargs)
        return call

    for name in FS_MUTATIONS:
        monkeypatch.setattr(os, name, armed(getattr(os, name)))


def crash_everywhere(monkeypatch, prepare: Callable[[int], object], write: Callable[[object], object],
                     check: Callable[[object, bool], None], limit: int = 200) -> int:
    """Run `write(prepare(n))` with a crash before its n-th directory change, for n = 1, 2, … until
    one run finishes, calling `check(prepared, finished)` after each; returns how many crash points
    there were."""
    for n in range(1, limit):
        prepared = prepare(n)
        with monkeypatch.context() as m:
            crash_at(m, n)
            try:
                write(prepared)
                finished = True
            except Crash:
                finished = False
        check(prepared, finished)
        if finished:
            return n - 1
    raise AssertionError(f"the write did not finish within {limit} directory changes")


def without_file_permission_override(cmd: list[str]) -> list[str]:
    """`cmd` run so that file modes bind it: as root, without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    (`setpriv --bounding-set`: root reads a chmod 000 file otherwise); as another user, unchanged.
    Skips the calling test where root cannot drop them (no setpriv)."""
    import shutil
    import subprocess

    import pytest

    if os.geteuid() != 0:
        return cmd
    prefix = [shutil.which("setpriv") or "setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("root cannot drop CAP_DAC_OVERRIDE here (setpriv): a file mode does not stop it")
    return [*prefix, *cmd]


def refill_shapes(out: Path) -> dict[int, tuple[int, int, int, int]]:
    """step → (samples, groups, refills, dropped_groups) of every trained step in `out/metrics.jsonl`."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["samples"], r["groups"], r["refills"], r["dropped_groups"]) for r in rows
            if r["event"] == "step"}


def trained_sample_ids(out: Path) -> list[str]:
    """The sample ids the actor's ledgers (`out/ledger/actor-*.jsonl`) say were trained, in file order."""
    return [json.loads(line)["sample_id"] for p in sorted((out / "ledger").glob("actor-*.jsonl"))
            for line in p.read_text().splitlines()]
