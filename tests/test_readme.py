"""The README's python examples, and those of docs/examples.md, run as written, in order, in one namespace each (like
a reader pasting them); the README stays one screen."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks._workloads_table import format_headline, summarize

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLES = ROOT / "docs" / "examples.md"


def _python_blocks(page: Path = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def test_readme_is_one_screen_with_autotune_first():
    text = README.read_text()
    assert len(text.splitlines()) <= 150, "README.md passes 150 lines: move the detail into docs/"
    first = _python_blocks()[0]
    assert "autotune(" in first and "plan.fit(" in first
    assert len(_python_blocks(EXAMPLES)) >= 8


@pytest.mark.slow
@pytest.mark.parametrize("page", [README, EXAMPLES], ids=["README", "examples"])
def test_page_examples_run(page: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files the examples write land here
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(_python_blocks(page)):
        code = block.replace("    ...\n", "    pass\n")
        try:
            exec(compile(code, f"{page.name} block {i}", "exec"), namespace)
        except Exception as err:  # name the failing block in the error
            raise AssertionError(f"{page.name} python block {i} failed:\n{code}") from err


def test_readme_results_are_the_suite_run_as_its_file_holds_it():
    """The README's suite table is what ``format_headline`` writes from ``docs/_data/workloads.json``, the one run of
    the suite the docs quote: it cannot mix rows of other runs or drift from the file."""
    rows = json.loads((ROOT / "docs" / "_data" / "workloads.json").read_text())
    table = format_headline(summarize(rows))
    assert table in README.read_text(), f"README.md's results table is not the suite file's; it is now:\n{table}"
