"""The console script: --help, info, bench --quick (JSON + PNG), bad technique names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from lightning_speedups.cli import main


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "info" in out and "bench" in out and "advise" in out


def test_cli_console_script_installed():
    exe = shutil.which("lightning-speedups") or shutil.which("lightning-speedups", path=str(sys.prefix) + "/bin")
    assert exe, "console script `lightning-speedups` is not installed"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "bench" in proc.stdout


def test_cli_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for needle in ("torch", "lightning", "Trainer settings", "accelerator", "precision", "Techniques", "peak fp32"):
        assert needle in out
    peak = next(line for line in out.splitlines() if "peak fp32" in line)
    assert "an estimate" in peak or "unknown" in peak  # the CPU peak is estimated (ISA x cores x clock) or says why not


def test_cli_bench_only_json_and_plots(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--quick",
            "--only",
            "trainer_settings",
            "--json",
            str(out_json),
            "--plots",
            str(tmp_path),
            "--markdown",
            str(tmp_path / "bench.md"),
        ]
    )
    assert code == 0
    payload = json.loads(out_json.read_text())
    assert payload["quick"] is True and payload["errors"] == {}
    assert [r["technique"] for r in payload["rows"]] == ["precision"]
    assert payload["rows"][0]["ratio"] > 0
    assert (tmp_path / "components.png").stat().st_size > 1000 and not (tmp_path / "end_to_end.png").exists()
    assert "| technique |" in (tmp_path / "bench.md").read_text()
    assert "speedup" in capsys.readouterr().out


def test_cli_bench_unknown_technique(capsys):
    assert main(["bench", "--quick", "--only", "warp_drive"]) == 2
    err = capsys.readouterr().err
    assert "`technique`='warp_drive' is not registered. Allowed values:" in err


def test_cli_bench_target_out_of_range(capsys):
    assert main(["bench", "--quick", "--only", "recipes", "--target-accuracy", "1.5"]) == 2
    assert "`target`=1.5 is out of range" in capsys.readouterr().err


def test_cli_bench_unreachable_target_errors_in_bounded_time(capsys):
    # the digits task cannot reach 100% validation accuracy: the bench stops after its epoch budget and says so
    assert main(["bench", "--quick", "--only", "recipes", "--target-accuracy", "1.0"]) == 1
    err = capsys.readouterr().err
    assert "recipes: SpeedupConfigError: `target`=1.0 was not reached" in err and "lower the target" in err


@pytest.mark.slow
def test_cli_bench_quick_every_technique(tmp_path):
    from lightning_speedups._registry import get_technique, list_techniques

    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(out), "--plots", str(tmp_path)]) == 0
    payload = json.loads(out.read_text())
    with_bench = {n for n in list_techniques() if get_technique(n).bench is not None}
    assert len(payload["rows"]) >= len(with_bench)
    for r in payload["rows"]:
        assert r["technique"] and r["metric"] and isinstance(r["ratio"], float)
        if not (0 < r["ratio"] < float("inf")):  # only a target that one side missed may leave no finite ratio
            assert "not reach" in r["note"], r
    for chart in ("end_to_end.png", "components.png", "accuracy_vs_time.png"):  # the end-to-end chart comes first
        assert (tmp_path / chart).exists(), chart
    assert payload["rows"][0]["technique"] in ("recipe", "autotune")  # the headline: whole-run results first


def test_bench_table_says_no_speedup_once_and_never_beside_a_gain():
    from lightning_speedups.benchmarks._common import BenchRow
    from lightning_speedups.benchmarks.runner import _table_rows

    rows = [
        BenchRow("optim", "a", "m", 1.0, 1.0, 1.02, note=""),
        BenchRow("optim", "b", "m", 1.0, 1.0, 0.9, note="no speedup (masks keep dense kernels); x"),
        BenchRow("optim", "c", "m", 1.0, 1.0, 1.5, note="fused kernel faster"),
        BenchRow("finetune", "d", "m", float("nan"), float("nan"), float("nan"), note="target not reached"),
    ]
    notes = [r[-1] for r in _table_rows(rows)]
    assert notes[0] == "no speedup" and notes[1].count("no speedup") == 1
    assert notes[2] == "fused kernel faster" and "not reached" in notes[3] and "no speedup" not in notes[3]
    assert _table_rows(rows)[3][3] == "not reached"
    # a choice scored against the best one (the batch-size finder's rows) is a quality ratio: no speedup verdict
    quality = BenchRow(
        "batch_size_finder",
        "e",
        "throughput",
        1.0,
        0.93,
        0.93,
        note="target ratio >= 0.9",
        extra={"quality_ratio": True},
    )
    assert _table_rows([quality])[0][-1] == "target ratio >= 0.9"
