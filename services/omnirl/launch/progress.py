"""The local run's live view: a progress bar with the live reward, the final reward table and the
summary of a finished run."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from omnirl.api.run_dir import finish_covers, term_means, train_reward


class Progress:
    """Follows `metrics.jsonl` and shows steps done, the last reward and the last validation."""

    def __init__(self, metrics_path: Path, total_steps: int) -> None:
        self.path, self.offset = metrics_path, 0
        self.bar = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                console=Console(stderr=True), transient=False)
        self.task = self.bar.add_task("train", total=total_steps, info="")
        self.reward = self.val = None
        self.total = total_steps
        self.last_step = -1  # the highest step with a line in the file (an earlier launch's too)
        self.finished = False  # a `finish` record of this many steps (or more): the controller ended the job
        self.bar.start()

    def update(self) -> None:
        """Read new metric lines and refresh the bar."""
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for line in complete.splitlines():
            rec = json.loads(line)
            if rec.get("event") == "finish" and finish_covers(rec, self.total):
                self.finished = True
            if rec.get("event") == "step":
                self.last_step = max(self.last_step, rec["step"])
                self.reward = train_reward(rec)
                self.bar.update(self.task, completed=rec["step"] + 1)
            elif rec.get("event") == "validation" and rec["val_reward_mean"] is not None:  # None: every sample missing
                self.val = rec["val_reward_mean"]
        info = []
        if self.reward is not None:
            info.append(f"reward {self.reward:.3f}")
        if self.val is not None:
            info.append(f"held-out {self.val:.3f}")
        self.bar.update(self.task, info="  ".join(info))

    def close(self) -> None:
        """Final refresh and stop."""
        self.update()
        self.bar.stop()


def validation_table(records: list[dict]) -> str:
    """The held-out reward by step as a printed table ('' when the run had no validation)."""
    # a round whose every sample was missing (tensors expired) has no mean: its line counts them, no row here
    vals = [r for r in records if r.get("event") == "validation" and r["val_reward_mean"] is not None]
    if not vals:
        return ""
    steps = {r["step"]: r for r in records if r.get("event") == "step"}
    table = Table(title="held-out reward (ODE) by training step")
    # several per-sample rewards (the audio+video task's four terms): a column each, the sum first
    terms = list(term_means(vals[0])) if len(term_means(vals[0])) > 1 else []
    for col in ("step", "policy_version", "held-out reward", *terms, "exact match", "background", "train reward",
                "grid"):
        table.add_column(col)
    base = vals[0]["val_reward_mean"]
    for v in vals:
        train = train_reward(steps[v["step"] - 1]) if v["step"] - 1 in steps else None
        parts = [f"{v[f'val_reward_{t}']:.3f}" if v.get(f"val_reward_{t}") is not None else "—" for t in terms]
        table.add_row(str(v["step"]), str(v["policy_version"]), f"{v['val_reward_mean']:.3f}", *parts,
                      "—" if v.get("val_exact_match") is None else f"{v['val_exact_match']:.3f}", f"{v.get('val_background_darkness', float('nan')):.3f}",
                      "" if train is None else f"{train:.3f}", v["grid"])
    console = Console(file=io.StringIO(), width=160)
    console.print(table)
    if len(vals) > 1:  # one validation (a run stopped early) has no change to report, not "+0.000"
        console.print(f"held-out reward: {base:.3f} → {vals[-1]['val_reward_mean']:.3f} "
                      f"({vals[-1]['val_reward_mean'] - base:+.3f})")
    return console.file.getvalue()


def finish_summary(records: list[dict], job_name: str, metrics_path: Path, since: int = 0) -> str:
    """A finished run, readably: the controller's `finish` record (the last one in `records`, the lines of
    `metrics_path`) with the step and validation lines before it. '' when `records[since:]` (this launch's
    lines) holds no `finish`.

    The lines: the training steps (all of them, and this launch's share after a resume) and the seconds
    from the controller's start to its finish; the train reward of the first and last step; the held-out
    reward of the first and last validation (with exact match when an OCR-rule reward gives one); the last
    checkpoint and export as the record names them; where the machine-readable record is. (It was the controller's
    `{"event": "controller-finished", "validation": [...]}`, one raw JSON line.) The rewards are the whole
    run's, as the held-out table above it: after a `--resume` they were this launch's only (`0.491 at step 4 →
    0.491 at step 4` under a table reading 0.426 → 0.491).
    """
    ends = [i for i, r in enumerate(records) if r.get("event") == "finish" and i >= since]
    if not ends:
        return ""
    finish = records[ends[-1]]
    # this launch's first start: a restart-job writes another, and timing from it dropped the time before it
    begun = next((r for r in records[since:ends[-1]] if r.get("event") == "start"),
                 next((r for r in reversed(records[:ends[-1]]) if r.get("event") == "start"), {}))
    steps = [r for r in records[:ends[-1]] if r.get("event") == "step"]
    vals = [r for r in records[:ends[-1]] if r.get("event") == "validation" and r.get("val_reward_mean") is not None]
    first = finish.get("start_step", 0)
    total = finish.get("total_steps") or (steps[-1]["step"] + 1 if steps else first)
    grid = Table.grid(padding=(0, 2), pad_edge=True)
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    took = f"{finish['time'] - begun['time']:.0f} s" if "time" in begun and "time" in finish else ""
    if first:  # a resume: this launch trained the steps after the ones its run had
        grid.add_row("training steps", f"{total} (this run: {first} → {total}" + (f", {took})" if took else ")"))
    else:
        grid.add_row("training steps", f"{total}" + (f" in {took}" if took else ""))
    if steps:
        grid.add_row("train reward", f"{train_reward(steps[0]):.3f} at step {steps[0]['step']} → "
                                     f"{train_reward(steps[-1]):.3f} at step {steps[-1]['step']}")
    if vals:
        exact = vals[-1].get("val_exact_match")
        grid.add_row("held-out reward", f"{vals[0]['val_reward_mean']:.3f} at step {vals[0]['step']} → "
                                        f"{vals[-1]['val_reward_mean']:.3f} at step {vals[-1]['step']}"
                                        + ("" if exact is None else f" (exact match {exact:.3f})"))
    # the record's alone: a step line's is no stand-in (after a stop's checkpoint of the last step it named an
    # older scheduled one while `latest` and the export were that step, issue 31)
    grid.add_row("checkpoint", finish.get("last_checkpoint") or "none written")
    grid.add_row("export", finish.get("last_export") or "none")
    grid.add_row("record", f"{metrics_path} (its 'finish' line)")
    console = Console(file=io.StringIO(), width=200)
    console.print(f"omnirl: job {job_name} finished", style="bold")
    console.print(grid)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())
