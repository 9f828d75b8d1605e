"""`omnirl plan JOB.yaml [--configs DIR] [--gpu PRODUCT]`: the per-device memory table of the job's model roles and,
for a role that does not fit, the layouts that would (docs/parallel.md, "Memory plan"). Exit codes: `omnirl.api.exits`
(docs/reference/exit-codes.md)."""

from __future__ import annotations

import argparse
import sys

from omnirl.api.errors import ManifestError
from omnirl.api.exits import DONE, FAILED, USAGE_EXIT
from omnirl.api.loader import load_rljob
from omnirl.api.spec_parallel import GPU_MEMORY_GIB


def main(args: argparse.Namespace) -> int:
    """Print the plan; `DONE` when every role fits, `FAILED` when one does not, `USAGE_EXIT` when the inputs cannot
    be read (`omnirl.api.exits`)."""
    from omnirl.planning.memory import describe
    from omnirl.planning.plan import NO_FIT, plan_job

    if args.gpu is not None and args.gpu not in GPU_MEMORY_GIB:
        print(f"omnirl plan: --gpu {args.gpu}: not a device of the table; one of {', '.join(GPU_MEMORY_GIB)}",
              file=sys.stderr)
        return USAGE_EXIT
    try:
        job = load_rljob(args.file)
        plan = plan_job(job, args.configs, args.gpu)
    except ManifestError as err:
        for line in err.problems:
            print(line, file=sys.stderr)
        return USAGE_EXIT
    except (FileNotFoundError, ValueError) as err:
        print(f"omnirl plan: {err}", file=sys.stderr)
        return USAGE_EXIT
    for role in plan.roles:
        for line in describe(role, plan.product[role.role]):
            print(line)
        if not role.fits:
            for line in plan.fixes.get(role.role) or [NO_FIT]:
                print(f"  would fit: {line}")
    return DONE if all(r.fits for r in plan.roles) else FAILED
