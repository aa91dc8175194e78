"""The epoch-count comparison behind autotune's default methods: its variants are autotune's methods, a tiny run
counts validations, and bad arguments are refused. No timing asserted."""

from __future__ import annotations

import pytest

from lightning_speedups.autotune.methods import METHODS
from tests.helpers import load_benchmark_script


def _load():
    return load_benchmark_script("autotune_methods")


def test_the_default_variant_is_autotunes_default_methods():
    script = _load()
    methods, warmup = script.VARIANTS["ema+schedule"]
    assert tuple(methods) == METHODS and warmup is None  # None: autotune's own warm-up rule
    assert script.VARIANTS["ema+schedule_5pct"][1] == 0.05


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        _load().main(["digits", "--only", "ema,nope"])
    assert "--only ['nope'] unknown. Allowed values: none, ema" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _load().main(["digits", "--interval", "0"])
    assert "--interval 0.0 is out of range. Allowed values: (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("data_path", ["device", "loader"])
def test_a_run_counts_validations_to_the_target(monkeypatch, data_path):
    script = _load()
    monkeypatch.setattr(script, "PLANNED_EPOCHS", 1)
    got = script.intervals_to_target("digits", "ema+schedule", seed=0, interval=0.5, data_path=data_path)
    assert got is None or 1 <= got <= 2  # one planned epoch validated twice; the count, not its value, is tested
