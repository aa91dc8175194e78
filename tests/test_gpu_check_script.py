"""The prepared GPU check's CPU dry run (the real run needs a CUDA GPU): every section runs and writes its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import load_benchmark_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_gpu_check_dry_run_writes_every_row(tmp_path):
    rows = load_benchmark_script("gpu_check").main(["--dry-run", "--only", "steps,float8,data", "--out", str(tmp_path)])
    names = [r["row"] for r in rows]
    assert names == ["bf16", "channels_last", "compile", "float8", "device data"]
    timed = [r for r in rows if "ratio" in r]
    assert len(timed) == 4 and all(r["baseline_s"] > 0 and r["candidate_s"] > 0 for r in timed)
    assert not any(r["note"].startswith("failed") for r in rows)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["machine"].startswith("cpu dry run") and len(saved["rows"]) == 5
    assert "| device data |" in (tmp_path / "gpu_check.md").read_text()


def test_gpu_check_dry_run_sequence_and_fsdp_sections(tmp_path):
    """The sections added for the GPU: the sequence bench on a device and the zoo's cells under a strategy."""
    rows = load_benchmark_script("gpu_check").main(["--dry-run", "--only", "sequence,fsdp", "--out", str(tmp_path)])
    seq = [r for r in rows if r["row"].startswith("sequence: ")]
    assert len(seq) >= 6 and all(r["unit"] in ("tokens/s", "s") and "ratio" in r for r in seq)
    fsdp = [r for r in rows if r["row"].startswith("fsdp ")]
    assert [r["row"] for r in fsdp] == ["fsdp resnet18 x ema", "fsdp resnet18 x pruning_mask"]
    assert all(r["outcome"] == "works" for r in fsdp), fsdp
    from tests.zoo import cells

    assert cells.TRAINER_KWARGS == {"accelerator": "cpu", "devices": 1}  # the zoo's own runs are left as they were
    assert "tokens/s |" in (tmp_path / "gpu_check.md").read_text()


def test_gpu_check_budget_skips_later_sections(tmp_path):
    rows = load_benchmark_script("gpu_check").main(
        ["--dry-run", "--only", "steps,data", "--budget-s", "1e-9", "--out", str(tmp_path)]
    )
    assert rows[-1] == {"row": "data", "note": "skipped: the 0 s budget was spent", "section_s": 0.0}
    assert json.loads((tmp_path / "gpu_check.json").read_text())["rows"][-1]["row"] == "data"


def test_gpu_check_refuses_bad_sections_and_a_cpu_without_dry_run(tmp_path):
    with pytest.raises(SystemExit):
        load_benchmark_script("gpu_check").main(["--dry-run", "--only", "steps,turbo", "--out", str(tmp_path)])
    if torch.cuda.is_available():  # pragma: no cover - only on a GPU machine
        pytest.skip("CUDA present: the script would run for real")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr
