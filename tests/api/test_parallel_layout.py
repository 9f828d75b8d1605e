"""A replica's layout in the RLJob (`spec.roles.{rollout,actor}.parallel`, docs/parallel.md): the GPUs it asks for
follow from its degrees, and `omnirl validate` refuses a layout the model cannot take, naming the field and the
valid values: devices that do not match the degrees, a family without a context-parallel plan, heads that do not
divide by a degree (read from the model directory's configs), a text encoder without a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from omnirl.api.loader import job_from_dict
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RLJob
from omnirl.api.spec_parallel import actor_world, fsdp_degree
from omnirl.cli import main
from omnirl.models.parallel.layout import check_layout

FLUX = {"family": "flux", "path": "/models/flux", "dtype": "bfloat16"}


def manifest(model: dict | None = None, **roles) -> dict:
    return {"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "par"},
            "spec": {"model": model or FLUX, "data": {"trainPrompts": "t.txt"}, "reward": [{"name": "o", "kind": "ocr"}],
                     "roles": roles}}


def refusal(doc: dict) -> list[str]:
    try:
        job_from_dict(doc)
    except ValidationError as err:
        return [text for _, text in problem_lines(RLJob, err)]
    return []


def test_gpus_per_replica_follow_from_the_degrees():
    job = job_from_dict(manifest(
        rollout={"replicas": 2, "accelerator": {"type": "nvidia", "count": 4},
                 "parallel": {"ulysses": 8, "encoderTensor": 4, "podsPerReplica": 2}},
        actor={"replicas": 4, "accelerator": {"type": "nvidia", "count": 8}, "parallel": {"ulysses": 2, "replicate": 2}}))
    rollout, actor = job.spec.roles.rollout, job.spec.roles.actor
    assert (rollout.parallel.ranks, rollout.parallel.ranks_per_pod) == (8, 4)
    assert (actor_world(actor.replicas, actor.parallel), fsdp_degree(actor.replicas, actor.parallel)) == (8, 4)


@pytest.mark.parametrize(("model", "roles", "line"), [
    (FLUX, {"rollout": {"accelerator": {"type": "nvidia", "count": 4}, "parallel": {"ulysses": 8}}},
     "spec.roles.rollout.accelerator.count: 4 is invalid: must be 8: a rollout replica is parallel.ulysses × "
     "parallel.tensor = 8 × 1 = 8 device(s) (a rank per device) in parallel.podsPerReplica = 1 pod(s); set count: 8, "
     "or podsPerReplica: 2 with count: 4 or podsPerReplica: 4 with count: 2 or podsPerReplica: 8 with count: 1"),
    (FLUX, {"actor": {"replicas": 3, "accelerator": {"type": "nvidia", "count": 2}}},
     "spec.roles.actor.accelerator.count: 2 is invalid: must divide the actor's ranks, replicas × parallel.ulysses = "
     "3 × 1 = 3 (each pod holds as many ranks as devices); valid: [1, 3]"),
    ({**FLUX, "family": "sd3"}, {"rollout": {"parallel": {"ulysses": 2}}},
     "spec.roles.rollout.parallel.ulysses: 2 is invalid: needs a family with a context-parallel plan (flux, "
     "ltx2, minimax-h3, qwen-image, wan); model.family is sd3: set ulysses: 1"),
    (FLUX, {"rollout": {"parallel": {"ulysses": 2, "encoderTensor": 4}}},
     "spec.roles.rollout.parallel.encoderTensor: 4 is invalid: must divide the rollout replica's ranks, ulysses × "
     "tensor = 2 × 1 = 2 (the text encoder is split over the replica's own devices); valid: [1, 2]"),
    (FLUX, {"rollout": {"parallel": {"ulysses": 2, "tensor": 2}}},
     "spec.roles.rollout.parallel.tensor: 2 is invalid: cannot be combined with ulysses 2 (diffusers 0.42.1 refuses "
     "context and tensor parallelism in one model): keep one of the two at 1"),
    (FLUX, {"actor": {"replicas": 4, "parallel": {"replicate": 3}}},
     "spec.roles.actor.parallel.replicate: 3 is invalid: must divide roles.actor.replicas (4): each HSDP group holds "
     "as many data-parallel ranks; valid: [1, 2, 4]"),
])
def test_a_layout_the_spec_cannot_take_is_refused_naming_the_field_and_valid_values(model, roles, line):
    assert refusal(manifest(model, **roles)) == [line]


def _model_dir(tmp: Path, heads: int, encoder: dict) -> Path:
    (tmp / "transformer").mkdir(parents=True)
    (tmp / "transformer" / "config.json").write_text(json.dumps({"num_attention_heads": heads,
                                                                 "audio_num_attention_heads": 4}))
    (tmp / "text_encoder").mkdir()
    (tmp / "text_encoder" / "config.json").write_text(json.dumps(encoder))
    return tmp


def test_heads_that_do_not_divide_and_an_encoder_without_a_plan_are_read_from_the_configs(tmp_path):
    root = _model_dir(tmp_path / "m", 6, {"model_type": "t5", "num_heads": 6})
    spec = job_from_dict(manifest({**FLUX, "path": str(root)},
                                  rollout={"parallel": {"ulysses": 4, "encoderTensor": 4}})).spec
    assert check_layout(spec) == [
        "spec.roles.rollout.parallel.ulysses: 4 does not divide the transformer's num_attention_heads = 6 "
        "(transformer/config.json): each rank takes heads / ulysses heads; valid: [1, 2, 3, 6]",
        "spec.roles.rollout.parallel.encoderTensor: 4 does not divide text_encoder's num_heads = 6 "
        "(text_encoder/config.json): each rank takes heads / encoderTensor heads; valid: [1, 2, 3, 6]"]
    spec = job_from_dict(manifest({**FLUX, "path": str(root)}, rollout={"parallel": {"ulysses": 2}},
                                  actor={"parallel": {"ulysses": 2, "encoderTensor": 2}})).spec
    assert check_layout(spec) == []  # 6 and 4 heads divide by 2
    (root / "text_encoder" / "config.json").write_text(json.dumps({"model_type": "t5", "num_heads": 4, "d_ff": 37}))
    assert check_layout(spec) == [  # the MLP splits too: T5's d_ff of 37 does not divide by 2
        "spec.roles.actor.parallel.encoderTensor: 2 does not divide text_encoder's d_ff = 37 (text_encoder/config.json): "
        "each rank takes MLP columns / encoderTensor MLP columns; valid: [1, 37]"]
    (root / "text_encoder" / "config.json").write_text(json.dumps({"model_type": "bert", "num_attention_heads": 4}))
    assert check_layout(spec) == [
        "spec.roles.actor.parallel.encoderTensor: 2 needs a text encoder with a tensor-parallel plan; "
        "text_encoder/config.json is model_type 'bert' (planned: t5, umt5, clip_text_model, gemma3, gemma3_text, "
        "qwen2, qwen2_5_vl, qwen2_5_vl_text, qwen3, qwen3_vl, qwen3_vl_text, llama): set encoderTensor: 1"]


def test_omnirl_validate_refuses_heads_the_degree_does_not_divide(tmp_path, capsys):
    root = _model_dir(tmp_path / "m", 6, {"model_type": "t5", "num_heads": 8})
    prompts = tmp_path / "p.txt"
    prompts.write_text("a prompt\n")
    doc = manifest({**FLUX, "path": str(root)}, rollout={"parallel": {"ulysses": 4}})
    doc["spec"]["data"]["trainPrompts"] = str(prompts)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: spec.roles.rollout.parallel.ulysses: 4 does not divide the transformer's num_attention_heads = 6 "
        "(transformer/config.json): each rank takes heads / ulysses heads; valid: [1, 2, 3, 6]"]
    doc["spec"]["roles"]["rollout"]["parallel"]["ulysses"] = 2
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 0 and capsys.readouterr().out.startswith(f"{path}: ok")
