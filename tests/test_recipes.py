"""Recipes: they fit for a few batches, and their conflict rules raise or adjust as documented."""

from __future__ import annotations

import pytest
import torch

from lightning_speedups import ChannelsLast, SpeedupConfigError, StructuredPruning, TorchCompile
from lightning_speedups.benchmarks._common import TimeToTarget
from lightning_speedups.demo import DemoClassifier, DemoMLP, DigitsDataModule
from lightning_speedups.recipes import (
    check_conflicts,
    device_datamodule,
    fast_finetune,
    fast_train,
    get_recipe,
    list_recipes,
)
from tests.helpers import quiet_trainer

QUIET = dict(
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    limit_train_batches=4,
    limit_val_batches=1,
)


@pytest.mark.parametrize("name", list_recipes())
def test_recipe_fits_a_few_batches(name):
    model = DemoClassifier(width=8)
    recipe = get_recipe(name, model=model, max_epochs=2, precision="32-true", **QUIET)
    callbacks, kwargs = recipe
    recipe.apply(model)
    schedule = {"fast_train": "linear_warmup_cosine", "fast_finetune": "onecycle"}[name]
    assert model.scheduler_config.name == schedule and model.optimizer_config.name == "adamw"
    trainer = quiet_trainer(callbacks=callbacks, **kwargs)
    trainer.fit(model, device_datamodule(DigitsDataModule(batch_size=32), batch_size=64))
    assert trainer.global_step == 8
    assert "val_acc" in trainer.callback_metrics
    assert name in recipe.describe()


def test_recipe_device_datamodule_batches():
    dm = device_datamodule(DigitsDataModule(batch_size=32), batch_size=64, hflip=0.5)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (64,)
    assert abs(float(x.mean())) < 1.0  # normalised like the source datamodule


def test_recipe_conflicts_and_notes():
    pytest.importorskip("torch_pruning")
    with pytest.raises(SpeedupConfigError, match=r"`StructuredPruning` with `TorchCompile` is refused"):
        check_conflicts([StructuredPruning(amount=0.5), TorchCompile(backend="eager")])
    with pytest.raises(SpeedupConfigError, match=r"`StructuredPruning` with `TorchCompile` is refused"):
        fast_train(compile=True, callbacks=[StructuredPruning(amount=0.5)], precision="32-true")
    kept, notes = check_conflicts([ChannelsLast()], DemoMLP(hidden=(16,)))
    assert kept == [] and "no 2-D convolution" in notes[0]
    recipe = fast_train(model=DemoMLP(hidden=(16,)), channels_last=True, precision="32-true")
    assert not any(isinstance(cb, ChannelsLast) for cb in recipe.callbacks) and recipe.notes
    recipe = fast_train(model=DemoClassifier(width=8), channels_last=True, precision="32-true")
    assert any(isinstance(cb, ChannelsLast) for cb in recipe.callbacks)


def test_recipe_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`recipe`='fastest' is unknown. Allowed values: 'fast_train'"):
        get_recipe("fastest")
    import lightning as L

    class Plain(L.LightningModule):
        pass

    with pytest.raises(SpeedupConfigError, match=r"does not use SpeedupMixin"):
        fast_finetune(precision="32-true").apply(Plain())

    class NoTensors(L.LightningDataModule):
        pass

    with pytest.raises(SpeedupConfigError, match=r"has no `train_images` tensor"):
        device_datamodule(NoTensors())


def test_time_to_target_recorder_stops_at_target():
    class T:
        callback_metrics = {"val_acc": torch.tensor(0.97)}
        should_stop = False

    rec = TimeToTarget(0.95)
    rec.on_fit_start(None, None)
    rec.on_validation_epoch_end(T, None)
    assert T.should_stop and rec.reached_at is not None and rec.curve[0][1] == pytest.approx(0.97)


def test_recipe_rejects_bad_switches():
    from lightning_speedups import SpeedupConfigError
    from lightning_speedups.recipes import fast_train

    with pytest.raises(SpeedupConfigError, match="`channels_last`='maybe' is not supported. Allowed values: True"):
        fast_train(channels_last="maybe")
    with pytest.raises(SpeedupConfigError, match="`compile`='yes' is not supported"):
        fast_train(compile="yes")


def test_fast_train_probe_is_cached_and_timed(monkeypatch, tmp_path):
    # the CPU layout/precision probe runs once per model and machine: the second recipe reads the cache (no timing),
    # reports the seconds the first one spent, and a caller's precision limits the probe to the layout
    from lightning_speedups import _recipe_probe

    calls = []

    def fake_probe(model, example, precisions=("32-true", "bf16-mixed"), **kw):
        calls.append(tuple(precisions))
        return True, precisions[-1], {"nchw+fp32": 1.0, "channels_last+fp32": 1.3}

    monkeypatch.setattr(_recipe_probe, "measure_cpu_layout_and_precision", fake_probe)
    kw = dict(model=DemoClassifier(width=4), max_epochs=1, accelerator="cpu", cache_dir=tmp_path)
    first = fast_train(**kw)
    second = fast_train(**kw)
    assert calls == [("32-true", "bf16-mixed")]
    assert first.probe_s > 0 and first.notes[0].startswith("measured on this CPU")
    assert second.notes[0].startswith("cached measurement on this CPU")
    assert "channels_last+fp32 1.30x" in second.notes[0]
    assert [type(c).__name__ for c in second.callbacks] == [type(c).__name__ for c in first.callbacks]
    assert "ChannelsLast" in [type(c).__name__ for c in second.callbacks]
    assert second.trainer_kwargs["precision"] == first.trainer_kwargs["precision"] == "bf16-mixed"
    fast_train(**kw, precision="32-true")
    assert calls[-1] == ("32-true",)
    fast_train(**{**kw, "cache": False})
    assert len(calls) == 3
    with pytest.raises(SpeedupConfigError, match="`cache`='yes'"):
        fast_train(**{**kw, "cache": "yes"})


def test_fast_train_adds_one_ema():
    from lightning_speedups.callbacks.ema import EMA

    recipe = fast_train(model=DemoClassifier(width=4), channels_last=False, precision="32-true")
    assert [cb.decay for cb in recipe.callbacks if isinstance(cb, EMA)] == [0.99]
    mine = EMA(decay=0.9)
    recipe = fast_train(model=DemoClassifier(width=4), channels_last=False, precision="32-true", callbacks=[mine])
    assert [cb for cb in recipe.callbacks if isinstance(cb, EMA)] == [mine]
    recipe = fast_train(model=DemoClassifier(width=4), channels_last=False, precision="32-true", ema=None)
    assert not any(isinstance(cb, EMA) for cb in recipe.callbacks)
