"""`omnirl ledger OUT`: a run's samples accounted from its ledgers, written here as the roles write them
(`api/ledger.py::Ledger` for rollout and reward, the actor's `actor-*`/`checkpoints-*` lines), with known
duplicated and lost samples; exact counts, the exit codes and the messages of the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.chaos import chaos_job

from omnirl.api.exits import INTERRUPTED_EXIT, LEDGER_PROBLEMS_EXIT
from omnirl.api.ledger import Ledger
from omnirl.cli import main
from omnirl.evaluation.ledger import account, check_ledger

ROOT = Path(__file__).resolve().parents[2]
G, P = 3, 2  # chaos_job's groupSize, promptsPerStep


def ids(step: int) -> list[str]:
    return [f"{step}:{p}:{i}" for p in range(P) for i in range(G)]


def write_run(out: Path, steps: int, *, trained: int | None = None, checkpoints: list[int] | None = None,
              finished: bool = True, manifest: bool = True, generated: int | None = None) -> None:
    """A run directory as `omnirl run` leaves it: `job.yaml` (chaos_job: 2 prompts × 3), `metrics.jsonl`,
    and ledgers of `generated` steps generated and scored, `trained` steps trained by one actor process
    (run "a"), checkpoints at `checkpoints` (default: every trained step)."""
    out.mkdir(parents=True, exist_ok=True)
    if manifest:
        shutil.copy(chaos_job(out.parent, f"job-{out.name}", steps), out / "job.yaml")
    trained = steps if trained is None else trained
    generated = trained if generated is None else generated
    records = [{"event": "start", "total_steps": steps, "start_step": 0}]
    records += [{"event": "step", "step": s} for s in range(trained)]
    records += [{"event": "finish", "total_steps": steps, "start_step": 0}] if finished else []
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rollout, reward = Ledger(out, "rollout", "0"), Ledger(out, "reward", "0")
    for s in range(generated):
        for sid in ids(s):
            rollout.record(sid, True, policy_version=s)
            reward.record(sid, True, reward=0.5)
    rollout.record("val0:0:0", True, policy_version=0)  # validation samples are not counted
    rollout.close()
    reward.close()
    actor_rows(out, "a", range(trained), base=-1, checkpoints=list(range(trained)) if checkpoints is None else checkpoints)


def actor_rows(out: Path, run: str, steps: range, base: int, checkpoints: list[int], drop: str = "") -> None:
    """The actor leader's lines (`actor/service.py`): one per trained sample, one per checkpoint."""
    with (out / "ledger" / f"actor-{run}.jsonl").open("a") as f:
        for s in steps:
            f.writelines(json.dumps({"sample_id": x, "step": s, "run": run, "base": base}) + "\n" for x in ids(s) if x != drop)
    with (out / "ledger" / f"checkpoints-{run}.jsonl").open("a") as f:
        f.writelines(json.dumps({"checkpoint": c, "run": run}) + "\n" for c in checkpoints)


def ledger(*args: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(["ledger", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_finished_run_with_nothing_lost_exits_0_with_its_counts(tmp_path, capsys):
    out = tmp_path / "run"
    write_run(out, steps=4)
    code, text, err = ledger(str(out), capsys=capsys)
    assert (code, err) == (0, "")
    assert f"{out}: 4 of 4 steps counted (0–3), groups of 3 × 2 prompts per step (from {out / 'job.yaml'}, " \
        f"{out / 'metrics.jsonl'})" in text
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines() if line.split()[:1] in (
        ["generated"], ["scored"], ["trained"], ["lost"], ["duplicated"], ["wasted"], ["pending"])}
    assert rows == {"generated": "24", "scored": "24", "trained": "24", "lost": "0", "duplicated": "0", "wasted": "0"}
    assert text.rstrip().endswith("ok: nothing lost, nothing duplicated")


def test_a_duplicated_score_and_a_lost_sample_are_counted_and_exit_3(tmp_path, capsys):
    """A second reward worker that wrote a line of a sample the first had written (a duplicate), a sample
    trained but missing from its group in the final weights (lost), a sample generated and never trained."""
    out = tmp_path / "run"
    write_run(out, steps=2, trained=0, checkpoints=[], generated=2)
    actor_rows(out, "a", range(2), base=-1, checkpoints=[1], drop="1:1:2")
    (out / "ledger" / "reward-1.jsonl").write_text(json.dumps({"sample_id": "0:0:1", "reward": 0.5}) + "\n")
    code, text, _ = ledger(str(out), "--json", capsys=capsys)
    got = json.loads(text)
    assert code == LEDGER_PROBLEMS_EXIT == 3
    assert {k: got[k] for k in ("generated", "scored", "trained", "lost", "duplicated", "wasted", "ok")} == {
        "generated": 12, "scored": 12, "trained": 11, "lost": 1, "duplicated": 1, "wasted": 1, "ok": False}
    assert got["problems"] == [f"{out}: partial groups in the final weights: {{'1:1': 2}}"]
    assert (got["counted_steps"], got["planned_steps"], got["finished"]) == (2, 2, True)
    code, text, _ = ledger(str(out), capsys=capsys)
    assert code == 3
    assert text.rstrip().splitlines()[-2:] == [f"{out}: partial groups in the final weights: {{'1:1': 2}}",
                                               "PROBLEM: 1 sample(s) lost, 1 duplicated"]


def test_a_stopped_run_is_counted_through_its_last_checkpoint_not_as_lost(tmp_path, capsys):
    """Stopped after training step 2 of 6, its last checkpoint step 1 (everySteps 2), step 3 generated: steps 0–1
    are counted; step 2's trained samples are in no saved weights and steps 2–3's generated ones are pending.
    Counted against the planned 6 (as `make chaos` counts a finished run) every step would be 'lost': 36."""
    out = tmp_path / "run"
    write_run(out, steps=6, trained=3, checkpoints=[1], finished=False, generated=4)
    assert check_ledger(out, 6, G, P).lost == 36  # what the test function said of such a run
    code, text, _ = ledger(str(out), capsys=capsys)
    assert code == 0, text
    assert "counted through the last checkpoint in the ledger (steps 0–1): the run has not finished; " \
        f"steps 2–5 not checkpointed yet, not lost (omnirl run JOB --out {out} --resume trains them)" in text
    assert "6 sample(s) trained after that checkpoint are in no saved weights (--resume trains them again)" in text
    got = account(out).to_json()
    assert {k: got[k] for k in ("counted_steps", "planned_steps", "finished", "generated", "scored", "trained",
                                "lost", "duplicated", "wasted", "pending", "trained_after_checkpoint")} == {
        "counted_steps": 2, "planned_steps": 6, "finished": False, "generated": 24, "scored": 24, "trained": 12,
        "lost": 0, "duplicated": 0, "wasted": 0, "pending": 12, "trained_after_checkpoint": 6}


def test_a_run_stopped_before_its_first_checkpoint_has_nothing_counted_and_nothing_lost(tmp_path, capsys):
    out = tmp_path / "run"
    write_run(out, steps=2, trained=1, checkpoints=[], finished=False, generated=1)
    code, text, _ = ledger(str(out), capsys=capsys)
    assert code == 0
    assert f"{out}: 0 of 2 steps counted, groups of 3" in text
    assert "no checkpoint in the ledger yet: nothing trained is saved: the run has not finished; steps 0–1 not " \
        "checkpointed yet, not lost" in text
    got = account(out).to_json()
    assert [got[k] for k in ("generated", "trained", "lost", "wasted", "pending", "trained_after_checkpoint")] == \
        [6, 0, 0, 0, 6, 6]


def test_a_resumed_run_is_counted_over_both_actor_processes(tmp_path, capsys):
    """Process a trained steps 0–2 and checkpointed 1 (killed); b resumed from 1, trained 2–3 again: step 2's
    samples are in the weights once (b's), a's step 2 is replaced, not duplicated."""
    out = tmp_path / "run"
    write_run(out, steps=4, trained=3, checkpoints=[1], generated=4)
    actor_rows(out, "b", range(2, 4), base=1, checkpoints=[3])
    a = account(out)
    assert (a.counted_steps, a.counts.samples(), a.counts.problems) == (4, (24, 24, 24, 0, 0, 0), [])


def test_a_bare_ledger_needs_the_flags_and_names_the_missing_one(tmp_path, capsys):
    out = tmp_path / "copy"
    write_run(out, steps=2, manifest=False)
    (out / "metrics.jsonl").unlink()
    code, _, err = ledger(str(out), capsys=capsys)
    assert code == 2
    assert err == (f"omnirl ledger: {out}: no manifest here (job.yaml or exports/latest/job.yaml) to read "
                   "spec.algorithm.steps from: pass --steps N (or -f JOB.yaml, the job's manifest)\n")
    code, _, err = ledger(str(out), "--steps", "2", capsys=capsys)
    assert code == 2 and "pass --group-size N" in err
    code, text, _ = ledger(str(out), "--steps", "2", "--group-size", "3", "--prompts-per-step", "2", "--json",
                           capsys=capsys)
    assert code == 0 and json.loads(text)["sources"] == {
        "steps": "--steps", "group_size": "--group-size", "prompts_per_step": "--prompts-per-step"}
    job = chaos_job(tmp_path, "given", steps=2)
    code, text, _ = ledger(str(out), "-f", str(job), "--json", capsys=capsys)
    assert code == 0 and json.loads(text)["trained"] == 12
    code, text, _ = ledger(str(out), "--steps", "3", "--group-size", "3", "--prompts-per-step", "2", capsys=capsys)
    assert code == 0 and "counted through the last checkpoint in the ledger (steps 0–1); step 2 in no checkpoint here: " \
        "not trained yet if the run has not finished, lost if it has (a finished run checkpoints its last step; put " \
        "its metrics.jsonl beside ledger/ to tell)" in text  # 2 of 3 steps checkpointed


def test_a_flag_that_contradicts_the_runs_manifest_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    write_run(out, steps=2)
    code, _, err = ledger(str(out), "--group-size", "4", capsys=capsys)
    assert (code, err) == (2, f"omnirl ledger: --group-size 4, but {out / 'job.yaml'} (the manifest this run used) "
                              "says spec.algorithm.groupSize 3: drop --group-size\n")


def test_a_read_write_once_copy_counts_what_was_trained_and_says_what_it_cannot(tmp_path, capsys):
    """The claim of a ReadWriteOnce job holds the actor's ledger only (the rollout and reward pods keep an emptyDir)."""
    out = tmp_path / "claim"
    write_run(out, steps=2)
    for f in [*(out / "ledger").glob("rollout-*"), *(out / "ledger").glob("reward-*")]:
        f.unlink()
    code, text, _ = ledger(str(out), "--json", capsys=capsys)
    got = json.loads(text)
    assert code == 0
    assert {k: got[k] for k in ("generated", "scored", "trained", "lost", "duplicated", "wasted", "uncounted")} == {
        "generated": None, "scored": None, "trained": 12, "lost": 0, "duplicated": 0, "wasted": None,
        "uncounted": ["rollout", "reward"]}
    code, text, _ = ledger(str(out), capsys=capsys)
    assert code == 0
    assert "no rollout or reward ledger here: generated, wasted, scored, trained but never scored cannot " \
        "be counted (a ReadWriteOnce claim holds the actor's ledger only" in " ".join(text.split())


def test_wrong_directories_are_one_line_with_the_fix(tmp_path, capsys):
    out = tmp_path / "run"
    write_run(out, steps=1)
    code, _, err = ledger(str(out / "ledger"), capsys=capsys)
    assert (code, err) == (2, f"omnirl ledger: {out / 'ledger'} holds the ledger files itself (rollout, reward, actor, "
                              f"checkpoints): pass the directory above it, omnirl ledger {out}\n")
    code, _, err = ledger(str(tmp_path), capsys=capsys)
    assert code == 2 and err.startswith(f"omnirl ledger: {tmp_path / 'ledger'}: no ledger files") and \
        "kubectl cp NS/J-actor-0:/var/lib/omnirl/ledger ./run/ledger" in err
    code, _, err = ledger(str(tmp_path / "nope"), capsys=capsys)
    assert code == 2 and "no such directory" in err
    # a file of the run (it said "no such directory" of a path that is there)
    code, _, err = ledger(str(out / "metrics.jsonl"), capsys=capsys)
    assert (code, err) == (2, f"omnirl ledger: {out / 'metrics.jsonl'} is a file, not a directory; pass the run "
                              f"directory that holds it, omnirl ledger {out}\n")
    (tmp_path / "notes.txt").write_text("x")
    code, _, err = ledger(str(tmp_path / "notes.txt"), capsys=capsys)
    assert code == 2 and err.startswith(f"omnirl ledger: {tmp_path / 'notes.txt'} is a file, not a directory; pass "
                                        "the run directory (omnirl run --out)"), err
    actor = out / "ledger" / "actor-a.jsonl"
    actor.write_text(actor.read_text() + '{"sample_id": "0:0:0"')  # a line being appended (or cut): skipped
    assert account(out).counts.samples() == (6, 6, 6, 0, 0, 0)
    actor.write_text(actor.read_text() + "\ngarbage\n")
    code, _, err = ledger(str(out), capsys=capsys)
    assert (code, err.split(" (")[0]) == (2, f"omnirl ledger: {actor}: line 7 is not a JSON ledger line")


def test_the_console_command_exits_3_naming_the_problem(tmp_path):
    """The real `omnirl ledger` process: a step missing from the final weights."""
    out = tmp_path / "run"
    write_run(out, steps=2, trained=0, checkpoints=[], generated=2)
    actor_rows(out, "a", range(1), base=-1, checkpoints=[0, 1])  # step 1 checkpointed, never trained
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "ledger", str(out)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == LEDGER_PROBLEMS_EXIT, done.stderr
    assert f"{out}: steps missing from the final weights: [1]" in done.stdout
    assert "PROBLEM: 6 sample(s) lost, 0 duplicated" in done.stdout


def _ledger_json(out: Path, env: dict) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "omnirl.cli", "ledger", str(out), "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode in (0, LEDGER_PROBLEMS_EXIT), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_omnirl_ledger_on_a_real_run_stopped_then_resumed(tmp_path):
    """`omnirl run` of 4 steps (checkpoint every 2) SIGTERMed once step 0 is recorded: `omnirl ledger` counts the
    steps the stop checkpointed, nothing lost; after `--resume`, all 4 steps, every sample generated, scored and
    trained once."""
    job, out = chaos_job(tmp_path, "ledger-real", steps=4), tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "operator"), str(ROOT)])}
    run = [sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), "--no-ray", "--device", "cpu"]
    with (tmp_path / "run.log").open("w") as log:
        proc = subprocess.Popen(run, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            while proc.poll() is None and not ((out / "metrics.jsonl").exists() and '"event": "step"' in
                                               (out / "metrics.jsonl").read_text()):
                time.sleep(0.5)
            proc.terminate()
            assert proc.wait(timeout=300) == INTERRUPTED_EXIT, (tmp_path / "run.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    code, got = _ledger_json(out, env)
    assert (code, got["finished"], got["planned_steps"], got["lost"], got["duplicated"], got["problems"]) == \
        (0, False, 4, 0, 0, []), got
    assert 1 <= got["counted_steps"] <= 4 and got["trained"] == got["counted_steps"] * 6, got
    done = subprocess.run([*run, "--resume"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    code, got = _ledger_json(out, env)
    assert (code, got["counted_steps"], got["finished"], got["problems"]) == (0, 4, True, []), got
    assert [got[k] for k in ("generated", "scored", "trained", "lost", "duplicated", "wasted")] == [24, 24, 24, 0, 0, 0]


def test_a_run_whose_finish_line_has_no_total_steps_is_counted_from_its_start_line(tmp_path, capsys):
    """A run directory of omnirl before 2026-12 ends its metrics.jsonl with `{"event": "finish", "time": …}`
    alone: `omnirl ledger` said only `omnirl ledger: total_steps` (a KeyError), exit 2."""
    out = tmp_path / "run"
    write_run(out, steps=2)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "finish"
    (out / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps({"event": "finish", "time": 1.0})]) + "\n")
    code, text, err = ledger(str(out), capsys=capsys)
    assert (code, err) == (0, "")
    assert text.startswith(f"{out}: 2 of 2 steps counted (0–1), groups of 3 × 2 prompts per step (from "
                           f"{out / 'job.yaml'}, {out / 'metrics.jsonl'})\n"), text
    assert "trained        12" in text and text.rstrip().endswith("ok: nothing lost, nothing duplicated")


@pytest.mark.parametrize("file,line,why", [
    ("actor-a.jsonl", '{"sample_id": "0:0:0", "run": "a", "base": -1}', "no 'step'"),
    ("checkpoints-a.jsonl", '{"checkpoint": "1", "run": "a"}', "'checkpoint' '1' is not an integer"),
    ("rollout-0.jsonl", '{"sample_id": "0-0-0", "policy_version": 0}',
     "sample id '0-0-0': expected {step}:{prompt}:{index}[r{attempt}]"),
    ("reward-0.jsonl", '["0:0:0"]', "a JSON list, not an object")], ids=["no-step", "str-checkpoint", "bad-id", "list"])
def test_a_ledger_line_of_the_wrong_shape_names_its_file_and_line(tmp_path, capsys, file, line, why):
    """A ledger line without a field the accounting reads said only `omnirl ledger: step` (a bare KeyError), one
    with another id form `omnirl ledger: sample id '0-0-0': …` naming no file."""
    out = tmp_path / "run"
    write_run(out, steps=2)
    path = out / "ledger" / file
    n = len(path.read_text().splitlines()) + 1
    with path.open("a") as f:
        f.write(line + "\n")
    code, text, err = ledger(str(out), capsys=capsys)
    assert (code, text) == (2, "")
    kind = file.split("-")[0]
    assert err == (f"omnirl ledger: {path}: line {n} is not a line of {'an' if kind[0] in 'aeiou' else 'a'} {kind} ledger ({why}): {line!r}; a ledger is "
                   "written by the roles only: an edited or damaged file cannot be accounted; copy it again\n")


def test_a_manifest_given_with_f_that_contradicts_the_runs_own_is_refused(tmp_path, capsys):
    """`-f` another job's manifest (groups of 8 × 8) for a run that holds its own (3 × 2): it was counted against
    the -f one without a word, `PROBLEM: 40 sample(s) lost`, exit 3, for a run that lost nothing."""
    out = tmp_path / "run"
    write_run(out, steps=2)
    other = ROOT / "examples" / "ocr-flowgrpo.yaml"
    code, text, err = ledger(str(out), "-f", str(other), capsys=capsys)
    assert (code, text) == (2, "")
    assert err == (f"omnirl ledger: -f {other} says spec.algorithm.groupSize 8, but {out / 'job.yaml'} (the manifest "
                   "this run used) says 3: drop -f, the run's own manifest is read\n")
    code, text, err = ledger(str(out), "-f", str(out / "job.yaml"), capsys=capsys)  # the same numbers: accepted
    assert (code, err) == (0, "") and "trained        12" in text


@pytest.mark.parametrize("steps", [3, 50])
def test_steps_that_contradict_the_runs_start_line_are_refused(tmp_path, capsys, steps):
    """A finished 4-step run counted with `--steps 3` or `--steps 50`: it was `steps missing from the final
    weights`, `PROBLEM: 18 sample(s) lost` (or 300, trained 0), exit 3, for a run that lost nothing."""
    out = tmp_path / "run"
    write_run(out, steps=4)
    code, text, err = ledger(str(out), "--steps", str(steps), capsys=capsys)
    assert (code, text) == (2, "")
    assert err == (f"omnirl ledger: --steps {steps}, but {out / 'metrics.jsonl'} (the run's last start) planned 4 "
                   "steps: drop --steps, the run's own count is read\n")
    code, text, err = ledger(str(out), "--steps", "4", capsys=capsys)  # its own count: accepted
    assert (code, err) == (0, "") and "trained        24" in text


def test_a_run_that_has_published_no_sample_yet_says_so(tmp_path, capsys):
    """`omnirl ledger` in a run's first seconds (its job.yaml and metrics.jsonl written, no ledger line yet) told
    the user to copy ledger/ off a Kubernetes claim."""
    out = tmp_path / "run"
    write_run(out, steps=2)
    for f in (out / "ledger").iterdir():
        f.unlink()
    code, text, err = ledger(str(out), capsys=capsys)
    assert (code, text) == (2, "")
    assert err == (f"omnirl ledger: {out / 'ledger'}: no ledger files yet: the run in {out} has published no sample "
                   "(a run just started writes them as its first samples are generated); try again once its first "
                   "step is on its way\n")
