"""Per-component reward metrics and the autoscaler's replica count reach Prometheus."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from omnirl.telemetry.meters import Meters


def test_component_gauges_carry_the_reward_label():
    meters = Meters("comp-test")
    try:
        meters.record_step({"reward_mean": 0.25, "reward_ocr": 0.5, "component_std_ocr": 0.125,
                            "component_missing_judge": 2.0, "scorer_replicas": 3})
        text = generate_latest(REGISTRY).decode()
    finally:
        meters.shutdown()
    lines = {}
    for line in text.splitlines():
        if 'job="comp-test"' in line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, labels = series.rstrip("}").split("{")
            kept = ",".join(kv for kv in labels.split(",") if not kv.startswith("otel_scope"))
            lines[f"{name}{{{kept}}}"] = float(value)
    assert lines['omnirl_reward_mean{job="comp-test",reward="ocr"}'] == 0.5
    assert lines['omnirl_reward_mean{job="comp-test",reward="total"}'] == 0.25
    assert lines['omnirl_reward_component_std{job="comp-test",reward="ocr"}'] == 0.125
    assert lines['omnirl_reward_component_missing{job="comp-test",reward="judge"}'] == 2.0
    assert lines['omnirl_reward_replicas{job="comp-test"}'] == 3.0
    # the component keys are not mistaken for reward names
    assert not any('reward="std_' in k or 'reward="component' in k for k in lines)
