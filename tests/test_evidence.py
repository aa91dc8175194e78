"""Evidence lives out of the code: no dates in the package's docstrings, comments or messages; the README stays short;
``docs/evidence.md`` is what ``python -m benchmarks.evidence --from-json docs/_data --markdown`` writes; the package
keeps its shape (no import circles, no imports up the layers: ``tools/arch_check.py``); and ``ruff format`` decides
the layout of every Python file (no ``# fmt: skip``)."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from benchmarks.evidence import EVIDENCE_SECTIONS, format_evidence, main
from tools import arch_check

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_speedups"
DATA = ROOT / "docs" / "_data"

_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December"
    "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
DATE = re.compile(rf"\b(?:(?:19|20)\d\d-[01]\d-[0-3]\d|(?:{_MONTHS})\.? (?:[0-3]?\d, )?(?:19|20)\d\d)\b")


def dates_in(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every date in the comments and string constants (docstrings, messages) of ``source``."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found += [(tok.start[0], m.group()) for m in DATE.finditer(tok.string)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in DATE.finditer(node.value):
                found.append((node.lineno + node.value[: m.start()].count("\n"), m.group()))
    return sorted(set(found))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("# measured 2026-12-01 on 2 cores", ["2026-12-01"]),
        ('"""Docstring.\n\nIn December 2026 it was 2.1x."""', ["December 2026"]),
        ('warn(f"as of Dec 1, 2026 this held")', ["Dec 1, 2026"]),
        ('x = "shape (2026, 12)"  # 12-01 is not a date', []),
    ],
)
def test_date_finder(text: str, expected: list[str]) -> None:
    assert [d for _, d in dates_in(text)] == expected


def test_no_dates_in_the_package() -> None:
    """Measured numbers and their dates belong in docs/evidence.md: a docstring, a comment or a warning names the
    evidence section instead ("docs/evidence.md, section Batch-size finder")."""
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {date}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, date in dates_in(path.read_text(encoding="utf-8"))
    ]
    assert not hits, "dates in the package (move the evidence to docs/_data and cite docs/evidence.md):\n" + "\n".join(
        hits
    )


def test_readme_stays_short() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 150, f"README.md has {lines} lines (at most 150): move the detail into docs/ and link it"


def test_readme_has_no_tracker_language() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"\b[Ii]ssues? #?\d+", readme), "README.md refers to the issue tracker"


def test_evidence_page_is_generated_from_the_committed_json(tmp_path: Path) -> None:
    out = tmp_path / "evidence.md"
    assert main(["--from-json", str(DATA), "--markdown", str(out)]) == 0
    committed = (ROOT / "docs" / "evidence.md").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == committed, (
        "docs/evidence.md is stale: python -m benchmarks.evidence --from-json docs/_data --markdown docs/evidence.md"
    )


def test_evidence_page_has_the_sections_docstrings_cite() -> None:
    page = format_evidence(DATA)
    for name in (
        "Batch-size finder",
        "autotune",
        "Advisor",
        "Measuring",
        "Sequence batching",
        "Workloads",
        "Recipes",
        "Pruning",
        "Quantization",
        *EVIDENCE_SECTIONS.values(),
    ):
        assert f"\n## {name}\n" in page, name
    for table in re.findall(r"\n### [^\n]+\n\n([^\n]+)", page):  # every table opens with its machine and date
        assert table.startswith("Machine: ") and " Date: " in table, table


def test_evidence_prints_without_markdown(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(
        '{"machine": {"cpu": "TestCPU", "cpu_count": 2, "torch_threads": 2, "torch": "x", "device": "cpu"},'
        ' "date": "D", "quick": true, "errors": {}, "rows": [{"technique": "pruning", "variant": "v", "metric": "m",'
        ' "baseline": 2.0, "candidate": 1.0, "ratio": 2.0}]}'
    )
    assert main(["--from-json", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Evidence") and "Machine: TestCPU (2 cores" in out and "Date: D." in out
    assert "| v | m | 2.00x |" in out.split("## Pruning")[1]
    assert "Nothing is committed for this section yet." in out.split("## Measuring")[1].split("##")[0]


def test_a_note_that_names_a_file_is_followed_by_its_table(tmp_path: Path) -> None:
    machine = '{"cpu": "TestCPU", "cpu_count": 2, "torch_threads": 2, "torch": "x", "device": "cpu"}'
    (tmp_path / "run.json").write_text(
        f'{{"machine": {machine}, "date": "D", "quick": false, "errors": {{}}, "rows": [{{"technique": "pruning", '
        '"variant": "v", "metric": "m", "baseline": 2.0, "candidate": 1.0, "ratio": 2.0}]}'
    )
    note = {"technique": "pruning", "machine": "M", "date": "D", "command": "c", "file": "run.json"}
    notes = [{**note, "title": "Before", "file": None, "text": "a"}, {**note, "title": "The run", "text": "b"}]
    (tmp_path / "evidence_notes.json").write_text(json.dumps({"notes": notes}))
    section = format_evidence(tmp_path).split("## Pruning")[1]
    assert section.index("### Before") < section.index("### The run") < section.index("| v | m | 2.00x |")
    assert section.count("| v | m | 2.00x |") == 1  # placed after its note, not again with the other files
    (tmp_path / "evidence_notes.json").write_text(json.dumps({"notes": [{**notes[1], "file": "gone.json"}]}))
    with pytest.raises(ValueError, match="names docs/_data/gone.json, not found"):
        format_evidence(tmp_path)


# ---------------------------------------------------------------- the package's shape (tools/arch_check.py)


def test_package_has_no_circles_and_no_arrows_up() -> None:
    graph = arch_check.import_graph(PACKAGE)
    assert not arch_check.circles(graph), f"import circles: {arch_check.circles(graph)}"
    assert not arch_check.arrows_up(graph), "imports up the layers:\n" + "\n".join(arch_check.arrows_up(graph))


def test_arch_check_finds_circles_and_arrows_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pkg = tmp_path / "lightning_speedups"
    (pkg / "functional").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from lightning_speedups.functional import a\n")
    (pkg / "functional" / "__init__.py").write_text("")
    (pkg / "functional" / "a.py").write_text("from lightning_speedups.functional import b\n")
    (pkg / "functional" / "b.py").write_text("def f():\n    from . import a\n")  # a lazy import closes the circle
    (pkg / "callbacks.py").write_text("x = 1\n")
    (pkg / "measure.py").write_text("import lightning_speedups.callbacks\n" + "x = 1\n" * 650)  # long: not an error
    graph = arch_check.import_graph(pkg)
    assert arch_check.circles(graph) == [["lightning_speedups.functional.a", "lightning_speedups.functional.b"]]
    assert arch_check.arrows_up(graph) == [
        "lightning_speedups.measure (layer 1) -> lightning_speedups.callbacks (layer 5)"
    ]
    assert arch_check.main([str(pkg)]) == 1
    out = capsys.readouterr().out
    assert "import circles: 1" in out and "imports up the layers: 1" in out and "arch_check: FAILED" in out
    assert "lines" not in out.rsplit("import circles:", 1)[1]  # no module is judged by its length
    (pkg / "functional" / "b.py").write_text("")
    (pkg / "measure.py").write_text("x = 1\n" * 650)
    assert arch_check.main([str(pkg)]) == 0
    assert "arch_check: ok" in capsys.readouterr().out


# ---------------------------------------------------------------- the layout (ruff format)

# the repository's Python: the package, its tests, benchmarks and tools, the docs' build code
PYTHON_ROOTS = ("lightning_speedups", "tests", "benchmarks", "tools", "docs", "conftest.py")
_NOT_SOURCE = {"_build", "_auto", "__pycache__", "build", "dist"}


def _python_files() -> list[Path]:
    found = []
    for name in PYTHON_ROOTS:
        root = ROOT / name
        paths = [root] if root.is_file() else sorted(root.rglob("*.py"))
        found += [p for p in paths if not _NOT_SOURCE & set(p.relative_to(ROOT).parts)]
    return found


def _ruff() -> list[str]:
    """The command that runs ruff: this interpreter's module, else the binary next to it, else one on the PATH."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (`pip install -e .[dev]`): the layout is not checked")
    return [found]


def test_ruff_format_decides_the_layout() -> None:
    result = subprocess.run(
        [*_ruff(), "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    output = result.stdout + result.stderr
    # ruff before 0.9 says `Would reformat: path`; later ones point at the first change, `--> path:line:col`
    files = sorted(set(re.findall(r"^(?:Would reformat: |\s*--> )(.+?\.py)\b", output, flags=re.M)))
    assert result.returncode == 0, "run `ruff format .`; it would reformat:\n" + ("\n".join(files) or output)


def test_no_python_file_turns_the_formatter_off() -> None:
    off = re.compile(r"#\s*fmt:\s*(skip|off)\b")
    found = [
        f"{path.relative_to(ROOT)}:{token.start[0]}"
        for path in _python_files()
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if token.type == tokenize.COMMENT and off.search(token.string)
    ]
    assert not found, "the formatter decides the layout; drop the marker and run `ruff format`:\n" + "\n".join(found)


def _long_functions_without_a_reason(limit: int = 60) -> list[str]:
    """Functions whose body (docstring left out) runs past ``limit`` lines with no ``# long: <why>`` comment in it."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = node.body[0]
            has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            start = first.end_lineno + 1 if has_doc and len(node.body) > 1 else first.lineno
            body = lines[start - 1 : node.end_lineno]
            if len(body) > limit and not any(line.strip().startswith("# long:") for line in body):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({len(body)} lines)")
    return found


def test_no_function_over_60_lines_without_a_reason() -> None:
    long = _long_functions_without_a_reason()
    assert not long, "split these at a seam, or say why they are long with a '# long: ...' comment:\n" + "\n".join(long)
