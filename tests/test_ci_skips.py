"""The repository conftest turns a skip for a missing dependency into a failure under CI=true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = '''
import pytest

pytest.importorskip("omnirl_no_such_module")


def test_never_runs():
    pass
'''
TOOL = '''
import pytest


def test_needs_a_tool():
    pytest.skip("/usr/bin/nope not installed; run `make k8s-tools`")


def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU")
'''


def run_pytest(tmp: Path, ci: str) -> subprocess.CompletedProcess:
    """Run the two throw-away test files under the repository's conftest.py with CI=`ci`."""
    case = tmp / "cases"
    case.mkdir(exist_ok=True)
    (case / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    (case / "test_module_skip.py").write_text(CASES)
    (case / "test_tool_skip.py").write_text(TOOL)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "--continue-on-collection-errors", str(case)],
                          capture_output=True, text=True, timeout=120, cwd=case, env={"CI": ci, "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("ci", ["true", ""])
def test_missing_dependency_skips_fail_only_in_ci(tmp_path, ci):
    proc = run_pytest(tmp_path, ci)
    tail = proc.stdout.strip().splitlines()[-1]
    if ci:
        assert proc.returncode == 1 and "1 failed" in tail and "1 error" in tail and "1 skipped" in tail, proc.stdout
        assert "make install" in proc.stdout
    else:
        assert proc.returncode == 0 and "3 skipped" in tail, proc.stdout
