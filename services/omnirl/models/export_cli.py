"""`omnirl export RUN_DIR --out DIR [--checkpoint PATH] [--job JOB.yaml]`: export any checkpoint.

The manifest is `--job`, else the run's own (`RUN_DIR/job.yaml`, which `omnirl run` writes, else
the one in `RUN_DIR/exports/latest/`, which a Kubernetes run's controller writes); the checkpoint
is `--checkpoint`, else `RUN_DIR/<checkpoint.dir>/latest`. See `omnirl.models.export` for what
DIR holds. A problem prints one line naming the fix and exits 2 (5 for a file that cannot be read or
written: `omnirl.system.disk.failure`).
"""

from __future__ import annotations

import argparse
import errno
import json
import shlex
import sys
from pathlib import Path

from omnirl.api.errors import ManifestError
from omnirl.api.exits import STORAGE_ERROR_EXIT, USAGE_EXIT
from omnirl.api.loader import load_rljob
from omnirl.api.run_dir import run_manifest
from omnirl.api.spec import RLJob
from omnirl.models.export import EXPORTS, export_checkpoint
from omnirl.models.policy_io import LATEST, POLICY_FILE
from omnirl.system import disk


def _check_run_dir(run_dir: Path, out: str = "DIR") -> None:
    """RUN_DIR must be a run directory, not one of the two directories a user has at hand after a run.

    `out` is the command's `--out`, repeated in the command a checkpoint given as RUN_DIR is told to run.

    Raises:
        FileNotFoundError: `run_dir` is missing, a checkpoint (it holds the policy: naming the run
            directory and `--checkpoint` to pass instead) or an export (`export.json`).
    """
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory; pass a run directory (omnirl run --out, or the "
                                "mounted spec.storage claim)")
    if (run_dir / POLICY_FILE).is_file():  # OUT/checkpoints/latest: its run is two levels up in omnirl run's layout
        run = run_dir.resolve().parent.parent
        # the user's own --out, so the command named is the one to paste (it said `--out DIR` beside a given --out)
        instead = (f"omnirl export {run} --out {shlex.quote(out)} --checkpoint {shlex.quote(str(run_dir))}" if (run / "job.yaml").is_file() else
                   f"the run directory as RUN_DIR and --checkpoint {run_dir}")
        raise FileNotFoundError(f"{run_dir} is a checkpoint, not a run directory; pass {instead}")
    if (run_dir / "export.json").is_file():
        raise FileNotFoundError(f"{run_dir} is an export already (the trained model as users load it); pass the run "
                                "directory it came from (omnirl run --out) to export one of its checkpoints")


def _manifest(run_dir: Path, job: str | None) -> Path:
    if job is not None:
        return Path(job)
    found = run_manifest(run_dir)
    if found is not None:
        return found
    raise FileNotFoundError(f"{run_dir} holds no job.yaml (nor {EXPORTS}/{LATEST}/job.yaml); pass the run's "
                            "manifest with --job JOB.yaml")


def _export_to(job: RLJob, checkpoint: Path, out: Path, run_dir: Path) -> Path:
    """`export_checkpoint` into `out`, whose failure to take the files is named as `--out`'s: it named the
    export's hidden temporary sibling (`[Errno 30] Read-only file system: '/mnt/ro/.tmp-e-17762`) or, on a
    full disk, the checkpoint file being copied (`… No space left on device: '…/policy.safetensors' -> …`).

    Raises:
        ValueError: `out` cannot be written (read-only, full, under a file, no permission): `--out`, the
            nearest existing folder, the errno text and the fix; checked before any file is written, and
            again for a write refused on the way (a disk with room for the probe but not the weights).
        as `export_checkpoint` otherwise.
    """
    disk.check_writable(out, purpose="the export")
    try:
        return export_checkpoint(job, checkpoint, out, run_dir=run_dir)
    except OSError as raised:
        err = disk.storage_error(raised)
        where = out
        while not where.exists() and where != where.parent:
            where = where.parent
        if err is None or (err.errno in (errno.EACCES, errno.EPERM) and disk.unwritable(where) is None):
            raise  # e.g. a checkpoint file it may not read: as raised, naming that file
        raise ValueError(f"--out {out}: cannot be written ({disk.describe(err)}); {disk.fix(err)} or choose "
                         "another --out (nothing was left there)") from raised


def main(args: argparse.Namespace) -> int:
    """CLI adapter; returns 0, or 2 (5: a storage error) with one line on stderr."""
    run_dir = Path(args.run_dir)
    try:
        _check_run_dir(run_dir, args.out)
        job = load_rljob(_manifest(run_dir, args.job))
        checkpoint = Path(args.checkpoint) if args.checkpoint else run_dir / job.spec.checkpoint.dir / LATEST
        if not args.checkpoint and not checkpoint.exists():
            raise FileNotFoundError(f"{run_dir} has no checkpoint ({checkpoint} is missing); pass --checkpoint "
                                    "PATH, or let the run reach its first checkpoint")
        out = _export_to(job, checkpoint, Path(args.out), run_dir)
    except ManifestError as err:
        for line in err.problems:
            print(f"omnirl export: {line}", file=sys.stderr)
        return USAGE_EXIT
    except (OSError, ValueError, KeyError) as err:
        full = disk.storage_error(err) if isinstance(err, OSError) else None
        if full is not None:  # unreadable checkpoint, unwritable --out: which, the path and the fix
            what, fix = disk.failure(full)
            print(f"omnirl export: {what}; {fix}", file=sys.stderr)
            return STORAGE_ERROR_EXIT
        print(f"omnirl export: {str(err).strip(chr(39) + chr(34))}", file=sys.stderr)
        return USAGE_EXIT
    # the step directory and its step, not `latest` as given: which weights these are, as export.json records them
    meta = json.loads((out / "export.json").read_text())
    print(f"exported {meta['checkpoint']} (step {meta['step']}, policy_version {meta['policy_version']}) → {out}")
    return 0
