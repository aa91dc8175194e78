"""channels_last (NHWC) memory format for conv nets: the model's 4-D weights and the 4-D input batches.

cuDNN (tensor cores, AMP) and oneDNN run convolutions natively in NHWC; with NCHW tensors they insert layout
transposes around every conv. Converting the weights once and each input batch once removes them. Only the memory
layout changes: shapes, indexing and values stay the same, so checkpoints load into a plain (NCHW) model.
"""

from __future__ import annotations

import warnings
from collections.abc import MutableMapping, MutableSequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

__all__ = [
    "ChannelsLastSummary",
    "apply_channels_last",
    "count_conv2d",
    "is_channels_last",
    "match_optimizer_layout",
    "restore_contiguous",
    "to_channels_last",
    "to_channels_last_",
]

_CL = torch.channels_last


@dataclass(frozen=True)
class ChannelsLastSummary:
    """What :func:`apply_channels_last` did.

    Attributes:
        converted: ``False`` when the model has no 2-D convolution and was left untouched.
        num_conv: number of 2-D (transposed) convolution modules found.
        num_tensors: 4-D parameters and buffers whose layout was changed (already-NHWC ones are not counted).
    """

    converted: bool
    num_conv: int
    num_tensors: int


def count_conv2d(module: nn.Module) -> int:
    """Number of 2-D convolution modules (``Conv2d``, ``ConvTranspose2d`` and subclasses) in ``module``."""
    return sum(1 for m in module.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)))


def is_channels_last(tensor: torch.Tensor) -> bool:
    """Whether a 4-D tensor is laid out as channels_last (``False`` for other ranks)."""
    return tensor.dim() == 4 and tensor.is_contiguous(memory_format=_CL)


def _needs_conversion(t: torch.Tensor) -> bool:
    return t.dim() == 4 and not t.is_contiguous(memory_format=_CL)


def apply_channels_last(module: nn.Module, warn: bool = True) -> ChannelsLastSummary:
    """Convert every 4-D parameter and buffer of ``module`` to channels_last, in place.

    Parameter objects are kept (only ``.data`` changes), so an optimizer built before still holds the right tensors.
    Unlike ``module.to(memory_format=torch.channels_last)`` this leaves 5-D tensors (``Conv3d``) alone instead of
    raising. Models without a 2-D convolution gain nothing, so they are left untouched (with a warning).

    Args:
        module: any ``nn.Module``; converted in place.
        warn: emit a ``UserWarning`` when the model has no 2-D convolution.

    Returns:
        A :class:`ChannelsLastSummary`.

    Example::

        >>> from lightning_speedups.demo import DemoClassifier
        >>> model = DemoClassifier(width=8)
        >>> apply_channels_last(model).converted
        True
        >>> is_channels_last(model.backbone[0][0].weight)
        True
    """
    num_conv = count_conv2d(module)
    if num_conv == 0:
        if warn:
            warnings.warn(
                f"channels_last: `{type(module).__name__}` has no 2-D convolution, so channels_last cannot speed it "
                "up; the model was left unchanged.",
                UserWarning,
                stacklevel=2,
            )
        return ChannelsLastSummary(converted=False, num_conv=0, num_tensors=0)
    return ChannelsLastSummary(converted=True, num_conv=num_conv, num_tensors=_relayout(module, _CL))


def _relayout(module: nn.Module, memory_format: torch.memory_format) -> int:
    """Give every 4-D parameter (and its grad) and buffer of ``module`` ``memory_format``, in place; how many
    changed. ``.data =`` keeps the Parameter objects, so optimizers and DDP buckets stay valid."""
    changed = 0
    with torch.no_grad():
        for sub in module.modules():
            for param in sub._parameters.values():
                if param is not None and param.dim() == 4 and not param.is_contiguous(memory_format=memory_format):
                    param.data = param.data.contiguous(memory_format=memory_format)
                    if param.grad is not None and param.grad.dim() == 4:
                        param.grad = param.grad.contiguous(memory_format=memory_format)
                    changed += 1
            for name, buf in sub._buffers.items():
                if buf is not None and buf.dim() == 4 and not buf.is_contiguous(memory_format=memory_format):
                    sub._buffers[name] = buf.contiguous(memory_format=memory_format)
                    changed += 1
    return changed


def restore_contiguous(module: nn.Module) -> int:
    """Convert every 4-D parameter and buffer of ``module`` back to the default (NCHW) layout, in place: the inverse
    of :func:`apply_channels_last`. Parameter objects are kept (only ``.data`` changes), as are values.

    Returns:
        The number of tensors whose layout changed.

    Example::

        >>> from lightning_speedups.demo import DemoClassifier
        >>> model = DemoClassifier(width=8)
        >>> _ = apply_channels_last(model)
        >>> restore_contiguous(model) > 0, is_channels_last(model.backbone[0][0].weight)
        (True, False)
    """
    return _relayout(module, torch.contiguous_format)


def match_optimizer_layout(optimizer: torch.optim.Optimizer) -> int:
    """Give the 4-D state tensors of ``optimizer`` (Adam's moments, SGD's momentum) their parameter's layout, in
    place, after the parameters changed layout: the optimizer's elementwise kernels then read matching strides.
    Values are unchanged.

    Returns:
        The number of state tensors whose layout changed.

    Example::

        >>> conv = nn.Conv2d(3, 4, 3)
        >>> opt = torch.optim.Adam(conv.parameters())
        >>> conv(torch.randn(1, 3, 8, 8)).sum().backward(); opt.step()
        >>> _ = apply_channels_last(conv)
        >>> match_optimizer_layout(opt), is_channels_last(opt.state[conv.weight]["exp_avg"])
        (2, True)
    """
    changed = 0
    for param, state in optimizer.state.items():
        if not isinstance(param, torch.Tensor) or param.dim() != 4:
            continue
        layout = _CL if is_channels_last(param) and not param.is_contiguous() else torch.contiguous_format
        for key, value in state.items():
            if (
                isinstance(value, torch.Tensor)
                and value.shape == param.shape
                and not value.is_contiguous(memory_format=layout)
            ):
                state[key] = value.contiguous(memory_format=layout)
                changed += 1
    return changed


def _convert(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=_CL) if t.dim() == 4 else t


def to_channels_last(batch: Any) -> Any:
    """Return ``batch`` with every 4-D tensor converted to channels_last (any nesting of lists, tuples, dicts).

    Other tensors and objects are returned as they are; a tensor already in channels_last is returned itself.

    Example::

        >>> x, y = to_channels_last((torch.zeros(2, 3, 8, 8), torch.zeros(2)))
        >>> is_channels_last(x), y.dim()
        (True, 1)
    """
    return apply_to_collection(batch, torch.Tensor, _convert)


def to_channels_last_(batch: Any) -> int:
    """Convert the 4-D tensors held in mutable containers (lists, dicts, nested) of ``batch``, in place.

    Lightning passes the same batch object to ``on_train_batch_start`` and to ``training_step``, so replacing its
    items is how a callback changes what the step sees. Tensors directly inside tuples (immutable) or a bare tensor
    batch cannot be replaced; mutable containers nested in tuples are still converted.

    Returns:
        The number of tensors replaced.

    Example::

        >>> batch = [torch.zeros(2, 3, 8, 8), torch.zeros(2)]
        >>> to_channels_last_(batch), is_channels_last(batch[0])
        (1, True)
    """
    count = 0
    if isinstance(batch, MutableSequence):
        items: Any = enumerate(list(batch))
    elif isinstance(batch, MutableMapping):
        items = list(batch.items())
    elif isinstance(batch, tuple):
        return sum(to_channels_last_(item) for item in batch)
    else:
        return 0
    for key, value in items:
        if isinstance(value, torch.Tensor):
            if _needs_conversion(value):
                batch[key] = value.contiguous(memory_format=_CL)
                count += 1
        else:
            count += to_channels_last_(value)
    return count
