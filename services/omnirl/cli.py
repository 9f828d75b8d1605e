"""The `omnirl` command. Each subcommand lives with the package that owns it; this file only parses.

Imports are lazy so `omnirl validate` does not pay for torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from omnirl.api.exits import (
    DONE,
    FAILED,
    INTERRUPTED_EXIT,
    LEDGER_PROBLEMS_EXIT,
    STORAGE_ERROR_EXIT,
    USAGE_EXIT,
)

DESCRIPTION = ("Reinforcement-learning post-training of flow-matching (diffusion) models from one RLJob manifest: "
               "on this machine (omnirl run) or on Kubernetes (the operator).")


def _cmd_validate(args: argparse.Namespace) -> int:
    from omnirl.api.loader import validate_files

    def grid(job) -> list[str]:  # after the spec checks: only a valid job pays for torch
        from omnirl.controller.ttl import budget_line
        from omnirl.launch.preflight import missing_local_paths
        from omnirl.models.registry import check_media, describe_sigma_grid
        from omnirl.reward.registry import environment_lines

        # valid for a cluster, where the files live in the pods; said, because `omnirl run` here refuses them
        missing = [f"{field}: {path} is not on this machine: omnirl run here refuses it; on Kubernetes it must "
                   "exist inside the pods (the image, or a volume from spec.storage or the role's template)"
                   for field, path, _ in missing_local_paths(job)]
        media = [line for line in [check_media(job.spec)] if line]
        return [describe_sigma_grid(job.spec), *media, budget_line(job.spec), *missing,
                *environment_lines(job.spec.reward)[0]]

    def check(job) -> list[str]:
        # `omnirl run`'s pre-flight LoRA check (a weightless skeleton of the model), where the model is on this
        # machine: validate said ok to targetModules [qkv_proj] on the built-in model, which omnirl run refused
        # and each reward kind's check of this machine (a python reward's function imports and is callable)
        from omnirl.api.errors import ConfigError
        from omnirl.launch.preflight import check_lora, missing_local_paths
        from omnirl.models.parallel.layout import check_layout
        from omnirl.models.registry import check_media
        from omnirl.reward.registry import environment_lines

        problems = environment_lines(job.spec.reward)[1]
        try:  # a video family's frames and size against its VAE (the released checkpoints' when not here)
            check_media(job.spec)
        except ValueError as err:
            problems = [*problems, str(err)]
        if any(field == "spec.model.path" for field, _, _ in missing_local_paths(job)):
            return problems  # the model's: said under `ok` (a cluster's pods hold it)
        problems = [*problems, *check_layout(job.spec)]  # the parallel degrees against the model's heads (configs)
        if not problems:  # each model role's memory under its layout against its device (omnirl plan's table)
            from omnirl.planning.plan import fit_problems

            problems = fit_problems(job)
        try:
            check_lora(job)
        except ConfigError as err:
            return [*problems, str(err)]
        return problems

    return validate_files(args.files, out=sys.stdout, describe=grid, check=check)


def _cmd_plan(args: argparse.Namespace) -> int:
    from omnirl.planning.cli import main as plan_main

    return plan_main(args)


def _cmd_crd(args: argparse.Namespace) -> int:
    from omnirl.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    if args.family == "av-digits":
        from omnirl.models.avdigits.pretrain import main as pretrain_main
    else:
        from omnirl.models.digits.pretrain import main as pretrain_main

    return pretrain_main(args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from omnirl.evaluation.cli import main as eval_main

    return eval_main(args)


def _cmd_run(args: argparse.Namespace) -> int:
    if args.no_ray and args.ray_address:
        raise ValueError(f"--no-ray with --ray-address {args.ray_address}: the roles run either as plain processes "
                         "or on that Ray cluster; drop one of the two")
    from omnirl.launch.local import main as run_main

    return run_main(args)


def _cmd_role(args: argparse.Namespace) -> int:
    from omnirl.launch.roles import main as role_main

    code = role_main(args)
    if "omnirl.weight_sync.groups" in sys.modules:
        from omnirl.weight_sync.groups import groups_left_behind

        if groups_left_behind():  # the interpreter's exit would wait out a stuck collective's timeout
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def _cmd_export(args: argparse.Namespace) -> int:
    from omnirl.models.export_cli import main as export_main

    return export_main(args)
def _cmd_ledger(args: argparse.Namespace) -> int:
    from omnirl.evaluation.ledger import main as ledger_main

    return ledger_main(args)


def _cmd_scorer_serve(args: argparse.Namespace) -> int:
    from omnirl.reward.serve import main as serve_main

    return serve_main(args)


def _cmd_render(args: argparse.Namespace) -> int:
    from omnirl_operator.render import main as render_main

    return render_main(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from omnirl.api.extensions import REWARD_KINDS
    from omnirl.api.roles import ROLE_NAMES

    p = argparse.ArgumentParser(prog="omnirl", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate", help=f"check RLJob manifests; exit {USAGE_EXIT} with one line per problem")
    s.add_argument("files", nargs="+", help="RLJob manifests (YAML or JSON; a file may hold several documents)")
    s.set_defaults(fn=_cmd_validate)

    s = sub.add_parser("plan", help="per-GPU memory of each role under its parallel layout, and the layouts that "
                       f"fit; exit {FAILED} when a role does not fit")
    s.add_argument("file", help="RLJob manifest (YAML or JSON)")
    s.add_argument("--configs", default=None, help="the model directory whose config files are read (default: "
                   "spec.model.path; only config.json files are read, never weights)")
    s.add_argument("--gpu", default=None, help="the device to fit into, e.g. h200 (default: each role's "
                   "accelerator.product, else its type's common one)")
    s.set_defaults(fn=_cmd_plan)

    s = sub.add_parser("crd", help="print the RLJob CustomResourceDefinition generated from the spec")
    s.set_defaults(fn=_cmd_crd)

    s = sub.add_parser("pretrain", help="pretrain a built-in model by flow matching: the OCR digits model, or "
                       "the audio+video one (--family av-digits)")
    s.add_argument("--family", choices=["ocr-digits", "av-digits"], default="ocr-digits",
                   help="which built-in model (default ocr-digits; av-digits: the audio+video task, docs/omni.md)")
    s.add_argument("--out", required=True, help="output directory (safetensors weights + config.json)")
    s.add_argument("--steps", type=int, default=3000, help="training (optimiser) steps (default 3000; the shipped model: 550)")
    s.add_argument("--seed", type=int, default=0, help="seed of the weights, images and noise (default 0)")
    s.add_argument("--batch-size", type=int, default=64, help="rendered images per step (default 64)")
    s.add_argument("--lr", type=float, default=None, help="peak AdamW lr (default: the shipped checkpoint's, 1.5e-3)")
    s.add_argument("--device", default="cpu", help="cpu | cuda")
    s.add_argument("--snapshot-every", type=int, default=None, metavar="K",
                   help="av-digits: also save the EMA weights to OUT/step-K, OUT/step-2K, … (to choose a step count)")
    s.add_argument("--init", default=None, metavar="DIR",
                   help="av-digits: start from this checkpoint's tensors of the same name and shape (a warm start)")
    s.set_defaults(fn=_cmd_pretrain)

    s = sub.add_parser("eval", help="sample prompts as validation does (rollout engine, job's σ grid), score them "
                       "with the job's weighted rewards, write an image grid")
    s.add_argument("job", help="RLJob manifest (model and reward are taken from it)")
    s.add_argument("--checkpoint", default=None, help="a run's checkpoint dir (e.g. OUT/checkpoints/latest)")
    s.add_argument("--prompts", default=None,
                   help="file with one prompt per line (default: the job's first validation.maxPrompts held-out prompts)")
    s.add_argument("--sampling-steps", type=int, default=None, metavar="N",
                   help="denoising steps per sample (default: spec.validation.numSteps); "
                        "not --steps, which is omnirl run's number of training steps")
    s.add_argument("--steps", default=None, help=argparse.SUPPRESS)  # its old name: refused, naming the new one
    s.add_argument("--sampler", choices=["ode", "sde"], default="ode",
                   help="ode (default, as validation) or sde (every step but the last stochastic)")
    s.add_argument("--seed", type=int, default=None, help="noise seed (default: spec.validation.seed)")
    s.add_argument("--out", default="eval-out", help="directory for grid.png and rewards.json (default eval-out); "
                   "one that already holds an evaluation is refused unless --overwrite")
    s.add_argument("--overwrite", action="store_true",
                   help="replace the grid.png and rewards.json a previous evaluation left in --out")
    s.set_defaults(fn=_cmd_eval)

    s = sub.add_parser("run", help="run an RLJob on this machine (embedded Redis, roles as processes)")
    s.add_argument("job", help="RLJob manifest (YAML or JSON, one RLJob)")
    s.add_argument("--steps", type=int, default=None, metavar="N",
                   help="total training steps of the run, counted from its first: with --resume too, --steps 80 "
                        "trains on to step 80, not 80 more (default: spec.algorithm.steps; the denoising steps per "
                        "sample are spec.algorithm.sampling.numSteps)")
    s.add_argument("--out", default=None, help="output directory (default runs/<job name>)")
    s.add_argument("--resume", action="store_true",
                   help="continue the run in --out (its latest checkpoint, then the batches its Redis kept)")
    s.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local one)")
    s.add_argument("--no-ray", action="store_true", help="place roles as plain subprocesses")
    s.add_argument("--device", choices=["auto", "cpu"], default="auto",
                   help="auto: roles on the accelerators their manifest asks for; cpu: every role on the CPU")
    s.add_argument("--share-gpus", action="store_true",
                   help="let roles share accelerators when the manifest asks for more than this machine has")
    s.set_defaults(fn=_cmd_run)

    s = sub.add_parser("role", help="run one role of a job (the container entrypoint)")
    s.add_argument("role", choices=ROLE_NAMES, help="the role to run")
    s.add_argument("--job", required=True, help="RLJob manifest (YAML or JSON)")
    s.add_argument("--out", default=None, help="run output directory")
    s.add_argument("--index", type=int, default=0, help="replica index of this role")
    s.set_defaults(fn=_cmd_role)

    s = sub.add_parser("export", help="export a run's checkpoint in the form its users load (diffusers LoRA, "
                       "the family's weights layout)")
    s.add_argument("run_dir", help="the run directory (omnirl run --out, or the job's storage claim)")
    s.add_argument("--out", required=True, help="the export directory to create (must not exist)")
    s.add_argument("--checkpoint", default=None, help="a checkpoint directory (default: RUN_DIR/checkpoints/latest)")
    s.add_argument("--job", default=None, help="the run's manifest (default: RUN_DIR/job.yaml)")
    s.set_defaults(fn=_cmd_export)
    s = sub.add_parser("ledger", help="account a run's training samples from its ledgers: generated, scored, "
                       f"trained, lost, duplicated, wasted; exit {LEDGER_PROBLEMS_EXIT} when any was lost or duplicated")
    s.add_argument("run_dir", metavar="OUT",
                   help="the run directory (omnirl run --out), or a directory holding a ledger/ copied off the job's claim")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    s.add_argument("-f", "--job", default=None, metavar="JOB.yaml",
                   help="the job's manifest, for groupSize, promptsPerStep and steps (default: OUT/job.yaml, "
                        "else OUT/exports/latest/job.yaml)")
    s.add_argument("--steps", type=int, default=None, metavar="N",
                   help="the run's total training steps (default: OUT/metrics.jsonl's last start, else the manifest's)")
    s.add_argument("--group-size", type=int, default=None, metavar="G", help="spec.algorithm.groupSize")
    s.add_argument("--prompts-per-step", type=int, default=None, metavar="P", help="spec.algorithm.promptsPerStep")
    s.set_defaults(fn=_cmd_ledger)

    s = sub.add_parser("scorer", help="scorer servers (the scorer protocol, see services/omnirl/reward/protocol)")
    scorer_sub = s.add_subparsers(dest="scorer_command", required=True)
    s = scorer_sub.add_parser("serve", help="serve a built-in scorer or a Python function over gRPC (with gRPC health) "
                              "or HTTP/JSON")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--reward", choices=[k for k, info in REWARD_KINDS.items() if info.runs == "in-process"],
                      help="the in-process reward kind to serve")
    what.add_argument("--function", metavar="MODULE:FUNCTION",
                      help="serve a Python function as the reward (--reward python --param function=MODULE:FUNCTION; "
                           "docs/rewards-python.md)")
    s.add_argument("--protocol", choices=["grpc", "http"], default="grpc",
                   help="grpc (default; omnirl.scorer.v1.Scorer + gRPC health) or http (POST /v1/score)")
    s.add_argument("--host", default="0.0.0.0", help="address to listen on (default all interfaces)")
    s.add_argument("--port", type=int, default=50051, help="TCP port (0 picks a free one, printed on start)")
    s.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a scorer parameter as in spec.reward[].params, e.g. --param threads=2 (repeatable)")
    s.add_argument("--delay-ms", type=float, default=0.0,
                   help="sleep this many ms per sample before scoring (a slow judge for tests and benchmarks)")
    s.set_defaults(fn=_cmd_scorer_serve)

    s = sub.add_parser("render", help="print the Kubernetes objects the operator would create")
    s.add_argument("job", help="RLJob manifest (YAML or JSON, one RLJob)")
    s.add_argument("--namespace", default=None, help="default: the manifest's namespace, else 'default'")
    s.set_defaults(fn=_cmd_render)
    _describe(p)
    return p


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give each subcommand's own `--help` its one-line summary (argparse shows `help=` only in the
    parent's list, so `omnirl run --help` said nothing of what run does)."""
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for choice in action._choices_actions:
            child = action.choices[choice.dest]
            child.description = child.description or choice.help
            _describe(child)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `omnirl` console script; returns the process exit code.

    A user error (bad manifest, missing file, bad value) prints one line per problem and exits 2; a
    file or directory that cannot be read or written (no permission, no space: `omnirl.system.disk`)
    one line saying which, the path and the fix, exit 5 (`STORAGE_ERROR_EXIT`, as a role's);
    Ctrl-C prints `omnirl COMMAND: interrupted` and exits 130 (`omnirl run` stops its job first and
    says how to continue); OMNIRL_DEBUG=1 shows the traceback instead. `omnirl role` reports its own failures.
    """
    import os

    args = build_parser().parse_args(argv)
    if args.command == "role" or os.environ.get("OMNIRL_DEBUG") == "1":
        return int(args.fn(args) or DONE)
    try:
        out = getattr(args, "out", None)
        if out is not None and not out.strip():  # `--out "$OUT"` with OUT unset
            raise ValueError(f"--out {out!r}: an empty path (an unset shell variable?); pass a directory"
                             + (", or leave --out out for runs/<job name>" if args.command == "run" else ""))
        return int(args.fn(args) or DONE)
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's 130, not a traceback from wherever it landed
        print(f"omnirl {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT
    except BrokenPipeError:  # `omnirl validate … | head`: the reader left; no traceback, as other CLIs
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush must not raise too
        return FAILED
    except (FileNotFoundError, ValueError, KeyError) as err:
        from omnirl.api.errors import error_text

        lines = getattr(err, "problems", None) or [error_text(err)]  # as raised: a quoted value keeps its quotes
        for line in lines:
            print(f"omnirl {args.command}: {line}", file=sys.stderr)
        return USAGE_EXIT
    except OSError as err:
        from omnirl.system import disk

        full = disk.storage_error(err)
        if full is None:
            raise
        what, fix = disk.failure(full)  # an unreadable model file or checkpoint, a read-only --out
        print(f"omnirl {args.command}: {what}; {fix}", file=sys.stderr)
        return STORAGE_ERROR_EXIT


if __name__ == "__main__":
    raise SystemExit(main())
