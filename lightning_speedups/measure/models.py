"""What a measurement runs on: a copy of the model, and one training step of it as a closure.

These are the one model-copy helper and the one step factory of the package: the probes, the recipes' check,
autotune's trials and the benchmarks build their timed steps here.

Example::

    >>> from torch import nn
    >>> model = nn.Linear(4, 3)
    >>> step = make_train_step(model_copy(model, train=True), torch.randn(8, 4), torch.zeros(8, dtype=torch.long))
    >>> isinstance(step(), float)
    True
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["NoLossError", "make_train_step", "model_copy", "training_step_loss", "validation_step_metrics"]


def model_copy(module: nn.Module, train: bool | None = None) -> nn.Module:
    """A deep copy of ``module`` to measure on, so the real model, its grads and its optimizer stay untouched.

    A Lightning Trainer attached to ``module`` is not copied: the copy has none (its ``self.log`` then only warns).

    Args:
        module: the model to copy.
        train: put the copy in train (``True``) or eval (``False``) mode; ``None`` keeps the original's modes.
    """
    trainer = module.__dict__.get("_trainer")
    memo = {id(trainer): None} if trainer is not None else {}
    clone = copy.deepcopy(module, memo)
    if train is not None:
        clone.train(train)
    return clone


class NoLossError(TypeError):
    """A ``training_step`` returned no loss tensor (``None`` skips the batch in Lightning; a mapping without
    ``"loss"``): there is nothing to time or to check on this batch."""


def training_step_loss(model: nn.Module, batch: Any, batch_idx: int = 0, *, quiet: bool = False) -> torch.Tensor:
    """The loss of one ``model.training_step(batch, batch_idx)`` outside the Trainer, as the fit would compute it
    (``model(batch)`` for a module without ``training_step``): the tensor, or the ``"loss"`` of a mapping.

    The copies measured here have no Trainer, so their ``self.log()`` calls only warn: those warnings are silenced,
    the model's own are not, unless ``quiet`` (a check whose real step shows the same warnings, or a compiled copy's
    tracing) silences every warning.

    Raises:
        NoLossError: the step returned no loss tensor.
    """
    step = getattr(model, "training_step", None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")
        warnings.filterwarnings("ignore", message=r".*self\.trainer.*")
        if quiet:
            warnings.simplefilter("ignore")
        out = step(batch, batch_idx) if callable(step) else model(batch)
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(loss, torch.Tensor):
        what = f"a {type(out).__name__} without a 'loss' tensor" if isinstance(out, Mapping) else type(out).__name__
        raise NoLossError(f"training_step returned {what}, not a loss tensor")
    return loss


def validation_step_metrics(model: nn.Module, batch: Any, batch_idx: int = 0) -> dict[str, float]:
    """What one ``model.validation_step(batch, batch_idx)`` logs outside the Trainer: each name ``self.log`` or
    ``self.log_dict`` was given, with its value on this batch as a float.

    Meant for a copy (:func:`model_copy`): its ``log`` and ``log_dict`` are replaced for the call, and a torchmetrics
    ``Metric`` logged as an object is computed on what this step updated, then reset. Values that are not numbers
    (strings, tensors of more than one element) are left out; a module without ``validation_step`` logs nothing.

    Example::

        >>> class Scored(nn.Linear):
        ...     def validation_step(self, batch, batch_idx):
        ...         self.log("val_err", (self(batch) - 1).abs().mean())
        >>> validation_step_metrics(Scored(2, 1), torch.ones(4, 2)).keys()
        dict_keys(['val_err'])
    """
    step = getattr(model, "validation_step", None)
    if not callable(step):
        return {}
    logged: dict[str, float] = {}

    def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if callable(getattr(value, "compute", None)) and callable(getattr(value, "reset", None)):
            metric = value
            value = metric.compute()
            metric.reset()
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            logged[name] = float(value)

    def log_dict(values: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in values.items():
            log(name, value)

    had = {name: model.__dict__[name] for name in ("log", "log_dict") if name in model.__dict__}
    model.__dict__.update(log=log, log_dict=log_dict)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step(batch, batch_idx)
    finally:
        for name in ("log", "log_dict"):
            model.__dict__.pop(name, None)
        model.__dict__.update(had)
    return logged


def _device_type(model: nn.Module, x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return x.device.type
    param = next(model.parameters(), None)
    return param.device.type if param is not None else "cpu"


def _cross_entropy(y: Any) -> Callable[[nn.Module, Any], torch.Tensor]:
    loss_fn = torch.nn.CrossEntropyLoss()
    return lambda model, x: loss_fn(model(x), y)


def make_train_step(
    model: nn.Module,
    x: Any,
    y: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    autocast_dtype: torch.dtype | None = None,
    *,
    loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    steps: int = 1,
    grad_scaler: bool = False,
    optimizer_only: bool = False,
    return_loss: bool = True,
) -> Callable[[], float | None]:
    """A closure doing one (or ``steps``) forward/backward/optimizer step(s) of ``model`` on ``x``.

    Args:
        model: trained in place, in train mode (pass a :func:`model_copy` to keep the original as it is).
        x: the input, or the whole batch when ``loss`` reads it.
        y: the class targets of the default loss, the cross-entropy of ``model(x)``.
        optimizer: default SGD (lr 1e-3) on the trainable parameters.
        autocast_dtype: run the forward under autocast to this dtype on ``x``'s device
            (``torch.bfloat16``: as ``precision="bf16-mixed"``); ``None``: no autocast, as ``32-true``.
        loss: ``loss(model, x) -> Tensor`` instead of the cross-entropy (a LightningModule's ``training_step``).
        steps: optimizer steps per call.
        grad_scaler: scale the loss with a ``GradScaler`` and step through it, as ``precision="16-mixed"``.
        optimizer_only: run the forward and backward once now, then only the optimizer step per call (its cost
            alone, on the gradients of one training step).
        return_loss: return the loss as a float (a host sync per call); ``False``: return ``None`` and synchronize
            CUDA once at the end of the call.

    Returns:
        The closure; each call runs ``steps`` steps.
    """
    optimizer = optimizer or torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    compute = loss if loss is not None else _cross_entropy(y)
    device_type = _device_type(model, x)
    scaler = torch.amp.GradScaler(device_type) if grad_scaler else None
    model.train()
    last: list[torch.Tensor] = []

    def backward() -> None:
        optimizer.zero_grad(set_to_none=True)
        cast = (
            torch.autocast(device_type, dtype=autocast_dtype)
            if autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with cast:
            out = compute(model, x)
        (out if scaler is None else scaler.scale(out)).backward()
        if return_loss:
            last[:] = [out]

    def optimizer_step() -> None:
        if scaler is None:
            optimizer.step()
        else:  # unscale, inf check, step, update: what Lightning's 16-mixed runs
            scaler.step(optimizer)
            scaler.update()

    if optimizer_only:
        backward()

    def step() -> float | None:
        for _ in range(steps):
            if not optimizer_only:
                backward()
            optimizer_step()
        if return_loss:
            return float(last[0].detach())
        if device_type == "cuda":
            torch.cuda.synchronize()
        return None

    return step
