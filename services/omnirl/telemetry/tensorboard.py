"""TensorBoard event files of a run (`spec.telemetry.tensorboard: true`): the numbers of each `metrics.jsonl` line.

The controller's reporter hands every step and validation record to `Meters` (Prometheus, Grafana) and, when asked,
to `TensorBoardLog`, which writes each finite number of the record as a scalar: `train/<key>` at the step's index
(`step`, 0-based), `validation/<key>` at the round's (`step`: the training steps before it). Its writer is
`torch.utils.tensorboard.SummaryWriter` (the `tensorboard` package: `pip install omnirl[tensorboard]`), imported
only when a job asks for it. View: `tensorboard --logdir OUT/tensorboard`.
"""

from __future__ import annotations

import math
from pathlib import Path

from omnirl.api.errors import ConfigError

TENSORBOARD_DIR = "tensorboard"
"""`OUT/tensorboard/`: the event files of the run (one file per controller that wrote to it)."""
SKIPPED = frozenset({"step", "event", "time"})
"""Keys that are the record's position, not a metric: the step is the x axis, the time each point's wall time."""


def require_tensorboard(field: str = "spec.telemetry.tensorboard") -> None:
    """Raise ConfigError naming `field` and the fix when the `tensorboard` package is not installed here."""
    try:
        import tensorboard  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"{field}: true needs the tensorboard package, which is not installed here ({err}); "
                          "pip install 'omnirl[tensorboard]' (in the controller's image on Kubernetes), or set it "
                          "to false") from None


class TensorBoardLog:
    """Writes the scalars of step and validation records into `run_dir/tensorboard/`.

    Args:
        run_dir: the run's output directory (OUT).
    Raises:
        ConfigError: the `tensorboard` package is missing (`require_tensorboard`).
    """

    def __init__(self, run_dir: Path) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(run_dir) / TENSORBOARD_DIR
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def record(self, prefix: str, record: dict) -> None:
        """Each finite int or float of `record` (bools and the position keys `SKIPPED` left out) as the scalar
        `<prefix>/<key>` at `record["step"]`, wall time `record["time"]` (seconds since the epoch) when present."""
        step, walltime = int(record["step"]), record.get("time")
        for key, value in record.items():
            if key in SKIPPED or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(f"{prefix}/{key}", float(value), global_step=step, walltime=walltime)
        self.writer.flush()  # a killed controller's last step is in the file too

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
