"""Every panel of every shipped Grafana dashboard gets data from a short real job: `omnirl run` (two
FlowGRPO steps, the OCR reward, validation, a real redis-server) with the controller's `/metrics`
scraped until it exits; each panel's selectors, labels included, must match a served series
(`tests/dashboards.py`). A panel the short job cannot fill is listed in `EXEMPT` with the reason."""

from __future__ import annotations

import pytest
import yaml
from e2e.test_local_job import tiny_job
from tests.dashboards import empty_panels, run_scraped

# (dashboard file, panel title) → why this job cannot fill it. None today: FlowGRPO reports every
# actor gauge, the controller every queue, reward and step meter.
EXEMPT: dict[tuple[str, str], str] = {}


@pytest.mark.slow
def test_every_dashboard_panel_gets_data_from_a_short_job(tmp_path, redis_url):
    name = "dashboards"
    job = tiny_job(tmp_path, name, redis_url, steps=2)  # step 0's numbers are scraped while step 1 runs
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["validation"]["maxPrompts"] = 2
    job.write_text(yaml.safe_dump(doc))
    code, log, seen, values = run_scraped(job, tmp_path / "out", "--no-ray", timeout_s=420)
    assert code == 0, log[-4000:]
    # the last scrape (every 0.2 s) may come before the last step's update: the controller exits right after it
    step = values["omnirl_training_step"]
    assert step in (0, 1) and values["omnirl_samples_trained_total"] == (step + 1) * 2 * 3
    # one latency observation per trained sample (it was one per step: the step's mean, so p95 hid slow samples)
    assert values["omnirl_reward_latency_seconds_count"] == values["omnirl_samples_trained_total"]
    empty = empty_panels(seen, {"job": name})
    assert set(empty) == set(EXEMPT), f"panels without data (missing series): {empty}"
    # the queue panels: each data stream's depth and lag, recorded after the step
    for meter in ("omnirl_queue_depth", "omnirl_queue_lag"):
        streams = {dict(labels).get("stream") for n, labels in seen if n == meter}
        assert streams == {"requests", "samples", "scores"}, (meter, streams)
