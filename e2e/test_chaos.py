"""The short chaos run of `make test`: >= 20 faults over real jobs, nothing lost, nothing doubled."""

from __future__ import annotations

import pytest
from e2e.chaos import suite

from omnirl.evaluation.ledger import check_ledger


@pytest.mark.slow
@pytest.mark.timeout(1800)  # real jobs under faults: minutes on 2 busy cores
def test_chaos_short_run_loses_and_duplicates_nothing(tmp_path):
    total = suite(tmp_path, runs=2, seed=7, steps=6, max_kills=12)
    assert total.problems == []
    assert total.lost == 0 and total.duplicated == 0
    assert total.kills >= 20
    assert total.trained == 2 * 6 * 2 * 3  # runs × steps × prompts × group size, all in the final weights


def test_ledger_check_counts_a_doubled_and_a_partial_group(tmp_path):
    """The checker itself: a sample trained twice in the final weights and a group trained partly
    are reported (so a green chaos run means something)."""
    led = tmp_path / "ledger"
    led.mkdir()
    ids = [f"{s}:{p}:{i}" for s in range(2) for p in range(2) for i in range(3)]
    (led / "rollout-r.jsonl").write_text("".join(f'{{"sample_id": "{x}", "policy_version": 0}}\n' for x in ids))
    (led / "reward-r.jsonl").write_text("".join(f'{{"sample_id": "{x}", "reward": 1.0}}\n' for x in ids))
    rows = [{"sample_id": x, "step": int(x[0]), "run": "a", "base": -1} for x in ids if x != "1:1:2"]
    rows.append(rows[0])  # trained twice
    (led / "actor-a.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    (led / "checkpoints-a.jsonl").write_text('{"checkpoint": 1, "run": "a"}\n')
    c = check_ledger(tmp_path, total_steps=2, group_size=3, prompts_per_step=2)
    assert (c.generated, c.scored, c.trained, c.duplicated, c.lost, c.wasted) == (12, 12, 11, 1, 1, 1)
    assert any("partial" in p for p in c.problems)
