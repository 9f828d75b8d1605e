"""docs/reference/*.md against the code they are generated from (`python -m tools.gen_docs`): the RLJob fields
(pydantic spec), the CLI (argparse), the role environment (`RoleEnv`), the metric names, the exit codes
(`omnirl.api.exits`) and the test map (test modules' docstrings). A page edited by hand, or a code change whose page
was not regenerated, fails here naming the command; and the exit codes keep their values.

The README kept the reward parameters by hand and gave the OCR reward's `threads` a default of 1 while the spec said
None; nothing compared them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tools import gen_docs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(gen_docs.PAGES))
def test_the_generated_reference_page_is_what_the_code_generates(name):
    on_disk = (ROOT / "docs" / "reference" / name).read_text()
    assert on_disk == gen_docs.PAGES[name](), f"docs/reference/{name} is stale: run `{gen_docs.COMMAND}` (make reference)"


def test_the_reward_parameters_page_gives_the_specs_defaults():
    from omnirl.reward.kinds.ocr import OCRParams

    page = (ROOT / "docs" / "reference" / "rljob.md").read_text()
    ocr = page.split("### kind: ocr", 1)[1].split("###", 1)[0]
    row = next(line for line in ocr.splitlines() if line.startswith("| `threads` |"))
    assert OCRParams.model_fields["threads"].default is None and "| `null` |" in row


def test_check_names_a_stale_page_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(gen_docs, "OUT", tmp_path)
    assert gen_docs.main([]) == 0 and sorted(p.name for p in tmp_path.iterdir()) == sorted(gen_docs.PAGES)
    assert gen_docs.main(["--check"]) == 0
    (tmp_path / "metrics.md").write_text((tmp_path / "metrics.md").read_text().replace("omnirl_kl", "omnirl_kl_old"))
    result = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from tools import gen_docs; "
                             f"gen_docs.OUT = Path({str(tmp_path)!r}); sys.exit(gen_docs.main(['--check']))"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"docs/reference/metrics.md is stale: run `{gen_docs.COMMAND}` (make reference)"]


def test_exit_codes_keep_their_values_and_one_owner():
    from omnirl.api import exits, runtime
    from omnirl.evaluation import ledger as ledger_check

    assert (exits.USAGE_EXIT, exits.JOB_FAILED_EXIT, exits.CONFIG_ERROR_EXIT, exits.STORAGE_ERROR_EXIT,
            exits.LEDGER_PROBLEMS_EXIT, exits.INTERRUPTED_EXIT, exits.TERMINATED_EXIT) == (2, 3, 4, 5, 3, 130, 143)
    assert runtime.PERMANENT_EXITS is exits.PERMANENT_EXITS == (3, 4, 5)
    assert runtime.CONFIG_ERROR_EXIT is exits.CONFIG_ERROR_EXIT and ledger_check.LEDGER_PROBLEMS_EXIT == 3
    documented = {code for rows in exits.MEANINGS.values() for code, _ in rows}
    assert documented == {0, 1, 2, 3, 4, 5, 130, 143}
