"""`omnirl run --resume` of a run stopped mid-step, with a manifest whose groupSize changed: refused at once
with one line naming the field, both values and the fix, before Redis or any role starts; the run directory
is left as it was; a new learning rate (it shapes nothing stored) passes the same check.

Before the fix the resume started and hung: the controller rebuilt the published step's groups with the new
groupSize and waited for ever for samples never requested (measured on 2 prompts × 3 samples stopped after
step 11: groupSize 4, or promptsPerStep 3, and no step trained in 120 s; the step's log line never came)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tests.helpers import wait_until

from omnirl.api.exits import CONFIG_ERROR_EXIT, INTERRUPTED_EXIT
from omnirl.api.loader import dump_rljob, load_rljob
from omnirl.api.resume import resume_changes, resume_notes
from omnirl.launch import preflight

ROOT = Path(__file__).resolve().parents[2]


def _job(tmp: Path, spec: dict | None = None, **algorithm) -> Path:
    """The reshape job in `tmp/job.yaml`; `algorithm` updates `spec.algorithm`, `spec` the spec's top level."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = "reshape"
    spec_updates, spec = spec, doc["spec"]
    spec["data"] = {"trainPrompts": str(ROOT / "examples/prompts/ocr-train.txt")}
    spec["algorithm"].update(steps=50, groupSize=3, promptsPerStep=2, sampling={"numSteps": 4},
                             optimizer={"learningRate": 1e-4, "microBatchSize": 6, "updatesPerStep": 1})
    spec["algorithm"]["flowGrpo"]["window"] = {"size": 2, "range": [0, 3]}
    spec["algorithm"].update(algorithm)
    spec["checkpoint"] = {"everySteps": 1, "keep": 1}
    spec.update(spec_updates or {})
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _omnirl(job: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    return subprocess.Popen([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray",
                             "--device", "cpu", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its roles and Redis
        output, _ = proc.communicate(timeout=60)
        raise AssertionError(f"still running after {timeout_s} s (hung?):\n{output[-3000:]}") from None
    return proc.returncode, output


def _trained(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r["step"] for r in map(json.loads, lines) if r["event"] == "step"]


def test_a_resume_with_another_group_size_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "out"
    first = _omnirl(_job(tmp_path), out)
    try:
        wait_until(lambda: first.poll() is not None or _trained(out), "the first step", timeout_s=120)
        time.sleep(0.3)  # into the next step: its requests are published, its samples on their way
    finally:
        first.send_signal(signal.SIGTERM)  # as Ctrl-C
    assert _finish(first, 90)[0] == INTERRUPTED_EXIT
    trained, before = _trained(out), (out / "job.yaml").read_text()

    code, output = _finish(_omnirl(_job(tmp_path, groupSize=4), out, "--resume"), 60)
    lines = output.strip().splitlines()
    assert code == 2 and len(lines) == 1, output[-3000:]
    assert lines[0] == (
        f"omnirl run: --resume: {out} holds a run started with spec.algorithm.groupSize 3 (now 4): the steps it "
        "published and its data position were made with it, and a resumed controller would wait for samples never "
        "requested or train samples with settings they were not drawn with; put the earlier values back to resume "
        "it, or start a new run (another --out) with model.path: OUT/exports/latest to continue from its weights")
    assert (out / "job.yaml").read_text() == before and _trained(out) == trained

    # a new learning rate shapes nothing stored: the same check lets it through
    preflight.check_same_job(load_rljob(_job(tmp_path, optimizer={"learningRate": 5e-5, "microBatchSize": 6})), out)

    # another model: the checkpoints hold the built-in model's weights (with LoRA, a rank 4 → 8 crashed the actor
    # after loading and the job restarted until maxRestarts; another path trained on other base weights silently)
    model = shutil.copytree(ROOT / "services/omnirl/models/digits/weights", tmp_path / "model")  # the same weights
    code, output = _finish(_omnirl(_job(tmp_path, {"model": {"path": str(model)}}), out, "--resume"), 60)
    assert code == 2 and output.strip().splitlines() == [
        f"omnirl run: --resume: {out} holds a run started with spec.model.path 'builtin' (now '{model}'): "
        "its checkpoints hold the weights of that model in that layout, which the actor cannot load into another (it "
        "fails after loading, or restarts until failurePolicy.maxRestarts) or would go on training on other base "
        "weights or at another adapter scale; put the earlier values back to resume it, or start a new run (another "
        "--out) with model.path: OUT/exports/latest to continue from its weights"], output[-3000:]
    # a reward added: the step's scored samples lack it
    jpeg = [{"name": "ocr", "kind": "ocr", "params": {"alphabet": "0123456789"}}, {"name": "jpeg", "kind": "jpeg"}]
    code, output = _finish(_omnirl(_job(tmp_path, {"reward": jpeg}), out, "--resume"), 60)
    assert code == 2 and output.strip().splitlines() == [
        f"omnirl run: --resume: {out} holds a run started with spec.reward[].name ['ocr'] (now ['ocr', 'jpeg']): the "
        "scores already made for its pending steps come from those rewards, and a resumed step would mix them with "
        "scores of the new definition; put the earlier values back to resume it, or start a new run (another --out) "
        "with model.path: OUT/exports/latest to continue from its weights"], output[-3000:]
    assert (out / "job.yaml").read_text() == before and _trained(out) == trained


def test_which_changes_a_resume_refuses(tmp_path):
    """The fields of `RESUME_FIXED` only, each with both values; a prompt path written relative (a manifest as
    typed, the operator's ConfigMap) matches the absolute one it ends; another algorithm's block is not compared."""
    base = dump_rljob(load_rljob(_job(tmp_path)))

    def edited(**changes) -> dict:
        doc = json.loads(json.dumps(base))
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            node = doc
            for key in parents:
                node = node[key]
            node[leaf] = value
        return doc

    assert resume_changes(base, edited(spec__algorithm__optimizer__learningRate=5e-5, spec__algorithm__steps=9,
                                       spec__validation__everySteps=3)) == []
    assert resume_changes(base, edited(spec__algorithm__promptsPerStep=3, spec__seed=1,
                                       spec__algorithm__flowGrpo__noiseLevel=0.5)) == [
        ("spec.algorithm.promptsPerStep", 2, 3), ("spec.seed", 0, 1), ("spec.algorithm.flowGrpo.noiseLevel", 0.8, 0.5)]
    train = base["spec"]["data"]["trainPrompts"]
    assert resume_changes(edited(spec__data__trainPrompts="prompts/ocr-train.txt"), base) == []
    assert resume_changes(edited(spec__data__trainPrompts="./prompts/ocr-train.txt"), base) == []
    assert resume_changes(edited(spec__data__trainPrompts="other/ocr-train.txt"), base) == [
        ("spec.data.trainPrompts", "other/ocr-train.txt", train)]
    nft = edited(spec__algorithm__name="diffusion-nft")
    del nft["spec"]["algorithm"]["flowGrpo"]
    assert resume_changes(base, nft) == []  # the algorithm's name is check_same_job's

    # the model: family, path (relative matches the absolute it ends), LoRA on/off, and its layout only when on
    assert resume_changes(base, edited(spec__model__dtype="bfloat16", spec__model__compile=True,
                                       spec__model__gradientCheckpointing=True)) == []
    assert resume_changes(base, edited(spec__model__family="sd3", spec__model__path="/models/sd3")) == [
        ("spec.model.family", "ocr-digits", "sd3"), ("spec.model.path", "builtin", "/models/sd3")]
    assert resume_changes(edited(spec__model__path="/data/models/m"), edited(spec__model__path="models/m")) == []
    assert resume_changes(base, edited(spec__model__lora__rank=8)) == []  # LoRA off: no adapter is stored
    lora = edited(spec__model__lora__enabled=True)
    assert resume_changes(base, lora) == [("spec.model.lora.enabled", False, True)]
    lora8 = json.loads(json.dumps(lora))
    lora8["spec"]["model"]["lora"].update(rank=8, alpha=16.0, targetModules=["qkv"])
    assert resume_changes(lora, lora8) == [("spec.model.lora.rank", 32, 8), ("spec.model.lora.alpha", 64.0, 16.0),
                                           ("spec.model.lora.targetModules", [], ["qkv"])]

    # the rewards: their names, kind, params and required are kept; weight and normalize are accepted and noted
    two = edited(spec__reward=[{**base["spec"]["reward"][0]}, {"name": "jpeg", "kind": "jpeg", "weight": 0.1}])
    assert resume_changes(base, two) == [("spec.reward[].name", ["ocr"], ["ocr", "jpeg"])]
    other = json.loads(json.dumps(two))
    other["spec"]["reward"][1].update(weight=0.5, normalize="group", timeoutSeconds=9.0)
    other["spec"]["reward"][0].update(params={"alphabet": "0123"}, required=False)
    assert resume_changes(two, other) == [("spec.reward[0].params", {"alphabet": "0123456789"}, {"alphabet": "0123"}),
                                          ("spec.reward[0].required", True, False)]
    assert resume_notes(two, other) == ("spec.reward[1].weight 0.1 → 0.5, spec.reward[1].normalize 'none' → "
                                        "'group': the scores already made for the pending steps are combined with "
                                        "the new values too (reward_mean changes scale from the first resumed step); "
                                        "spec.reward[1].timeoutSeconds 30.0 → 9.0: how a scorer is run and waited "
                                        "for, not what it scores (the resumed roles use the new value)")
    assert resume_notes(base, base) is None

    # the judge: its url, or the server the job runs (what it runs: image, command, args, model, path), is the scorer;
    # how it is run and waited for is not (timeoutSeconds, replicas, port, probes, placement): accepted and said
    url = edited(spec__reward=[{"name": "judge", "kind": "http", "url": "http://judge-a:8000/v1/score"}])
    moved = edited(spec__reward=[{"name": "judge", "kind": "http", "url": "http://judge-b:8000/v1/score",
                                  "timeoutSeconds": 60.0}])
    assert resume_changes(url, moved) == [("spec.reward[0].url", "http://judge-a:8000/v1/score",
                                           "http://judge-b:8000/v1/score")]
    assert resume_notes(url, moved) == ("spec.reward[0].timeoutSeconds 30.0 → 60.0: how a scorer is run and waited "
                                        "for, not what it scores (the resumed roles use the new value)")
    server = {"command": ["vllm", "serve", "{modelPath}"], "modelPath": "/models/judge-7b", "replicas": 1,
              "port": 8000, "urlPath": "/v1", "healthPath": None, "startupSeconds": 600}
    served = edited(spec__reward=[{"name": "judge", "kind": "vlm", "params": {"model": "j"}, "url": None,
                                   "server": server}])
    bigger = json.loads(json.dumps(served))
    bigger["spec"]["reward"][0]["server"].update(modelPath="/models/judge-70b", args=["--tp", "2"])
    assert resume_changes(served, bigger) == [("spec.reward[0].server.args", [], ["--tp", "2"]),
                                              ("spec.reward[0].server.modelPath", "/models/judge-7b",
                                               "/models/judge-70b")]
    scaled = json.loads(json.dumps(served))
    scaled["spec"]["reward"][0]["server"].update(replicas=4, healthPath="/health", startupSeconds=900)
    assert resume_changes(served, scaled) == []
    assert resume_notes(served, scaled) == (
        "spec.reward[0].server.replicas 1 → 4, spec.reward[0].server.healthPath None → '/health', "
        "spec.reward[0].server.startupSeconds 600 → 900: how a scorer is run and waited for, not what it scores (the "
        "resumed roles use the new values)")
    # server.template sets the judge container's image, command or args over the generated ones (user fields win):
    # that is another judge; node pools and env are placement, accepted and said
    def templated(**judge):
        out = json.loads(json.dumps(served))
        out["spec"]["reward"][0]["server"]["template"] = {"spec": {
            "nodeSelector": {"pool": "a100"}, "containers": [{"name": "judge", "env": [{"name": "X", "value": "1"}],
                                                               **judge}]}}
        return out
    pinned = templated(image="vllm/vllm-openai:v0.9")
    assert resume_changes(templated(), pinned) == [("spec.reward[0].server.template.judge", {},
                                                    {"image": "vllm/vllm-openai:v0.9"})]
    assert resume_changes(pinned, templated(image="vllm/vllm-openai:v0.9", args=["--quantization", "fp8"])) == [
        ("spec.reward[0].server.template.judge", {"image": "vllm/vllm-openai:v0.9"},
         {"image": "vllm/vllm-openai:v0.9", "args": ["--quantization", "fp8"]})]
    moved_pool = json.loads(json.dumps(pinned))
    moved_pool["spec"]["reward"][0]["server"]["template"]["spec"]["nodeSelector"] = {"pool": "h100"}
    assert resume_changes(pinned, moved_pool) == [] and resume_changes(served, templated()) == []
    assert "server.template" in resume_notes(pinned, moved_pool)
    yours = edited(spec__reward=[{"name": "judge", "kind": "vlm", "params": {"model": "j"},
                                  "url": "http://mine:8000/v1", "server": None}])
    assert resume_changes(served, yours) == [("spec.reward[0].url", None, "http://mine:8000/v1")]  # server → url

    # the dtype: the checkpoint loads cast to the new one (tests/actor/test_actor.py), accepted and said, with the rounding
    # when float32 → bfloat16; in one line with the rewards' note
    half = edited(spec__model__dtype="bfloat16")
    assert resume_changes(base, half) == [] and resume_changes(half, base) == []
    assert resume_notes(base, half) == DTYPE_NOTE
    assert resume_notes(half, base) == ("spec.model.dtype 'bfloat16' → 'float32': the checkpoint's weights and AdamW "
                                        "state load cast to float32, and training goes on in float32")
    both = json.loads(json.dumps(other))
    both["spec"]["model"]["dtype"] = "bfloat16"
    assert resume_notes(other, both) is not None and resume_notes(two, both) == (
        resume_notes(two, other) + "; " + DTYPE_NOTE)


DTYPE_NOTE = ("spec.model.dtype 'float32' → 'bfloat16': the checkpoint's weights and AdamW state load cast to bfloat16 "
              "(rounded to 8 significant bits; measured on the built-in model after 4 optimizer steps: an error 15% "
              "the size of what training had changed), and training goes on in bfloat16")


def test_a_resume_in_another_dtype_says_what_it_does_to_the_checkpoint(tmp_path, capsys):
    """`omnirl run --resume` with `model.dtype: bfloat16` on a float32 run: accepted (it trained on, measured both
    ways), and the launcher says so before anything starts (was: silently). Here the run has all its steps,
    so nothing starts after the note."""
    from omnirl.cli import main

    job = _job(tmp_path, steps=2)
    out = tmp_path / "run"
    out.mkdir()
    (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(load_rljob(job))))
    records = [{"event": "start"}, *({"event": "step", "step": s} for s in range(2)), {"event": "finish"}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["model"]["dtype"] = "bfloat16"
    job.write_text(yaml.safe_dump(doc))
    assert main(["run", str(job), "--resume", "--no-ray", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"omnirl: --resume: {DTYPE_NOTE}",
        f"omnirl: {out} has trained 2 steps, the job asks for 2 (spec.algorithm.steps): nothing to do; pass --steps N "
        "(N > 2) to train further"]


def test_a_resume_that_moves_a_judges_url_is_refused_and_a_new_timeout_is_said(tmp_path, capsys):
    """`omnirl run --resume` of a run whose `http` reward's `url` now names another judge: refused before anything
    starts, one line naming the field, both values and the fix. Measured before (`omnirl run` to step 1 with an OCR
    judge, `--resume --steps 2` with the url on a JPEG judge): accepted without a word, the train reward 0.567 →
    -3.193. A new `timeoutSeconds` alone is accepted and said (it was accepted silently). Here the run has all its
    steps, so nothing starts after the note."""
    from omnirl.cli import main

    judge = {"name": "judge", "kind": "http", "url": "http://127.0.0.1:19501/v1/score"}
    job = _job(tmp_path, {"reward": [judge]}, steps=2)
    out = tmp_path / "run"
    out.mkdir()
    (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(load_rljob(job))))
    records = [{"event": "start"}, *({"event": "step", "step": s} for s in range(2)), {"event": "finish"}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    before = (out / "job.yaml").read_text()

    _job(tmp_path, {"reward": [{**judge, "url": "http://127.0.0.1:19502/v1/score"}]}, steps=2)
    assert main(["run", str(job), "--resume", "--no-ray", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"omnirl run: --resume: {out} holds a run started with spec.reward[0].url 'http://127.0.0.1:19501/v1/score' "
        "(now 'http://127.0.0.1:19502/v1/score'): spec.reward[0].url names the judge that scores the reward, and "
        "another judge (another model or version) would change the reward from the first resumed step without a "
        "word (a judge that only moved: make it answer at the earlier address too); put the earlier values back to "
        "resume it, or start a new run (another --out) with model.path: OUT/exports/latest to continue from its "
        "weights"]
    assert (out / "job.yaml").read_text() == before

    _job(tmp_path, {"reward": [{**judge, "timeoutSeconds": 60}]}, steps=2)
    assert main(["run", str(job), "--resume", "--no-ray", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "omnirl: --resume: spec.reward[0].timeoutSeconds 30.0 → 60.0: how a scorer is run and waited for, not what "
        "it scores (the resumed roles use the new value)",
        f"omnirl: {out} has trained 2 steps, the job asks for 2 (spec.algorithm.steps): nothing to do; pass --steps N "
        "(N > 2) to train further"]


@pytest.mark.slow  # 20-70 s on 2 cores: make test-slow
def test_a_resume_with_a_new_reward_weight_weighs_the_scores_made_before_the_stop_with_it(tmp_path):
    """Stopped while step 0's first group was scored and its second one generated; resumed with the reward's
    weight 1 → 0.5. The controller reused the 3 scores the reward role had made (their totals at weight 1) and
    mixed them with 3 new ones at 0.5: measured reward_mean 0.383 for raw OCR scores of mean 0.467 (0.233 is
    right). Now the step's totals are combined from the components with the manifest's weights, and the
    launcher says so in one line."""
    one = {"roles": {"rollout": {"replicas": 1, "accelerator": {"type": "cpu"}, "maxBatchSize": 3}}}  # group by group
    out, scored = tmp_path / "out", tmp_path / "out" / "ledger"

    def scores() -> int:
        return sum(len(p.read_text().splitlines()) for p in scored.glob("reward-*.jsonl")) if scored.is_dir() else 0

    first = _omnirl(_job(tmp_path, one), out, "--steps", "1")
    try:
        wait_until(lambda: first.poll() is not None or scores() >= 3, "the first group's scores", timeout_s=120)
    finally:
        first.send_signal(signal.SIGTERM)  # as Ctrl-C
    assert _finish(first, 90)[0] == INTERRUPTED_EXIT
    # scores made before the stop and the step not trained. A loaded machine finishes the reward role's batch in
    # flight and scores all 6 (CI: 6); the test holds either way: scores reused at weight 1 give reward_ocr, not half
    assert 3 <= scores() <= 6 and _trained(out) == [], f"stopped too late to test this: {_trained(out)} trained"

    weight = [{"name": "ocr", "kind": "ocr", "weight": 0.5, "params": {"alphabet": "0123456789"}}]
    code, output = _finish(_omnirl(_job(tmp_path, {**one, "reward": weight}), out, "--steps", "1", "--resume"), 120)
    assert code == 0, output[-3000:]
    assert ("omnirl: --resume: spec.reward[0].weight 1.0 → 0.5: the scores already made for the pending steps are "
            "combined with the new value too (reward_mean changes scale from the first resumed step)") in output
    assert scores() == 6  # those scored before the stop were not scored again
    step = next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == "step")
    assert step["samples"] == 6 and step["reward_mean"] == pytest.approx(0.5 * step["reward_ocr"], abs=1e-6), step


@pytest.mark.slow  # 20-70 s on 2 cores: make test-slow
def test_a_finished_run_on_a_shared_redis_leaves_no_keys_and_resumes_for_more_steps(tmp_path, redis_client, redis_url):
    """A run that finished on the manifest's Redis (spec.transferQueue.redisUrl) left its job's keys there: the
    `stop` flag, `actor_state` (step 1), streams, markers. An RLJob of that name on that Redis then failed at once:
    its actor, started as the pod starts it (OMNIRL_RESUME=auto, an empty run directory), exited 4 with "the job's
    actor had trained step 1, but there is none … the checkpoint directory was lost or belongs to another run";
    without `actor_state` the `stop` flag alone ends every role at start. A finished run now deletes its keys (its
    checkpoints and metrics are in its --out), and its `--resume` for more steps still trains from the checkpoint."""
    from omnirl.transfer.keys import job_pattern

    shared = {"transferQueue": {"redisUrl": redis_url}}
    out = tmp_path / "out"
    code, output = _finish(_omnirl(_job(tmp_path, shared), out, "--steps", "1"), 180)
    assert code == 0 and _trained(out) == [0], output[-3000:]
    assert sorted(redis_client.scan_iter(match=job_pattern("reshape"))) == []

    code, output = _finish(_omnirl(_job(tmp_path, shared), out, "--steps", "2", "--resume"), 180)
    assert code == 0 and _trained(out) == [0, 1], output[-3000:]
    assert sorted(redis_client.scan_iter(match=job_pattern("reshape"))) == []



def test_a_resume_with_nothing_to_do_clears_its_finished_runs_leftover_keys_but_not_another_runs(
        tmp_path, redis_client, redis_url):
    """`omnirl run --resume` of a run that had finished, on the manifest's Redis, with keys of that name left there
    (a launcher killed after the job's `finish` record, or an older one that kept them after a Ctrl-C: its `stop`
    flag, its place, its record marked stopped, `actor_state`, streams): it said "nothing to do" and left them, so
    a fresh run of that name from another --out was still refused ("holds the pending work of a run that was
    stopped before it finished …: continue it with … --resume"), the very --resume that had nothing to do. Found
    by hand with the real CLI. It now deletes them, as that run would have once finished, and says so; keys another
    run holds (its record) are left, and it says whose."""
    import socket

    from omnirl.launch.preflight import check_not_running_elsewhere
    from omnirl.transfer.keys import job_pattern, kv_key
    from omnirl.transfer.owner import RUN_OWNER, local_owner, rljob_owner, write_owner
    from omnirl.transfer.records import STOPPED_RUN

    job = _job(tmp_path, {"transferQueue": {"redisUrl": redis_url}}, steps=2)
    out = tmp_path / "run"
    out.mkdir()
    (out / "job.yaml").write_text(yaml.safe_dump(dump_rljob(load_rljob(job))))
    records = [{"event": "start"}, *({"event": "step", "step": s} for s in range(2)), {"event": "finish"}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_owner(redis_client, "reshape", {**local_owner(str(out)), "pid": 1, "stopped": time.time()})
    redis_client.set(kv_key("reshape", "stop"), b"true")
    redis_client.set(kv_key("reshape", STOPPED_RUN), json.dumps({"host": socket.gethostname(), "out": str(out),
                                                                  "time": time.time()}).encode())
    redis_client.set(kv_key("reshape", "actor_state"), b'{"step": 1}')
    redis_client.xadd("omnirl:reshape:samples", {"x": b"1"})
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    nothing = (f"omnirl: {out} has trained 2 steps, the job asks for 2 (spec.algorithm.steps): nothing to do; pass "
               "--steps N (N > 2) to train further")
    code, output = _finish(_omnirl(job, out, "--resume"), 60)
    assert (code, output.splitlines()) == (0, [nothing, (
        f"omnirl: deleted the 5 keys job 'reshape' had left on 127.0.0.1:{port} (spec.transferQueue.redisUrl), as the "
        f"run does once it finished: they held no pending work (its checkpoints and metrics are in {out}); the name "
        "is free there")]), output
    assert list(redis_client.scan_iter(match=job_pattern("reshape"))) == []
    check_not_running_elsewhere(redis_url, load_rljob(job), tmp_path / "other")  # a fresh run elsewhere may start

    code, output = _finish(_omnirl(job, out, "--resume"), 60)  # again: nothing left, nothing more said
    assert (code, output.splitlines()) == (0, [nothing]), output

    rljob = rljob_owner("team-a", "reshape", "uid-1")  # another run holds the name now: its keys stay
    write_owner(redis_client, "reshape", rljob, ttl_s=60)
    redis_client.set(kv_key("reshape", "actor_state"), b'{"step": 9}')
    code, output = _finish(_omnirl(job, out, "--resume"), 60)
    assert code == 0 and output.splitlines()[0] == nothing, output
    assert output.splitlines()[1].startswith(
        f"omnirl: left the keys of job 'reshape' on 127.0.0.1:{port} (spec.transferQueue.redisUrl) as they are: "
        f"metadata.name: job 'reshape' on 127.0.0.1:{port} (spec.transferQueue.redisUrl) is claimed by RLJob "
        "team-a/reshape (uid uid-1)"), output
    assert json.loads(redis_client.get(kv_key("reshape", RUN_OWNER))) == rljob
    assert redis_client.get(kv_key("reshape", "actor_state")) == b'{"step": 9}'


def test_an_actor_that_meets_a_stopped_local_runs_work_names_that_run(tmp_path, redis_client, redis_url):
    """An RLJob (or any fresh start) of a job whose keys on the shared Redis are an `omnirl run` stopped before it
    finished: its actor, started as the pod starts it (OMNIRL_RESUME=auto, an empty run directory), exited 4 with
    "… the checkpoint directory was lost or belongs to another run; restore it (on Kubernetes: spec.storage, …), or
    start a fresh run in another --out" (measured after a Ctrl-C of a run on redis-server :46379). Deleting that work
    would lose the stopped run's resume (the launcher refuses a fresh run there too), so the actor names the run."""
    from omnirl.transfer.keys import kv_key
    from omnirl.transfer.records import STOPPED_RUN

    redis_client.set(kv_key("reshape", "actor_state"), b'{"step": 1, "policy_version": 2, "data_position": [0, 4]}')
    redis_client.set(kv_key("reshape", STOPPED_RUN), b'{"host": "laptop", "out": "/runs/a", "time": 0}')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)]),
           "OMNIRL_JOB_NAME": "reshape", "OMNIRL_REDIS_URL": redis_url, "OMNIRL_WEIGHT_SYNC_ADDR": "127.0.0.1:1",
           "OMNIRL_WORKER_ID": "actor-0", "OMNIRL_OUT": str(tmp_path / "pod"), "OMNIRL_RESUME": "auto",
           "OMNIRL_DEVICE": "cpu"}
    try:
        done = subprocess.run([sys.executable, "-m", "omnirl.cli", "role", "actor", "--job", str(_job(tmp_path))],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        redis_client.delete(kv_key("reshape", "actor_state"), kv_key("reshape", STOPPED_RUN))
    assert done.returncode == CONFIG_ERROR_EXIT, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"omnirl role actor: configuration error: checkpoint {tmp_path / 'pod' / 'checkpoints' / 'latest'}: the job's "
        "actor had trained step 1, but there is none: the keys of job 'reshape' on this Redis hold the pending work of "
        "an omnirl run that was stopped before it finished (laptop:/runs/a); continue that run with omnirl run JOB "
        "--out /runs/a --resume, or give this job another metadata.name (restarting cannot help)")
