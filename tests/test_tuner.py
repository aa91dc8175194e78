"""The tuner layer: ``find_batch_size`` searches through the callback and stops, leaving the model as it was."""

from __future__ import annotations

import os

import pytest
import torch

import lightning_speedups
from lightning_speedups.callbacks.batch_size import ThroughputBatchSizeFinder
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.tuner import find_batch_size
from tests.helpers import quiet_trainer


def test_find_batch_size_functional():
    dm = DigitsDataModule(batch_size=32)
    model = DemoClassifier(width=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = quiet_trainer(max_epochs=1)
    result = find_batch_size(
        trainer, model, dm, mode="max_fit", init_val=16, max_val=64, steps_per_trial=1, warmup_steps=0, verbose=False
    )
    assert result.chosen == 64 and [t.batch_size for t in result.trials] == [16, 32, 64]
    assert all(t.samples_per_s > 0 and t.peak_memory > 0 for t in result.trials)
    assert dm.batch_size == 64 and dm.hparams.batch_size == 64
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert trainer.global_step == 0 and os.listdir(".") == []
    assert lightning_speedups.tuner.find_batch_size is find_batch_size


def test_find_batch_size_puts_the_trainers_callbacks_back():
    own = ThroughputBatchSizeFinder(init_val=16, max_val=16, verbose=False)
    trainer = quiet_trainer(max_epochs=1, callbacks=[own])
    saved = list(trainer.callbacks)
    result = find_batch_size(
        trainer,
        DemoClassifier(width=8),
        DigitsDataModule(batch_size=8),
        init_val=16,
        max_val=32,
        steps_per_trial=1,
        warmup_steps=0,
        verbose=False,
    )
    assert [t.batch_size for t in result.trials] == [16, 32] and own.result is None  # the trainer's own finder sat out
    assert trainer.callbacks == saved and trainer.global_step == 0


def test_exit_after_search_is_a_public_argument():
    cb = ThroughputBatchSizeFinder(
        init_val=16, max_val=32, steps_per_trial=1, warmup_steps=0, verbose=False, exit_after_search=True
    )
    assert cb.exit_after_search is True and ThroughputBatchSizeFinder().exit_after_search is False
    dm = DigitsDataModule(batch_size=8)
    trainer = quiet_trainer(max_steps=5)
    trainer.callbacks = [cb]
    trainer.fit(DemoClassifier(width=8), datamodule=dm)
    assert cb.result is not None and dm.batch_size == cb.result.chosen and trainer.global_step == 0


def test_find_batch_size_without_search_raises():
    with pytest.raises(RuntimeError, match="did not run"):
        find_batch_size(quiet_trainer(fast_dev_run=True), DemoClassifier(width=8), DigitsDataModule(), verbose=False)
