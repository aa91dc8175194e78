"""Rebuild the optimizers, LR schedulers and DDP wrapper of a running fit after a model's parameters were replaced.

Structural pruning (and any technique that swaps ``nn.Parameter`` objects) leaves the optimizer pointing at dead tensors
and DDP's gradient buckets sized for the old shapes. :func:`rebuild_optimizers` re-runs the module's
``configure_optimizers`` the way ``Strategy.setup_optimizers`` does at the start of a fit, then

- carries the per-parameter optimizer state (Adam moments, SGD momentum, step counts) to every parameter that survived
  unchanged, and to every parameter that was *sliced* from an old one when the caller says how (``origins``);
  parameters with no known origin start with fresh state (the documented reset);
- copies the param-group hyperparameters (``lr``, ``initial_lr``, ``momentum``...) and loads the old schedulers'
  ``state_dict`` into the new schedulers, so the learning rate at the next step is exactly what it would have been;
- re-wraps the module in ``DistributedDataParallel`` under a DDP strategy (new buckets, parameters re-broadcast from
  rank 0).

Nothing keeps a reference to the old optimizers or the old parameters afterwards.
"""

from __future__ import annotations

import copy
import gc
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lightning_speedups._compat import ddp_wrap_again, init_optimizers_and_schedulers
from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError

__all__ = [
    "KERNELS",
    "ParamOrigin",
    "clone_optimizer",
    "init_arguments",
    "rebuild_optimizers",
    "rewrap_ddp",
    "slice_state_tensor",
    "with_implementation",
]

# torch's optimizer kernels beside the default for-loop one, as the constructors name them
KERNELS = ("fused", "foreach")

# A new parameter's origin: the old parameter it was sliced from and, per dimension, the kept indices (sorted).
ParamOrigin = tuple[torch.Tensor, dict[int, torch.Tensor]]


def init_arguments(cls: type) -> set[str] | None:
    """The keyword arguments ``cls.__init__`` takes (``None``: any, it has ``**kwargs``)."""
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def clone_optimizer(optimizer: torch.optim.Optimizer, params: Mapping[int, nn.Parameter]) -> torch.optim.Optimizer:
    """``optimizer``'s class, param groups, defaults and state on other parameters: ``params[id(p)]`` replaces each
    ``p`` (a model copy's parameters, say). Defaults its constructor does not take (those it derives) are left to it.

    Example::

        >>> a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> opt = torch.optim.AdamW(a.parameters(), lr=0.01)
        >>> twin = clone_optimizer(opt, {id(p): q for p, q in zip(a.parameters(), b.parameters())})
        >>> twin.param_groups[0]["params"][0] is b.weight, twin.param_groups[0]["lr"]
        (True, 0.01)

    The state is copied, not shared: stepping the clone leaves ``optimizer``'s moments as they were.
    """
    accepted = init_arguments(type(optimizer))
    defaults = {k: v for k, v in optimizer.defaults.items() if accepted is None or k in accepted}
    groups = [{**g, "params": [params[id(p)] for p in g["params"]]} for g in optimizer.param_groups]
    clone = type(optimizer)(groups, **defaults)
    # a deep copy: load_state_dict keeps the tensors it is given (same dtype and device), so a clone stepped on its own
    # would move the original's moments too
    clone.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    return clone


def slice_state_tensor(value: Any, old: torch.Tensor, new: torch.Tensor, kept: Mapping[int, torch.Tensor]) -> Any:
    """Slice one optimizer-state entry of ``old`` the way ``new`` was sliced from ``old``.

    Tensors shaped like the old parameter (moments, momentum buffers) are ``index_select``-ed along each pruned
    dimension; scalars and anything else (``step``) are copied unchanged. Returns ``None`` when the entry cannot be
    mapped (the caller then resets that parameter's state).
    """
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape != old.shape:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != new.shape:
            return None  # a per-element tensor of unknown layout: not safe to keep
        return value.clone() if isinstance(value, torch.Tensor) else value
    out = value
    for dim, idx in kept.items():
        out = out.index_select(dim, idx.to(out.device))
    return out if out.shape == new.shape else None


def _carry_state(
    old_state: Mapping[torch.Tensor, dict[str, Any]],
    params: list[torch.Tensor],
    origins: Mapping[int, ParamOrigin],
) -> tuple[dict[torch.Tensor, dict[str, Any]], int, int]:
    """Map old per-parameter state onto ``params``; return (state, carried, reset)."""
    new_state: dict[torch.Tensor, dict[str, Any]] = {}
    carried = reset = 0
    for p in params:
        if p in old_state:  # same object: survived untouched
            new_state[p] = old_state[p]
            carried += 1
            continue
        origin = origins.get(id(p))
        if origin is None:
            reset += 1
            continue
        old, kept = origin
        if old not in old_state:
            reset += 1
            continue
        entry: dict[str, Any] = {}
        for key, value in old_state[old].items():
            sliced = slice_state_tensor(value, old, p, kept)
            if sliced is None:
                entry = {}
                break
            entry[key] = sliced
        if entry:
            new_state[p] = entry
            carried += 1
        else:
            reset += 1
    return new_state, carried, reset


def rewrap_ddp(trainer: Any) -> bool:
    """Wrap the LightningModule in a fresh DDP after its parameters changed (new shapes, or newly trainable ones).

    A fresh DDP builds buckets for the current trainable parameters, checks that shapes agree across ranks and
    broadcasts rank 0's values. Returns False (and does nothing) when the model is not DDP-wrapped.
    """
    from lightning.pytorch.strategies import DDPStrategy
    from torch.nn.parallel import DistributedDataParallel

    strategy = trainer.strategy
    if not isinstance(strategy, DDPStrategy) or not isinstance(strategy.model, DistributedDataParallel):
        return False
    old = strategy.model
    inner = old.module
    strategy.model = inner
    del old
    gc.collect()  # drop the old reducer and its autograd hooks before the new one registers its own
    ddp_wrap_again(strategy, inner)
    return True


def _follow_old_groups(old_opt: Any, new_opt: Any, origins: Mapping[int, ParamOrigin]) -> None:
    """Regroup ``new_opt``'s parameters like ``old_opt``'s: a callback (layer-wise LR decay, unfreezing) split the
    groups that ``configure_optimizers`` returns, and re-running it must not silently merge them again."""
    group_of = {id(p): i for i, g in enumerate(old_opt.param_groups) for p in g["params"]}
    groups: list[dict[str, Any]] = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": []} for g in old_opt.param_groups
    ]
    extra: list[dict[str, Any]] = []
    for new_group in new_opt.param_groups:
        leftover = {**{k: v for k, v in new_group.items() if k != "params"}, "params": []}
        for p in new_group["params"]:
            root = origins.get(id(p), (p, {}))[0]
            index = group_of.get(id(root), group_of.get(id(p)))
            (groups[index] if index is not None else leftover)["params"].append(p)
        if leftover["params"]:
            extra.append(leftover)
    new_opt.param_groups = [g for g in groups if g["params"]] + extra


def rebuild_optimizers(
    trainer: Any,
    pl_module: nn.Module,
    origins: Mapping[int, ParamOrigin] | None = None,
) -> dict[str, int]:
    """Re-create the optimizers and LR schedulers of a running fit after parameters were replaced.

    Call it after changing parameters inside a fit (e.g. from a callback hook). Works with any LightningModule whose
    ``configure_optimizers`` builds its optimizers from the module's current parameters.

    Args:
        trainer: the running ``Trainer``.
        pl_module: its LightningModule (already modified).
        origins: ``{id(new_param): (old_param, {dim: kept_indices})}`` for parameters that were sliced from old ones
            (structural pruning). Parameters that are the same objects as before keep their state without it.

    Returns:
        ``{"carried": n, "reset": m, "ddp_rewrapped": 0/1}``: parameters whose optimizer state was kept / started
        fresh.

    Raises:
        SpeedupConfigError: under a strategy whose optimizers cannot be rebuilt this way (DeepSpeed, FSDP, ...).
        SpeedupRuntimeError: when the rebuilt module defines a different number of optimizers or schedulers.

    Example::

        >>> import lightning as L, torch
        >>> class Shrink(L.Callback):
        ...     def on_train_epoch_start(self, trainer, pl_module):
        ...         pl_module.head = torch.nn.Linear(pl_module.head.in_features, 10)
        ...         rebuild_optimizers(trainer, pl_module)
    """
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):
        raise SpeedupConfigError(
            f"`strategy`={type(strategy).__name__} is not supported when parameters change during training. "
            "Allowed values: single-device strategies, DDPStrategy ('ddp', 'ddp_spawn'). "
            "HINT: sharded strategies (FSDP, DeepSpeed) own their optimizers; prune before fitting instead."
        )
    origins = origins or {}
    old_optimizers = list(strategy.optimizers)
    old_configs = list(strategy.lr_scheduler_configs)

    rewrapped = rewrap_ddp(trainer)
    new_optimizers, new_configs = init_optimizers_and_schedulers(pl_module)  # type: ignore[arg-type]
    if len(new_optimizers) != len(old_optimizers) or len(new_configs) != len(old_configs):
        raise SpeedupRuntimeError(
            f"`configure_optimizers` returned {len(new_optimizers)} optimizers / {len(new_configs)} schedulers after "
            f"the rebuild, but {len(old_optimizers)} / {len(old_configs)} before. Allowed values: the same counts. "
            "HINT: make configure_optimizers depend only on the module's parameters."
        )

    carried = reset = 0
    for old_opt, new_opt in zip(old_optimizers, new_optimizers):
        if len(old_opt.param_groups) != len(new_opt.param_groups):
            _follow_old_groups(old_opt, new_opt, origins)
        params = [p for g in new_opt.param_groups for p in g["params"]]
        state, c, r = _carry_state(old_opt.state, params, origins)
        carried = carried + c
        reset = reset + r
        new_opt.state.clear()
        new_opt.state.update(state)
        if len(old_opt.param_groups) == len(new_opt.param_groups):
            # the scheduler has already moved lr/momentum away from their initial values: copy them over
            for old_group, new_group in zip(old_opt.param_groups, new_opt.param_groups):
                for key, value in old_group.items():
                    if key != "params":
                        new_group[key] = value
        old_opt.state.clear()  # drop references to dead tensors even if someone still holds the old optimizer

    for old_cfg, new_cfg in zip(old_configs, new_configs):
        # same progress: last_epoch, _step_count, base_lrs, warm-up counters... (the optimizer is not in state_dict)
        new_cfg.scheduler.load_state_dict(old_cfg.scheduler.state_dict())

    strategy.optimizers = new_optimizers  # also re-creates the LightningOptimizer wrappers
    strategy.lr_scheduler_configs = new_configs
    return {"carried": carried, "reset": reset, "ddp_rewrapped": int(rewrapped)}


def with_implementation(optimizer: torch.optim.Optimizer, implementation: str | None) -> torch.optim.Optimizer:
    """``optimizer``'s class re-created on the same param groups and defaults with ``fused=True`` or
    ``foreach=True``; ``optimizer`` itself when ``implementation`` is neither or the class does not accept it."""
    if implementation not in KERNELS:
        return optimizer
    accepted = init_arguments(type(optimizer))
    if accepted is not None and implementation not in accepted:
        return optimizer
    kernel = {k: True if k == implementation else None for k in KERNELS if accepted is None or k in accepted}
    # defaults the constructor derives itself (AdamW's decoupled_weight_decay) are not arguments: it sets them again
    defaults = {k: v for k, v in optimizer.defaults.items() if k not in KERNELS and (accepted is None or k in accepted)}
    groups = [{k: v for k, v in g.items() if k not in KERNELS} for g in optimizer.param_groups]
    try:
        return type(optimizer)(groups, **{**defaults, **kernel})
    except (RuntimeError, TypeError, ValueError):  # no such kernel for this class, its dtype or its device
        return optimizer
