"""The closing summary `omnirl run` prints under the held-out table (`launch.local._summary`), after a
`--resume`: the records are a real resumed run's `metrics.jsonl` (the CPU demo stopped after 3 steps,
then `--resume --steps 4`, whose actor was SIGKILLed once: a restart-job writes a second `start` line)."""

import json

from omnirl.launch.local import _summary

RUN = [
    {"event": "start", "time": 1000.0, "total_steps": 80, "start_step": 0},
    {"event": "validation", "step": 0, "policy_version": 0, "val_reward_mean": 0.4258, "val_exact_match": 0.0547,
     "val_background_darkness": 0.051, "grid": "samples/step-00000.png"},
    {"event": "step", "step": 0, "reward_mean": 0.4440, "reward_std": 0.237},
    {"event": "step", "step": 1, "reward_mean": 0.4820, "reward_std": 0.236},
    {"event": "step", "step": 2, "reward_mean": 0.4927, "reward_std": 0.228},
    # the --resume (this launch): its own start, then the restart-job's
    {"event": "start", "time": 2000.0, "total_steps": 4, "start_step": 3},
    {"event": "start", "time": 2063.0, "total_steps": 4, "start_step": 3},
    {"event": "step", "step": 3, "reward_mean": 0.5284, "reward_std": 0.289, "checkpoint": "CKPT"},
    {"event": "validation", "step": 4, "policy_version": 4, "val_reward_mean": 0.4910, "val_exact_match": 0.0859,
     "val_background_darkness": 0.057, "grid": "samples/step-00004.png"},
    {"event": "finish", "time": 2536.0, "total_steps": 4, "start_step": 3, "last_checkpoint": "CKPT",
     "last_export": "EXPORT", "validation": None},
]


def test_a_resumed_runs_summary_gives_the_whole_runs_rewards_as_the_table_above_it(tmp_path, capsys):
    """It printed `train reward 0.528 at step 3 → 0.528 at step 3` and `held-out reward 0.491 at step 4 → 0.491
    at step 4` (this launch's lines only) under a table reading `held-out reward: 0.426 → 0.491 (+0.065)`, and
    timed the launch from the restart-job's start (472 s of 536)."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUN))
    _summary(tmp_path, "ocr-awm", since=5)  # the launcher's own records begin at the resume's start line
    lines = capsys.readouterr().out.splitlines()
    assert "held-out reward: 0.426 → 0.491 (+0.065)" in lines  # the table's
    at = lines.index("omnirl: job ocr-awm finished")
    assert lines[at + 1:at + 4] == [
        "  training steps   4 (this run: 3 → 4, 536 s)",
        "  train reward     0.444 at step 0 → 0.528 at step 3",
        "  held-out reward  0.426 at step 0 → 0.491 at step 4 (exact match 0.086)"]


def test_an_earlier_launchs_finish_is_not_this_launchs_summary(tmp_path, capsys):
    """A launch whose controller did not finish prints no summary, even when an earlier launch's `finish` is in
    the file (a finished run resumed for more steps, then stopped)."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        *RUN, {"event": "start", "time": 3000.0, "total_steps": 8, "start_step": 4}]))
    _summary(tmp_path, "ocr-awm", since=len(RUN))
    out = capsys.readouterr().out
    assert "held-out reward: 0.426 → 0.491 (+0.065)" in out and "finished" not in out


def test_after_a_stop_in_the_last_step_and_a_resume_the_summary_names_the_stop_checkpoint(tmp_path, redis_url):
    """Issue 31: Ctrl-C at step 5 of 6 (the actor trains the step in hand and checkpoints it, `step-000005`, in no
    step line), then `--resume`: the controller, with nothing left to train, exports `latest` and finishes. Its
    `finish` record named no checkpoint, and the summary fell back to the last step line with one, the scheduled
    `step-000003`, while `latest` and the export were step 5. The controller runs here in-process on a real Redis,
    over the run directory the stopped run left."""
    import yaml
    from tests.controller.test_expiry_waits import _doc

    from omnirl.actor.checkpoint import save_checkpoint
    from omnirl.api.loader import job_from_dict
    from omnirl.api.runtime import RoleEnv
    from omnirl.controller.loop import Controller
    from omnirl.launch.progress import finish_summary
    from omnirl.models.registry import load_adapter
    from omnirl.transfer import TransferQueue

    name, out = "stopped-last", tmp_path / "out"
    doc = _doc(name, steps=6)
    doc["spec"]["checkpoint"] = {"everySteps": 2, "keep": 3}
    doc["spec"]["transferQueue"]["redisUrl"] = redis_url
    job = job_from_dict(doc)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    policy = load_adapter("ocr-digits", "builtin").module.state_dict()
    root = out / "checkpoints"
    for step in (1, 3, 5):  # scheduled after steps 1 and 3; the stop's after step 5
        save_checkpoint(root, step, policy=policy, trained={}, old=None, optimizer=({}, {"param_groups": [],
                        "scalars": {}}), state={"step": step, "policy_version": step + 1, "job": name,
                                                "family": "ocr-digits", "lora": False}, keep=3)
    lines = [{"event": "start", "time": 1.0, "total_steps": 6, "start_step": 0}]
    lines += [{"event": "step", "step": s, "policy_version": s + 1, "time": 2.0 + s, "reward_mean": 0.5,
               **({"checkpoint": str(root / f"step-{s:06d}")} if s in (1, 3) else {})} for s in range(6)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    queue = TransferQueue.from_url(redis_url, name)
    queue.set_json("actor_ready", {"policy_version": 6, "step": 5})
    queue.set_json("actor_state", {"step": 5, "policy_version": 6, "data_position": [0, 12]})
    env = RoleEnv(job_name=name, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=1,
                  worker_id="controller-0", out_dir=str(out), manifest=str(tmp_path / "job.yaml"))
    controller = Controller(job, env, resume=True)
    try:
        record = controller.run()
    finally:
        controller.close()
        queue.cleanup()
        queue.close()
    assert record["last_checkpoint"] == str(root / "step-000005") == str(root / (root / "latest").resolve().name)
    assert record["last_export"] == str(out / "exports" / "step-000005")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = finish_summary(records, name, out / "metrics.jsonl", since=len(lines))
    rows = {line.split()[0]: line.split()[-1] for line in summary.splitlines()[1:]}
    assert (rows["checkpoint"], rows["export"]) == (str(root / "step-000005"), str(out / "exports" / "step-000005"))
