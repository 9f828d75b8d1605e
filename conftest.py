"""Repository-wide pytest hooks (tests/ and e2e/).

Layout: unit tests mirror the packages, `tests/<package>/test_<module>.py` for
`services/omnirl/<package>/<module>.py` (`tests/operator/` for `omnirl_operator`, `tests/benchmarks/`,
`tests/tools/`, `tests/cli/`); whole jobs through the role processes are in `e2e/`. No folder has an
`__init__.py`: pytest's default import mode imports each test module by its basename, so a basename must
be unique across tests/ and e2e/ — checked at the start of every session (`pytest_sessionstart`).

No silent skips in CI: with `CI=true` (as `.ci/run` is started), a test or module skipped because a
dependency is missing — `pytest.importorskip`'s "could not import", or a tool "not installed" —
is reported as a failure: `make install` installs diffusers, transformers, helm and kubectl, so a
missing one there is a broken install, not a reason to pass. Skips for a CUDA GPU, or a
parametrisation that does not apply, stay skips.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

import pytest

MISSING_DEPENDENCY = re.compile(r"could not import|No module named|not installed", re.IGNORECASE)


def duplicate_test_basenames(root: Path) -> dict[str, list[str]]:
    """Test-module basenames that more than one file under `root`/tests and `root`/e2e has: {name: [paths]}."""
    where: dict[str, list[str]] = defaultdict(list)
    for folder in ("tests", "e2e"):
        for path in sorted((root / folder).rglob("test_*.py")):
            where[path.name].append(str(path.relative_to(root)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def pytest_sessionstart(session):
    """Two test modules with one basename would be one module to pytest (rootdir-less imports): refuse them."""
    duplicates = duplicate_test_basenames(Path(__file__).resolve().parent)
    if duplicates:
        raise pytest.UsageError("test module basenames must be unique across tests/ and e2e/ (rename one): "
                                + "; ".join(f"{name}: {', '.join(paths)}" for name, paths in duplicates.items()))


def in_ci() -> bool:
    """True when CI is set to a true value (`true`, `1`, `yes`)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _fail_missing_dependency(report) -> None:
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if MISSING_DEPENDENCY.search(reason):
        report.outcome = "failed"
        report.longrepr = (f"skipped for a missing dependency under CI=true ({reason}); "
                           "`make install` provides it, so the install is broken")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped for a missing dependency fails in CI."""
    outcome = yield
    _fail_missing_dependency(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped at import (`importorskip` at module level) fails in CI."""
    outcome = yield
    _fail_missing_dependency(outcome.get_result())


def pytest_collection_modifyitems(config, items):
    """An `omni` test must also be `slow`: `make test` selects `not slow`, so an omni test without it would run in CI."""
    unmarked = [item.nodeid for item in items
                if item.get_closest_marker("omni") and not item.get_closest_marker("slow")]
    if unmarked:
        raise pytest.UsageError("marked omni but not slow (add @pytest.mark.slow): " + ", ".join(unmarked))
