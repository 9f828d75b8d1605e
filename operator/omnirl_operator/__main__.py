"""`python -m omnirl_operator`: run the operator (the same as the chart's
`kopf run -m omnirl_operator.handlers --standalone ...`).

    python -m omnirl_operator --all-namespaces
    python -m omnirl_operator --namespace team-a --namespace team-b --liveness http://0.0.0.0:8080/healthz

Credentials: in-cluster service account, else the local kubeconfig (both for kopf and for the
operator's own client).
"""

from __future__ import annotations

import argparse

import kopf

from omnirl_operator import handlers  # noqa: F401  (registers the handlers on kopf's default registry)


def main(argv: list[str] | None = None) -> None:
    """Parse the flags and run kopf until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m omnirl_operator", description=__doc__.splitlines()[0])
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    scope.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeatable)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    args = parser.parse_args(argv)
    kopf.run(standalone=True, clusterwide=args.all_namespaces, namespaces=args.namespace or (),
             liveness_endpoint=args.liveness)


if __name__ == "__main__":
    main()
