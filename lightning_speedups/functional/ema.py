"""An exponential moving average (EMA) of the weights, evaluated instead of the raw weights.

The raw weights of a run with a constant or slowly decaying learning rate jitter around a good point; their running
average sits closer to it, so the averaged model often reaches a validation accuracy earlier than the raw one
(Polyak averaging; timm ``ModelEmaV3``; Composer ``EMA``). Torch implements the average itself
(``torch.optim.swa_utils.AveragedModel``); this module only adds the *decay schedule* and a picklable update:

* :func:`ema_decay` with ``warmup=True`` uses ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates (TensorFlow's
  ``ExponentialMovingAverage(num_updates=)``), so in a short run the average does not stay anchored to the random
  initial weights for the ``1 / (1 - decay)`` steps a fixed 0.999 would need;
* :class:`EMAUpdate` is the ``multi_avg_fn`` for ``AveragedModel`` (a class, not a closure, so it pickles for
  ``ddp_spawn``); it reads ``n`` from the ``AveragedModel``'s own ``n_averaged`` buffer, which checkpoints save, so a
  resumed run continues the same decay schedule.

Use :func:`create_ema_model` without Lightning, or the :class:`~lightning_speedups.callbacks.ema.EMA` callback.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from lightning_speedups._errors import SpeedupConfigError, check_range

__all__ = [
    "EMAUpdate",
    "FollowingAveragedModel",
    "check_decay",
    "create_ema_model",
    "ema_decay",
    "follow_shapes",
    "follow_shapes_at_update",
    "swap_ema_weights",
]


def check_decay(decay: float) -> float:
    """Raise unless ``0 <= decay < 1`` (1 would never move the average)."""
    return check_range("decay", decay, 0.0, 1.0, high_inclusive=False, hint="typical values are 0.99 - 0.9999.")


def ema_decay(num_updates: int, decay: float, warmup: bool = True) -> float:
    """The decay used for the update after ``num_updates`` earlier ones.

    Example::

        >>> ema_decay(0, 0.999), ema_decay(90, 0.999), ema_decay(10_000, 0.999)
        (0.1, 0.91, 0.999)
        >>> ema_decay(5, 0.999, warmup=False)
        0.999
    """
    if not warmup:
        return decay
    return min(decay, (1.0 + num_updates) / (10.0 + num_updates))


class EMAUpdate:
    """``multi_avg_fn`` for :class:`~torch.optim.swa_utils.AveragedModel`: one EMA step at :func:`ema_decay`.

    Delegates the arithmetic to torch's ``get_ema_multi_avg_fn`` (a foreach lerp per device and dtype). A tensor whose
    value held an infinity or a NaN when the average first saw it is copied from the model instead of averaged: such
    tensors are bounds, not weights (Gemma 4's clipped linears start with ``input_min = -inf``), and a lerp between two
    infinities is NaN, which would make every output of the averaged model NaN.

    Args:
        decay: the decay after warm-up, in ``[0, 1)``.
        warmup: ramp the decay up as ``(1 + n) / (10 + n)`` (see :func:`ema_decay`).
    """

    def __init__(self, decay: float = 0.999, warmup: bool = True) -> None:
        self.decay = check_decay(decay)
        if not isinstance(warmup, bool):
            raise SpeedupConfigError(f"`warmup`={warmup!r} is not supported. Allowed values: True, False.")
        self.warmup = warmup
        self._copied: dict[int, bool] = {}  # an averaged tensor's data_ptr -> copied (held inf/NaN when first seen)

    def __call__(self, ema_params: Any, model_params: Any, num_averaged: torch.Tensor | int) -> None:
        # AveragedModel copies the weights on its first update (n = 0), so this runs from n = 1 on
        n = int(num_averaged)
        copied = [self._held_non_finite(e, m) for e, m in zip(ema_params, model_params, strict=True)]
        if any(copied):  # rare: the usual model goes to torch's foreach lerp as it came
            for e, m, copy in zip(ema_params, model_params, copied, strict=True):
                if copy:
                    e.copy_(m)
            ema_params = [e for e, copy in zip(ema_params, copied, strict=True) if not copy]
            model_params = [m for m, copy in zip(model_params, copied, strict=True) if not copy]
        if ema_params:
            get_ema_multi_avg_fn(ema_decay(n, self.decay, self.warmup))(ema_params, model_params, num_averaged)

    def _held_non_finite(self, ema: torch.Tensor, model: torch.Tensor) -> bool:
        """Whether ``model``'s value held an infinity or a NaN when this averaged tensor was first seen (checked once
        per tensor: a later NaN is a diverged run, which the average is not to hide)."""
        key = ema.data_ptr()
        if key not in self._copied:
            floating = ema.is_floating_point() or ema.is_complex()
            self._copied[key] = floating and not bool(torch.isfinite(model).all())
        return self._copied[key]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_copied": {}}  # addresses mean nothing in another process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_copied": {}, **state})

    def __repr__(self) -> str:
        return f"EMAUpdate(decay={self.decay}, warmup={self.warmup})"


def create_ema_model(
    model: nn.Module,
    decay: float = 0.999,
    warmup: bool = True,
    use_buffers: bool = True,
    device: torch.device | str | None = None,
) -> AveragedModel:
    """An ``AveragedModel`` holding the EMA of ``model``; call ``ema.update_parameters(model)`` after each step.

    Args:
        model: the model being trained (deep-copied once).
        decay: see :func:`ema_decay`.
        warmup: see :func:`ema_decay`.
        use_buffers: also average buffers (BatchNorm running statistics), as Lightning's ``WeightAveraging`` does by
            default; with ``False`` the buffers are copied from ``model``.
        device: keep the average on another device (e.g. ``"cpu"`` to save accelerator memory).

    Returns:
        The ``AveragedModel`` (a :class:`FollowingAveragedModel`: tensors the first forward pass builds are followed);
        ``ema.module`` is the averaged network.

    Example::

        >>> net = nn.Linear(2, 1)
        >>> ema = create_ema_model(net, decay=0.9)
        >>> with torch.no_grad():
        ...     ema.update_parameters(net)  # first update: a copy
        ...     _ = net.weight.add_(1.0)
        ...     ema.update_parameters(net)  # n = 1: decay min(0.9, 2 / 11)
        >>> round(float((ema.module.weight - net.weight).detach().mean()), 4)
        -0.1818
    """
    return FollowingAveragedModel(model, device=device, use_buffers=use_buffers, multi_avg_fn=EMAUpdate(decay, warmup))


def follow_shapes(average: nn.Module, model: nn.Module) -> list[str]:
    """Give ``average`` (an ``AveragedModel``'s ``module``) a copy of each tensor of ``model`` whose shape changed
    since the average was made; return their names.

    Some models build a tensor on their first forward pass: timm's ConViT replaces its ``rel_indices`` buffer (made
    ``[1, 1, 1, 3]``) by one sized for the input's patches, and a lazy module (``nn.LazyLinear``) materializes its
    weights. The average, copied before that step, would then fail to update (``output with shape [1, 1, 1, 3]
    doesn't match the broadcast shape``; ``Can't access the shape of an uninitialized parameter``).
    :class:`FollowingAveragedModel` calls it at each update; the average of such a tensor starts from the model's value.

    Example::

        >>> net = nn.Module()
        >>> net.register_buffer("table", torch.zeros(1))
        >>> ema = create_ema_model(net)
        >>> net.table = torch.arange(4.0)  # the forward pass rebuilt it
        >>> follow_shapes(ema.module, net), ema.module.table.shape
        (['table'], torch.Size([4]))
    """
    mine = dict(itertools.chain(average.named_parameters(), average.named_buffers()))
    changed = []
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        held = mine.get(name)
        if held is None or is_lazy(tensor) or (not is_lazy(held) and held.shape == tensor.shape):
            continue
        owner, _, attr = name.rpartition(".")
        copy = tensor.detach().clone().to(held.device)
        value = nn.Parameter(copy, requires_grad=False) if isinstance(held, nn.Parameter) else copy
        setattr(average.get_submodule(owner), attr, value)
        changed.append(name)
    return changed


class FollowingAveragedModel(AveragedModel):
    """torch's ``AveragedModel`` whose update first takes from the model each tensor whose shape changed since the
    copy (:func:`follow_shapes`), so that the update does not fail on it. The state is the same as the base class's."""

    def update_parameters(self, model: nn.Module) -> None:
        follow_shapes(self.module, model)
        super().update_parameters(model)


def follow_shapes_at_update(average: AveragedModel) -> AveragedModel:
    """``average`` (an ``AveragedModel`` built elsewhere: Lightning's ``WeightAveraging`` builds a plain one) as a
    :class:`FollowingAveragedModel`: the same object and state, its class changed, so no second copy of the model."""
    if not isinstance(average, FollowingAveragedModel):
        average.__class__ = FollowingAveragedModel
    return average


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    return itertools.chain(module.parameters(), module.buffers())


@contextlib.contextmanager
def swap_ema_weights(model: nn.Module, ema: AveragedModel) -> Iterator[nn.Module]:
    """Evaluate ``model`` with the EMA weights inside the block; its own weights are back afterwards.

    Parameters and buffers are swapped in place (same order as ``AveragedModel.update_parameters`` walks them), so
    optimizers and DDP keep holding the same tensors.
    """
    pairs = list(zip(_tensors(ema.module), _tensors(model), strict=True))

    def swap() -> None:
        with torch.no_grad():
            for avg, cur in pairs:
                tmp = cur.detach().clone()
                cur.copy_(avg.to(cur.device))
                avg.copy_(tmp.to(avg.device))

    swap()
    try:
        yield model
    finally:
        swap()
