"""Pruning during training: :class:`StructuredPruning` (channels removed: a real speedup) and :class:`MaskPruning`
(weights zeroed by masks: dense shapes, no speedup), on one shared schedule.

Importing this package registers the ``pruning`` technique. The modules, from the bottom:

- ``schedule``: :func:`pruning_schedule` (the cubic schedule) and :class:`ScheduledPruning`, the base both callbacks
  share (when to prune, example inputs, checkpoint state, logged metrics).
- ``structured``: :class:`StructuredPruning` (optimizer, scheduler and DDP rebuilt after each step; the pruned
  structure in checkpoints); registers the technique.
- ``masks``: :class:`MaskPruning` (masks in the callback state, folded in at the end).
- ``alias``: ``Pruning(mode=...)``, deprecated, which builds one of the two.

The pruning itself, without Lightning, is :mod:`lightning_speedups.functional.pruning`.
"""

from lightning_speedups.callbacks.pruning.alias import Pruning
from lightning_speedups.callbacks.pruning.masks import MaskPruning
from lightning_speedups.callbacks.pruning.schedule import ScheduledPruning, pruning_schedule
from lightning_speedups.callbacks.pruning.structured import StructuredPruning

__all__ = ["MaskPruning", "Pruning", "ScheduledPruning", "StructuredPruning", "pruning_schedule"]
