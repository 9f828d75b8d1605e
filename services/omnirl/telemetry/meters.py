"""OpenTelemetry meters exported for Prometheus (docs/architecture.md §6, docs/reference/metrics.md).

`Meters.start(port)` serves `/metrics` (prometheus_client) through OpenTelemetry's Prometheus
reader; `record_step(stats)` turns one controller step's numbers into the `omnirl_*` instruments
named in `omnirl.telemetry.names`. Port 0 records without serving (tests, `omnirl eval`).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider

from omnirl.api.run_dir import train_reward, train_reward_std
from omnirl.api.runtime import port_errors
from omnirl.telemetry import names as N

MISMATCH_PREFIX = "logprob_mismatch_step"


class Meters:
    """The job's instruments.

    Args:
        job: RLJob name, attached to every point as attribute `job`.
        port: Prometheus port; 0 = no HTTP server.
    Raises:
        ConfigError: `port` cannot be served (taken by another process, e.g. a second `omnirl run` with
            the same OMNIRL_METRICS_PORT, or out of range): the same on every restart, so the role exits 4
            with one line naming the variable instead of crashing into the failure policy's restarts.
    """

    def __init__(self, job: str, port: int = 0) -> None:
        self.reader = PrometheusMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        m = self.provider.get_meter("omnirl")
        self.attrs = {"job": job}
        self.hist = {n: m.create_histogram(n, description=N.HELP[n], explicit_bucket_boundaries_advisory=N.SECONDS_BUCKETS)
                     for n in (N.STEP_SECONDS, N.WEIGHT_SYNC_SECONDS, N.REWARD_LATENCY_SECONDS)}
        self.counters = {n: m.create_counter(n.removesuffix("_total"), description=N.HELP[n])
                         for n in (N.GROUPS_DROPPED, N.GROUPS_REFILLED, N.ZERO_STD_GROUPS, N.SAMPLES_TRAINED)}
        gauges = set(N.ALL) - set(self.hist) - set(self.counters)
        self.gauges = {n: m.create_gauge(n, description=N.HELP[n]) for n in gauges}
        if port:
            from prometheus_client import start_http_server

            with port_errors("metrics_port", port, serves="/metrics"):
                start_http_server(port)

    def record_step(self, s: dict, reward_latencies: Sequence[float] = ()) -> None:
        """Record one step's stats (keys as in metrics.jsonl; absent keys are skipped).

        Args:
            s: the step's metrics.jsonl record.
            reward_latencies: seconds from generation to score of each of the step's samples: one
                observation each in `omnirl_reward_latency_seconds`, so its quantiles are samples'
                (the step's mean, `reward_latency_seconds`, hid a slow tail).
        """
        a = self.attrs
        for phase in ("step", "rollout", "reward", "train", "sync"):
            if f"{phase}_seconds" in s:
                self.hist[N.STEP_SECONDS].record(s[f"{phase}_seconds"], {**a, "phase": "total" if phase == "step" else phase})
        if "sync_seconds" in s:
            self.hist[N.WEIGHT_SYNC_SECONDS].record(s["sync_seconds"], a)
        for latency in reward_latencies:
            self.hist[N.REWARD_LATENCY_SECONDS].record(float(latency), a)
        gauge_keys = {
            N.IMAGES_PER_SECOND: "images_per_second", N.TRAINING_STEP: "step",
            N.POLICY_VERSION: "policy_version", N.POLICY_STALENESS: "staleness_mean", N.KL: "kl",
            N.CLIP_FRACTION: "clip_fraction", N.IS_WEIGHT: "is_weight_mean", N.IS_ESS: "is_ess",
            N.RS_MASKED_FRACTION: "rs_masked_fraction", N.GRAD_NORM: "grad_norm", N.LOSS: "loss",
            N.REWARD_REPLICAS: "scorer_replicas",
            N.LOGPROB_MISMATCH_MAX: "logprob_mismatch_max",
        }
        for name, key in gauge_keys.items():
            if key in s:
                self.gauges[name].set(float(s[key]), a)
        if "reward_mean" in s:  # a normalised job's raw weighted sum: its trained mean is the same every step
            self.gauges[N.REWARD_MEAN].set(float(train_reward(s)), {**a, "reward": "total"})
        if "reward_std" in s:  # and its spread: the trained z-scores' is about 1 every step
            self.gauges[N.REWARD_STD].set(float(train_reward_std(s)), a)
        for key, value in s.items():
            if key.startswith("reward_") and key not in ("reward_mean", "reward_std", "reward_seconds",
                                                          "reward_latency_seconds"):
                self.gauges[N.REWARD_MEAN].set(float(value), {**a, "reward": key.removeprefix("reward_")})
        for prefix, name in (("component_std_", N.REWARD_COMPONENT_STD),
                             ("component_missing_", N.REWARD_COMPONENT_MISSING)):
            for key, value in s.items():
                if key.startswith(prefix):
                    self.gauges[name].set(float(value), {**a, "reward": key.removeprefix(prefix)})
        for key, value in s.items():  # FlowGRPO: logprob_mismatch_step{k}
            if key.startswith(MISMATCH_PREFIX):
                self.gauges[N.LOGPROB_MISMATCH].set(float(value), {**a, "step": key.removeprefix(MISMATCH_PREFIX)})
        counter_keys = {N.GROUPS_DROPPED: "dropped_groups", N.GROUPS_REFILLED: "refills",
                        N.ZERO_STD_GROUPS: "zero_std_groups", N.SAMPLES_TRAINED: "samples"}
        for name, key in counter_keys.items():
            if key in s:
                self.counters[name].add(int(s[key]), a)

    def record_validation(self, v: dict) -> None:
        """Record a validation round's mean reward (none when every sample of the round was missing)."""
        if v["val_reward_mean"] is not None:
            self.gauges[N.VALIDATION_REWARD].set(float(v["val_reward_mean"]), self.attrs)

    def record_queue(self, stream: str, depth: int, lag: int) -> None:
        """Queue depth (entries held) and lag (not yet delivered) of one stream."""
        self.gauges[N.QUEUE_DEPTH].set(depth, {**self.attrs, "stream": stream})
        self.gauges[N.QUEUE_LAG].set(lag, {**self.attrs, "stream": stream})

    def shutdown(self) -> None:
        """Flush and stop the meter provider."""
        self.provider.shutdown()
