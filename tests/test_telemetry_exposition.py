"""What Prometheus scrapes: the seconds histograms have buckets at the scale of what they measure, and
every family has a help text.

With OpenTelemetry's default boundaries (0, 5, 10, 25, … 10000: milliseconds) every reward latency
(about 1 s) and weight sync (0.2–1 s) fell in the one bucket (0, 5], and the pipeline dashboard's
`histogram_quantile(0.5, …)` / `(0.95, …)` read 2.5 s and 4.75 s whatever the job did.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from omnirl.telemetry.meters import Meters


def _quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) pairs: linear within the bucket."""
    total = buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= q * total:
            return lower + (upper - lower) * (q * total - below) / (count - below)
        lower, below = upper, count
    raise AssertionError("unreachable: the last bucket holds every observation")


def test_reward_latency_and_sync_quantiles_land_near_the_recorded_seconds():
    meters = Meters("bucket-test")
    try:
        for latency, sync, step in ((0.6, 0.2, 9.0), (0.8, 0.3, 11.0)):
            meters.record_step({"reward_latency_seconds": latency, "sync_seconds": sync, "step_seconds": step})
        text = generate_latest(REGISTRY).decode()
    finally:
        meters.shutdown()

    def buckets(name: str, extra: str = "") -> list[tuple[float, float]]:
        rows = []
        for line in text.splitlines():
            if line.startswith(f"{name}_bucket{{") and 'job="bucket-test"' in line and extra in line:
                le = line.split('le="')[1].split('"')[0]
                if le != "+Inf":
                    rows.append((float(le), float(line.rsplit(" ", 1)[1])))
        return sorted(rows)

    latency = _quantile(buckets("omnirl_reward_latency_seconds"), 0.5)
    sync = _quantile(buckets("omnirl_weight_sync_seconds"), 0.95)
    step = _quantile(buckets("omnirl_step_seconds", 'phase="total"'), 0.5)
    assert 0.5 <= latency <= 1.0, latency  # both observations in (0.5, 1]: was 2.5 (the (0, 5] bucket's middle)
    assert 0.25 <= sync <= 0.5, sync
    assert 5.0 <= step <= 25.0, step


def test_every_exported_family_has_a_help_text():
    """Prometheus' `# HELP omnirl_x` lines were empty: Grafana's metric browser said nothing about them."""
    from omnirl.telemetry import names

    assert set(names.HELP) == set(names.ALL)
    meters = Meters("help-test")
    try:
        meters.record_step({"reward_mean": 0.5, "step_seconds": 1.0, "samples": 4})
        helps = {line.split()[2]: line.split(maxsplit=3)[3:] for line in generate_latest(REGISTRY).decode().splitlines()
                 if line.startswith("# HELP omnirl_")}
    finally:
        meters.shutdown()
    assert helps and all(text and text[0].strip() for text in helps.values()), helps


def test_a_metrics_port_taken_by_another_process_is_a_configuration_error_naming_the_variable():
    """A second `omnirl run` with the same OMNIRL_METRICS_PORT: the controller crashed on `OSError: [Errno
    98] Address already in use` (a traceback), was restarted maxRestarts times with the whole job and the
    run ended exit 1 without naming the variable. Now it is a ConfigError (the role exits 4, once)."""
    import socket

    import pytest

    from omnirl.api.errors import ConfigError

    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=rf"^OMNIRL_METRICS_PORT {port}: .*Address already in use.*; "
                                              r"set OMNIRL_METRICS_PORT to a free port"):
            Meters("port-taken", port)
    finally:
        held.close()
    with pytest.raises(ConfigError, match=r"^OMNIRL_METRICS_PORT 70000: .*; set OMNIRL_METRICS_PORT to a free port"):
        Meters("port-out-of-range", 70000)
