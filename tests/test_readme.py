"""The README's python examples, and those of docs/examples.md, run as written, in order, in one namespace each (like
a reader pasting them); the README stays one screen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
