"""Tuning entry points above the callbacks: run a search on a Trainer, set what it found, and stop.

This layer drives the callbacks, as Lightning's ``Tuner`` drives its ``BatchSizeFinder``; nothing below imports it.
:func:`find_batch_size` runs ``trainer.fit`` with a
:class:`~lightning_speedups.callbacks.batch_size.ThroughputBatchSizeFinder` built with ``exit_after_search=True``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_speedups.callbacks.batch_size import ThroughputBatchSizeFinder
from lightning_speedups.functional.batch_size import BatchSizeSearchResult

if TYPE_CHECKING:
    import lightning as L

__all__ = ["find_batch_size"]


def find_batch_size(
    trainer: L.Trainer,
    model: L.LightningModule,
    datamodule: L.LightningDataModule | None = None,
    train_dataloaders: Any = None,
    **kwargs: Any,
) -> BatchSizeSearchResult:
    """Search the batch size on ``trainer`` without training, set it on the model/datamodule and return the result.

    Runs ``trainer.fit`` with a :class:`~lightning_speedups.callbacks.batch_size.ThroughputBatchSizeFinder` that
    exits right after the search (``exit_after_search=True``, like Lightning's ``Tuner``); weights, optimizer and RNG
    are left as they were. ``kwargs`` go to the callback (``mode``, ``init_val``, ``max_val``, ``scale_lr``, ...).
    Another ``ThroughputBatchSizeFinder`` in ``trainer.callbacks`` is left out of this fit and put back afterwards.

    Raises:
        RuntimeError: when the search did not run (``fast_dev_run``, or no training batches).

    Example::

        >>> import lightning as L
        >>> from lightning_speedups.demo import DemoClassifier, DigitsDataModule
        >>> trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
        ...                     enable_model_summary=False, enable_checkpointing=False)
        >>> dm = DigitsDataModule(batch_size=32)
        >>> result = find_batch_size(trainer, DemoClassifier(width=8), dm, init_val=16, max_val=32,
        ...                          steps_per_trial=1, warmup_steps=0, verbose=False)
        >>> dm.batch_size == result.chosen
        True
    """
    finder = ThroughputBatchSizeFinder(**kwargs, exit_after_search=True)
    saved = trainer.callbacks
    trainer.callbacks = [finder] + [c for c in saved if not isinstance(c, ThroughputBatchSizeFinder)]
    try:
        trainer.fit(model, train_dataloaders=train_dataloaders, datamodule=datamodule)
    finally:
        trainer.callbacks = saved
    if finder.result is None:
        raise RuntimeError("The batch-size search did not run (is `fast_dev_run` set or `limit_train_batches=0`?).")
    return finder.result
