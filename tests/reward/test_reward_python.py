"""`kind: python`: a user's function as the reward, in-process (`RewardSet`, as the reward role scores), through
`omnirl scorer serve` (gRPC and HTTP, as `kind: grpc`/`http` reach it), and its checks in `omnirl validate` and
`omnirl run`'s pre-flight (docs/rewards-python.md). A whole job: e2e/test_python_reward_job.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from omnirl.api.spec import RewardSpec
from omnirl.cli import main
from omnirl.reward.registry import build_scorer
from omnirl.reward.scoring import RewardSet

ROOT = Path(__file__).resolve().parents[2]
NFT = str(ROOT / "examples" / "ocr-nft.yaml")
USER_MODULE = '''
import numpy as np

def score(images, prompts):
    """Batch: the closed form 0.01 * len(prompt) + mean pixel / 255, checking what omnirl passes."""
    assert images.dtype == np.uint8 and images.ndim == 4 and images.shape[3] == 3 and len(prompts) == len(images)
    if any("boom" in p for p in prompts):
        raise RuntimeError("cannot score boom")
    return [0.01 * len(p) + float(image.mean()) / 255.0 for image, p in zip(images, prompts)]

def one(image, prompt):
    """Per sample: the same closed form."""
    assert image.dtype == np.uint8 and image.ndim == 3
    return 0.01 * len(prompt) + float(image.mean()) / 255.0

def wrong_length(images, prompts):
    return [1.0]

NOT_A_FUNCTION = 3
'''
PROMPTS = ['a sign that says "12"', 'a sign that says "345"', 'x']


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of reward functions on sys.path (and PYTHONPATH, for child processes); its name."""
    name = f"user_rewards_{os.getpid()}_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return name


def images(n: int = 3) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(n, 8, 12, 3), dtype=np.uint8)


def closed_form(imgs: np.ndarray, prompts: list[str]) -> list[float]:
    return [np.float32(0.01 * len(p) + float(i.mean()) / 255.0).item() for i, p in zip(imgs, prompts, strict=True)]


@pytest.mark.parametrize("function,call", [("score", "batch"), ("one", "sample")])
def test_the_reward_is_the_functions_value(user_module: str, function: str, call: str) -> None:
    spec = RewardSpec(name="mine", kind="python", params={"function": f"{user_module}:{function}", "call": call})
    imgs = images()
    results = RewardSet([spec]).score(list(imgs), PROMPTS, ["s0", "s1", "s2"])
    assert [r[0] for r in results] == closed_form(imgs, PROMPTS)
    assert [r[1]["mine"] for r in results] == closed_form(imgs, PROMPTS)


def test_a_function_that_raises_fails_only_its_sample_and_says_why(user_module: str) -> None:
    spec = RewardSpec(name="mine", kind="python", params={"function": f"{user_module}:score"})
    imgs, prompts = images(), ["ok", "boom", "fine"]
    results = RewardSet([spec]).score(list(imgs), prompts, ["s0", "s1", "s2"])
    want = closed_form(imgs, prompts)
    assert [r[0] for r in results] == [want[0], None, want[2]]
    assert results[1][2] == f"mine: {user_module}:score raised RuntimeError: cannot score boom"


def test_a_function_that_returns_the_wrong_count_fails_every_sample_naming_it(user_module: str) -> None:
    spec = RewardSpec(name="mine", kind="python", params={"function": f"{user_module}:wrong_length"})
    results = RewardSet([spec]).score(list(images()), PROMPTS, ["s0", "s1", "s2"])
    assert {r[2] for r in results} == {f"mine: {user_module}:wrong_length returned shape [1] for 3 samples; return 3 "
                                       "floats, shape [B]"} and {r[0] for r in results} == {None}


def _job(tmp_path: Path, function: str) -> str:
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    doc["spec"]["reward"] = [{"name": "mine", "kind": "python", "params": {"function": function}}]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_validate_and_run_name_params_function_when_it_is_not_a_function(user_module, tmp_path, capsys) -> None:
    field = "spec.reward[0].params.function"
    for function, problem in [
        (f"{user_module}:nope", f"{user_module} has no attribute 'nope'; name the reward function as MODULE:FUNCTION "
                                f"(module {user_module} defines score, one, wrong_length)"),
        (f"{user_module}:NOT_A_FUNCTION", f"{user_module}:NOT_A_FUNCTION is a int, not a function; name the reward "
                                          "function")]:
        path = _job(tmp_path, function)
        assert main(["validate", path]) == 2
        assert capsys.readouterr().out.splitlines() == [f"{path}: {field}: {problem}"]
        assert main(["run", path, "--no-ray", "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
        assert capsys.readouterr().err.splitlines() == [f"omnirl run: {field}: {problem}"]
        assert not (tmp_path / "o").exists()
    path = _job(tmp_path, "my_pkg.rewards")  # no colon: the spec refuses it (the operator too)
    assert main(["validate", path]) == 2
    assert capsys.readouterr().out.splitlines()[0].startswith(
        f'{path}: {field}: "my_pkg.rewards" is invalid: must be MODULE:FUNCTION, a dotted module path, a colon and the '
        "function's name, e.g. my_pkg.rewards:score")


def test_a_module_not_on_this_machine_is_a_note_in_validate_and_refused_by_run(tmp_path, capsys) -> None:
    # valid for a cluster whose reward image has the package, as a model directory that is not here
    path = _job(tmp_path, "omnirl_no_such_pkg.rewards:score")
    problem = ("spec.reward[0].params.function: module 'omnirl_no_such_pkg.rewards' cannot be imported here "
               "('omnirl_no_such_pkg' not found); install it, or add its directory to PYTHONPATH for omnirl run (on "
               "Kubernetes: in the reward image)")
    assert main(["validate", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: ok" and f"  ocr-nft: {problem} (omnirl run here refuses it)" in lines
    assert main(["run", path, "--no-ray", "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"omnirl run: {problem}"]


@pytest.mark.parametrize("protocol,flags", [("grpc", ["--function", "{m}:score"]),
                                            ("http", ["--reward", "python", "--param", "function={m}:score"])])
def test_scorer_serve_serves_the_function_to_a_remote_reward(user_module: str, protocol: str, flags: list[str]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "scorer", "serve", *(f.format(m=user_module)
                             for f in flags), "--protocol", protocol, "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {user_module}:score over {protocol} on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        url = f"127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}/v1/score"
        remote = build_scorer(RewardSpec(name="served", kind=protocol, url=url))
        imgs, prompts = images(), ["ok", "boom", "fine"]
        outcome = remote.score_each(imgs, prompts, ["s0", "s1", "s2"])
        want = closed_form(imgs, prompts)
        assert outcome.values[[0, 2]].tolist() == [want[0], want[2]]
        assert list(outcome.errors) == [1] and "cannot score boom" in outcome.errors[1].reason
        getattr(remote, "close", lambda: None)()  # the gRPC client holds a channel
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_scorer_serve_names_the_function_flag_when_it_is_not_a_function(user_module: str, capsys) -> None:
    assert main(["scorer", "serve", "--function", "nocolon", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        'omnirl scorer: --function: "nocolon" is invalid: must be MODULE:FUNCTION, a dotted module path, a colon and '
        "the function's name, e.g. my_pkg.rewards:score"]
    assert main(["scorer", "serve", "--function", f"{user_module}:NOT_A_FUNCTION", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"omnirl scorer: --function: {user_module}:NOT_A_FUNCTION is a int, not a function; name the reward function"]
