"""Example inputs for tracing and checks, taken from a training batch when the user gave none, and the one way to run
a model on them: :func:`call_model` (a dict, a tuple or a single input), in :func:`eval_mode` or :func:`train_mode`
(both leave the model as they found it); when a run fails, :func:`failing_module` says which submodule it failed in."""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn

__all__ = [
    "LABEL_KEYS",
    "call_model",
    "candidate_inputs",
    "eval_mode",
    "example_from_batch",
    "failing_module",
    "first_batch",
    "flat_tensors",
    "forward_error",
    "head_samples",
    "train_mode",
]

# keys of a dict batch that are targets, not model inputs (Hugging Face, torchvision detection, common usage)
LABEL_KEYS = ("labels", "label", "target", "targets", "y")


def _head(value: Any, n: int, batch_size: int | None) -> Any:
    """The first ``n`` samples of every tensor whose first dimension is the batch dimension."""
    if isinstance(value, torch.Tensor):
        return value[:n] if value.dim() > 0 and (batch_size is None or value.shape[0] == batch_size) else value
    if isinstance(value, Mapping):
        return {k: _head(v, n, batch_size) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_head(v, n, batch_size) for v in value)
    return value


def head_samples(batch: Any, n: int = 2) -> Any:
    """The first ``n`` samples of every batched tensor of ``batch`` (the batch dimension read off the batch)."""
    return _head(batch, n, _batch_size(batch))


def _batch_size(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else []
    for v in values:
        size = _batch_size(v)
        if size is not None:
            return size
    return None


def candidate_inputs(batch: Any) -> Iterator[Any]:
    """Plausible ``forward`` inputs in a batch, most likely first (tensor / tuple of args / dict of kwargs)."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        features = {k: v for k, v in batch.items() if k not in LABEL_KEYS}
        yield features  # model(**features): Hugging Face style
        if len(features) != len(batch):
            yield dict(batch)
        yield tuple(features.values())  # model(input_ids, attention_mask)
        yield (dict(batch),)  # model(batch)
    elif isinstance(batch, (tuple, list)) and batch:
        yield batch[0]  # (x, y): model(x)
        yield tuple(batch)  # model(x, y), e.g. Lightning's demo transformer
        yield (batch,)


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value`` (a tensor, or any nesting of mappings, lists and tuples), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in flat_tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat_tensors(v)]
    return []


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a mapping, ``model(*inputs)`` for a tuple, ``model(inputs)`` for anything else.

    A list is one argument (torchvision's detection models take a list of images), a tuple is the arguments: the
    form :func:`candidate_inputs` yields and ``example_input_array`` documents.

    Example::

        >>> call_model(nn.Bilinear(2, 2, 1), (torch.zeros(1, 2), torch.zeros(1, 2))).shape
        torch.Size([1, 1])
    """
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (BatchNorm statistics must not see an example input); every module's train/eval flag restored."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


@contextlib.contextmanager
def train_mode(model: nn.Module) -> Iterator[None]:
    """Train mode without side effects: buffers (BatchNorm statistics), the RNG state and the flags are put back.

    Checks and tracing must see the branches that run only in training (aux heads), the way training will run them.
    """
    modes = {m: m.training for m in model.modules()}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    tensors = [*model.parameters(), *model.buffers()]
    devices = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):  # dropout draws from the RNG: training must see the same draws
        model.train()
        try:
            yield
        finally:
            with torch.no_grad():
                for buf, saved in buffers:
                    if buf.shape == saved.shape:
                        buf.copy_(saved)
            for m, mode in modes.items():
                m.training = mode


def forward_error(model: nn.Module, inputs: Any) -> str | None:
    """Why one eval-mode, no-grad ``forward`` on ``inputs`` fails (``"Type: message"``), or ``None`` if it runs.

    ``inputs`` is called by :func:`call_model`; the train/eval flags are restored afterwards.
    """
    try:
        with torch.no_grad(), eval_mode(model):
            call_model(model, inputs)
        return None
    except Exception as err:  # any failure of the user's forward
        return f"{type(err).__name__}: {err}"


def failing_module(
    model: nn.Module,
    err: BaseException,
    frame_modules: Callable[[FrameType, dict[int, str]], list[nn.Module]] | None = None,
) -> str | None:
    """Dotted name of the innermost submodule of ``model`` that was running when ``err`` was raised.

    Read off the traceback, so it also finds a module whose ``forward`` was called directly: a frame whose ``self``
    is one of ``model``'s modules (its ``forward``, a method or a hook of it) names that module. ``frame_modules(frame,
    names)`` may name the modules behind any other frame (a library working on layers it was given), ``names``
    mapping ``id(module)`` to its name; several modules are reported as their common parent.

    Returns:
        The submodule's name for ``model.get_submodule``, ``""`` for ``model`` itself, or ``None`` when no frame of
        the traceback ran in ``model``.

    Example::

        >>> net = nn.Sequential(nn.Linear(3, 4), nn.Linear(5, 1))
        >>> try:
        ...     net(torch.zeros(1, 3))
        ... except RuntimeError as err:
        ...     failing_module(net, err)
        '1'
    """
    names = {id(m): n for n, m in model.named_modules()}
    found = None
    for frame, _line in traceback.walk_tb(err.__traceback__ or sys.exc_info()[2]):
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            modules = [owner]
        else:
            modules = frame_modules(frame, names) if frame_modules is not None else []
        if modules:
            found = _common_parent([names[id(m)] for m in modules])
    return found


def _common_parent(paths: list[str]) -> str:
    parts = [p.split(".") for p in dict.fromkeys(paths)]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common)


def example_from_batch(model: nn.Module, batch: Any, n: int = 2) -> Any:
    """The first ``n`` samples of ``batch`` in the form ``model``'s forward accepts, or ``None``.

    Each candidate (see :func:`candidate_inputs`) is tried with one no-grad eval-mode forward; BatchNorm statistics
    and the train/eval flags are left as they were.

    Example::

        >>> example_from_batch(nn.Linear(3, 1), (torch.zeros(8, 3), torch.zeros(8))).shape
        torch.Size([2, 3])
    """
    small = head_samples(batch, n)
    for candidate in candidate_inputs(small):
        if forward_error(model, candidate) is None:
            return candidate
    return None


def first_batch(dataloader: Any) -> Any:
    """The first batch of ``dataloader``, with the global torch RNG left as it was (shuffling draws from it)."""
    with torch.random.fork_rng(devices=[]):
        return next(iter(dataloader))
