"""An actor SIGKILLed after it wrote a step's scheduled checkpoint but before it broadcast the weights and
published the step's result: its successor resumes from that checkpoint, finds the step trained, and
publishes its result again — with the step's metrics (loss, KL), which it keeps in `kv:trained` from the
moment the step is trained.

Before the fix the result was noted only after the broadcast, so the successor published a result without
metrics and the step's line in `metrics.jsonl` had no loss (`omnirl run`, this test: step 1's line held
only the controller's numbers; `e2e/test_survive_local.py` lost the line altogether when the controller
restarted too)."""

from __future__ import annotations

import json

import pytest
from e2e.chaos import check_ledger
from e2e.test_crash_points import _run_killed


@pytest.mark.timeout(600)
def test_an_actor_killed_between_checkpoint_and_broadcast_keeps_the_steps_metrics(tmp_path):
    """`omnirl run` (real redis-server and role processes), 2 sync steps of 2 groups of 3, checkpoint every
    2 steps: the actor dies right after step 1's checkpoint. The run finishes; both steps' lines carry the
    actor's loss and KL; the ledger: 12 trained, nothing lost or duplicated; the actor restarted once."""
    # the actor's first scheduled checkpoint written in a live step (step 1: everySteps 2) is its last act
    out = _run_killed(tmp_path, ("actor", "omnirl.actor.service:ActorService._save", "after", "args[1] == 1"), steps=2)

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["action"]) for e in events] == [("actor-0", "restart-job")], events
    lines = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == "step"]
    assert [r["step"] for r in lines] == [0, 1]
    for r in lines:  # before the fix step 1's line had no loss: its result was published again without metrics
        assert isinstance(r.get("loss"), float) and isinstance(r.get("kl"), float), r
    counts = check_ledger(out, total_steps=2, group_size=3, prompts_per_step=2)
    assert (counts.lost, counts.duplicated, counts.trained, counts.problems) == (0, 0, 12, [])
