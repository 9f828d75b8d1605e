"""`omnirl ledger OUT`: account a run's training samples from its sample ledgers (`api/ledger.py`).

The ledgers (`OUT/ledger/`): `rollout-*.jsonl` and `reward-*.jsonl`, one line per sample a rollout or
reward worker published; `actor-*.jsonl`, one line per sample the actor trained (`step`, the actor
process's `run`, the checkpoint step it resumed from, `base`); `checkpoints-*.jsonl`, one line per
checkpoint (`checkpoint` step, `run`). The samples in the weights a run leaves are those of its
lineage (:func:`final_lineage`): the last actor process that checkpointed the counted step, and
before its `base` the process that wrote that checkpoint, recursively.

Counts (training samples only; validation ids `val…` are left out): generated, scored, trained
(distinct ids); duplicated (a second line of an id in the rollout, reward or trained-lineage rows);
lost (trained but never scored, the missing members of partial groups in the weights, and every
sample of a counted step missing from them); wasted (generated for a counted step, never in the
weights). The same numbers `make chaos` (`e2e/chaos.py`) and the survive tests assert.

Which steps are counted: all the run's steps when its `metrics.jsonl` says it finished (or the
ledger holds a checkpoint of its last step); else those through the last checkpoint in the ledger
(a stopped, crashed, resumed-and-running run: its later steps are not lost, they are not checkpointed
yet, and samples generated for them are `pending`, not wasted).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from omnirl.api.exits import DONE, LEDGER_PROBLEMS_EXIT
from omnirl.api.ids import parse_sample_id
from omnirl.api.run_dir import METRICS_FILE, RUN_MANIFESTS, read_metrics, run_manifest
from omnirl.api.run_dir import finished as run_finished

LEDGER_DIR = "ledger"
LEDGERS = {"rollout": "rollout-*.jsonl", "reward": "reward-*.jsonl", "actor": "actor-*.jsonl",
           "checkpoints": "checkpoints-*.jsonl"}
"""Each ledger kind → its files' glob in `OUT/ledger/` (one file per worker or pod)."""


@dataclass
class LedgerCounts:
    """The sample numbers of one run (see the module doc). `uncounted` names the ledger kinds absent
    (`rollout`, `reward`): their numbers (generated, scored, wasted; never-scored) are 0 and not checked."""

    generated: int = 0
    scored: int = 0
    trained: int = 0
    lost: int = 0
    duplicated: int = 0
    wasted: int = 0
    problems: list[str] = field(default_factory=list)
    uncounted: list[str] = field(default_factory=list)

    def samples(self) -> tuple[int, int, int, int, int, int]:
        """(generated, scored, trained, lost, duplicated, wasted): what a test of one run compares."""
        return self.generated, self.scored, self.trained, self.lost, self.duplicated, self.wasted

    def line(self) -> str:
        """`generated=G scored=S trained=T lost=L duplicated=D wasted=W`."""
        return (f"generated={self.generated} scored={self.scored} trained={self.trained} "
                f"lost={self.lost} duplicated={self.duplicated} wasted={self.wasted}")


def ledger_rows(run_dir: Path, kind: str) -> list[dict]:
    """Every line of the `kind` ledgers (`LEDGERS`) of `run_dir/ledger/`, file by file in name order,
    as written; a last line without its newline (being appended now, or cut by a full disk) is skipped.

    Raises:
        ValueError: a whole line that is not JSON, or not a `kind` line (`FIELDS`: a field missing or of
            another type, a training sample id of another form); names the file and line.
        OSError: a ledger file cannot be read.
    """
    rows = []
    for f in sorted((Path(run_dir) / LEDGER_DIR).glob(LEDGERS[kind])):
        text = f.read_text()
        for n, line in enumerate(text[: text.rfind("\n") + 1].splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{f}: line {n} is not a JSON ledger line ({err}): {line[:80]!r}; {_DAMAGED}") from err
            why = _malformed(kind, row)
            if why:  # read as it is, a missing field was a bare KeyError ('omnirl ledger: run')
                raise ValueError(f"{f}: line {n} is not a line of {'an' if kind[0] in 'aeiou' else 'a'} {kind} ledger ({why}): {line[:80]!r}; {_DAMAGED}")
            rows.append(row)
    return rows


_DAMAGED = "a ledger is written by the roles only: an edited or damaged file cannot be accounted; copy it again"
FIELDS = {"rollout": {"sample_id": str}, "reward": {"sample_id": str},
          "actor": {"sample_id": str, "step": int, "run": str, "base": int},
          "checkpoints": {"checkpoint": int, "run": str}}
"""Each ledger kind → the fields its lines must have and their type (what the roles write)."""


def _malformed(kind: str, row: object) -> str:
    """Why `row` is not a `kind` ledger line ('' when it is one): a field missing or of another type, or a
    training sample id not of the form `{step}:{prompt}:{index}[r{attempt}]`."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    for name, typ in FIELDS[kind].items():
        if name not in row:
            return f"no {name!r}"
        if not isinstance(row[name], typ) or isinstance(row[name], bool):
            return f"{name!r} {row[name]!r} is not {'an integer' if typ is int else 'a string'}"
    sid = row.get("sample_id")
    if isinstance(sid, str) and not sid.startswith("val"):
        try:
            parse_sample_id(sid)
        except ValueError as err:
            return str(err)
    return ""


def _present(run_dir: Path, kind: str) -> bool:
    return any((Path(run_dir) / LEDGER_DIR).glob(LEDGERS[kind]))


def final_lineage(run_dir: Path, total_steps: int) -> list[dict]:
    """The actor ledger rows whose updates are in the weights of step `total_steps - 1`'s checkpoint.

    Every actor process (`run`) that resumed from checkpoint step `base` contributes its rows with
    step > base; the rows up to `base` come from the run that wrote that checkpoint, recursively.
    The final run is the last one that checkpointed step `total_steps - 1`; [] when none did.

    Raises:
        ValueError: a run resumed from a checkpoint step no run of the ledger wrote.
    """
    rows = ledger_rows(run_dir, "actor")
    ckpts = ledger_rows(run_dir, "checkpoints")
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    finals = [c["run"] for c in ckpts if c["checkpoint"] == total_steps - 1]
    if not finals:
        return []
    lineage, run, upto = [], finals[-1], total_steps - 1
    while run is not None:
        mine = [r for r in by_run.get(run, []) if r["step"] <= upto]
        lineage += mine
        base = mine[0]["base"] if mine else -1
        if base < 0:
            break
        writers = [c["run"] for c in ckpts if c["checkpoint"] == base and c["run"] != run]
        if not writers:
            raise ValueError(f"{Path(run_dir) / LEDGER_DIR}: actor run {run} resumed from checkpoint step {base}, "
                             "which no checkpoints-*.jsonl of this ledger records (a ledger file missing from the copy?)")
        run, upto = writers[-1], base
    return lineage


def group_of(sample_id: str) -> str:
    """`{step}:{prompt}:{index}[r{attempt}]` → its group `{step}:{prompt}[r{attempt}]`.

    Raises:
        ValueError: not a training sample id.
    """
    ref = parse_sample_id(sample_id)
    return f"{ref.step}:{ref.prompt}" + (f"r{ref.attempt}" if ref.attempt else "")


def check_ledger(run_dir: Path, total_steps: int, group_size: int, prompts_per_step: int) -> LedgerCounts:
    """Count the training samples of steps 0 … `total_steps - 1` in `run_dir/ledger/` (module doc):
    the weights counted are those of the checkpoint of step `total_steps - 1`.

    Args:
        run_dir: a directory holding `ledger/`.
        total_steps: the steps counted (a missing one is `group_size * prompts_per_step` samples lost).
        group_size, prompts_per_step: `spec.algorithm.groupSize`, `promptsPerStep`.
    Raises:
        ValueError: a lineage that names a checkpoint no ledger line records; a sample id not of
            the training form; a ledger line that is not JSON.
        OSError: a ledger file that cannot be read.
    """
    gen = [r["sample_id"] for r in ledger_rows(run_dir, "rollout") if not r["sample_id"].startswith("val")]
    scored = [r["sample_id"] for r in ledger_rows(run_dir, "reward") if not r["sample_id"].startswith("val")]
    lineage = final_lineage(run_dir, total_steps)
    trained = [r["sample_id"] for r in lineage]
    c = LedgerCounts(generated=len(set(gen)), scored=len(set(scored)), trained=len(set(trained)),
                     uncounted=[k for k in ("rollout", "reward") if not _present(run_dir, k)])
    c.duplicated = (len(gen) - len(set(gen))) + (len(scored) - len(set(scored))) + (len(trained) - len(set(trained)))
    # without a reward ledger (a ReadWriteOnce claim's copy) nothing can be told unscored
    never_scored = set() if "reward" in c.uncounted else set(trained) - set(scored)
    groups = Counter(group_of(sid) for sid in trained)
    partial = {g: n for g, n in groups.items() if n != group_size}
    steps = {r["step"] for r in lineage}
    missing_steps = [s for s in range(total_steps) if s not in steps]
    c.lost = len(never_scored) + sum(group_size - n for n in partial.values() if n < group_size) \
        + len(missing_steps) * group_size * prompts_per_step
    counted = {s for s in set(gen) if parse_sample_id(s).step < total_steps}
    c.wasted = len(counted - set(trained))
    if never_scored:
        c.problems.append(f"{run_dir}: trained but never scored: {sorted(never_scored)[:3]}")
    if partial:
        c.problems.append(f"{run_dir}: partial groups in the final weights: {partial}")
    if missing_steps:
        c.problems.append(f"{run_dir}: steps missing from the final weights: {missing_steps}")
    return c


@dataclass
class Accounting:
    """`omnirl ledger`'s answer: the counts and what they were counted against.

    Attributes:
        counted_steps: steps 0 … counted_steps − 1 were counted (0: no checkpoint yet).
        planned_steps: the run's total training steps.
        finished: the run finished (its `metrics.jsonl`), False when not, None when the directory
            holds no `metrics.jsonl` to tell.
        pending: distinct training samples generated for steps after the counted ones (in play, not wasted).
        trained_after: distinct samples trained after the last checkpoint (in no saved weights yet;
            `--resume` trains them again).
        sources: parameter → where its value came from (a flag, a file).
    """

    run_dir: Path
    counts: LedgerCounts
    counted_steps: int
    planned_steps: int
    finished: bool | None
    group_size: int
    prompts_per_step: int
    pending: int = 0
    trained_after: int = 0
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing duplicated."""
        return self.counts.lost == 0 and self.counts.duplicated == 0 and not self.counts.problems

    def to_json(self) -> dict:
        """`omnirl ledger --json`'s object; a count whose ledger is absent (`uncounted`) is null."""
        c = self.counts
        absent = set(c.uncounted)
        return {"run_dir": str(self.run_dir), "counted_steps": self.counted_steps,
                "planned_steps": self.planned_steps, "finished": self.finished,
                "group_size": self.group_size, "prompts_per_step": self.prompts_per_step, "sources": self.sources,
                "generated": None if "rollout" in absent else c.generated,
                "scored": None if "reward" in absent else c.scored, "trained": c.trained, "lost": c.lost,
                "duplicated": c.duplicated, "wasted": None if "rollout" in absent else c.wasted,
                "pending": None if "rollout" in absent else self.pending, "trained_after_checkpoint": self.trained_after,
                "uncounted": c.uncounted, "problems": c.problems, "ok": self.ok}


def _ledger_dir(run_dir: Path) -> Path:
    """`run_dir/ledger`, refused with the fix when it is not there or holds no ledger file."""
    if run_dir.is_file():  # `omnirl ledger OUT/metrics.jsonl`: "no such directory" named a path that is there
        parent = run_dir.parent
        above = (f"pass the run directory that holds it, omnirl ledger {parent}" if (parent / LEDGER_DIR).is_dir()
                 else f"pass the run directory (omnirl run --out) or a directory holding a {LEDGER_DIR}/ copied off "
                      "the job's claim")
        raise FileNotFoundError(f"{run_dir} is a file, not a directory; {above}")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such directory; pass the run directory (omnirl run --out) or a "
                                f"directory holding a {LEDGER_DIR}/ copied off the job's claim")
    here = [k for k, pattern in LEDGERS.items() if any(run_dir.glob(pattern))]
    led = run_dir / LEDGER_DIR
    if here and not led.is_dir():
        raise ValueError(f"{run_dir} holds the ledger files itself ({', '.join(here)}): pass the directory above it, "
                         f"omnirl ledger {run_dir.parent}")
    if not led.is_dir() or not any(any(led.glob(p)) for p in LEDGERS.values()):
        if (run_dir / METRICS_FILE).is_file() or run_manifest(run_dir) is not None:  # a run of omnirl run --out
            raise FileNotFoundError(f"{led}: no ledger files yet: the run in {run_dir} has published no sample (a "
                                    "run just started writes them as its first samples are generated); try again "
                                    "once its first step is on its way")
        raise FileNotFoundError(f"{led}: no ledger files (rollout-*.jsonl, reward-*.jsonl, actor-*.jsonl, "
                                "checkpoints-*.jsonl); pass the run directory of omnirl run --out, or copy ledger/ off "
                                "the job's claim: kubectl cp NS/J-actor-0:/var/lib/omnirl/ledger ./run/ledger")
    return led


def _manifest(run_dir: Path, job: str | None) -> tuple[dict | None, str]:
    """The `spec.algorithm` numbers of `-f JOB` or of the manifest the run directory holds (`run_manifest`), and its path."""
    from omnirl.api.loader import load_rljob  # pydantic: only when a manifest is read

    path = Path(job) if job else run_manifest(run_dir)
    if path is None:
        return None, ""
    algo = load_rljob(path).spec.algorithm
    return {"steps": algo.steps, "group_size": algo.groupSize, "prompts_per_step": algo.promptsPerStep}, str(path)


FLAGS = {"steps": ("--steps", "spec.algorithm.steps"), "group_size": ("--group-size", "spec.algorithm.groupSize"),
         "prompts_per_step": ("--prompts-per-step", "spec.algorithm.promptsPerStep")}


def account(run_dir: str | Path, steps: int | None = None, group_size: int | None = None,
            prompts_per_step: int | None = None, job: str | None = None) -> Accounting:
    """Account `run_dir`'s samples (module doc): its parameters from the flags given, else its
    `metrics.jsonl` (the planned steps of its last start) and the manifest it holds (or `job`).

    Args:
        run_dir: a run directory of `omnirl run`, or a directory holding a `ledger/` copied off a claim.
        steps, group_size, prompts_per_step: flags; `steps` is the run's planned total.
        job: a manifest to read the three from (`-f`).
    Raises:
        FileNotFoundError: no ledger there; `job` does not exist.
        ValueError: a parameter found nowhere (names the flag), a flag or `job` that contradicts the run's own
            manifest (groupSize, promptsPerStep), a value < 1, a ledger naming a checkpoint it does not record.
        omnirl.api.errors.ManifestError: the manifest does not validate.
    """
    run_dir = Path(run_dir)
    _ledger_dir(run_dir)
    flags = {"steps": steps, "group_size": group_size, "prompts_per_step": prompts_per_step}
    for name, value in flags.items():
        if value is not None and value < 1:
            raise ValueError(f"{FLAGS[name][0]} {value}: must be >= 1")
    spec, spec_path = _manifest(run_dir, job)
    own, own_path = _manifest(run_dir, None) if job else (spec, spec_path)  # the manifest the run used, if here
    for name in ("group_size", "prompts_per_step") if job and own is not None else ():
        if own[name] != spec[name]:  # else counted against another job's groups: hundreds of samples "lost"
            raise ValueError(f"-f {job} says {FLAGS[name][1]} {spec[name]}, but {own_path} (the manifest this run "
                             f"used) says {own[name]}: drop -f, the run's own manifest is read")
    records = read_metrics(run_dir) if (run_dir / METRICS_FILE).is_file() else None
    starts = [r for r in records or [] if r.get("event") in ("start", "finish")]
    finished = None if records is None else run_finished(run_dir)
    # the planned steps: the last start's (a finish line of a run before 2026-12 has no total_steps)
    planned_at = [r for r in starts if r["event"] == "start" and "total_steps" in r]
    values, sources = {}, {}
    for name, value in flags.items():
        if value is not None:
            if name == "steps" and planned_at and int(planned_at[-1]["total_steps"]) != value:
                # a finished run held to another count: every step past its own "lost", or a checkpoint never written
                raise ValueError(f"--steps {value}, but {run_dir / METRICS_FILE} (the run's last start) planned "
                                 f"{planned_at[-1]['total_steps']} steps: drop --steps, the run's own count is read")
            if own is not None and name != "steps" and own[name] != value:
                raise ValueError(f"{FLAGS[name][0]} {value}, but {own_path} (the manifest this run used) says "
                                 f"{FLAGS[name][1]} {own[name]}: drop {FLAGS[name][0]}")
            values[name], sources[name] = value, FLAGS[name][0]
        elif name == "steps" and planned_at:  # `omnirl run --steps N` is in the start record, not in job.yaml
            values[name], sources[name] = int(planned_at[-1]["total_steps"]), str(run_dir / METRICS_FILE)
        elif spec is not None:
            values[name], sources[name] = spec[name], spec_path
        else:
            raise ValueError(f"{run_dir}: no manifest here ({' or '.join(RUN_MANIFESTS)}) to read {FLAGS[name][1]} "
                             f"from: pass {FLAGS[name][0]} N (or -f JOB.yaml, the job's manifest)")
    planned, g, p = values["steps"], values["group_size"], values["prompts_per_step"]
    ckpts = [int(c["checkpoint"]) for c in ledger_rows(run_dir, "checkpoints")]
    last = max(ckpts, default=-1)
    # a finished run (or one whose last step is checkpointed) is held to every planned step; an unfinished
    # one to the steps it has checkpointed: the rest are not trained yet, not lost
    counted = planned if finished or last >= planned - 1 else last + 1
    counts = check_ledger(run_dir, counted, g, p)
    gen = {r["sample_id"] for r in ledger_rows(run_dir, "rollout") if not r["sample_id"].startswith("val")}
    pending = sum(parse_sample_id(s).step >= counted for s in gen)
    after = {r["sample_id"] for r in ledger_rows(run_dir, "actor") if r["step"] >= counted}
    return Accounting(run_dir=run_dir, counts=counts, counted_steps=counted, planned_steps=planned, finished=finished,
                      group_size=g, prompts_per_step=p, pending=pending, trained_after=len(after), sources=sources)


def _span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}–{last}"


def _steps(n: int) -> str:
    return "no step" if n == 0 else _span(0, n - 1)


def describe(a: Accounting) -> list[str]:
    """The lines above and below `omnirl ledger`'s table: what was counted, against what, and the verdict."""
    c = a.counts
    src = sorted(set(a.sources.values()))
    span = f" ({_steps(a.counted_steps).split(' ', 1)[1]})" if a.counted_steps else ""
    head = (f"{a.run_dir}: {a.counted_steps} of {a.planned_steps} steps counted{span}, groups of {a.group_size} × "
            f"{a.prompts_per_step} prompts per step (from {', '.join(src)})")
    lines = [head]
    if a.counted_steps < a.planned_steps:
        first = (f"counted through the last checkpoint in the ledger ({_steps(a.counted_steps)})" if a.counted_steps
                 else "no checkpoint in the ledger yet: nothing trained is saved")
        rest = _span(a.counted_steps, a.planned_steps - 1)
        them = "it" if rest.startswith("step ") else "them"
        if a.finished is False:
            lines.append(f"{first}: the run has not finished; {rest} not checkpointed yet, not lost "
                         f"(omnirl run JOB --out {a.run_dir} --resume trains {them})")
        else:  # a bare ledger: no metrics.jsonl to tell a stopped run from a finished one that lost its last steps
            lines.append(f"{first}; {rest} in no checkpoint here: not trained yet if the run has not finished, lost "
                         f"if it has (a finished run checkpoints its last step; put its {METRICS_FILE} beside "
                         f"{LEDGER_DIR}/ to tell)")
        if a.trained_after:
            lines.append(f"{a.trained_after} sample(s) trained after that checkpoint are in no saved weights "
                         "(--resume trains them again)")
    elif a.finished is False:  # every step checkpointed, the controller's end (final validation, export) not written
        lines.append(f"the run has not finished (no finish line in {METRICS_FILE} after its last start): every planned "
                     f"step is trained and checkpointed; omnirl run JOB --out {a.run_dir} --resume writes the rest")
    if c.uncounted:
        lines.append(f"no {' or '.join(c.uncounted)} ledger here: {', '.join(_unknown(c.uncounted))} cannot be counted "
                     "(a ReadWriteOnce claim holds the actor's ledger only: the rollout and reward pods keep an "
                     "emptyDir; use a ReadWriteMany storage class to account them). What was trained is counted.")
    lines += c.problems
    if a.ok:
        lines.append("ok: nothing lost, nothing duplicated")
    else:
        lines.append(f"PROBLEM: {c.lost} sample(s) lost, {c.duplicated} duplicated")
    return lines


def _unknown(kinds: list[str]) -> list[str]:
    return (["generated", "wasted"] if "rollout" in kinds else []) + \
        (["scored", "trained but never scored"] if "reward" in kinds else [])


def main(args: argparse.Namespace) -> int:
    """`omnirl ledger OUT [--json] [--steps N --group-size G --prompts-per-step P | -f JOB]`.

    Returns:
        `DONE` nothing lost or duplicated; `LEDGER_PROBLEMS_EXIT` something was (the problems printed).
    Raises:
        as :func:`account` (the CLI prints one line and exits `USAGE_EXIT`).
    """
    import sys

    a = account(args.run_dir, steps=args.steps, group_size=args.group_size, prompts_per_step=args.prompts_per_step,
                job=args.job)
    if args.json:
        sys.stdout.write(json.dumps(a.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render(a))
    return DONE if a.ok else LEDGER_PROBLEMS_EXIT


def render(a: Accounting) -> str:
    """The human form: the lines of :func:`describe` around a table of the counts."""
    import io

    from rich.console import Console
    from rich.table import Table

    lines, data = describe(a), a.to_json()
    table = Table(box=None, pad_edge=False)
    for col, just in (("samples", "left"), ("count", "right"), ("", "left")):
        table.add_column(col, justify=just)
    meaning = {"generated": "distinct training samples the rollout workers published",
               "scored": "distinct samples the reward workers scored",
               "trained": "in the weights of the last counted step",
               "lost": "trained unscored, missing from a group in the weights, or of a missing step",
               "duplicated": "a second line: generated, scored or trained twice",
               "wasted": "generated for a counted step, never in the weights",
               "pending": "generated for a step not counted yet"}
    for key, text in meaning.items():
        if key == "pending" and a.counted_steps >= a.planned_steps:
            continue
        value = data[key]
        table.add_row(key, "—" if value is None else str(value), text)
    console = Console(file=io.StringIO(), width=120, highlight=False)
    console.print(table)
    # the lines unwrapped: a path or a problem is copied or grepped whole
    rows = "".join(row.rstrip() + "\n" for row in console.file.getvalue().splitlines())
    return lines[0] + "\n" + rows + "".join(line + "\n" for line in lines[1:])
