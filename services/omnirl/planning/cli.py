"""`omnirl plan JOB.yaml [--configs DIR] [--gpu PRODUCT]`: the per-device memory table of the job's model roles and,
for a role that does not fit, the layouts that would (docs/parallel.md, "Memory plan"). Exit 0 when every role
fits, 1 when one does not, 2 for a manifest or model directory it cannot read."""

from __future__ import annotations

import argparse
import sys

from omnirl.api.errors import ManifestError
from omnirl.api.loader import load_rljob
from omnirl.api.spec_parallel import GPU_MEMORY_GIB


def main(args: argparse.Namespace) -> int:
    """Print the plan; 0 when every role fits, 1 when one does not, 2 when the inputs cannot be read."""
    from omnirl.planning.memory import describe
    from omnirl.planning.plan import NO_FIT, plan_job

    if args.gpu is not None and args.gpu not in GPU_MEMORY_GIB:
        print(f"omnirl plan: --gpu {args.gpu}: not a device of the table; one of {', '.join(GPU_MEMORY_GIB)}",
              file=sys.stderr)
        return 2
    try:
        job = load_rljob(args.file)
        plan = plan_job(job, args.configs, args.gpu)
    except ManifestError as err:
        for line in err.problems:
            print(line, file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as err:
        print(f"omnirl plan: {err}", file=sys.stderr)
        return 2
    for role in plan.roles:
        for line in describe(role, plan.product[role.role]):
            print(line)
        if not role.fits:
            for line in plan.fixes.get(role.role) or [NO_FIT]:
                print(f"  would fit: {line}")
    return 0 if all(r.fits for r in plan.roles) else 1
