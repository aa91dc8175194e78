"""ThroughputBatchSizeFinder (way 7): pick the batch size that trains fastest, then train with it.

Importing this package registers the ``batch_size_finder`` technique. The modules:

- ``callback``: :class:`ThroughputBatchSizeFinder`, which decides when to search and applies the choice.
- ``trials``: the search on the live trainer (state put back afterwards) and the timed optimizer steps of one trial.
- ``loaders``: where the batch size lives (model, datamodule, hparams) and re-batching a loader passed to ``fit()``.
- ``apply``: learning rates rescaled for the chosen size, and the result logged.

The search itself, without Lightning, is :mod:`lightning_speedups.functional.batch_size`.
"""

from lightning_speedups.callbacks.batch_size.callback import UNITS, ThroughputBatchSizeFinder

__all__ = ["ThroughputBatchSizeFinder", "UNITS"]
