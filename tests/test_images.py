"""The Dockerfiles: entrypoints exist as console scripts and name valid roles, the user is non-root
(uid 1000, the pods' runAsUser), CUDA by default and Ascend (torch-npu) by build argument.

No image is built here (no Docker on CI machines); the checks read the Dockerfiles.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from omnirl.cli import build_parser
from omnirl_operator.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[1]
IMAGES = {"rollout_image": ["rollout"], "reward_image": ["reward"], "trainer_image": ["actor", "controller"]}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile line, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def last(path: Path, word: str) -> str:
    values = [rest for w, rest in instructions(path) if w == word]
    assert values, f"{path} has no {word}"
    return values[-1]


def console_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml (read by hand: tomllib needs Python 3.11, we support 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^\s*"?([A-Za-z0-9_.-]+)"?\s*=\s*"([^"]+)"', section, flags=re.M))


def role_choices() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    role_action = next(a for a in sub.choices["role"]._actions if a.dest == "role")
    return list(role_action.choices)


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_entrypoint_is_a_console_script_running_a_valid_role(image):
    dockerfile = ROOT / image / "Dockerfile"
    entrypoint = json.loads(last(dockerfile, "ENTRYPOINT"))  # exec form, so signals reach the role
    script, subcommand, role = entrypoint
    scripts = console_scripts()
    assert scripts.get(script) == "omnirl.cli:main", f"{script} is not a [project.scripts] entry of pyproject.toml"
    assert subcommand == "role" and role in role_choices() and role == IMAGES[image][0]
    for served in IMAGES[image]:  # the operator runs `omnirl role <role> --job …` on this image
        assert served in role_choices()


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_non_root_cuda_default_and_ascend_build_arg(image):
    dockerfile = ROOT / image / "Dockerfile"
    steps = instructions(dockerfile)
    assert last(dockerfile, "USER") == "1000:1000"
    args = {rest.split("=")[0]: rest.split("=", 1)[1] for w, rest in steps if w == "ARG" and "=" in rest}
    assert args["ACCELERATOR"] == "cuda" and args["CUDA_BASE"].startswith("nvidia/cuda:")
    stages = {rest.split(" AS ")[-1] for w, rest in steps if w == "FROM" and " AS " in rest}
    assert stages == {"base-cuda", "base-ascend"}
    assert last(dockerfile, "FROM") == "base-${ACCELERATOR}"
    ascend = dockerfile.read_text().split("AS base-ascend")[1].split("FROM ")[0]
    assert "torch-npu" in ascend
    run = " ".join(rest for w, rest in steps if w == "RUN")
    assert "python -m omnirl.reward.protocol.stubs" in run  # gRPC stubs built in the image
    copies = [rest for w, rest in steps if w == "COPY"]
    assert "examples /opt/omnirl/examples" in copies
    assert OperatorSettings().data_root == "/opt/omnirl/examples"  # what the operator resolves against


def test_operator_image_runs_kopf_without_torch():
    dockerfile = ROOT / "operator" / "Dockerfile"
    entrypoint = json.loads(last(dockerfile, "ENTRYPOINT"))
    assert entrypoint[:4] == ["kopf", "run", "-m", "omnirl_operator.handlers"]
    run = " ".join(rest for w, rest in instructions(dockerfile) if w == "RUN")
    assert "--no-deps" in run and "torch" not in run
    assert last(dockerfile, "USER") == "1000:1000"


def test_chart_defaults_reference_the_images_the_operator_defaults_to():
    import yaml

    values = yaml.safe_load((ROOT / "charts" / "omnirl" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts" / "omnirl" / "Chart.yaml").read_text())
    defaults = OperatorSettings()
    for role, image in (("rollout", defaults.rollout_image), ("reward", defaults.reward_image),
                        ("trainer", defaults.trainer_image)):
        spec = values["jobImages"][role]
        assert f"{spec['repository']}:{spec['tag'] or chart['appVersion']}" == image


def image_specific(line: str) -> bool:
    """Lines allowed to differ between the three role images: the header comment naming the image and
    its build commands, the ports it exposes, its default role."""
    return line.startswith(("# omnirl ", "#   docker build ", "# 9090 ", "EXPOSE ", "ENTRYPOINT "))


def test_the_role_images_differ_only_in_their_name_ports_and_role():
    """One recipe for the three role images: the torch build, the extras and the user are set once in
    each and must agree (a torch bump in one image only would run the roles of one job on two torches)."""
    recipes = {image: [line for line in (ROOT / image / "Dockerfile").read_text().splitlines()
                       if not image_specific(line)] for image in IMAGES}
    first, *rest = recipes
    for image in rest:
        assert recipes[image] == recipes[first], f"{image}/Dockerfile differs from {first}/Dockerfile"


def stage_args(dockerfile: Path, stage: str) -> dict[str, str]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text()).split(f"AS {stage}")[1].split("\nFROM ")[0]
    return dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M))


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_images_run_the_tested_torch_and_can_load_the_diffusers_families(image):
    """The images install the torch the GPU tests ran on (pyproject's floor, 2.11.0: FSDP2's public
    `torch.distributed.fsdp.fully_shard` needs ≥ 2.6; the images once pinned 2.5.1 and 2.4.0) and the
    `diffusers` extra (without it every sd3/flux/qwen-image RLJob's pods fail at import)."""
    dockerfile = ROOT / image / "Dockerfile"
    floor = re.search(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    cuda, ascend = stage_args(dockerfile, "base-cuda"), stage_args(dockerfile, "base-ascend")
    assert cuda["TORCH_VERSION"] == ascend["TORCH_VERSION"] == f"{floor}.0"
    assert ascend["TORCH_NPU_VERSION"].startswith(f"{floor}.0")  # torch-npu X.Y.Z.postN is built for torch X.Y.Z
    run = " ".join(rest for w, rest in instructions(dockerfile) if w == "RUN")
    assert 'pip install "/src[diffusers]"' in run
    extras = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    assert re.search(r'^diffusers = \[.*"diffusers>=', extras, flags=re.M)
