"""The installed package holds what users run; the project's own evidence harness (the top-level ``benchmarks/``: the
workload suite, sweeps, grids, the evidence page) stays in the repository. The harness imports the package, never
the other way round: nothing under ``lightning_speedups/`` names ``benchmarks`` or a module that moved there."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_speedups"
# what left lightning_speedups/benchmarks/ for the top-level benchmarks/
MOVED = (
    "workloads",
    "workloads_bench",
    "workloads_ceiling",
    "lr_grid",
    "batch_size_suite",
    "autotune_reach",
    "_workloads_advisor",
    "_workloads_table",
    "fewer_steps",
    "evidence",
)
OLD_PATH = re.compile(rf"^lightning_speedups\.benchmarks\.({'|'.join(MOVED)})(\.|:|$)")
# a string that names the harness as a module (``importlib.import_module("benchmarks.x")``, ``"benchmarks.x:run"``)
HARNESS = re.compile(r"^benchmarks(\.[\w.]+)?(:\w+)?$")


def harness_imports(source: str, module: str, is_package: bool) -> list[str]:
    """``"line N: what"`` for every import of the harness or of a moved module, and every string that names one.

    Relative imports are resolved against ``module``, so ``from . import evidence`` in
    ``lightning_speedups.benchmarks`` counts.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if HARNESS.match(node.value) or OLD_PATH.match(node.value):
                found.append(f"line {node.lineno}: {node.value!r}")
        for name in names:
            if name == "benchmarks" or name.startswith("benchmarks.") or OLD_PATH.match(name):
                found.append(f"line {node.lineno}: import {name}")
                break
    return found


@pytest.mark.parametrize(
    "source, module, expected",
    [
        ("import benchmarks.workloads", "lightning_speedups.cli", ["line 1: import benchmarks.workloads"]),
        ("from benchmarks import evidence", "lightning_speedups.cli", ["line 1: import benchmarks"]),
        (
            "from lightning_speedups.benchmarks.lr_grid import main",
            "lightning_speedups.cli",
            ["line 1: import lightning_speedups.benchmarks.lr_grid"],
        ),
        (
            "def f():\n    from .workloads import get_workload",
            "lightning_speedups.benchmarks.runner",
            ["line 2: import lightning_speedups.benchmarks.workloads"],
        ),
        (
            'SUITES = {"w": "lightning_speedups.benchmarks.workloads_bench:run"}',
            "lightning_speedups.benchmarks.runner",
            ["line 1: 'lightning_speedups.benchmarks.workloads_bench:run'"],
        ),
        ('importlib.import_module("benchmarks.evidence")', "lightning_speedups.cli", ["line 1: 'benchmarks.evidence'"]),
        # what stays: the shipped benches, and prose that mentions the harness
        ("from lightning_speedups.benchmarks.runner import bench_main", "lightning_speedups.cli", []),
        ("from . import _sequence_tasks", "lightning_speedups.benchmarks.sequences", []),
        ('"""Run python -m benchmarks.workloads_bench from a clone."""', "lightning_speedups.cli", []),
    ],
)
def test_harness_import_finder(source: str, module: str, expected: list[str]) -> None:
    assert harness_imports(source, module, is_package=False) == expected


def test_no_module_of_the_package_imports_the_harness() -> None:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = harness_imports(path.read_text(), module, path.name == "__init__.py")
        hits += [f"{path.relative_to(ROOT)} {hit}" for hit in found]
    assert not hits, "the package imports the evidence harness (benchmarks/ is not installed):\n" + "\n".join(hits)


def test_moved_modules_are_gone_from_the_package() -> None:
    left = [name for name in MOVED if any((PACKAGE / "benchmarks" / p).exists() for p in (name, f"{name}.py"))]
    assert not left, f"lightning_speedups/benchmarks/ holds harness modules again: {left}; they live in benchmarks/"


def test_importing_every_module_of_the_package_loads_no_harness() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import lightning_speedups\n"
        "skipped = []\n"
        "for info in pkgutil.walk_packages(lightning_speedups.__path__, 'lightning_speedups.'):\n"
        "    try:\n"
        "        importlib.import_module(info.name)\n"
        "    except ImportError as err:\n"  # an optional extra that is not installed
        "        skipped.append(f'{info.name}: {err}')\n"
        "loaded = sorted(m for m in sys.modules if m == 'benchmarks' or m.startswith('benchmarks.'))\n"
        "assert not loaded, loaded\n"
        "print('modules', len([m for m in sys.modules if m.startswith('lightning_speedups')]), 'skipped', skipped)\n"
    )
    # from the repository's root, where `benchmarks` is importable: an import of it would succeed and show
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "modules" in proc.stdout
