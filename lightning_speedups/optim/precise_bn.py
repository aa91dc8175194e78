"""BatchNorm running statistics recomputed for the current weights (PreciseBN style), from a few batches.

Schedule-free optimizers evaluate at averaged weights ``x`` while BatchNorm's running statistics were gathered at the
train point ``y``; the ``schedulefree`` README advises a few training batches forward at ``x`` before evaluating.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_speedups._errors import check_int
from lightning_speedups._inputs import call_model, candidate_inputs, forward_error, head_samples

__all__ = ["DEFAULT_BN_BATCHES", "batchnorm_layers", "recompute_batchnorm"]

# training batches run through the model at the eval weights to refresh BatchNorm statistics (the authors' README)
DEFAULT_BN_BATCHES = 50


def _input_picker(model: nn.Module, batch: Any) -> Callable[[nn.Module, Any], Any] | None:
    """``forward(model, batch)`` for the first form of the inputs in ``batch`` that ``model`` accepts (eval probe)."""
    for i, candidate in enumerate(candidate_inputs(head_samples(batch))):
        if forward_error(model, candidate) is None:
            return lambda m, b, i=i: call_model(m, next(islice(candidate_inputs(b), i, None)))
    return None


def batchnorm_layers(model: nn.Module) -> list[_BatchNorm]:
    """The BatchNorm layers of ``model`` that keep running statistics."""
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


def recompute_batchnorm(
    model: nn.Module,
    batches: Iterable[Any],
    num_batches: int = DEFAULT_BN_BATCHES,
    forward: Callable[[nn.Module, Any], Any] | None = None,
) -> int:
    """Recompute the running statistics of ``model``'s BatchNorm layers from ``batches`` (PreciseBN style).

    The statistics are reset and then averaged over up to ``num_batches`` batches with equal weights (``momentum`` is
    ``None`` meanwhile), with only the BatchNorm layers in train mode (dropout stays as it is) and no gradients. The
    momenta and train/eval flags are restored; when no batch runs, the old statistics are put back.

    Args:
        model: the network.
        batches: batches as the data loader gives them (on the model's device).
        num_batches: the most batches to use.
        forward: ``forward(model, batch)``; ``None`` tries the batch itself, its first element (``(x, y)``) or its
            feature keys (dict batches), as :func:`lightning_speedups._inputs.candidate_inputs` lists them.

    Returns:
        The number of batches used (0 when the model has no BatchNorm or no input form of the batch works).

    Example::

        >>> net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        >>> recompute_batchnorm(net, [(torch.randn(16, 3) + 5, torch.zeros(16)) for _ in range(2)])
        2
        >>> bool(net[1].running_mean.abs().max() > 0)
        True
    """
    check_int("num_batches", num_batches, 0)
    layers = batchnorm_layers(model)
    if not layers or not num_batches:
        return 0
    saved = [(m, m.momentum, m.training, {k: v.clone() for k, v in m.named_buffers(recurse=False)}) for m in layers]
    used = 0
    try:
        with torch.no_grad():
            for batch in islice(batches, num_batches):
                if forward is None:
                    forward = _input_picker(model, batch)
                    if forward is None:
                        rank_zero_warn(
                            f"BatchNorm statistics are not recomputed: no part of the batch runs through "
                            f"{type(model).__name__}.forward. HINT: pass `forward=lambda model, batch: ...`."
                        )
                        return 0
                if used == 0:
                    for m in layers:
                        m.reset_running_stats()
                        m.momentum = None  # cumulative average: every batch counts the same
                        m.train()
                forward(model, batch)
                used += 1
    finally:
        for m, momentum, training, buffers in saved:
            m.momentum = momentum
            m.train(training)
            if used == 0:
                for k, v in buffers.items():
                    getattr(m, k).copy_(v)
    return used
