"""The measuring module: interleaving order, warm-up, the time budget, ratios, model copies, machine description."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_speedups import measure
from lightning_speedups.measure import validation_step_metrics


def test_interleaved_timings_order_warmup_and_budget() -> None:
    calls: list[str] = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = measure.interleaved_timings(fns, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4  # one warm-up round, then A B A B A B
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for v in times.values() for t in v)
    # a spent budget stops after two timed rounds (never fewer), whatever `repeats` asks for
    calls.clear()
    times = measure.interleaved_timings(fns, repeats=50, warmup=0, budget_s=0.0)
    assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2} and calls == ["a", "b"] * 2
    assert len(measure.interleaved_timings(fns, repeats=1, warmup=0, budget_s=0.0)["a"]) == 1


def test_ratios_and_median() -> None:
    assert measure.median([3.0, 1.0, 2.0]) == 2.0
    assert measure.speed_ratio([2.0, 2.0], [1.0, 1.0]) == pytest.approx(2.0)
    assert measure.speed_ratio([1.0], [0.0]) > 1e6  # no division by zero
    calls: list[str] = []
    ratio = measure.interleaved_ratio(lambda: calls.append("base"), lambda: calls.append("cand"), repeats=2)
    assert ratio > 0 and calls == ["base", "cand"] * 3  # one warm-up pair, two timed pairs


def test_model_copy_and_train_step() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.1)).eval()
    clone = measure.model_copy(model, train=True)
    assert clone is not model and clone.training and not model.training
    assert all(a is not b and torch.equal(a, b) for a, b in zip(clone.parameters(), model.parameters()))
    assert not measure.model_copy(model).training  # None keeps the original's modes
    before = [p.detach().clone() for p in clone.parameters()]
    step = measure.make_train_step(clone, torch.randn(8, 4), torch.zeros(8, dtype=torch.long))
    assert isinstance(step(), float)
    assert any(not torch.equal(a, b) for a, b in zip(before, clone.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the original is untouched


def test_machine_info() -> None:
    info = measure.machine_info()
    assert info["cpu"] == measure.cpu_model() and info["torch"] == torch.__version__
    assert info["torch_threads"] >= 1 and info["device"]


def test_training_step_loss_reads_the_loss_the_fit_would_and_names_a_step_without_one() -> None:
    import warnings

    class Step(nn.Module):
        def __init__(self, out: object) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 1)
            self.out = out

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> object:
            warnings.warn("You are trying to `self.log()` but the loop has no Trainer", stacklevel=2)
            loss = self.lin(batch).sum()
            return {"loss": loss} if self.out == "mapping" else loss if self.out == "tensor" else self.out

    x = torch.ones(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the copy's self.log() warning is silenced, nothing else is raised
        assert measure.training_step_loss(Step("tensor"), x).requires_grad
        assert measure.training_step_loss(Step("mapping"), x).requires_grad
    assert measure.training_step_loss(nn.Linear(2, 1), x).shape == (3, 1)  # no training_step: the forward
    with pytest.raises(measure.NoLossError, match="training_step returned NoneType, not a loss tensor"):
        measure.training_step_loss(Step(None), x)
    with pytest.raises(TypeError, match="returned a dict without a .loss. tensor"):
        measure.training_step_loss(Step({"logits": 1}), x)


def test_validation_step_metrics_reads_what_one_step_logs_and_leaves_the_module_as_it_was() -> None:
    import lightning as L
    import torchmetrics

    class Scored(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(3, 2)
            self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2, average="micro")

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            logits = self.net(x)
            self.acc.update(logits, y)
            self.log("val_acc", self.acc)
            self.log_dict({"val_loss": nn.functional.cross_entropy(logits, y), "val_tag": "a", "val_vec": logits})

    module = Scored()
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    logged = validation_step_metrics(module, (x, y))
    assert set(logged) == {"val_acc", "val_loss"}
    assert logged["val_acc"] == pytest.approx((module.net(x).argmax(1) == y).float().mean().item())
    assert logged["val_loss"] == pytest.approx(nn.functional.cross_entropy(module.net(x), y).item())
    assert "log" not in module.__dict__ and module.log.__func__ is L.LightningModule.log  # the class's own again
    assert module.acc.update_count == 0  # computed on this step, then reset
    assert validation_step_metrics(nn.Linear(2, 2), torch.ones(1, 2)) == {}
