"""What Prometheus scrapes: the seconds histograms have buckets at the scale of what they measure, and
every family has a help text.

With OpenTelemetry's default boundaries (0, 5, 10, 25, … 10000: milliseconds) every reward latency
(about 1 s) and weight sync (0.2–1 s) fell in the one bucket (0, 5], and the pipeline dashboard's
`histogram_quantile(0.5, …)` / `(0.95, …)` read 2.5 s and 4.75 s whatever the job did.
"""

from __future__ import annotations

from pathlib import Path

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
            meters.record_step({"sync_seconds": sync, "step_seconds": step}, reward_latencies=[latency])
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


def _series(job: str, name: str) -> dict[str, float]:
    """`name`'s samples of `job` in the exposition: label text (without job) → value."""
    out = {}
    for line in generate_latest(REGISTRY).decode().splitlines():
        if line.startswith(name) and f'job="{job}"' in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_the_reward_latency_histogram_holds_each_samples_latency(tmp_path):
    """A step of 20 samples, 18 scored 0.5 s after generation and two 40 s: the histogram holds 20
    observations and its p95 is in the slow samples' bucket (25, 50]. It held the step's mean (4.45 s),
    one observation per step, and its p95 read 4.9 s (the (2.5, 5] bucket) whatever the tail. The per-sample list stays out
    of metrics.jsonl, whose line keeps the mean."""
    from omnirl.api.loader import load_rljob
    from omnirl.api.messages import TrainDone
    from omnirl.api.run_dir import read_metrics
    from omnirl.api.runtime import RoleEnv
    from omnirl.controller.report import REWARD_LATENCIES, Reporter

    job = load_rljob(str(Path(__file__).resolve().parents[2] / "examples" / "ocr-nft.yaml"))
    env = RoleEnv(job_name="latency-test", redis_url="redis://127.0.0.1:1/0", weight_sync_host="127.0.0.1",
                  weight_sync_port=1, worker_id="controller-0", out_dir=str(tmp_path))
    latencies = [0.5] * 18 + [40.0] * 2
    reporter = Reporter(tmp_path, env, job)
    try:
        reporter.started(1, 0)
        reporter.step(0, 1, {"reward_mean": 0.5, "reward_std": 0.1, "samples": 20, "step_seconds": 50.0,
                             "reward_latency_seconds": sum(latencies) / 20, REWARD_LATENCIES: latencies},
                      TrainDone(step=0, policy_version=1, metrics={}))
        count = _series("latency-test", "omnirl_reward_latency_seconds_count")
        buckets = sorted((float(k.split('le="')[1].split('"')[0]), v)
                         for k, v in _series("latency-test", "omnirl_reward_latency_seconds_bucket").items()
                         if 'le="+Inf"' not in k)
    finally:
        reporter.close()
    assert list(count.values()) == [20.0]
    assert 25.0 <= _quantile(buckets, 0.95) <= 50.0, buckets
    assert 0.25 <= _quantile(buckets, 0.5) <= 0.5, buckets
    line = read_metrics(tmp_path)[-1]
    assert REWARD_LATENCIES not in line and line["reward_latency_seconds"] == 4.45


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


def test_a_health_port_taken_by_another_process_is_a_configuration_error_naming_the_variable():
    """`omnirl role` with OMNIRL_HEALTH_PORT on a port another process listens on crashed with grpc's
    `RuntimeError: Failed to bind to address [::]:N; set GRPC_VERBOSITY=debug ...` (exit 1, restarted);
    a second role's health server on the same port bound silently (grpc's SO_REUSEPORT) and the probes
    went to either process. Both are now the ConfigError of OMNIRL_METRICS_PORT's kind."""
    import socket

    import pytest

    from omnirl.api.errors import ConfigError
    from omnirl.telemetry.health import HealthServer

    fix = r"; set OMNIRL_HEALTH_PORT to a free port \(or unset it: no gRPC health probes\)$"
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^OMNIRL_HEALTH_PORT {port}: cannot listen on \[::\]:{port} \(taken "
                                              rf"by another process.*\){fix}"):
            HealthServer(port)
    first = HealthServer(0)
    try:
        with pytest.raises(ConfigError, match=rf"^OMNIRL_HEALTH_PORT {first.port}: cannot listen .*{fix}"):
            HealthServer(first.port)
    finally:
        first.stop()
