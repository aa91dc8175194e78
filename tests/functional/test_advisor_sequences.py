"""The advisor's padding rule: fires above the threshold with the measured fraction, silent below and on images."""

from __future__ import annotations

import pytest

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.functional.advisor import AdvisorReport, AdvisorThresholds, Measurements, diagnose


def _measurements(tokens: int = 0, padded: int = 0, **kw):
    return Measurements(
        batch_size=8, compute_times=[0.01] * 5, data_waits=[0.0] * 5, tokens=tokens, padded_tokens=padded, **kw
    )


def _padding(m: Measurements, th: AdvisorThresholds | None = None):
    return next((f for f in diagnose(m, th) if f.key == "padding"), None)


def test_padding_rule_fires_above_threshold_with_the_fraction_and_the_fix():
    m = _measurements(tokens=600, padded=1000)
    assert m.pad_fraction == pytest.approx(0.4) and m.summary()["pad_fraction"] == pytest.approx(0.4)
    f = _padding(m)
    assert f is not None and f.severity == "high" and f.score == pytest.approx(0.4)  # all compute, 40% of it padding
    assert f.title.startswith("40% of the training batches' token positions are padding")
    assert f.evidence["pad_fraction"] == pytest.approx(0.4) and f.evidence["padded_tokens"] == 1000
    assert 'SequenceBatching(strategy="length_grouped")' in f.fix
    assert "pad_collate" in f.fix and "LengthGroupedSampler" in f.fix and "lightning_speedups" in f.fix
    assert "1.67x real tokens/s" in f.expected
    assert "padding: 40% of the token positions" in AdvisorReport(m.summary(), [f]).to_text()


def test_padding_rule_silent_below_threshold_and_on_image_data():
    assert _padding(_measurements(tokens=850, padded=1000)) is None  # 15%
    assert _padding(_measurements(tokens=800, padded=1000)) is None  # exactly 20% is not above it
    images = _measurements()  # image batches: no tokens counted
    assert images.pad_fraction is None and images.summary()["pad_fraction"] is None
    assert _padding(images) is None


def test_padding_rule_threshold_and_sequence_batching_already_on():
    assert _padding(_measurements(tokens=850, padded=1000), AdvisorThresholds(pad_fraction=0.1)) is not None
    with pytest.raises(SpeedupConfigError, match="`pad_fraction`=1.5 is out of range"):
        AdvisorThresholds(pad_fraction=1.5)
    f = _padding(_measurements(tokens=500, padded=1000, callbacks=["SequenceBatching"]))
    assert f is not None and "`SequenceBatching` is on" in f.fix and "token_budget" in f.fix
