"""The dashboard-panel check of `tests/dashboards.py` (the e2e test runs it on a real job's scrape):
it parses every shipped query and tells a panel with data from one without."""

from __future__ import annotations

import json

import pytest
from tests.dashboards import DASHBOARDS, SELECTOR_RE, Selector, empty_panels, panels, parse_scrape, selectors


def test_every_shipped_query_parses_into_its_selectors():
    found = panels()
    assert len(found) >= 19 and all(found.values())  # every panel queries some omnirl_* series
    for path in DASHBOARDS.glob("*.json"):
        for panel in json.loads(path.read_text())["panels"]:
            names = {m.group(1) for t in panel["targets"] for m in SELECTOR_RE.finditer(t["expr"])}
            assert {s.name for s in found[(path.name, panel["title"])]} == names
    assert found[("omnirl-pipeline.json", "variable job")] == [Selector("omnirl_training_step", ())]


def test_matchers_follow_promql():
    (sel,) = selectors('omnirl_queue_lag{job=~"$job", stream="samples"}')
    assert sel.matchers == (("job", "=~", "$job"), ("stream", "=", "samples"))
    series = ("omnirl_queue_lag", frozenset({"job": "a.b", "stream": "samples"}.items()))
    assert sel.matches(series, {"job": "a.b"})
    assert not sel.matches(series, {"job": "a"})  # anchored regex
    assert not sel.matches(("omnirl_queue_lag", frozenset({"job": "axb", "stream": "samples"}.items())), {"job": "a.b"})
    assert not sel.matches(("omnirl_queue_lag", frozenset({"job": "a.b", "stream": "requests"}.items())), {"job": "a.b"})
    (neg,) = selectors('omnirl_reward_mean{job=~"$job", reward!="total"}')
    assert neg.matches(("omnirl_reward_mean", frozenset({"job": "j", "reward": "ocr"}.items())), {"job": "j"})
    assert not neg.matches(("omnirl_reward_mean", frozenset({"job": "j", "reward": "total"}.items())), {"job": "j"})
    with pytest.raises(ValueError, match="cannot parse the matcher"):
        selectors("omnirl_x{job=~$job}")


def test_a_scrape_without_the_samples_lag_leaves_exactly_that_panel_empty():
    everything = {("omnirl-pipeline.json", t) for t in ("Reward workers (autoscaler)",)}
    lines = []
    for sels in panels().values():
        for s in sels:
            labels = {"job": "j", "stream": "requests", "reward": "ocr"}
            lines.append(f'{s.name}{{{",".join(f"{k}={json.dumps(v)}" for k, v in labels.items())}}} 1.0')
    seen = parse_scrape("\n".join(lines) + "\n")
    assert set(empty_panels(seen, {"job": "j"})) == everything
    assert empty_panels(seen, {"job": "j"})[("omnirl-pipeline.json", "Reward workers (autoscaler)")] == [
        "omnirl_queue_lag{job=~$job, stream=samples}"]
    seen.add(("omnirl_queue_lag", frozenset({"job": "j", "stream": "samples"}.items())))
    assert empty_panels(seen, {"job": "j"}) == {}
    assert len(empty_panels(set(), {"job": "j"})) == len(panels())
