"""The README's python examples run as written, in order, in one namespace (like a reader pasting them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(_python_blocks()) >= 8


@pytest.mark.slow
def test_readme_examples_run(tmp_path):
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(_python_blocks()):
        code = block.replace("    ...\n", "    pass\n")
        try:
            exec(compile(code, f"README.md block {i}", "exec"), namespace)
        except Exception as err:  # name the failing block in the error
            raise AssertionError(f"README python block {i} failed:\n{code}") from err
