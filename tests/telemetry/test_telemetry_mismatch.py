"""The per-denoising-step log-prob mismatch reaches Prometheus as omnirl_logprob_mismatch{step}."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY, generate_latest

from omnirl.telemetry import names as N
from omnirl.telemetry.meters import Meters


def test_mismatch_per_step_and_max_are_exported():
    meters = Meters("mismatch-job")
    try:
        meters.record_step({"logprob_mismatch_step2": 3e-5, "logprob_mismatch_step3": 5e-5,
                            "logprob_mismatch_max": 2e-4, "loss": 0.5})
        text = generate_latest(REGISTRY).decode()
    finally:
        meters.shutdown()
    values = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(omnirl_logprob_mismatch\w*)\{(.*)\} (\S+)", line)
        if m and 'job="mismatch-job"' in m.group(2):
            step = re.search(r'step="(\d+)"', m.group(2))
            values[(m.group(1), step.group(1) if step else None)] = float(m.group(3))
    assert values == {(N.LOGPROB_MISMATCH, "2"): 3e-5, (N.LOGPROB_MISMATCH, "3"): 5e-5,
                      (N.LOGPROB_MISMATCH_MAX, None): 2e-4}
