"""The GPU float8-vs-bf16 script's CPU dry-run mode (the real run needs an sm89+ GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_benchmark_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "float8_vs_bf16.py"


def _load():
    return load_benchmark_script("float8_vs_bf16")


def test_float8_script_dry_run(capsys):
    rows = _load().main(["--dry-run", "--sizes", "16", "32", "--layers", "1", "--json"])
    assert [r["size"] for r in rows] == [16, 32]
    assert all(r["bf16_s"] > 0 and r["float8_s"] > 0 and r["float8_layers"] == 0 for r in rows)
    out = capsys.readouterr().out
    assert "dry run" in out and json.loads(out.splitlines()[-1]) == rows


def test_float8_script_refuses_cpu_without_dry_run():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "16"], capture_output=True, text=True)
    if proc.returncode == 0:  # pragma: no cover - only on an sm89+ GPU
        pytest.skip("float8-capable GPU present: the script ran for real")
    assert "compute capability >= 8.9" in proc.stderr


@pytest.mark.requires_sm89
def test_float8_script_gpu():
    rows = _load().main(["--sizes", "1024", "--tokens", "2048", "--repeats", "3", "--no-compile"])
    assert rows[0]["float8_layers"] == 2
