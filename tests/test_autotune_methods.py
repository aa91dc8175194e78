"""autotune's time-to-accuracy methods (the EMA, the schedule): added when named (the EMA with its measured per-step
cost), left out on request or where the run cannot take them, rebuilt from the cache, and real fits with the plan.
No timing asserted."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import StochasticWeightAveraging
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import SpeedupConfigError
from lightning_speedups.autotune import autotune
from lightning_speedups.autotune.methods import METHODS, ema_blocker
from lightning_speedups.callbacks.ema import EMA
from lightning_speedups.demo import DemoClassifier


def _loader(n: int = 32, batch_size: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)),
        batch_size=batch_size,
    )


def _plan(**kw):
    return autotune(
        DemoClassifier(width=4),
        _loader(),
        candidates=[],
        budget_s=5.0,
        accelerator="cpu",
        max_epochs=1,
        **{"cache": False, **kw},
    )


def test_ema_named_in_methods_is_added_with_its_measured_cost():
    plan = _plan(methods=["ema"])
    (choice,) = plan.choices
    assert choice.name == "ema" and choice.chosen == 0.99 and choice.trials == 5
    assert 0.0 < choice.gain <= 1.0  # per step it only costs: the gain is in epochs, which a trial cannot time
    assert "of a training step" in choice.note and "`methods=[]`" in choice.note
    (cb,) = plan.callbacks
    assert isinstance(cb, EMA) and cb.decay == 0.99 and cb.warmup
    assert plan.settings["ema"] == 0.99 and METHODS == ("ema", "schedule")
    assert _plan(methods=[]).callbacks == [] and _plan(methods=[]).choices == []


def test_ema_left_out_where_the_run_cannot_take_it():
    plan = _plan(methods=["ema"], callbacks=[StochasticWeightAveraging(swa_lrs=1e-2)])
    assert plan.choices == [] and not any(isinstance(cb, EMA) for cb in plan.callbacks)
    assert any(
        "ema not added: the Trainer already averages weights (StochasticWeightAveraging)" in n for n in plan.notes
    )
    assert "sharded" in ema_blocker({"strategy": "fsdp"}) and ema_blocker({"strategy": "ddp_spawn"}) is None
    assert ema_blocker({"callbacks": [EMA()]}).startswith("the Trainer already averages weights (EMA)")


def test_methods_bad_input():
    allowed = r"Allowed values: \['ema', 'schedule'\]"
    with pytest.raises(SpeedupConfigError, match=r"`methods` has unknown names \['swa'\]. " + allowed):
        _plan(methods=["swa"])
    with pytest.raises(SpeedupConfigError, match=r"`methods`='ema' is a string. Allowed values: a list"):
        _plan(methods="ema")


def test_cached_plan_rebuilds_the_ema_and_methods_are_in_the_key(tmp_path):
    first = _plan(cache=True, cache_dir=tmp_path, methods=["ema"])
    again = _plan(cache=True, cache_dir=tmp_path, methods=["ema"])
    assert again.from_cache and [type(cb) for cb in again.callbacks] == [EMA]
    assert again.choices[0].as_dict() == first.choices[0].as_dict()
    without = _plan(cache=True, cache_dir=tmp_path, methods=[])
    assert not without.from_cache and without.callbacks == []
    # a cached plan meets a run that now has its own averaging callback: the EMA is left out, with a note
    swa = _plan(cache=True, cache_dir=tmp_path, methods=["ema"], callbacks=[StochasticWeightAveraging(swa_lrs=1e-2)])
    assert swa.from_cache and swa.callbacks == [] and any("ema not added" in n for n in swa.notes)


def test_fit_with_the_plan_validates_and_ends_on_the_average(tmp_path):
    L.seed_everything(0)
    model = DemoClassifier(width=4)
    plan = autotune(
        model, _loader(), candidates=[], methods=["ema"], budget_s=5.0, cache=False, accelerator="cpu", max_epochs=2
    )
    plan.apply(model)
    callbacks, kwargs = plan
    trainer = L.Trainer(
        callbacks=callbacks,
        **kwargs,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=3,
    )
    trainer.fit(model, train_dataloaders=_loader(), val_dataloaders=_loader(n=16))
    assert sum(isinstance(cb, EMA) for cb in trainer.callbacks) == 1
    trainer.save_checkpoint(tmp_path / "end.ckpt")
    ckpt = torch.load(tmp_path / "end.ckpt", weights_only=True)
    assert int(ckpt["averaging_state"]["n_averaged"]) == 6  # one update per optimizer step
    raw = ckpt["current_model_state"]  # the raw weights differ from the average the fit ended on
    assert any(not torch.equal(v, raw[k]) for k, v in model.state_dict().items() if v.is_floating_point())
    assert all(torch.equal(v, ckpt["state_dict"][k]) for k, v in model.state_dict().items())
