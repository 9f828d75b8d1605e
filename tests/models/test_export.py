"""Exports of checkpoints in the form users load: a diffusers LoRA file `load_lora_weights` takes,
the transformer's `save_pretrained` layout, the digits model's own layout (LoRA merged), and the
`omnirl export` CLI's one-line errors. Tiny models built locally; nothing is downloaded."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tests.helpers import crash_everywhere, without_file_permission_override

from omnirl.actor.checkpoint import save_checkpoint
from omnirl.api.exits import STORAGE_ERROR_EXIT
from omnirl.api.loader import dump_rljob, job_from_dict
from omnirl.api.spec import LoRASpec, RLJob
from omnirl.cli import main
from omnirl.models.digits.adapter import load_digits_adapter, save_digits_checkpoint
from omnirl.models.export import export_checkpoint, export_run_checkpoint
from omnirl.models.lora import inject_lora, lora_tensors

LORA = {"enabled": True, "rank": 4, "alpha": 8.0}


REPO = Path(__file__).resolve().parents[2]

def rljob(family: str = "ocr-digits", path: str = "builtin", lora: dict | None = None) -> RLJob:
    return job_from_dict({"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "exp"},
                          "spec": {"model": {"family": family, "path": path, "lora": lora or {"enabled": False}},
                                   "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]}})


def checkpoint(run: Path, policy: dict[str, torch.Tensor], *, lora: bool, step: int = 3,
               family: str = "ocr-digits") -> Path:
    """A checkpoint as the actor writes it (only the policy matters to an export) + a metrics.jsonl
    holding validations of this policy's version and of an earlier one."""
    state = {"step": step, "policy_version": step + 1, "lora": lora, "job": "exp", "family": family}
    ckpt = save_checkpoint(run / "checkpoints", step, policy=policy, trained=policy, old=None,
                           optimizer=({}, {"param_groups": [], "scalars": {}}), state=state)
    rows = [{"event": "validation", "step": 0, "policy_version": 0, "val_reward_mean": 0.4},
            {"event": "step", "step": step, "policy_version": step + 1},
            {"event": "validation", "step": step + 1, "policy_version": step + 1, "val_reward_mean": 0.7}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ckpt


def _randomize_lora_b(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B.default" in name:
                p.normal_(0, 0.1)


# ---------------------------------------------------------------- diffusers (SD3)


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    pytest.importorskip("diffusers")
    from tests.models.test_diffusers import RES, _sd3_pipeline

    from omnirl.models.registry import load_adapter

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("sd3")
    _sd3_pipeline().save_pretrained(path)
    return path, load_adapter("sd3", str(path), "cpu", "float32", resolution=RES, max_sequence_length=16)


def test_sd3_lora_export_loads_with_load_lora_weights(sd3, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    path, adapter = sd3
    original = adapter.module
    adapter.module = module = copy.deepcopy(original)  # the fixture's module stays LoRA-free
    try:
        inject_lora(module, LoRASpec(**LORA), adapter.lora_target_modules)
        _randomize_lora_b(module)
        policy = {k: v.detach().clone() for k, v in lora_tensors(module).items()}
        ckpt = checkpoint(tmp_path / "run", policy, lora=True, family="sd3")
        out = export_checkpoint(rljob("sd3", str(path), LORA), ckpt, tmp_path / "export", run_dir=tmp_path / "run")
        manifest = json.loads((out / "export.json").read_text())
        assert (manifest["weights"], manifest["lora"], manifest["step"], manifest["policy_version"]) == \
            ("lora", {"rank": 4, "alpha": 8.0, "merged": False}, 3, 4)
        assert sorted(p.name for p in out.iterdir()) == ["export.json", "job.yaml", "pytorch_lora_weights.safetensors",
                                                         "validation.json"]
        validation = json.loads((out / "validation.json").read_text())
        assert validation["validation"]["val_reward_mean"] == 0.7 and len(validation["history"]) == 2

        pipe = StableDiffusion3Pipeline.from_pretrained(path, local_files_only=True)
        pipe.load_lora_weights(str(out))
        loaded = {n.replace(".default_0.", "."): p for n, p in pipe.transformer.named_parameters() if "lora_" in n}
        ours = {n.replace(".default.", "."): t for n, t in policy.items()}
        assert loaded.keys() == ours.keys() and len(ours) >= 16
        assert all(torch.equal(loaded[n], ours[n]) for n in ours)
        # rank and alpha restored: the loaded pipeline's transformer computes our velocity
        cond = adapter.encode([adapter.tokenize('a sign that says "hi"')])
        x = torch.randn((1, *adapter.latent_shape([])), generator=torch.Generator().manual_seed(0))
        sigma = torch.tensor([0.5])
        with torch.no_grad():
            ours_v = adapter.velocity(x, sigma, cond)
            adapter.module = pipe.transformer
            theirs_v = adapter.velocity(x, sigma, cond)
        assert torch.allclose(ours_v, theirs_v, atol=1e-5, rtol=0)
    finally:
        adapter.module = original


def test_sd3_full_weights_export_is_the_transformer_save_pretrained_layout(sd3, tmp_path):
    from diffusers import SD3Transformer2DModel

    path, adapter = sd3
    policy = {k: v.detach().clone() + 0.01 for k, v in adapter.module.state_dict().items()}  # "trained"
    ckpt = checkpoint(tmp_path / "run", policy, lora=False, family="sd3")
    out = export_checkpoint(rljob("sd3", str(path)), ckpt, tmp_path / "export", run_dir=tmp_path / "run")
    assert json.loads((out / "export.json").read_text())["weights"] == "full"
    loaded = SD3Transformer2DModel.from_pretrained(out / "transformer", local_files_only=True)
    state = loaded.state_dict()
    assert state.keys() == policy.keys() and all(torch.equal(state[k], policy[k]) for k in policy)
    # hard-linked from the checkpoint, not copied, where the file system allows it
    assert (out / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_ino == \
        (ckpt / "policy.safetensors").stat().st_ino


# ---------------------------------------------------------------- the built-in digits model


def test_digits_lora_export_is_merged_into_the_builtin_layout(tmp_path):
    adapter = load_digits_adapter()
    inject_lora(adapter.module, LoRASpec(**LORA), adapter.lora_target_modules)
    _randomize_lora_b(adapter.module)
    policy = {k: v.detach().clone() for k, v in lora_tensors(adapter.module).items()}
    ckpt = checkpoint(tmp_path / "run", policy, lora=True)
    job = rljob(lora=LORA)
    final = export_run_checkpoint(job, tmp_path / "run", ckpt, keep=1)
    assert final == tmp_path / "run" / "exports" / "step-000003"
    assert (tmp_path / "run" / "exports" / "latest").resolve() == final
    exported = load_digits_adapter(final / "")
    config = json.loads((final / "config.json").read_text())
    assert config["provenance"]["lora_merged"] is True and config["provenance"]["policy_version"] == 4
    ids = [adapter.tokenize('A sign that says "2048"')]
    x = torch.randn((1, *adapter.latent_shape(ids[0])), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.7])
    with torch.no_grad():
        lora_v = adapter.velocity(x, sigma, adapter.encode(ids))
        merged_v = exported.velocity(x, sigma, exported.encode(ids))
        base_v = load_digits_adapter().velocity(x, sigma, exported.encode(ids))
    assert torch.allclose(merged_v, lora_v, atol=1e-4, rtol=0)
    assert not torch.allclose(base_v, lora_v, atol=1e-3, rtol=0)  # the LoRA did change the model
    # a later checkpoint's export replaces `latest` and prunes to `keep`
    later = checkpoint(tmp_path / "run", policy, lora=True, step=5)
    export_run_checkpoint(job, tmp_path / "run", later, keep=1)
    assert sorted(p.name for p in (tmp_path / "run" / "exports").iterdir()) == ["latest", "step-000005"]


# ---------------------------------------------------------------- omnirl export


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    """A run directory like `omnirl run` leaves: job.yaml, metrics.jsonl, a full-weights digits checkpoint."""
    run = tmp_path / "run"
    policy = {k: v.clone() for k, v in load_digits_adapter().module.state_dict().items()}
    checkpoint(run, policy, lora=False)
    (run / "job.yaml").write_text(yaml.safe_dump(dump_rljob(rljob())))
    return run


def test_the_last_step_exported_again_and_killed_at_any_point_leaves_exports_latest_loadable(run_dir, tmp_path,
                                                                                            monkeypatch):
    """A controller restarted after its final export exports the last step again while `exports/latest`
    names it (`Controller._export_latest`); that export is killed before each of its directory changes
    in turn: `exports/latest` loads every time, and the finished one is `step-000003.1`. Before, the old
    export was deleted first: a kill during the new one left `latest` naming nothing (FileNotFoundError)."""
    job = rljob()

    def prepare(n):
        run = tmp_path / str(n)
        shutil.copytree(run_dir, run, symlinks=True)
        export_run_checkpoint(job, run, run / "checkpoints" / "step-000003", keep=1)
        return run

    def check(run, finished):
        latest = run / "exports" / "latest"
        assert json.loads((latest / "export.json").read_text())["step"] == 3
        load_digits_adapter(latest / "")  # as model.path: builtin layout
        if finished:
            assert sorted(p.name for p in latest.parent.iterdir()) == ["latest", "step-000003.1"]

    crash_everywhere(monkeypatch, prepare,
                     lambda run: export_run_checkpoint(job, run, run / "checkpoints" / "step-000003", keep=1), check)


def _export(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["export", *map(str, args)])
    return code, capsys.readouterr().err.splitlines()


def test_export_cli_writes_the_latest_checkpoint(run_dir, tmp_path, capsys):
    code = main(["export", str(run_dir), "--out", str(tmp_path / "x")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads((tmp_path / "x" / "export.json").read_text())["policy_version"] == 4
    # the step directory exported, not `…/checkpoints/latest` as defaulted (it printed that)
    assert out.splitlines() == [f"exported {(run_dir / 'checkpoints' / 'latest').resolve()} (step 3, policy_version 4) "
                                f"→ {tmp_path / 'x'}"]
    assert load_digits_adapter(tmp_path / "x").config.d_model == 128


def test_export_cli_errors_are_one_line_naming_the_fix(run_dir, tmp_path, capsys):
    cases = [
        ((tmp_path / "nope", "--out", tmp_path / "a"), "is not a directory; pass a run directory"),
        ((tmp_path, "--out", tmp_path / "a"), "holds no job.yaml (nor exports/latest/job.yaml); pass the run's "
         "manifest with --job JOB.yaml"),
        ((run_dir, "--out", tmp_path / "a", "--checkpoint", tmp_path), "no policy.safetensors; pass a run's checkpoint "
         "dir"),
        ((run_dir, "--out", run_dir), "already exists; choose another --out or remove it"),
        ((run_dir, "--out", tmp_path / "a", "--checkpoint", run_dir / "checkpoints" / "step-999999"),
         "step-999999: does not exist; pass a checkpoint the run still keeps"),
        # the checkpoint's weights file itself: it said "…/policy.safetensors: no policy.safetensors"
        ((run_dir, "--out", tmp_path / "a", "--checkpoint", run_dir / "checkpoints" / "latest" / "policy.safetensors"),
         f"latest/policy.safetensors is a file; pass the checkpoint directory that holds it, "
         f"{run_dir / 'checkpoints' / 'latest'}"),
        ((run_dir, "--out", tmp_path / "a", "--checkpoint", run_dir / "job.yaml"),
         "job.yaml is a file; pass a run's checkpoint dir, e.g. OUT/checkpoints/latest"),
    ]
    for args, fix in cases:
        code, lines = _export(capsys, *args)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("omnirl export: ") and fix in lines[0], lines
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "job.yaml").write_text((run_dir / "job.yaml").read_text())
    code, lines = _export(capsys, empty, "--out", tmp_path / "a")
    assert code == 2 and len(lines) == 1 and "has no checkpoint" in lines[0] and "pass --checkpoint" in lines[0]
    # a manifest that does not describe the checkpoint: one line, and nothing half-written left behind
    lora_job = tmp_path / "lora.yaml"
    lora_job.write_text(yaml.safe_dump(dump_rljob(rljob(lora=LORA))))
    code, lines = _export(capsys, run_dir, "--out", tmp_path / "out" / "b", "--job", lora_job)
    assert code == 2 and len(lines) == 1 and "pass the run's own manifest" in lines[0]
    assert list((tmp_path / "out").iterdir()) == []


def test_export_of_a_checkpoint_or_an_export_as_run_dir_says_what_to_pass_instead(run_dir, tmp_path, capsys):
    """`omnirl export OUT/checkpoints/latest --out X` (the checkpoint a user has at hand) said "holds no
    job.yaml …; pass the run's manifest with --job", and with --job "has no checkpoint
    (…/checkpoints/latest/checkpoints/latest is missing)": neither names the mix-up. An export given as
    RUN_DIR said the same "has no checkpoint". Each now names what was given and the command that works."""
    latest = run_dir / "checkpoints" / "latest"
    for extra in ((), ("--job", run_dir / "job.yaml")):
        code, lines = _export(capsys, latest, "--out", tmp_path / "a", *extra)
        # the command to paste, with the --out given (it said `--out DIR`)
        assert (code, lines) == (2, [f"omnirl export: {latest} is a checkpoint, not a run directory; pass omnirl "
                                     f"export {run_dir} --out {tmp_path / 'a'} --checkpoint {latest}"]), lines
    code, lines = _export(capsys, run_dir, "--out", tmp_path / "a", "--checkpoint", latest)  # the command it names
    assert code == 0, lines
    loose = tmp_path / "loose"  # a checkpoint copied out of its run: the run directory is not known
    shutil.copytree(latest, loose)
    code, lines = _export(capsys, loose, "--out", tmp_path / "b")
    assert (code, lines) == (2, [f"omnirl export: {loose} is a checkpoint, not a run directory; pass the run "
                                 f"directory as RUN_DIR and --checkpoint {loose}"]), lines
    code, lines = _export(capsys, tmp_path / "a", "--out", tmp_path / "c")
    assert (code, lines) == (2, [f"omnirl export: {tmp_path / 'a'} is an export already (the trained model as users "
                                 "load it); pass the run directory it came from (omnirl run --out) to export one of "
                                 "its checkpoints"]), lines
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_export_and_eval_refuse_another_jobs_manifest(run_dir, tmp_path, capsys):
    """`omnirl export --job` and `omnirl eval JOB --checkpoint` with a manifest of another job: the
    same one line (policy_io.check_owner), each naming its own way to pass the run's manifest; eval
    used to sample and score the other job's checkpoint without a word."""
    other = dump_rljob(rljob())
    other["metadata"]["name"] = "other"
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    code, lines = _export(capsys, run_dir, "--out", tmp_path / "a", "--job", tmp_path / "other.yaml")
    latest = (run_dir / "checkpoints" / "latest").resolve()
    refusal = f"{latest} is a checkpoint of job 'exp' but the manifest is for job 'other'; pass the run's own manifest"
    assert code == 2 and lines == [f"omnirl export: {refusal} (--job) or that job's checkpoint"]
    prompts = tmp_path / "p.txt"
    prompts.write_text('A sign that says "12"\n')
    code = main(["eval", str(tmp_path / "other.yaml"), "--prompts", str(prompts), "--checkpoint",
                 str(run_dir / "checkpoints" / "latest"), "--out", str(tmp_path / "e")])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and lines == [f"omnirl eval: {refusal} (omnirl eval OUT/job.yaml) or that job's checkpoint"]
    assert not (tmp_path / "e").exists()
    state_file = run_dir / "checkpoints" / "latest" / "state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "family": "sd3"}))
    code, lines = _export(capsys, run_dir, "--out", tmp_path / "a")
    assert code == 2 and "checkpoint of model family 'sd3' but the manifest is for model family 'ocr-digits'" in lines[0]
    assert not (tmp_path / "a").exists()


def test_export_and_eval_refuse_a_manifest_whose_lora_differs_from_the_checkpoints(tmp_path, capsys):
    """The actor records its LoRA settings in state.json (`lora_settings`), and `omnirl export --job` and
    `omnirl eval JOB --checkpoint` refuse a manifest of another rank, alpha or targetModules, naming each
    field with both values (`policy_io.check_owner`). Before, another rank crashed eval on a tensor copy
    (`RuntimeError: The size of tensor a (8) must match the size of tensor b (4)`, exit 1) and export wrote
    export.json with the manifest's rank; another alpha merged the adapters at the wrong scale without a word."""
    from omnirl.actor.trainer import Trainer

    job = rljob(lora=LORA)
    run = tmp_path / "run"
    Trainer(load_digits_adapter(), job.spec).save(run / "checkpoints", 0, {
        "step": 0, "policy_version": 1, "data_position": [0, 3], "job": "exp", "family": "ocr-digits"})
    latest = (run / "checkpoints" / "latest").resolve()
    assert json.loads((latest / "state.json").read_text())["lora_settings"] == {
        "rank": 4, "alpha": 8.0, "targetModules": []}
    (run / "job.yaml").write_text(yaml.safe_dump(dump_rljob(job)))
    assert _export(capsys, run, "--out", tmp_path / "ok") == (0, [])  # the run's own manifest
    prompts = tmp_path / "p.txt"
    prompts.write_text('A sign that says "12"\n')
    for i, (lora, said) in enumerate([
            ({**LORA, "rank": 8}, "spec.model.lora.rank 4 (the manifest: 8)"),
            ({**LORA, "alpha": 16.0}, "spec.model.lora.alpha 8.0 (the manifest: 16.0)"),
            ({**LORA, "rank": 8, "targetModules": ["attn.qkv"]},
             "spec.model.lora.rank 4 (the manifest: 8), spec.model.lora.targetModules [] (the manifest: ['attn.qkv'])")]):
        other = tmp_path / f"other{i}.yaml"
        other.write_text(yaml.safe_dump(dump_rljob(rljob(lora=lora))))
        refusal = (f"{latest} was trained with {said}: its adapters mean something else under the manifest's; "
                   "pass the run's own manifest")
        code, lines = _export(capsys, run, "--out", tmp_path / "a", "--job", other)
        assert code == 2 and lines == [f"omnirl export: {refusal} (--job), or put those values back"], lines
        code = main(["eval", str(other), "--prompts", str(prompts), "--checkpoint", str(run / "checkpoints" / "latest"),
                     "--out", str(tmp_path / "e")])
        lines = capsys.readouterr().err.splitlines()
        assert code == 2 and lines == [f"omnirl eval: {refusal} (omnirl eval OUT/job.yaml), or put those values back"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "e").exists()
    # a checkpoint written before lora_settings: another rank is one line from the tensors' shapes, not a traceback
    state = json.loads((latest / "state.json").read_text())
    (latest / "state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "lora_settings"}))
    code = main(["eval", str(tmp_path / "other0.yaml"), "--prompts", str(prompts), "--checkpoint", str(latest),
                 "--out", str(tmp_path / "e")])
    assert code == 2 and capsys.readouterr().err.splitlines() == [
        f"omnirl eval: {latest}: policy tensor blocks.0.attn.qkv.lora_A.default.weight has shape [4, 128] but the "
        "manifest's model has [8, 128] (48 such tensor(s); another spec.model.lora.rank or model config); pass the "
        "run's own manifest"]
    # LoRA off in the manifest of a LoRA checkpoint: named as such (eval said "policy tensors do not match")
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(dump_rljob(rljob())))
    code = main(["eval", str(tmp_path / "full.yaml"), "--prompts", str(prompts), "--checkpoint", str(latest),
                 "--out", str(tmp_path / "e")])
    assert code == 2 and capsys.readouterr().err.splitlines() == [
        f"omnirl eval: {latest} holds LoRA adapters but the manifest's spec.model.lora.enabled is False; pass the "
        "run's own manifest (omnirl eval OUT/job.yaml)"]


def test_a_truncated_or_corrupt_checkpoint_is_one_line_for_export_and_eval(run_dir, tmp_path, capsys):
    """`omnirl export` and `omnirl eval --checkpoint` on a checkpoint whose policy.safetensors is cut
    short (a full disk) or whose state.json is garbage: one line naming it and the fix, exit 2 (a
    SafetensorError traceback before), and no half-written export left behind."""
    latest = run_dir / "checkpoints" / "latest"
    policy = latest / "policy.safetensors"
    whole = policy.read_bytes()
    policy.write_bytes(whole[:500])
    code, lines = _export(capsys, run_dir, "--out", tmp_path / "out" / "a")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"omnirl export: checkpoint {latest.resolve()}: Error while deserializing header")
    assert lines[0].endswith("; restore it, or pass an older step-* directory with --checkpoint")
    assert list((tmp_path / "out").iterdir()) == []
    prompts = tmp_path / "p.txt"
    prompts.write_text('A sign that says "12"\n')
    job = run_dir / "job.yaml"  # the checkpoint's own job (another's is refused before the policy is read)
    code = main(["eval", str(job), "--prompts", str(prompts), "--checkpoint", str(latest), "--out", str(tmp_path / "e")])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"omnirl eval: --checkpoint {latest}: Error while deserializing header")
    assert lines[0].endswith("; restore it, or pass an older OUT/checkpoints/step-* directory")
    policy.write_bytes(whole)
    (latest / "state.json").write_text("{garbage")
    code, lines = _export(capsys, run_dir, "--out", tmp_path / "out" / "b")
    assert code == 2 and len(lines) == 1 and "Expecting property name enclosed in double quotes" in lines[0], lines


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_weights_files_get_the_mode_the_umask_allows_like_the_json_beside_them(sd3, tmp_path, mask):
    """safetensors 0.8 creates its files 0600: a run's checkpoints and exports were readable by their
    owner alone (`-rw-------` policy.safetensors, pytorch_lora_weights.safetensors, model.safetensors
    beside `-rw-r--r--` JSON), so another user or a serving container with another uid could not load
    the trained model. Now every file of a checkpoint and an export has 0o666 & ~umask."""
    import os
    import stat

    path, adapter = sd3
    old = os.umask(mask)
    try:
        digits = load_digits_adapter()
        inject_lora(digits.module, LoRASpec(**LORA), digits.lora_target_modules)
        _randomize_lora_b(digits.module)
        ckpt = checkpoint(tmp_path / "run", {k: v.detach().clone() for k, v in lora_tensors(digits.module).items()},
                          lora=True)
        merged = export_checkpoint(rljob(lora=LORA), ckpt, tmp_path / "digits-export", run_dir=tmp_path / "run")
        module = copy.deepcopy(adapter.module)  # the fixture's module stays LoRA-free
        inject_lora(module, LoRASpec(**LORA), adapter.lora_target_modules)
        lora = {k: v.detach().clone() for k, v in lora_tensors(module).items()}
        sd3_ckpt = checkpoint(tmp_path / "run-sd3", lora, lora=True, family="sd3")
        sd3_export = export_checkpoint(rljob("sd3", str(path), lora=LORA), sd3_ckpt, tmp_path / "sd3-export",
                                       run_dir=tmp_path / "run-sd3")
        base = load_digits_adapter()  # what `omnirl pretrain` writes
        pretrained = save_digits_checkpoint(base.module, base.config, tmp_path / "pretrained")
    finally:
        os.umask(old)
    files = [f for d in (ckpt, merged, sd3_export, pretrained) for f in d.rglob("*") if f.is_file()]
    assert {"policy.safetensors", "model.safetensors", "pytorch_lora_weights.safetensors"} <= {f.name for f in files}
    modes = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes


def test_eval_of_a_run_directory_or_an_export_says_what_to_pass_instead(run_dir, tmp_path, capsys):
    """`omnirl eval --checkpoint OUT` or `--checkpoint OUT/exports/latest` (what a user has at hand after a
    run) said only "no policy.safetensors; pass a run's checkpoint dir": now it names what was given and
    the path that works (an export is a model: model.path)."""
    export = export_checkpoint(rljob(), run_dir / "checkpoints" / "latest", tmp_path / "export")
    prompts = tmp_path / "p.txt"
    prompts.write_text('A sign that says "12"\n')
    said = {}
    for given in (run_dir, export):
        code = main(["eval", str(run_dir / "job.yaml"), "--prompts", str(prompts), "--checkpoint", str(given),
                     "--out", str(tmp_path / "e")])
        lines = capsys.readouterr().err.splitlines()
        assert code == 2 and len(lines) == 1, lines
        said[given] = lines[0]
    assert said[run_dir] == (f"omnirl eval: {run_dir}: no policy.safetensors; it is a run directory: pass "
                             f"{run_dir}/checkpoints/latest")
    assert said[export] == (f"omnirl eval: {export}: no policy.safetensors; it is an export (the trained model as "
                            f"users load it): evaluate it as model.path: {export} in a manifest, or pass the "
                            f"checkpoint it was exported from, {(run_dir / 'checkpoints' / 'latest').resolve()}")
    # a checkpoint that is gone (pruned by checkpoint.keep) is not named: the generic fix stays
    meta = json.loads((export / "export.json").read_text())
    (export / "export.json").write_text(json.dumps({**meta, "checkpoint": str(tmp_path / "pruned")}))
    main(["eval", str(run_dir / "job.yaml"), "--prompts", str(prompts), "--checkpoint", str(export),
          "--out", str(tmp_path / "e")])
    assert capsys.readouterr().err.splitlines() == [
        f"omnirl eval: {export}: no policy.safetensors; it is an export (the trained model as users load it): "
        f"evaluate it as model.path: {export} in a manifest, or pass the run's OUT/checkpoints/latest"]


def test_an_export_out_that_cannot_be_written_is_one_line_naming_out_and_the_fix(run_dir, tmp_path, capsys):
    """`omnirl export RUN --out DIR` where DIR cannot take the export: on a read-only mount it printed
    `omnirl export: [Errno 30] Read-only file system: '/mnt/ro/.tmp-e-17762` (the hidden temporary sibling,
    a quote cut off, no fix); on a full disk `[Errno 28] No space left on device: '…/checkpoints/
    step-000005/policy.safetensors' -> '…/.tmp-e-17800/model.safetensors` (the checkpoint it copied from).
    Now each names --out, the errno text and the fix, as `omnirl run` and `omnirl eval` do, and leaves
    nothing behind. Real file systems: a read-only and a 256 KiB tmpfs (root with mount)."""
    from tests.system.test_run_dir_faults import _mount_tmpfs, _umount

    (tmp_path / "a_file").write_text("x")
    code, lines = _export(capsys, run_dir, "--out", tmp_path / "a_file" / "e")
    assert (code, lines) == (2, [f"omnirl export: --out {tmp_path / 'a_file' / 'e'}: {tmp_path / 'a_file'} is a "
                                 "file, not a directory; choose a directory for the export"])
    ro, small = tmp_path / "ro", tmp_path / "small"
    if not (_mount_tmpfs(ro, "ro") and _mount_tmpfs(small)):
        pytest.skip("a read-only and a full file system need tmpfs mounts (root with mount)")
    try:
        code, lines = _export(capsys, run_dir, "--out", ro / "e")
        assert (code, lines) == (2, [f"omnirl export: --out {ro / 'e'}: {ro} cannot be written ([Errno 30] Read-only "
                                     "file system); make it writable or choose another --out"])
        code, lines = _export(capsys, run_dir, "--out", small / "e")  # the probe byte fits, the weights do not
        assert (code, lines) == (2, [f"omnirl export: --out {small / 'e'}: cannot be written ([Errno 28] No space "
                                     "left on device); free space there or choose another --out (nothing was left "
                                     "there)"])
        assert list(small.iterdir()) == []
    finally:
        _umount(ro)
        _umount(small)


@pytest.mark.parametrize("name", ["policy.safetensors", "state.json"])
def test_an_unreadable_checkpoint_file_is_reported_as_a_read_with_its_fix(run_dir, tmp_path, name):
    """A checkpoint file the user may not read (mode 000; a pod's volume owned by another uid): one
    line saying it cannot be *read*, its path, the errno and the fix, exit 5. Before, `omnirl export`
    said "No such file or directory" for the weights (safetensors' text for EACCES) and the roles'
    storage line said "cannot write" for any EACCES."""
    f = run_dir / "checkpoints" / "step-000003" / name
    f.chmod(0)
    cmd = without_file_permission_override([sys.executable, "-m", "omnirl.cli", "export", str(run_dir), "--out",
                                            str(tmp_path / "export")])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    f.chmod(0o644)
    assert done.returncode == STORAGE_ERROR_EXIT, done.stderr
    assert done.stderr.splitlines() == [
        f"omnirl export: cannot read {f} ([Errno 13] Permission denied); make it readable by uid {os.getuid()} "
        "(its owner or mode; in a pod, uid 1000: give the volume an fsGroup or chown it)"]
    assert not (tmp_path / "export").exists()


def test_a_manifest_that_spells_out_the_models_default_lora_targets_is_the_checkpoints_own(tmp_path):
    """`targetModules: [attn.qkv, attn.proj, mlp.fc1, mlp.fc2]` (the built-in model's defaults, any order) makes the
    same adapters as the run's `[]`: `omnirl eval` refused it ("its adapters mean something else"), exit 2."""
    from omnirl.models.policy_io import check_owner

    state = {"job": "exp", "family": "ocr-digits", "lora": True,
             "lora_settings": {"rank": 4, "alpha": 8.0, "targetModules": []}}
    for targets in (["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"], ["mlp.fc2", "mlp.fc1", "attn.proj", "attn.qkv"]):
        check_owner(rljob(lora={**LORA, "targetModules": targets}), tmp_path, state, "OUT/job.yaml")  # no refusal
    with pytest.raises(ValueError, match=r"targetModules \[\] \(the manifest: \['attn.qkv'\]\)"):
        check_owner(rljob(lora={**LORA, "targetModules": ["attn.qkv"]}), tmp_path, state, "OUT/job.yaml")
    spelled = {**state, "lora_settings": {**state["lora_settings"], "targetModules": ["attn.qkv", "attn.proj",
                                                                                       "mlp.fc1", "mlp.fc2"]}}
    check_owner(rljob(lora=LORA), tmp_path, spelled, "OUT/job.yaml")  # and the other way round
