"""The CLI's user-error paths: exit code 2 and exactly one stderr line that names the flag or field
and the fix, never a traceback (`omnirl run`, `eval`, `pretrain`, `render`).

Each case fails before any model, Redis or Ray is started, so they run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from omnirl.api.exits import INTERRUPTED_EXIT
from omnirl.api.spec import DNS1123_LABEL_RULE, JOB_NAME_RULE
from omnirl.cli import main
from omnirl.system.child import guarded

ROOT = Path(__file__).resolve().parents[2]
NFT = str(ROOT / "examples" / "ocr-nft.yaml")
HELDOUT = str(ROOT / "examples" / "prompts" / "ocr-heldout.txt")


def bad_manifest(tmp: Path) -> str:
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["algorithm"]["groupSize"] = 1
    path = tmp / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def missing_prompts(tmp: Path) -> str:
    """The NFT example with a training prompt file that does not exist (valid as a manifest: a pod's
    paths are not checked on this machine; `omnirl run` checks its own)."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"]["trainPrompts"] = str(tmp / "nope.txt")
    path = tmp / "missing-prompts.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def run_of_another_job(tmp: Path) -> str:
    """A run directory whose job.yaml is the AWM example's (another job name and algorithm)."""
    run = Path(existing_run(tmp))
    (run / "job.yaml").write_text((ROOT / "examples" / "ocr-awm.yaml").read_text())
    return str(run)


def untokenizable_prompt(tmp: Path) -> str:
    """The NFT example whose training file's third line (after a blank one) asks for 12 digits (the
    built-in model takes at most 8)."""
    (tmp / "train.txt").write_text('A sign that says "42"\n\nA sign that says "123456789012"\n')
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {"trainPrompts": str(tmp / "train.txt"), "validationPrompts": HELDOUT}
    path = tmp / "long-prompt.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def lora_settings_without_enabled(tmp: Path) -> str:
    """The NFT example with `model.lora: {rank: 8, alpha: 16}` but no `enabled: true`."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["model"]["lora"] = {"rank": 8, "alpha": 16}
    path = tmp / "lora.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def lora_target_of_no_layer(tmp: Path) -> str:
    """The NFT example with LoRA on `qkv_proj`, a name of other models' layers (the built-in model's is `attn.qkv`):
    `omnirl validate` said ok and `omnirl run` started Redis, Ray and every role, then stopped with exit 4."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["model"]["lora"] = {"enabled": True, "rank": 4, "targetModules": ["qkv_proj"]}
    doc["spec"]["data"] = {"trainPrompts": HELDOUT, "validationPrompts": HELDOUT}
    path = tmp / "lora-target.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


_HELD: list = []  # listening sockets kept open for the duration of the test session


def a_port_in_use(tmp: Path) -> str:
    """A port some process listens on (another scorer, say)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    _HELD.append(sock)
    return str(sock.getsockname()[1])


def with_judge_server(tmp: Path) -> str:
    """The NFT example plus an http judge the job runs itself (`reward[].server`, no url), whose command
    this machine does not have."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {"trainPrompts": HELDOUT, "validationPrompts": HELDOUT}
    doc["spec"]["reward"].append({"name": "judge", "kind": "http", "server": {"command": ["no-such-judge-e7", "--port", "{port}"],
                                                                              "urlPath": "/v1/score"}})
    path = tmp / "judge.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def prompt_file(tmp: Path, content: str | bytes) -> str:
    path = tmp / "p.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def prompts_dir(tmp: Path) -> str:
    """The NFT example whose training prompt path is a directory."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {"trainPrompts": str(tmp), "validationPrompts": HELDOUT}
    path = tmp / "dir-prompts.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def cudnn_on_gpus(tmp: Path) -> str:
    """A valid SD3 manifest asking for cuDNN attention on GPU roles (`--device cpu` cannot run it;
    refused before the model directory, which does not exist, is looked at)."""
    doc = yaml.safe_load(Path(NFT).read_text())
    spec = doc["spec"]
    spec["data"] = {k: str(ROOT / "examples" / v) for k, v in spec["data"].items()}
    spec["model"] = {"family": "sd3", "path": str(tmp / "sd3"), "dtype": "bfloat16", "attention": "cudnn"}
    spec["reward"] = [{"name": "jpeg", "kind": "jpeg"}]
    for role in ("rollout", "actor"):
        spec.setdefault("roles", {}).setdefault(role, {})["accelerator"] = {"type": "nvidia", "count": 1}
    path = tmp / "cudnn.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def model_without_weights(tmp: Path) -> str:
    """The NFT example on a model directory holding the built-in config.json but no model.safetensors."""
    import shutil

    (tmp / "model").mkdir()
    shutil.copy(ROOT / "services" / "omnirl" / "models" / "digits" / "weights" / "config.json", tmp / "model")
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["model"]["path"] = str(tmp / "model")
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    path = tmp / "no-weights.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def model_path_at(tmp: Path, what: str) -> str:
    """The NFT example whose spec.model.path is a run's checkpoint (`checkpoint`: policy.safetensors and
    state.json, as `OUT/checkpoints/latest` holds them) or a directory without config.json (`no-config`: a
    folder above the model, as `OUT/exports`). Both printed only `…/config.json not found; a digits checkpoint is
    a directory with config.json and model.safetensors`, naming no field (the prompts' tokenizer read it first)."""
    model = tmp / "model"
    model.mkdir()
    if what == "checkpoint":
        (model / "policy.safetensors").write_bytes(b"weights")
        (model / "state.json").write_text("{}")
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["model"]["path"] = str(model)
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    path = tmp / f"{what}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


UNSET_KEY = "OMNIRL_TEST_JUDGE_KEY_UNSET"


def judge_with_unset_key(tmp: Path) -> str:
    """The NFT example plus a VLM judge whose `apiKeyEnv` names a variable this process lacks."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    doc["spec"]["reward"].append({"name": "judge", "kind": "vlm", "url": "http://127.0.0.1:1/v1", "weight": 0.5,
                                  "params": {"model": "m", "template": "read-text", "apiKeyEnv": UNSET_KEY}})
    path = tmp / "judge.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def namespaced(tmp: Path, namespace: str, field: str = "namespace") -> str:
    """The NFT example with `metadata.namespace` (or another metadata `field`) set."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["metadata"][field] = namespace
    path = tmp / "ns.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def two_jobs(tmp: Path) -> str:
    """The NFT example, then a copy named `second`, in one file (two YAML documents)."""
    doc = yaml.safe_load(Path(NFT).read_text())
    path = tmp / "two.yaml"
    path.write_text(yaml.safe_dump_all([doc, {**doc, "metadata": {**doc["metadata"], "name": "second"}}], sort_keys=False))
    return str(path)


def dead_redis(tmp: Path) -> str:
    """The NFT example with a `transferQueue.redisUrl` nothing listens on (port 1)."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {k: str(ROOT / "examples" / v) for k, v in doc["spec"]["data"].items()}
    doc["spec"]["transferQueue"] = {"redisUrl": "redis://:secret@127.0.0.1:1/0"}
    path = tmp / "dead-redis.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def unreadable_alphabet(tmp: Path) -> str:
    """The NFT example whose OCR reward may read a snowman, a character the recogniser has no class for."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {"trainPrompts": HELDOUT, "validationPrompts": HELDOUT}
    doc["spec"]["reward"][0]["params"] = {"alphabet": "0123456789\u2603"}
    path = tmp / "alphabet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def alphabet_without_nine(tmp: Path) -> str:
    """The NFT example whose OCR reward reads the digits but 9, which the prompts ask for: found with "αβ", where
    `omnirl run` trained every step on rewards of 0.000 (held-out 0.000 → 0.000) without a word."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {"trainPrompts": HELDOUT, "validationPrompts": HELDOUT}
    doc["spec"]["reward"][0]["params"] = {"alphabet": "012345678"}
    path = tmp / "alphabet9.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def without_validation(tmp: Path, reward: list | None = None) -> str:
    """The NFT example without validation prompts (and with `reward` instead of its own)."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"] = {"trainPrompts": HELDOUT}
    if reward is not None:
        doc["spec"]["reward"] = reward
    path = tmp / "noval.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def existing_run(tmp: Path) -> str:
    (tmp / "run").mkdir()
    (tmp / "run" / "metrics.jsonl").write_text("{}\n")
    return str(tmp / "run")


def holding_a_model(tmp: Path) -> str:
    """A directory that already holds a pretrained model (its weights file)."""
    (tmp / "model").mkdir()
    (tmp / "model" / "model.safetensors").write_bytes(b"weights")
    return str(tmp / "model")


CASES = {
    "run-missing-manifest": (lambda t: ["run", str(t / "nope.yaml")], "omnirl run: ", "nope.yaml: cannot read"),
    "run-invalid-manifest": (lambda t: ["run", bad_manifest(t)], "omnirl run: ", "spec.algorithm.groupSize"),
    "run-missing-prompt-file": (lambda t: ["run", missing_prompts(t), "--out", str(t / "o")], "omnirl run: spec.data.trainPrompts: ",
                                "/nope.txt does not exist on this machine; point it at a local "
                                "prompt file (one prompt per line) (relative paths resolve against the manifest's folder)"),
    # `omnirl run` trained all weights while the user believed rank-8 adapters were trained (api/spec.py LoRASpec)
    "run-lora-settings-without-enabled": (
        lambda t: ["run", lora_settings_without_enabled(t), "--no-ray", "--out", str(t / "o")], "omnirl run: ",
        'lora.yaml: spec.model.lora: {"rank": 8, "alpha": 16.0} is invalid: LoRA is off (lora.enabled is not true), '
        "so rank and alpha would be ignored and all weights trained; set lora.enabled: true to train LoRA adapters, "
        "or remove rank and alpha (line 10)"),
    "run-zero-steps": (lambda t: ["run", NFT, "--steps", "0"], "omnirl run: ", "--steps 0: must be >= 1"),
    "run-out-holds-a-run": (lambda t: ["run", NFT, "--out", existing_run(t)], "omnirl run: ", "pass --resume"),
    "run-out-is-a-file": (lambda t: ["run", NFT, "--out", HELDOUT], "omnirl run: ", "is a file, not a directory"),
    "run-resume-nothing": (lambda t: ["run", NFT, "--resume", "--out", str(t / "empty")], "omnirl run: ",
                           "--resume: "),
    "run-resume-another-job": (lambda t: ["run", NFT, "--resume", "--out", run_of_another_job(t)], "omnirl run: ",
                               "metadata.name 'ocr-awm', not 'ocr-nft'"),
    "run-untokenizable-prompt": (lambda t: ["run", untokenizable_prompt(t), "--no-ray", "--out", str(t / "o")],
                                 "omnirl run: ", "train.txt line 3: text '123456789012' has 12 characters"),
    "run-model-without-weights": (lambda t: ["run", model_without_weights(t), "--no-ray", "--out", str(t / "o")],
                                  "omnirl run: spec.model.path: ", "/model/model.safetensors not found; a digits checkpoint "
                                  "needs model.safetensors beside config.json; copy the whole model directory there"),
    "run-model-path-is-a-checkpoint": (
        lambda t: ["run", model_path_at(t, "checkpoint"), "--no-ray", "--out", str(t / "o")],
        "omnirl run: spec.model.path: ", "/model is an omnirl run's checkpoint, not a model directory; point "
        "spec.model.path at the run's export (OUT/exports/latest, or omnirl export OUT --out DIR --checkpoint "
        "THAT_CHECKPOINT), or continue the run with omnirl run --resume"),
    "run-model-path-without-config": (
        lambda t: ["run", model_path_at(t, "no-config"), "--no-ray", "--out", str(t / "o")],
        "omnirl run: spec.model.path: ", "/model/config.json not found; a digits checkpoint "
        "is a directory with config.json and model.safetensors; copy the whole model directory there"),
    "eval-model-path-is-a-checkpoint": (
        lambda t: ["eval", model_path_at(t, "checkpoint"), "--out", str(t / "o")],
        "omnirl eval: spec.model.path: ", "is an omnirl run's checkpoint, not a model directory"),
    # `--out "$OUT"` with OUT unset: run went to runs/<job name>, eval and pretrain wrote into the working
    # directory (grid.png, rewards.json; config.json, model.safetensors), export said ". already exists"
    **{f"{cmd}-empty-out": (lambda t, argv=argv: [*argv, "--out", ""], f"omnirl {cmd}: ",
                            "--out '': an empty path (an unset shell variable?); pass a directory")
       for cmd, argv in {"run": ["run", NFT], "eval": ["eval", NFT], "export": ["export", str(ROOT)],
                         "pretrain": ["pretrain", "--steps", "1"]}.items()},
    "run-unset-api-key": (lambda t: ["run", judge_with_unset_key(t), "--no-ray", "--out", str(t / "o")],
                          "omnirl run: spec.reward[1].params.apiKeyEnv: ", f"variable {UNSET_KEY} is not set (or "
                          f"empty); export {UNSET_KEY}=<the judge's API key> before omnirl run or omnirl eval; on "
                          f"Kubernetes give the reward container {UNSET_KEY} from a Secret in spec.roles.reward.template"),
    "eval-unset-api-key": (lambda t: ["eval", judge_with_unset_key(t), "--prompts", HELDOUT, "--out", str(t / "o")],
                           "omnirl eval: spec.reward[1].params.apiKeyEnv: ", f"export {UNSET_KEY}=<"),
    # passed validate; the reward worker refused it (exit 4) only after every role had loaded
    "run-unreadable-ocr-alphabet": (lambda t: ["run", unreadable_alphabet(t), "--no-ray", "--out", str(t / "o")],
                                    "omnirl run: spec.reward[0].params.alphabet: ", "'0123456789\u2603' has characters "
                                    "the PP-OCRv4 recogniser does not know: ['\u2603']; remove them"),
    "run-ocr-alphabet-that-cannot-spell-a-prompt": (
        lambda t: ["run", alphabet_without_nine(t), "--no-ray", "--out", str(t / "o")],
        "omnirl run: spec.reward[0].params.alphabet: '012345678' lacks '9', which spec.data.trainPrompts: ",
        " asks for ('A sign that says \"{n}\"'): no sample of it could score 1; add the characters to the alphabet, "
        "or fix or remove that line".format(n=next(line.split('"')[1] for line in Path(HELDOUT).read_text().splitlines()
                                                   if "9" in line))),
    "run-lora-target-of-no-layer": (
        lambda t: ["run", lora_target_of_no_layer(t), "--no-ray", "--out", str(t / "o")],
        "omnirl run: spec.model.lora.targetModules: ['qkv_proj'] match no layer of the model, so LoRA would train "
        "nothing; ", "list linear layers of DigitsDiT: attn.proj, attn.qkv, mlp.fc1, mlp.fc2, modulation, "
        "modulation_out, out_proj, patch_embed, sigma_mlp.0, sigma_mlp.2 (empty: the model's defaults)"),
    # the scorer server: each answered "choose a free port", also for a host that is not this machine's, and gRPC's
    # bind failure printed its C-core log lines before it
    "scorer-serve-host-not-an-address": (
        lambda t: ["scorer", "serve", "--reward", "jpeg", "--protocol", "http", "--host", "no-such-host.invalid",
                   "--port", "0"],
        "omnirl scorer: --host no-such-host.invalid: not an address (", "); pass an address of this machine, e.g. "
        "127.0.0.1, or 0.0.0.0 for all interfaces (the default)"),
    "scorer-serve-host-of-another-machine": (
        lambda t: ["scorer", "serve", "--reward", "jpeg", "--host", "192.0.2.1", "--port", "0"],
        "omnirl scorer: --host 192.0.2.1: not an address of this machine (Cannot assign requested address); ",
        "pass one of its addresses, e.g. 127.0.0.1, or 0.0.0.0 for all interfaces (the default)"),
    "scorer-serve-grpc-port-in-use": (
        lambda t: ["scorer", "serve", "--reward", "jpeg", "--host", "127.0.0.1", "--port", a_port_in_use(t)],
        "omnirl scorer: --host 127.0.0.1 --port ", ": cannot listen there (Address already in use); choose a free "
        "port, or --port 0 for any"),
    "run-dead-redis-url": (lambda t: ["run", dead_redis(t), "--no-ray", "--out", str(t / "o")], "omnirl run: ",
                           "spec.transferQueue.redisUrl: 127.0.0.1:1 does not answer"),
    "run-cudnn-on-the-cpu": (lambda t: ["run", cudnn_on_gpus(t), "--device", "cpu", "--no-ray", "--out",
                                        str(t / "o")], "omnirl run: ", "spec.model.attention: cudnn runs on NVIDIA "
                             "GPUs only, and rollout-0 would run on cpu: set attention auto or torch for a CPU run, or "
                             "run without --device cpu on a machine with NVIDIA GPUs"),
    "run-dead-ray-address": (lambda t: ["run", NFT, "--ray-address", "127.0.0.1:1", "--out", str(t / "o")],
                             "omnirl run: ", "ray start --head"),
    "run-no-ray-with-ray-address": (lambda t: ["run", NFT, "--no-ray", "--ray-address", "127.0.0.1:1", "--out",
                                               str(t / "o")], "omnirl run: ", "drop one of the two"),
    "eval-not-a-checkpoint": (lambda t: ["eval", NFT, "--checkpoint", str(t), "--prompts", HELDOUT],
                              "omnirl eval: ", "pass a run's checkpoint dir"),
    "eval-missing-prompts": (lambda t: ["eval", NFT, "--prompts", str(t / "p.txt")], "omnirl eval: --prompts: ",
                             "p.txt not found"),
    "eval-prompts-directory": (lambda t: ["eval", NFT, "--prompts", str(t)], "omnirl eval: --prompts: ",
                               " is a directory; pass a file with one prompt per line"),
    "eval-prompts-empty": (lambda t: ["eval", NFT, "--prompts", prompt_file(t, "\n  \n")], "omnirl eval: --prompts: ",
                           "has no prompts"),
    "eval-prompts-not-text": (lambda t: ["eval", NFT, "--prompts", prompt_file(t, b"\xff\xfe")],
                              "omnirl eval: --prompts: ", "p.txt line 1 is not UTF-8 text (byte 0xff: invalid start "
                              "byte); save the file as UTF-8"),
    "eval-untokenizable-prompt": (lambda t: ["eval", NFT, "--prompts", prompt_file(t, '"12"\n\nA sign that says "abc"\n')],
                                  "omnirl eval: --prompts: ", "p.txt line 3: character 'a' in 'abc' is not in the "
                                  "tokenizer alphabet '0123456789'; fix or remove that line"),
    "run-prompts-directory": (lambda t: ["run", prompts_dir(t), "--no-ray", "--out", str(t / "o")], "omnirl run: ",
                              "spec.data.trainPrompts: "),
    # a job without validation prompts and no --prompts: a TypeError traceback
    "eval-no-validation-prompts": (lambda t: ["eval", without_validation(t), "--out", str(t / "o")],
                                   "omnirl eval: --prompts: ", "noval.yaml has no spec.data.validationPrompts to sample "
                                   "by default; pass --prompts FILE (one prompt per line)"),
    # only group-level rewards: every sample's reward came out 0, unscored
    "eval-group-rewards-only": (lambda t: ["eval", without_validation(t, [{"name": "pc", "kind": "pairwise-contrast"}]),
                                           "--prompts", HELDOUT, "--out", str(t / "o")], "omnirl eval: spec.reward: ",
                                "every reward is group-level (pc), and omnirl eval scores single samples; add a "
                                "per-sample reward (e.g. kind ocr) to the manifest"),
    # ... also without --prompts: it asked for --prompts first, and refused the job once they were given
    "eval-group-rewards-only-no-prompts": (
        lambda t: ["eval", without_validation(t, [{"name": "pc", "kind": "pairwise-contrast"}]), "--out", str(t / "o")],
        "omnirl eval: spec.reward: ", "every reward is group-level (pc)"),
    "eval-zero-steps": (lambda t: ["eval", NFT, "--prompts", HELDOUT, "--sampling-steps", "1"], "omnirl eval: ",
                        "--sampling-steps 1: must be >= 2 (denoising steps per sample; default spec.validation.numSteps)"),
    # eval's --steps was its denoising steps, run's (and pretrain's) the training steps: the old use is refused,
    # naming the new flag, not run silently with another meaning
    "eval-steps-of-run": (lambda t: ["eval", NFT, "--prompts", HELDOUT, "--steps", "10"], "omnirl eval: ",
                          "--steps 10: omnirl eval trains nothing (--steps is omnirl run's number of training steps); "
                          "for the denoising steps per sample pass --sampling-steps 10"),
    # both given: it said "pass --sampling-steps 10" beside the --sampling-steps 4 given
    "eval-steps-beside-sampling-steps": (
        lambda t: ["eval", NFT, "--prompts", HELDOUT, "--steps", "10", "--sampling-steps", "4"], "omnirl eval: ",
        "--steps 10: omnirl eval trains nothing (--steps is omnirl run's number of training steps); drop it "
        "(--sampling-steps 4 sets the denoising steps per sample)"),
    "eval-negative-seed": (lambda t: ["eval", NFT, "--prompts", HELDOUT, "--seed", "-1"], "omnirl eval: ",
                           "--seed -1: must be >= 0"),
    "eval-out-is-a-file": (lambda t: ["eval", NFT, "--prompts", HELDOUT, "--out", HELDOUT], "omnirl eval: ",
                           "is a file, not a directory"),
    "eval-invalid-manifest": (lambda t: ["eval", bad_manifest(t), "--prompts", HELDOUT], "omnirl eval: ",
                              "spec.algorithm.groupSize"),
    "pretrain-zero-steps": (lambda t: ["pretrain", "--out", str(t / "p"), "--steps", "0"], "omnirl pretrain: ",
                            "--steps 0: must be >= 1"),
    # "steps (1) and batch_size (0) must be >= 1", and torch's "Invalid learning rate: -1.0": no flag named
    "pretrain-zero-batch": (lambda t: ["pretrain", "--out", str(t / "p"), "--steps", "1", "--batch-size", "0"],
                            "omnirl pretrain: ", "--batch-size 0: must be >= 1"),
    "pretrain-negative-lr": (lambda t: ["pretrain", "--out", str(t / "p"), "--steps", "1", "--lr", "-1"],
                             "omnirl pretrain: ", "--lr -1.0: must be a finite number > 0 (default 0.0015"),
    "pretrain-nan-lr": (lambda t: ["pretrain", "--out", str(t / "p"), "--steps", "1", "--lr", "nan"],
                        "omnirl pretrain: ", "--lr nan: must be a finite number > 0"),
    "pretrain-unknown-device": (lambda t: ["pretrain", "--out", str(t / "p"), "--device", "tpu"],
                                "omnirl pretrain: ", "--device tpu: not a torch device; use cpu"),
    "pretrain-no-cuda": (lambda t: ["pretrain", "--out", str(t / "p"), "--device", "cuda"], "omnirl pretrain: ",
                         "use --device cpu"),
    # `omnirl pretrain --out services/omnirl/models/digits/weights` silently replaced the shipped model
    "pretrain-out-holds-a-model": (lambda t: ["pretrain", "--out", holding_a_model(t), "--steps", "1"],
                                   "omnirl pretrain: --out ", "model.safetensors); pretraining would overwrite it: "
                                   "choose another --out or remove it"),
    "render-missing-manifest": (lambda t: ["render", str(t / "nope.yaml")], "omnirl render: ", "nope.yaml: cannot read"),
    "render-invalid-manifest": (lambda t: ["render", bad_manifest(t)], "omnirl render: ", "spec.algorithm.groupSize"),
    # a file of 2 RLJobs (kubectl apply -f takes it): "expected exactly one", and no word of the fix
    "render-two-jobs": (lambda t: ["render", two_jobs(t)], "omnirl render: ", "two.yaml: holds 2 RLJob documents "
                        "(ocr-nft, second); this command takes exactly one: split the file, one RLJob per file "
                        "(kubectl apply -f takes the file as it is)"),
    "render-bad-namespace": (lambda t: ["render", NFT, "--namespace", "Bad_NS"],
                             "omnirl render: --namespace \"Bad_NS\" is invalid: ", f"must be {DNS1123_LABEL_RULE}"),
    "render-empty-namespace": (lambda t: ["render", NFT, "--namespace", ""], "omnirl render: --namespace \"\" is invalid",
                               "e.g. team-a"),
    "render-long-namespace": (lambda t: ["render", NFT, "--namespace", "a" * 64], "omnirl render: --namespace ",
                              "at most 63"),
    # the manifest's own namespace gets the same rule in words, not pydantic's regular expression
    "render-manifest-bad-namespace": (lambda t: ["render", namespaced(t, "Bad_NS")], "omnirl render: ",
                                      f'ns.yaml: metadata.namespace: "Bad_NS" is invalid: must be {DNS1123_LABEL_RULE} '
                                      "(e.g. team-a) (line 5)"),
    "run-manifest-bad-namespace": (lambda t: ["run", namespaced(t, "Bad_NS")], "omnirl run: ",
                                   f'metadata.namespace: "Bad_NS" is invalid: must be {DNS1123_LABEL_RULE}'),
    "render-bad-name": (lambda t: ["render", namespaced(t, "OCR_nft", "name")], "omnirl render: ",
                          f'metadata.name: "OCR_nft" is invalid: must be {JOB_NAME_RULE} (e.g. ocr-nft-1)'),
    # a Service name starts with a letter: "1job-actor" would be refused by the API server
    "render-digit-name": (lambda t: ["render", namespaced(t, "1job", "name")], "omnirl render: ",
                          f'metadata.name: "1job" is invalid: must be {JOB_NAME_RULE} (e.g. ocr-nft-1)'),
    # 47 characters: the operator could not create `<name>-actor`'s pods (validate said ok up to 53)
    "render-long-name": (lambda t: ["render", namespaced(t, "a" * 47, "name")], "omnirl render: ",
                           "is invalid: must be at most 46 characters (it has 47): the actor StatefulSet"),
    # eval serves a judge as omnirl run does (tests/evaluation/test_eval_judges.py); one it cannot start is named before
    # anything loads
    "eval-judge-server-not-here": (lambda t: ["eval", with_judge_server(t), "--out", str(t / "o")], "omnirl eval: ",
                                   "spec.reward[1].server.command: 'no-such-judge-e7' cannot be started on this machine "
                                   "(not found on PATH, or not an executable file); `omnirl eval` runs the judge's "
                                   "command here (its image is ignored): install it, put it on PATH or give its full "
                                   "path"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_errors_exit_2_with_one_line_naming_the_fix(case, tmp_path, capsys, monkeypatch):
    argv, prefix, fix = CASES[case]
    monkeypatch.delenv("OMNIRL_DEBUG", raising=False)
    monkeypatch.delenv(UNSET_KEY, raising=False)
    if case == "pretrain-no-cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA: --device cuda is valid here")
    code = main(argv(tmp_path))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(prefix) and fix in lines[0], err
    assert not (tmp_path / "o").exists()  # a dead --ray-address is refused before the run dir is made


def test_validate_refuses_lora_settings_without_enabled(tmp_path, capsys):
    # the same line as `omnirl run` (a manifest validate accepts must run as written), on stdout, exit 2
    path = lora_settings_without_enabled(tmp_path)
    assert main(["validate", path]) == 2
    assert capsys.readouterr().out.splitlines() == [
        f'{path}: spec.model.lora: {{"rank": 8, "alpha": 16.0}} is invalid: LoRA is off (lora.enabled is not true), so '
        "rank and alpha would be ignored and all weights trained; set lora.enabled: true to train LoRA adapters, or "
        "remove rank and alpha (line 10)"]


def test_validate_says_which_named_files_are_not_on_this_machine_and_run_refuses_them(tmp_path, capsys):
    """Valid for a cluster (the files live in the pods), but `omnirl run` here refuses them: validate says so."""
    doc = yaml.safe_load(Path(NFT).read_text())
    doc["spec"]["data"].update(trainPrompts="prompts/nope.txt", validationPrompts=HELDOUT)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    missing = tmp_path / "prompts" / "nope.txt"
    assert lines[0] == f"{path}: ok" and [line for line in lines if "not on this machine" in line] == [
        f"  {doc['metadata']['name']}: spec.data.trainPrompts: {missing} is not on this machine: omnirl run here "
        "refuses it; on Kubernetes it must exist inside the pods (the image, or a volume from spec.storage or the "
        "role's template)"]
    assert main(["run", str(path), "--no-ray", "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert f"spec.data.trainPrompts: {missing} does not exist on this machine" in capsys.readouterr().err
    assert main(["validate", NFT]) == 0 and "not on this machine" not in capsys.readouterr().out


def test_validate_notes_a_judge_key_this_machine_lacks(tmp_path, capsys):
    """The reward kinds' `check_environment` in validate: an API key variable unset here is a note under `ok` (the
    cluster's reward pods may have it), the line `omnirl run` refuses with (`run-unset-api-key` above)."""
    path = judge_with_unset_key(tmp_path)
    assert main(["validate", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: ok" and [line for line in lines if UNSET_KEY in line] == [
        f"  ocr-nft: spec.reward[1].params.apiKeyEnv: the environment variable {UNSET_KEY} is not set (or empty); "
        f"export {UNSET_KEY}=<the judge's API key> before omnirl run or omnirl eval; on Kubernetes give the reward "
        f"container {UNSET_KEY} from a Secret in spec.roles.reward.template (spec: {{containers: [{{name: reward, env: "
        f"[{{name: {UNSET_KEY}, valueFrom: {{secretKeyRef: {{name: SECRET, key: KEY}}}}}}]}}]}}); or drop apiKeyEnv "
        "if the judge needs no key (omnirl run here refuses it)"]


def test_validate_refuses_lora_targets_of_no_layer_as_omnirl_run_does(tmp_path, capsys):
    # validate said ok (exit 0) to targetModules [qkv_proj] on the built-in model, which omnirl run refuses (exit 2)
    path = lora_target_of_no_layer(tmp_path)
    assert main(["validate", path]) == 2
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: spec.model.lora.targetModules: ['qkv_proj'] match no layer of the model, so LoRA would train "
        "nothing; list linear layers of DigitsDiT: attn.proj, attn.qkv, mlp.fc1, mlp.fc2, modulation, modulation_out, "
        "out_proj, patch_embed, sigma_mlp.0, sigma_mlp.2 (empty: the model's defaults)"]
    doc = yaml.safe_load(Path(path).read_text())
    doc["spec"]["model"]["lora"]["targetModules"] = ["attn.qkv"]
    Path(path).write_text(yaml.safe_dump(doc))
    assert main(["validate", path]) == 0 and capsys.readouterr().out.startswith(f"{path}: ok")


@pytest.mark.parametrize("value", ["abc", "70000", "-1"])
def test_a_bad_metrics_port_is_refused_before_anything_starts(value, tmp_path, capsys, monkeypatch):
    """`OMNIRL_METRICS_PORT=abc omnirl run` printed the placement table, started Redis and wrote the
    run directory before refusing it (role_env read it when starting the controller); 70000 and -1
    reached the controller."""
    monkeypatch.setenv("OMNIRL_METRICS_PORT", value)
    code = main(["run", NFT, "--no-ray", "--device", "cpu", "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert err.splitlines() == [f"omnirl run: OMNIRL_METRICS_PORT={value!r}: must be a TCP port number from 1 to "
                                "65535, e.g. OMNIRL_METRICS_PORT=9090 (0 or unset: not served)"]
    assert out == "" and not (tmp_path / "o").exists()


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`omnirl validate … | head -1`: the pipe closes before the CLI writes; exit 1, stderr empty."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    env.pop("OMNIRL_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "validate", NFT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # before the child has imported anything, so its first write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait() == 1 and err == "", err


def test_ctrl_c_in_eval_is_one_line_and_exit_130_not_a_traceback(tmp_path):
    """Ctrl-C during `omnirl eval` printed a KeyboardInterrupt traceback from wherever it landed (the
    model's forward). The eval here reads its --prompts from a FIFO: once the test's open for writing
    returns, eval is inside the command, blocked reading it, when SIGINT arrives (set to its default
    disposition: a shell without job control would start the child with SIGINT ignored)."""
    import os
    import signal
    import subprocess
    import sys

    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    env.pop("OMNIRL_DEBUG", None)
    # guarded: SIGINT set to its default action in the child, without running Python between fork and exec
    proc = subprocess.Popen(guarded([sys.executable, "-m", "omnirl.cli", "eval", NFT, "--prompts", str(fifo),
                                     "--out", str(tmp_path / "o")]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    with open(fifo, "w"):  # returns once eval opened it: eval is reading its prompts
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (INTERRUPTED_EXIT, "omnirl eval: interrupted\n"), err.decode()[-2000:]
    assert not (tmp_path / "o").exists()


def test_a_second_launcher_on_a_run_directory_in_use_is_refused(tmp_path, capsys, monkeypatch):
    """`omnirl run --resume --out X` while another `omnirl run` holds X: exit 2 naming that pid, before
    a second Redis or actor touches X. The lock is held here as the running launcher holds it."""
    import fcntl

    monkeypatch.delenv("OMNIRL_DEBUG", raising=False)
    run = Path(existing_run(tmp_path))
    (run / "job.yaml").write_text(Path(NFT).read_text())
    with (run / "launcher.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        code = main(["run", NFT, "--resume", "--no-ray", "--out", str(run)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert "another omnirl run (pid 4242) is running in this directory" in err, err
        # without --resume too: it said "already holds a run: pass --resume", which the lock then refused
        code = main(["run", NFT, "--no-ray", "--out", str(run)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "another omnirl run (pid 4242)" in err, err
    assert not (run / "redis").exists()


def test_resuming_a_run_that_has_all_its_steps_says_so_and_starts_nothing(tmp_path, capsys):
    """`omnirl run --resume --steps 2` on a run with 3 trained steps: one line, exit 0, no role started
    (it used to start every role and show progress "3/2")."""
    run = tmp_path / "run"
    run.mkdir()
    records = [{"event": "start"}, *({"event": "step", "step": s} for s in range(3)), {"event": "finish"}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "job.yaml").write_text(Path(NFT).read_text())
    assert main(["run", NFT, "--resume", "--steps", "2", "--no-ray", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "has trained 3 steps, the job asks for 2 (--steps): nothing to do" in out
    assert not (run / "roles.json").exists() and not (run / "redis").exists()


def test_resuming_where_there_is_no_run_is_one_line_with_the_fix(tmp_path, capsys):
    """`omnirl run --resume` on an --out that holds no run (the launcher's side of OMNIRL_RESUME=1 with
    nothing to resume): one line, exit 2, nothing started; it named what was missing but not the fix."""
    run = tmp_path / "run"
    assert main(["run", NFT, "--resume", "--no-ray", "--out", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"omnirl run: --resume: {run} holds no run to continue (no metrics.jsonl); drop --resume to start a fresh "
        "run there, or pass the --out of the run to continue\n")
    assert not run.exists()


def test_a_new_run_on_another_jobs_results_names_that_job_not_resume(tmp_path, capsys):
    """`omnirl run AWM --out DIR` where DIR holds an ocr-nft run: it said "already holds a run: pass
    --resume to continue it", and --resume then refused the other job; now the first line names it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"event": "start"}) + "\n")
    (run / "job.yaml").write_text(Path(NFT).read_text())
    assert main(["run", str(ROOT / "examples" / "ocr-awm.yaml"), "--no-ray", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == (f"omnirl run: --out: {run} holds a run with metadata.name 'ocr-nft', not 'ocr-awm'; resume it "
                   "with its own manifest, or start a new run (another --out) with model.path: OUT/exports/latest\n")
    # the same job's run: pass --resume
    assert main(["run", NFT, "--no-ray", "--out", str(run)]) == 2
    assert "already holds a run: pass --resume to continue it" in capsys.readouterr().err


@pytest.mark.parametrize("raised,printed", [
    # a value quoted at the end of the message keeps its quotes (they were stripped from every message)
    (ValueError("--out: cannot use 'runs/a b'"), "--out: cannot use 'runs/a b'"),
    (ValueError('"12" is not a prompt'), '"12" is not a prompt'),
    (FileNotFoundError(2, "No such file or directory", "/x/p.txt"), "[Errno 2] No such file or directory: '/x/p.txt'"),
    # what the strip was for: a KeyError's str is the repr of its message
    (KeyError("OMNIRL_JOB_NAME is not set: the launcher (`omnirl run`) or the operator sets it"),
     "OMNIRL_JOB_NAME is not set: the launcher (`omnirl run`) or the operator sets it"),
    (KeyError("it's"), "it's"),
])
def test_errors_print_as_raised(raised, printed, capsys, monkeypatch):
    import omnirl.cli as cli

    def fail(args):
        raise raised

    monkeypatch.delenv("OMNIRL_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_cmd_render", fail)  # the parser binds the command when main builds it
    assert cli.main(["render", NFT]) == 2
    assert capsys.readouterr().err == f"omnirl render: {printed}\n"


def test_every_argument_of_every_subcommand_says_what_it_takes():
    """`omnirl <command> --help` for a new user: no bare `--steps STEPS` (pretrain's --steps, --seed and
    --batch-size, eval's --sampler, run's and render's JOB had no text), and run's --steps says it is the total,
    with --resume too (its help said "override spec.algorithm.steps")."""
    import argparse

    from omnirl.cli import build_parser

    bare = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not action.help:
                bare.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "omnirl")
    assert bare == []
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions if a.dest == "steps")
    assert "total" in run.help and "--resume" in run.help


def test_every_help_page_says_what_its_command_does():
    """`omnirl --help` describes omnirl, not its own source file (it printed "this file only parses"), and
    `omnirl run --help` (every subcommand's page) opens with the summary the parent's list shows (it had none)."""
    import argparse

    from omnirl.cli import build_parser

    parser = build_parser()
    assert "this file" not in parser.format_help() and "RLJob" in parser.description
    silent, visited = [], set()

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for listed in action._choices_actions:
                    sub = action.choices[listed.dest]
                    visited.add(f"{path} {listed.dest}")
                    if sub.description != listed.help or listed.help not in " ".join(sub.format_help().split()):
                        silent.append(f"{path} {listed.dest}")
                    walk(sub, f"{path} {listed.dest}")

    walk(parser, "omnirl")
    assert silent == []
    assert visited >= {"omnirl run", "omnirl eval", "omnirl scorer serve"}


def test_eval_of_an_exports_manifest_says_it_scores_the_starting_model_not_the_export(tmp_path, capsys):
    """An export's job.yaml is the run's manifest as written (model.path builtin): `omnirl eval` of it
    without --checkpoint scored the base model (0.350 where the export scored 0.400) and said nothing."""
    export = tmp_path / "exp"
    export.mkdir()
    (export / "export.json").write_text("{}")
    (export / "job.yaml").write_text(Path(NFT).read_text())
    prompts = prompt_file(tmp_path, 'A sign that says "42"\n')
    code = main(["eval", str(export / "job.yaml"), "--prompts", prompts, "--sampling-steps", "2", "--out",
                 str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "model builtin (spec.model.path; no --checkpoint)" in out.splitlines()
    assert err.splitlines() == [
        f"omnirl eval: note: {export / 'job.yaml'} is an export's manifest as written, so this scores spec.model.path "
        f"builtin (the model the run started from), not the exported weights; to score those set spec.model.path: "
        f"{export}"]


def test_eval_of_an_exports_manifest_names_the_checkpoint_it_was_exported_from(tmp_path, capsys):
    """The note's fix was "or pass --checkpoint", and `--checkpoint EXPORT` is refused (no policy.safetensors):
    it now names the checkpoint export.json records, when that checkpoint is on this machine."""
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    (ckpt / "policy.safetensors").write_bytes(b"")
    export = tmp_path / "exp"
    export.mkdir()
    (export / "export.json").write_text(json.dumps({"format": "omnirl-export-v1", "checkpoint": str(ckpt)}))
    (export / "job.yaml").write_text(Path(NFT).read_text())
    prompts = prompt_file(tmp_path, 'A sign that says "42"\n')
    code = main(["eval", str(export / "job.yaml"), "--prompts", prompts, "--sampling-steps", "2", "--out",
                 str(tmp_path / "o")])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert err.splitlines() == [
        f"omnirl eval: note: {export / 'job.yaml'} is an export's manifest as written, so this scores spec.model.path "
        f"builtin (the model the run started from), not the exported weights; to score those set spec.model.path: "
        f"{export}, or pass --checkpoint {ckpt} (the checkpoint it was exported from)"]
