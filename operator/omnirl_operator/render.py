"""`omnirl render JOB.yaml [--namespace NS]`: print the objects the operator would create.

The output is a YAML stream of the children exactly as the reconcile builds them, with the
ownerReference's uid replaced by a placeholder (the real one exists only once the RLJob is
stored). It is what ``kubectl apply`` would need to run the job without the operator, and what
``kubernetes-validate --strict`` checks in the tests.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any, TextIO

import yaml

from omnirl.api.errors import ManifestError, format_value
from omnirl.api.exits import DONE, USAGE_EXIT
from omnirl.api.loader import _Loader, job_from_dict, load_rljob
from omnirl.api.spec import DNS1123_LABEL_RULE, is_dns1123_label
from omnirl_operator.builders import build_children
from omnirl_operator.meta import PLACEHOLDER_UID, adopt
from omnirl_operator.settings import OperatorSettings

# What the chart's bundled Redis answers to (release `omnirl`), used when nothing else is set.
RENDER_DEFAULT_REDIS_URL = "redis://omnirl-redis:6379/0"
PREFIX = "omnirl render: "  # as `omnirl.cli.main` prefixes every other subcommand's error lines


def _read_manifest(path: str) -> dict[str, Any]:
    """The manifest as written (YAML 1.2 numbers, like the loader); relative paths untouched, so
    they resolve against the operator's data root as they would in the cluster."""
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader subclass


def render_documents(job_path: str, namespace: str | None, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The adopted children of the job in ``job_path``.

    The namespace is ``namespace`` if given, else the manifest's, else ``default``.

    Raises:
        ManifestError: the manifest is invalid (``.problems`` names each field).
        ValueError: the job cannot be built (name too long, no Redis URL), naming the field.
    """
    load_rljob(job_path)  # validates, with file line numbers in its problems
    job = job_from_dict(_read_manifest(job_path))  # as written: relative paths stay relative
    ns = namespace or job.metadata.namespace or "default"
    job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": ns})})
    return adopt(build_children(job, settings), job.metadata.name, ns, PLACEHOLDER_UID)


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (the ConfigMap's job.yaml) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_stream(docs: list[dict[str, Any]], out: TextIO) -> None:
    """Write ``docs`` as one YAML stream (``---`` between documents)."""
    yaml.dump_all(docs, out, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def main(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry of ``omnirl render`` (``args.job``, ``args.namespace``); returns the exit code.

    Settings come from the environment like the operator's (``OMNIRL_*_IMAGE``,
    ``OMNIRL_DEFAULT_REDIS_URL`` …). Exit code 2 with one line per problem on ``err``, each
    prefixed ``omnirl render: `` as every subcommand's, for an invalid manifest, setting or
    ``--namespace`` (not a DNS-1123 label).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    namespace = getattr(args, "namespace", None)
    if namespace is not None and not is_dns1123_label(namespace):  # the API server would refuse every object
        err.write(f"{PREFIX}--namespace {format_value(namespace)} is invalid: must be {DNS1123_LABEL_RULE} "
                  "(e.g. team-a)\n")
        return USAGE_EXIT
    try:
        settings = OperatorSettings.from_env()
        if settings.default_redis_url is None:
            settings = replace(settings, default_redis_url=RENDER_DEFAULT_REDIS_URL)
            note = (f"# OMNIRL_DEFAULT_REDIS_URL unset: jobs without spec.transferQueue.redisUrl use "
                    f"{RENDER_DEFAULT_REDIS_URL}\n")
        else:
            note = ""
        docs = render_documents(args.job, namespace, settings)
        err.write(note)  # only once the manifest rendered: an error stays one line
    except ManifestError as exc:
        for line in exc.problems:
            err.write(PREFIX + line + "\n")
        return USAGE_EXIT
    except ValueError as exc:
        err.write(f"{PREFIX}{args.job}: {exc}\n")
        return USAGE_EXIT
    dump_stream(docs, out)
    return DONE
