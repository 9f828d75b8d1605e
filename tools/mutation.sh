#!/usr/bin/env bash
# Mutation testing (mutmut 3) of omnirl.algorithms and the actor's loss code (`make mutation`; not in CI).
#
# mutmut derives module names from file paths and only strips a leading `src/`, so the code is
# staged as build/mutation/src/omnirl (a copy; the working tree is never mutated) with the fast
# unit tests that exercise it. Each mutant runs only the tests that executed the mutated function.
# Writes build/mutation/summary.txt (killed share) and survivors.txt (every surviving mutant's diff).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
WORK=${MUTATION_DIR:-$ROOT/build/mutation}
JOBS=${MUTATION_JOBS:-2}
TESTS=(tests/algorithms/test_advantages.py tests/algorithms/test_algorithms_losses.py tests/algorithms/test_nft.py
       tests/algorithms/test_sde.py tests/algorithms/test_algorithms_mutants.py tests/actor/test_actor.py)

"$VENV/bin/python" -c "import mutmut" 2>/dev/null || "$VENV/bin/pip" install -q "mutmut>=3.3,<4"

rm -rf "$WORK"
mkdir -p "$WORK/src" "$WORK/tests"
cp -r "$ROOT/services/omnirl" "$WORK/src/omnirl"
cp "$ROOT"/tests/{__init__.py,conftest.py,helpers.py} "$WORK/tests/" 2>/dev/null || true
# each test keeps its place in the tests/<package>/ mirror (the selection below names those paths)
for t in "${TESTS[@]}"; do mkdir -p "$WORK/$(dirname "$t")"; cp "$ROOT/$t" "$WORK/$t"; done
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
{
  echo '[tool.mutmut]'
  echo 'source_paths = ["src/"]'
  echo 'only_mutate = ["src/omnirl/algorithms/*", "src/omnirl/actor/flow_grpo_update.py", "src/omnirl/actor/nft_update.py"]'
  printf 'pytest_add_cli_args_test_selection = [%s]\n' "$(printf '"%s", ' "${TESTS[@]}" | sed 's/, $//')"
  echo 'pytest_add_cli_args = ["-p", "no:cacheprovider", "-W", "ignore"]'
  echo '[tool.pytest.ini_options]'
  echo 'timeout = 300'
  echo 'markers = ["gpu: needs a CUDA GPU", "slow: long"]'
} > "$WORK/pyproject.toml"

cd "$WORK"
# The staged copy, never the checkout's services/, must be what the tests import.
env -u PYTHONPATH OMP_NUM_THREADS=1 "$VENV/bin/mutmut" run --max-children "$JOBS" > run.log 2>&1 || {
  tail -40 run.log; exit 1; }
env -u PYTHONPATH "$VENV/bin/mutmut" results --all true > results.txt 2>&1 || true
"$VENV/bin/python" - <<'PY'
import re
from collections import Counter
from pathlib import Path

rows = [line.strip().rsplit(": ", 1) for line in Path("results.txt").read_text().splitlines() if ": " in line]
status = Counter(s for _, s in rows)
killed = status["killed"] + status["timeout"] + status["segfault"]
total = sum(status.values()) - status["skipped"]
lines = [f"mutants: {total}, killed: {killed} ({100 * killed / max(total, 1):.1f}%)",
         "by status: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items()))]
per_file = Counter()
for name, s in rows:
    if s == "survived":
        per_file[re.sub(r"\.x.*", "", name)] += 1
lines += [f"  survived in {k}: {v}" for k, v in per_file.most_common()]
Path("summary.txt").write_text("\n".join(lines) + "\n")
Path("survivors.txt").write_text("\n".join(n for n, s in rows if s == "survived") + "\n")
print("\n".join(lines))
PY
for name in $(cat survivors.txt); do env -u PYTHONPATH "$VENV/bin/mutmut" show "$name"; done > survivors-diff.txt 2>&1 || true
echo "details: $WORK/survivors-diff.txt"
