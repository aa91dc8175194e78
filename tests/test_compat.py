"""The seam to the frameworks' internals: one test per ``lightning_speedups._compat`` function.

Each test exercises the private name a function relies on against the installed Lightning / torchmetrics / torch.
When an upgrade moves or changes one, the test fails with a message naming the function to update (its docstring
says what it relies on), instead of a callback failing deep inside a fit.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import _compat
from tests.helpers import quiet_trainer


def _seam(name: str) -> str:
    return (
        f"lightning {L.__version__} / torchmetrics {torchmetrics.__version__} / torch {torch.__version__}: the private "
        f"API behind `lightning_speedups._compat.{name}` changed; update it (its docstring says what it relies on)"
    )


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a compat function; a missing or re-shaped private name fails the test with :func:`_seam`'s message."""
    try:
        return fn(*args, **kwargs)
    except (ImportError, AttributeError, TypeError, KeyError) as err:
        pytest.fail(f"{_seam(fn.__name__)}: {type(err).__name__}: {err}")


def _check(ok: bool, name: str, what: str) -> None:
    if not ok:
        pytest.fail(f"{_seam(name)}: {what}")


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int = 32, batch_size: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)), batch_size=batch_size
    )


class _TinyData(L.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return _loader(batch_size=self.batch_size)


class _Probe(L.Callback):
    """Runs ``fn(trainer, pl_module[, batch])`` in one hook and records batch sizes the fit trained on."""

    def __init__(self, hook: str, fn: Callable[..., Any]) -> None:
        self.hook = hook
        self.fn = fn
        self.out = None
        self.sizes = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.hook == "setup":
            self.out = self.fn(trainer, pl_module)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.hook == "on_fit_start":
            self.out = self.fn(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.hook == "on_train_epoch_start" and trainer.current_epoch == 1:
            self.out = self.fn(trainer, pl_module)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.sizes.append(batch[0].shape[0])
        if self.hook == "on_train_batch_start" and idx == 0 and self.out is None:
            self.out = self.fn(trainer, pl_module, batch)


def _fit(probe: _Probe, data: Any = None, **trainer_kwargs: Any) -> L.Trainer:
    trainer = quiet_trainer(callbacks=[probe], **{"max_steps": 2, **trainer_kwargs})
    if isinstance(data, L.LightningDataModule):
        trainer.fit(_Tiny(), datamodule=data)
    else:
        trainer.fit(_Tiny(), train_dataloaders=data if data is not None else _loader())
    return trainer


# --- batch size finder / LR finder ---------------------------------------------------------------------------------


def test_fit_source_instance() -> None:
    loader = _loader()
    dm = _TinyData()
    probe = _Probe("setup", lambda t, m: _call(_compat.fit_source_instance, t))
    _fit(probe, loader)
    _check(probe.out is loader, "fit_source_instance", "the loader passed to fit() is not the data source instance")
    _fit(probe, dm)
    _check(probe.out is dm, "fit_source_instance", "the datamodule passed to fit() is not the data source instance")


def test_fit_source_is_module() -> None:
    probe = _Probe("setup", lambda t, m: _call(_compat.fit_source_is_module, t))
    _fit(probe, _loader())
    _check(probe.out is False, "fit_source_is_module", "a loader passed to fit() counts as a module hook")
    _fit(probe, _TinyData())
    _check(probe.out is True, "fit_source_is_module", "a datamodule passed to fit() does not count as a module hook")


def test_set_fit_train_loader() -> None:
    probe = _Probe("setup", lambda t, m: _call(_compat.set_fit_train_loader, t, _loader(batch_size=4)))
    _fit(probe, _loader(batch_size=8))
    _check(probe.sizes == [4, 4], "set_fit_train_loader", f"training did not use the replaced loader: {probe.sizes}")


def test_fit_source_dataloader() -> None:
    probe = _Probe("setup", lambda t, m: _call(_compat.fit_source_dataloader, t))
    _fit(probe, _TinyData(batch_size=16))
    _check(
        isinstance(probe.out, DataLoader) and probe.out.batch_size == 16,
        "fit_source_dataloader",
        f"did not build the datamodule's train_dataloader(): {probe.out!r}",
    )


def test_reload_train_dataloader() -> None:
    dm = _TinyData(batch_size=8)

    def grow(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm.batch_size = 16
        _call(_compat.reload_train_dataloader, trainer)

    probe = _Probe("on_train_epoch_start", grow)
    _fit(probe, dm, max_steps=-1, max_epochs=2, limit_train_batches=2)
    _check(
        probe.sizes == [8, 8, 16, 16],
        "reload_train_dataloader",
        f"the epoch did not train on the rebuilt loader: {probe.sizes}",
    )


def test_train_dataloader_built() -> None:
    before = _Probe("on_fit_start", lambda t, m: _call(_compat.train_dataloader_built, t))
    _fit(before, _TinyData())
    _check(before.out is False, "train_dataloader_built", "the fit loop holds a train loader before it built one")
    during = _Probe("on_train_batch_start", lambda t, m, b: _call(_compat.train_dataloader_built, t))
    _fit(during, _TinyData())
    _check(during.out is True, "train_dataloader_built", "the fit loop's built train loader was not seen")


def test_no_gradient_sync() -> None:
    from lightning.pytorch.loops import utilities

    params = inspect.signature(getattr(utilities, "_block_parallel_sync_behavior", lambda: None)).parameters
    _check(
        list(params)[:2] == ["strategy", "block"],
        "no_gradient_sync",
        f"_block_parallel_sync_behavior(strategy, block) has the signature {list(params)}",
    )
    probe = _Probe("on_fit_start", lambda t, m: _call(_compat.no_gradient_sync, t.strategy))
    _fit(probe)
    with probe.out:  # a context manager, a no-op on one device
        pass


def test_replace_and_restore_training_results() -> None:
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection

    def swap(trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> tuple[Any, Any, Any]:
        previous = _call(_compat.replace_training_results, trainer)
        fresh = trainer.fit_loop.epoch_loop._results
        _call(_compat.restore_training_results, trainer, previous)
        return previous, fresh, trainer.fit_loop.epoch_loop._results

    probe = _Probe("on_train_batch_start", swap)
    _fit(probe)
    previous, fresh, restored = probe.out
    _check(
        isinstance(previous, _ResultCollection) and previous.training,
        "replace_training_results",
        f"fit_loop.epoch_loop._results is not a training _ResultCollection: {previous!r}",
    )
    _check(
        isinstance(fresh, _ResultCollection) and fresh is not previous and fresh.training,
        "replace_training_results",
        "no fresh training _ResultCollection was installed",
    )
    _check(restored is previous, "restore_training_results", "the previous collection was not put back")


def test_set_results_batch() -> None:
    marker = object()

    def set_batch(trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> Any:
        previous = trainer.fit_loop.epoch_loop._results.batch
        _call(_compat.set_results_batch, trainer, marker)
        seen = trainer.fit_loop.epoch_loop._results.batch
        _call(_compat.set_results_batch, trainer, previous)
        return seen

    probe = _Probe("on_train_batch_start", set_batch)
    _fit(probe)
    _check(probe.out is marker, "set_results_batch", "`_results.batch` did not take the batch")


def test_before_batch_transfer() -> None:
    class Doubling(_Tiny):
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return [batch[0] * 2, batch[1]]

    module = Doubling()
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(module, train_dataloaders=_loader())
    x = torch.ones(2, 4)
    out = _call(_compat.before_batch_transfer, module, [x, torch.zeros(2)])
    _check(torch.equal(out[0], x * 2), "before_batch_transfer", "on_before_batch_transfer did not run")


def test_strategy_training_step() -> None:
    probe = _Probe("on_train_batch_start", lambda t, m, b: _call(_compat.strategy_training_step, t, b, 0))
    _fit(probe)
    _check(
        isinstance(probe.out, torch.Tensor) and probe.out.requires_grad,
        "strategy_training_step",
        f"training_step through the strategy returned {probe.out!r}",
    )


def test_tuner_exit() -> None:
    err = _call(_compat.tuner_exit)
    _check(isinstance(err, BaseException), "tuner_exit", f"{err!r} is not an exception")

    def stop(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        raise err

    trainer = _fit(_Probe("on_fit_start", stop))  # returns normally: the trainer swallows it
    _check(
        trainer.global_step == 0 and trainer.state.finished,
        "tuner_exit",
        f"fit did not end quietly: step {trainer.global_step}, state {trainer.state}",
    )


def test_collect_and_restore_rng_states() -> None:
    states = _call(_compat.collect_rng_states, include_cuda=False)
    _check({"torch", "numpy", "python"} <= set(states), "collect_rng_states", f"states hold only {sorted(states)}")
    first = (torch.rand(2), np.random.rand(), random.random())
    _call(_compat.restore_rng_states, states)
    again = (torch.rand(2), np.random.rand(), random.random())
    _check(
        torch.equal(first[0], again[0]) and first[1:] == again[1:],
        "restore_rng_states",
        "the generators did not replay after restoring their states",
    )


def test_metric_state() -> None:
    metric = torchmetrics.classification.MulticlassAccuracy(3, average="micro")
    metric.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    expected = float(metric.compute())
    states, count, computed = _call(_compat.metric_state, metric)
    _check(
        set(states) == set(metric._defaults) and states and count == 1,
        "metric_state",
        f"states {sorted(states)}, update count {count!r}",
    )
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in states.items()}
    metric.reset()
    metric.update(torch.tensor([0]), torch.tensor([1]))
    _call(_compat.restore_metric_state, metric, saved, count, computed)
    _check(
        float(metric.compute()) == pytest.approx(expected) and metric._update_count == 1,
        "restore_metric_state",
        "the metric did not come back to its saved accumulation",
    )


def test_refresh_scheduler_last_lr() -> None:
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    opt.param_groups[0]["lr"] = 0.4
    _call(_compat.refresh_scheduler_last_lr, sched)
    _check(sched.get_last_lr() == [0.4], "refresh_scheduler_last_lr", f"get_last_lr() is {sched.get_last_lr()}")


def test_inner_schedulers() -> None:
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    sequential = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[2])
    got = _call(_compat.inner_schedulers, sequential)
    _check(got == [warm, cosine], "inner_schedulers", f"SequentialLR's schedulers read as {got!r}")
    _check(_call(_compat.inner_schedulers, cosine) == [], "inner_schedulers", "a plain scheduler has no inner ones")


def test_lr_finder_suggestion() -> None:
    xs = [float(i) for i in range(20)]
    losses = [5.0] * 8 + [5.0 - 2.0 * k for k in range(1, 5)] + [-3.0] * 8  # steepest drop from index 8 on
    got = _call(_compat.lr_finder_suggestion, xs, losses, skip_begin=2, skip_end=1)
    _check(got in xs[7:12], "lr_finder_suggestion", f"suggested {got!r}, not a point of the steepest descent")
    _check(
        _call(_compat.lr_finder_suggestion, xs[:3], losses[:3], skip_begin=2, skip_end=1) is None,
        "lr_finder_suggestion",
        "a curve too short for the skips should give None",
    )


def test_undo_lr_find_debias() -> None:
    from lightning.pytorch.tuner import Tuner

    class Constant(_Tiny):  # the loss is always 2.0, so every raw point shows Lightning's smoothing factor
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer.weight.sum() * 0.0 + 2.0

    trainer = quiet_trainer(max_steps=8)
    finder = Tuner(trainer).lr_find(
        Constant(),
        train_dataloaders=_loader(n=64, batch_size=4),
        num_training=8,
        early_stop_threshold=None,
        update_attr=False,
    )
    raw = finder.results["loss"]
    beta = 0.98
    expected_raw = [2.0 * (1 - beta ** (k + 1)) / (1 - beta ** (k + 2)) for k in range(len(raw))]
    _check(
        len(raw) >= 5 and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(raw, expected_raw)),
        "undo_lr_find_debias",
        f"Lightning's smoothed losses no longer read off by one step: {raw[:4]}",
    )
    fixed = _call(_compat.undo_lr_find_debias, raw)
    _check(all(math.isclose(x, 2.0, rel_tol=1e-6) for x in fixed), "undo_lr_find_debias", f"fixed {fixed[:4]}")


def test_averaged_model_reads_lightnings_weight_averaging():
    from lightning.pytorch.callbacks import EMAWeightAveraging

    from lightning_speedups._compat import averaged_model

    callback = EMAWeightAveraging()
    assert averaged_model(callback) is None, "WeightAveraging no longer starts with `_average_model = None`"


def test_retarget_scheduler_follows_split_groups() -> None:
    import warnings

    from torch.optim import lr_scheduler as tls

    def pair() -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        a, b, c = (nn.Parameter(torch.zeros(2)) for _ in range(3))
        old = torch.optim.SGD([{"params": [a]}, {"params": [b, c], "lr": 0.2}], lr=0.1)
        new = torch.optim.SGD([{"params": [a]}, {"params": [b]}, {"params": [c]}], lr=0.1)
        return old, new

    builders = {
        "LambdaLR": lambda o: tls.LambdaLR(o, [lambda s: 1.0, lambda s: 0.5**s]),
        "OneCycleLR": lambda o: tls.OneCycleLR(o, [0.1, 0.2], total_steps=6, cycle_momentum=False),
        "SequentialLR": lambda o: tls.SequentialLR(
            o, [tls.LinearLR(o, 0.5, total_iters=2), tls.CosineAnnealingLR(o, 4)], milestones=[2]
        ),
    }
    for name, build in builders.items():
        old, new = pair()
        scheduler = build(old)
        for group, source in zip(new.param_groups, [0, 1, 1]):  # a converter copies its source group's settings
            group.update({k: v for k, v in old.param_groups[source].items() if k != "params"})
        reference_old, _ = pair()
        reference = build(reference_old)
        _call(_compat.retarget_scheduler, scheduler, new, [0, 1, 1])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "optimizer.step() overridden" / call-order warning
            for _ in range(5):
                new.step()
                scheduler.step()
                reference_old.step()
                reference.step()
                got = [g["lr"] for g in new.param_groups]
                want = [g["lr"] for g in reference_old.param_groups]
                _check(
                    got == pytest.approx([want[0], want[1], want[1]]),
                    "retarget_scheduler",
                    f"{name} no longer keeps its per-group lists where this function looks: {got} vs {want}",
                )


def test_compat_all_names_every_public_function() -> None:
    """``_compat.__all__`` lists every public function and class ``_compat.py`` defines, and the torch-pruning
    overrides (``check_pruning_group``, ...) are touched nowhere else in the package."""
    defined = {
        name
        for name, obj in vars(_compat).items()
        if not name.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__ == _compat.__name__
    }
    assert sorted(defined - set(_compat.__all__)) == [], "defined in _compat.py but missing from its __all__"
    assert sorted(set(_compat.__all__) - defined) == [], "in _compat.__all__ but not defined there"
    package = Path(_compat.__file__).parent
    outside = [
        str(p.relative_to(package))
        for p in sorted(package.rglob("*.py"))
        if p.name != "_compat.py" and "check_pruning_group" in p.read_text()
    ]
    assert not outside, f"torch-pruning's check_pruning_group is overridden outside _compat.py: {outside}"
