from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.label_smoothing import (
    apply_label_smoothing,
    find_label_smoothing_targets,
    restore_label_smoothing,
    smooth_labels,
)


class _AttrNet(nn.Module):
    """Computes F.cross_entropy itself and reads its smoothing from an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.label_smoothing = 0.0

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.layer(x), y, label_smoothing=self.label_smoothing)


def test_label_smoothing_functional():
    model = DemoClassifier(width=4)
    x = torch.randn(6, 3, 32, 32)
    y = torch.randint(0, 10, (6,))
    model.eval()
    with torch.no_grad():
        logits = model(x)
    plain = model.loss_fn(logits, y)
    summary = apply_label_smoothing(model, 0.2)
    assert summary.loss_modules == ("loss_fn",) and summary.attribute is None and summary.num_targets == 1
    smoothed = model.loss_fn(logits, y)
    # the loss torch computes equals cross-entropy against the smoothed distribution
    expected = -(smooth_labels(y, 10, 0.2) * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(smoothed, expected)
    assert not torch.allclose(smoothed, plain)
    restore_label_smoothing(model, summary)
    assert model.loss_fn.label_smoothing == 0.0
    torch.testing.assert_close(model.loss_fn(logits, y), plain)


def test_label_smoothing_attribute_and_hparams():
    net = _AttrNet()
    x = torch.randn(5, 4)
    y = torch.randint(0, 3, (5,))
    summary = apply_label_smoothing(net, 0.1)
    assert summary.attribute == "label_smoothing" and net.label_smoothing == 0.1
    torch.testing.assert_close(net.loss(x, y), nn.functional.cross_entropy(net.layer(x), y, label_smoothing=0.1))
    restore_label_smoothing(net, summary)
    assert net.label_smoothing == 0.0

    class WithHparams(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hparams = {"label_smoothing": 0.0}

    held = WithHparams()
    assert find_label_smoothing_targets(held) == ([], True)
    summary = apply_label_smoothing(held, 0.3)
    assert held.hparams["label_smoothing"] == 0.3
    restore_label_smoothing(held, summary)
    assert held.hparams["label_smoothing"] == 0.0


def test_smooth_labels_rows():
    soft = smooth_labels(torch.tensor([1, 0, 2]), num_classes=3, smoothing=0.3)
    torch.testing.assert_close(soft.sum(-1), torch.ones(3))
    assert soft[0, 1] == pytest.approx(0.8) and soft[0, 0] == pytest.approx(0.1)
    probs = torch.tensor([[0.5, 0.5, 0.0]])
    torch.testing.assert_close(smooth_labels(probs, 3, 0.3), torch.tensor([[0.45, 0.45, 0.1]]))


def test_label_smoothing_functional_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`smoothing`=1.0 is out of range.*a number in \[0.0, 1.0\)"):
        apply_label_smoothing(DemoClassifier(width=4), 1.0)
    with pytest.raises(SpeedupConfigError, match=r"`num_classes`=1 is out of range"):
        smooth_labels(torch.tensor([0]), 1, 0.1)
    with pytest.raises(SpeedupConfigError, match=r"no nn.CrossEntropyLoss submodule and no `label_smoothing` attr"):
        apply_label_smoothing(nn.Linear(2, 2), 0.1)
    with pytest.raises(SpeedupConfigError, match=r"no attribute was given. HINT: compute the loss with"):
        apply_label_smoothing(nn.Linear(2, 2), 0.1, attribute=None)
    bad = _AttrNet()
    bad.label_smoothing = "high"  # type: ignore[assignment]
    with pytest.raises(SpeedupConfigError, match=r"`_AttrNet.label_smoothing`='high' cannot hold the label smoothing"):
        apply_label_smoothing(bad, 0.1)
