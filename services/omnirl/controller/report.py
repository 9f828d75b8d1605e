"""Where a step's numbers go: `OUT/metrics.jsonl` (one line per step and per validation), a log
line, the OpenTelemetry meters, TensorBoard event files when `spec.telemetry.tensorboard` asks, and — in a pod —
the RLJob's status (`kubectl get rlj`)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from omnirl.api.messages import TrainDone
from omnirl.api.run_dir import METRICS_FILE, read_metrics, term_means, train_reward, train_reward_std, trained_steps
from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.system.disk import append_lines
from omnirl.telemetry.meters import Meters

log = logging.getLogger("omnirl.controller")
# a step's stats key: every trained sample's seconds from generation to score, for the latency histogram
REWARD_LATENCIES = "reward_latencies"


def step_line(step: int, total: int, version: int, record: dict) -> str:
    """The console line of training step `step` (0-based: the `step` of `metrics.jsonl` and of the
    checkpoint directory `step-NNNNNN` it wrote, named on the line); `[k/N]` counts steps done.

    `record` is the step's metrics line (reward_mean, reward_std, step_seconds and images_per_second
    when measured, checkpoint when one was saved, raw_reward_mean and raw_reward_std when a reward is
    normalised). The reward is `train_reward`±`train_reward_std`: in a normalised job the raw weighted sum's
    mean and spread, marked `(raw sum; normalised for training)` (the trained rewards' mean is the same every
    step and their spread about 1). A step trained before this controller started has no step_seconds: its
    clock was the predecessor's.

    Raises:
        KeyError: as `train_reward_std`, a normalised record without `raw_reward_std`.
    """
    timing = (f"{record['step_seconds']:.1f} s  {record['images_per_second']:.1f} img/s" if "step_seconds" in record
              else "time not measured (trained before this controller started)")
    raw = " (raw sum; normalised for training)" if record.get("raw_reward_mean") is not None else ""
    line = (f"step {step} [{step + 1}/{total}] reward {train_reward(record):.3f}±{train_reward_std(record):.3f}{raw}  "
            f"{timing}  v{version}")
    if record.get("checkpoint"):
        line += f"  checkpoint {Path(record['checkpoint']).name}"
    return line + contention_note(record)


def contention_note(record: dict) -> str:
    """'  actor threads waited W s for a CPU ...' when processes holding the cores slowed the training
    phase (`train_cpu_wait_seconds` >= 1 s and >= half of `train_seconds`), else ''.

    A step several times slower than its neighbours on a shared machine did the same work: the
    note says so on its line; an idle box, or a step that waited little, adds nothing.
    """
    wait, train = record.get("train_cpu_wait_seconds"), record.get("train_seconds")
    if wait is None or train is None or wait < max(1.0, 0.5 * train):
        return ""
    return f"  actor threads waited {wait:.1f} s for a CPU (the cores were busy with other work)"


class Reporter:
    """Writes the job's progress.

    Args:
        out: run output directory.
        env: role settings (metrics port, status reporting).
        job: the RLJob (name, namespace).
    """

    def __init__(self, out: Path, env: RoleEnv, job: RLJob) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / METRICS_FILE
        self._f = append_lines(self.path)  # a line a full disk cut is dropped (system/disk.py)
        self.meters = Meters(env.job_name, env.metrics_port)
        self.tensorboard = None  # the same records as the meters', as event files (spec.telemetry.tensorboard)
        if job.spec.telemetry.tensorboard:
            from omnirl.telemetry.tensorboard import TensorBoardLog

            self.tensorboard = TensorBoardLog(out)
        self.status = None
        if env.report_status == "kubernetes":
            from omnirl.telemetry.k8s_status import StatusReporter

            self.status = StatusReporter(env.namespace, job.metadata.name)
        self.validations: list[dict] = []
        self.last_checkpoint: str | None = None
        self.last_export: str | None = None
        self.total = 0
        self.start_step = 0

    def has_validation(self, step: int) -> bool:
        """Whether `metrics.jsonl` already holds a validation round at `step` (a predecessor's)."""
        return step in {int(rec["step"]) for rec in read_metrics(self.path.parent) if rec.get("event") == "validation"}

    def has_step(self, step: int) -> bool:
        """Whether `metrics.jsonl` already holds the line of training step `step`."""
        return step in trained_steps(self.path.parent)

    def _write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._f.write(json.dumps(clean) + "\n")

    def started(self, total_steps: int, start_step: int) -> None:
        """Note the run's plan."""
        self.total, self.start_step = total_steps, start_step
        self._write({"event": "start", "time": time.time(), "total_steps": total_steps, "start_step": start_step})

    def step(self, step: int, version: int, stats: dict, done: TrainDone) -> None:
        """Record one finished training step."""
        record = {"event": "step", "step": step, "policy_version": version, "time": time.time(), **stats,
                  **done.metrics}
        latencies = record.pop(REWARD_LATENCIES, ())  # one per sample: the histogram's, too long for the line
        if "step_seconds" in stats:  # absent for a step its predecessor trained but never timed
            record["images_per_second"] = stats["samples"] / max(stats["step_seconds"], 1e-9)
        if done.checkpoint:
            self.last_checkpoint = done.checkpoint
            record["checkpoint"] = done.checkpoint
        self._write(record)
        self.meters.record_step(record, reward_latencies=latencies)
        if self.tensorboard is not None:
            self.tensorboard.record("train", record)
        log.info("%s", step_line(step, self.total, version, record))
        if self.status is not None:
            # the raw weighted sum in a normalised job: its trained mean is the same every step (REWARD column 0.050)
            self.status.report(step=step + 1, reward_mean=train_reward(stats), policy_version=version,
                               last_checkpoint=self.last_checkpoint)

    def validation(self, summary: dict) -> None:
        """Record a validation round."""
        self.validations.append(summary)
        record = {"event": "validation", "time": time.time(), **summary}
        self._write(record)
        self.meters.record_validation(summary)
        if self.tensorboard is not None:
            self.tensorboard.record("validation", record)
        exact, mean = summary["val_exact_match"], summary["val_reward_mean"]  # exact None: no OCR-rule reward
        missing = summary.get("missing", 0)  # samples whose tensors were gone: not in the means
        terms = term_means(summary)  # several rewards (the audio+video task's four): each term's mean too
        log.info("validation after %d training steps (v%d): reward %s%s%s (n=%d%s, %.1f s) grid %s",
                 summary["step"], summary["policy_version"], "—" if mean is None else f"{mean:.3f}",
                 "" if len(terms) < 2 else " = " + " ".join(f"{k} {v:.3f}" for k, v in terms.items()),
                 "" if exact is None else f" exact {exact:.3f}", summary["n"],
                 f", {missing} missing" if missing else "", summary["val_seconds"], summary["grid"])

    def stalled(self, text: str) -> None:
        """Name the roles without a recent heartbeat (log, and the RLJob's `status.stalled`)."""
        if text:
            log.warning("stalled roles: %s", text)
        if self.status is not None:
            self.status.report(stalled=text)

    def exported(self, path: Path) -> None:
        """Note an export of the run's weights (the finish record names the last one)."""
        self.last_export = str(path)
        log.info("exported %s", path)

    def finished(self) -> dict:
        """Write the run's final record — the machine-readable summary `omnirl run` prints readably — and log
        one line saying the same; returns the record.

        The record: `event` "finish", `time` (s since the epoch), `total_steps`, `start_step` (this
        controller's first step: > 0 after a resume), `last_checkpoint` (path; the run's `latest` when the
        controller sees the checkpoints, `Controller._note_latest_checkpoint`, else the last in this controller's
        step results; None when there is none) and `last_export` (path; None when this controller wrote none), `validation` (the last round's `step`, `val_reward_mean`,
        `val_exact_match`; None without validation).
        """
        last = self.validations[-1] if self.validations else None
        record = {"event": "finish", "time": time.time(), "total_steps": self.total, "start_step": self.start_step,
                  "last_checkpoint": self.last_checkpoint, "last_export": self.last_export,
                  "validation": None if last is None else {k: last.get(k) for k in
                                                           ("step", "val_reward_mean", "val_exact_match")}}
        self._write(record)
        held = "" if last is None or last["val_reward_mean"] is None else \
            f"; held-out reward {last['val_reward_mean']:.3f} at step {last['step']}"
        log.info("job finished after %d training steps%s; last export %s; its summary is the 'finish' line of %s",
                 self.total, held, self.last_export or "none", self.path)
        return record

    def close(self) -> None:
        """Close the metrics file, the meters and the TensorBoard log."""
        self._f.close()
        self.meters.shutdown()
        if self.tensorboard is not None:
            self.tensorboard.close()
