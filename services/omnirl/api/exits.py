"""Exit codes of the `omnirl` commands: the one owner of their values and of what each means.

`docs/reference/exit-codes.md` is generated from `MEANINGS` (`python -m tools.gen_docs`), and the
CLI (`omnirl.cli`), the roles (`omnirl.api.runtime` re-exports the role codes), the local supervisor
and the operator read the values here. Torch-free: the operator imports it.
"""

from __future__ import annotations

DONE = 0
FAILED = 1
"""A role crashed (restarted per `spec.failurePolicy`), or a command could not finish its work."""
USAGE_EXIT = 2
"""Refused before anything started: one stderr line naming the flag or manifest field and the fix."""
JOB_FAILED_EXIT = 3
"""The controller failed the job itself (every group of a step failed, a scorer is down)."""
LEDGER_PROBLEMS_EXIT = 3
"""`omnirl ledger`: samples were lost or duplicated (each problem on its own line)."""
CONFIG_ERROR_EXIT = 4
"""A role found a setting it cannot run with at start-up (`omnirl.api.errors.ConfigError`), or the training
diverged (a gradient norm or loss that is not finite); also a judge server (`reward[].server`) that did not start."""
STORAGE_ERROR_EXIT = 5
"""A write to the run directory failed for want of space or a writable mount (ENOSPC, EDQUOT, EFBIG, EROFS) or
permission (EACCES, EPERM), or a file could not be read for permission: every restart would fail the same way
until someone frees space or fixes the directory; a resume continues."""
SIGNAL_EXIT_BASE = 128
"""A process killed by signal N exits 128 + N, as a shell reports it (the launcher reports a role's death so)."""
INTERRUPTED_EXIT = SIGNAL_EXIT_BASE + 2
"""Ctrl-C (SIGINT), or SIGTERM to `omnirl run`: the shell's 128 + 2 (130)."""
TERMINATED_EXIT = SIGNAL_EXIT_BASE + 15
"""A role stopped by SIGTERM (a pod's deletion, the launcher's stop): its work stays pending in Redis."""

PERMANENT_EXITS = (JOB_FAILED_EXIT, CONFIG_ERROR_EXIT, STORAGE_ERROR_EXIT)
"""Role exits that neither `omnirl run` nor the operator restarts: the local supervisor stops the job at once,
the operator marks the RLJob Failed (the controller Job's podFailurePolicy fails it too)."""

# command → (code, meaning) rows, in the order the reference lists them
MEANINGS: dict[str, tuple[tuple[int, str], ...]] = {
    "omnirl run": (
        (DONE, "the job finished (or had already trained the steps asked for: nothing to do)"),
        (FAILED, "the job did not finish: a role's failures used up `spec.failurePolicy`, the embedded Redis did not "
                 "start, or the manifest's Redis did not answer for 150 s (`--resume` continues)"),
        (USAGE_EXIT, "refused before anything started: a bad flag, manifest, prompt file, model directory or `--out`"),
        (JOB_FAILED_EXIT, "a role's permanent exit: the controller failed the job (every group of a step failed, a "
                          "validation sample could not be scored)"),
        (CONFIG_ERROR_EXIT, "a role's configuration error at start-up or a diverged training step; or a judge server "
                            "of `reward[].server` that exited or never answered within its `startupSeconds`"),
        (STORAGE_ERROR_EXIT, "the run directory cannot be written (full disk, read-only, permission); free space, "
                             "then `--resume`"),
        (INTERRUPTED_EXIT, "interrupted (Ctrl-C, SIGTERM); the last line prints the `--resume` command"),
    ),
    "omnirl role": (
        (DONE, "done (also a role started after the job's `finish` record: nothing to do)"),
        (FAILED, "crashed; restarted per `spec.failurePolicy`"),
        (JOB_FAILED_EXIT, "the controller failed the job itself (every group of a step failed, or a validation "
                          "sample could not be scored: a required scorer down past `failurePolicy.scorerOutageSeconds`"
                          ", or answering errors); permanent"),
        (CONFIG_ERROR_EXIT, "a configuration error at start-up (one stderr line naming the field), or an actor step "
                            "whose gradient norm or loss is not finite (the update is not applied; the line names "
                            "`spec.algorithm.optimizer.learningRate`); permanent"),
        (STORAGE_ERROR_EXIT, "a write to the run directory refused for want of space or permission, or a file it "
                             "may not read; permanent"),
        (INTERRUPTED_EXIT, "Ctrl-C"),
        (TERMINATED_EXIT, "SIGTERM: the role handed its work back (pending in Redis); the actor first checkpoints"),
    ),
    "omnirl eval": (
        (DONE, "scored; `OUT/grid.png` and `OUT/rewards.json` written"),
        (FAILED, "a sample could not be scored (a judge's error); nothing written"),
        (USAGE_EXIT, "refused before it sampled (manifest, `--prompts`, `--checkpoint` of another job or LoRA "
                     "settings, an `--out` that holds an evaluation or cannot be written)"),
        (CONFIG_ERROR_EXIT, "a judge server of `reward[].server` that did not start"),
        (STORAGE_ERROR_EXIT, "a file it may not read, or an `--out` it cannot write"),
        (INTERRUPTED_EXIT, "interrupted"),
    ),
    "omnirl ledger": (
        (DONE, "nothing lost or duplicated"),
        (USAGE_EXIT, "refused: one line naming the flag or path; a damaged ledger line, naming its file and line"),
        (LEDGER_PROBLEMS_EXIT, "samples lost or duplicated (each problem on its own line)"),
        (STORAGE_ERROR_EXIT, "a ledger file the system cannot read (permission, I/O)"),
    ),
    "omnirl validate": (
        (DONE, "every manifest is valid (`FILE: ok`, with its σ grid and tensor budget)"),
        (USAGE_EXIT, "a problem: one line per problem, naming the field"),
    ),
    "omnirl export": (
        (DONE, "exported"),
        (USAGE_EXIT, "refused: a checkpoint given as the run directory, a manifest of another job or LoRA settings, "
                     "an `--out` that exists"),
        (STORAGE_ERROR_EXIT, "a file it may not read, or an `--out` it cannot write"),
        (INTERRUPTED_EXIT, "interrupted"),
    ),
    "omnirl plan": (
        (DONE, "every model role fits its device under its parallel layout (the table printed)"),
        (FAILED, "a role does not fit: the table, then the layouts that would (`would fit: …`)"),
        (USAGE_EXIT, "a manifest, model directory or `--gpu` it cannot read: one line naming it"),
    ),
    "omnirl pretrain, render, crd, scorer serve": (
        (DONE, "done (`scorer serve`: stopped by a signal)"),
        (USAGE_EXIT, "a bad flag, manifest or namespace: one line naming it"),
        (INTERRUPTED_EXIT, "interrupted"),
    ),
}
