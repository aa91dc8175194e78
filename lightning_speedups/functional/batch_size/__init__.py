"""Throughput batch-size search (way 7): the policy, its records and the state it must put back.

The search itself knows nothing about Lightning: :func:`search_batch_size` walks a ladder of batch sizes, asks a
``measure(batch_size)`` callable for one :class:`BatchSizeTrial` per size, and stops on a throughput plateau, an
out-of-memory error, the memory budget or the end of the ladder. On token sequences the trials carry real (non-pad)
tokens and the search ranks tokens/s. The
:class:`~lightning_speedups.callbacks.batch_size.ThroughputBatchSizeFinder` callback runs it on a live Trainer, and
:func:`lightning_speedups.tuner.find_batch_size` (one layer up) runs that callback for a search without training.

The modules, from the bottom:

- ``config``: :class:`BatchSizeSearchConfig`, how the search walks and when it stops.
- ``records``: :class:`BatchSizeTrial` and :class:`BatchSizeSearchResult`, and how the noise rules read a trial.
- ``curve``: the step-cost curve fitted to every measured size, and the cost of an epoch's partial last batch.
- ``policy``: the verdicts under timing noise and the final, re-measured choice.
- ``state``: peak memory per trial (:class:`MemoryMeter`) and the training-state snapshot put back afterwards.
- ``search``: :func:`search_batch_size` (climb, step back, refine) and :func:`batch_size_ladder`.
- ``noise_scale``: the gradient noise scale, the extra samples a larger batch needs to the same loss (autotune's bar
  for a larger batch).
"""

# LR_RULES, MODES and scale_lr_factor stay importable from here (the callbacks use them), outside `__all__`
from lightning_speedups.functional.batch_size.config import LR_RULES as LR_RULES
from lightning_speedups.functional.batch_size.config import MODES as MODES
from lightning_speedups.functional.batch_size.config import BatchSizeSearchConfig
from lightning_speedups.functional.batch_size.records import BatchSizeSearchResult, BatchSizeTrial
from lightning_speedups.functional.batch_size.search import NoBatchSizeFits, batch_size_ladder, search_batch_size
from lightning_speedups.functional.batch_size.search import scale_lr_factor as scale_lr_factor
from lightning_speedups.functional.batch_size.state import MemoryMeter, snapshot_training_state

__all__ = [
    "BatchSizeSearchConfig",
    "BatchSizeTrial",
    "BatchSizeSearchResult",
    "NoBatchSizeFits",
    "search_batch_size",
    "batch_size_ladder",
    "MemoryMeter",
    "snapshot_training_state",
]
