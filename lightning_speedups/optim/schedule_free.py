"""Schedule-free AdamW and SGD (Defazio et al. 2024, Meta's ``schedulefree`` package) and their train/eval switching.

A schedule-free optimizer keeps two points per weight: the parameters hold ``y`` (where gradients are taken) while
training, and the average ``x`` (where the model should be evaluated and saved) is computed on demand; ``z`` is kept in
the optimizer state. ``optimizer.train()`` moves the parameters to ``y``, ``optimizer.eval()`` to ``x``; both are
idempotent (a ``train_mode`` flag per param group). No learning-rate schedule is used: the averaging replaces it.

This module holds the registry factories, the plain-PyTorch switching (:func:`schedule_free_eval`,
:func:`schedule_free_train`, :func:`eval_weights_into_checkpoint`; the BatchNorm refresh is in
:mod:`~lightning_speedups.optim.precise_bn`) and the Lightning steps that :class:`~lightning_speedups.SpeedupMixin`
and the :class:`~lightning_speedups.ScheduleFreeSwitch` callback both call at the same hooks.
``schedulefree`` is an optional extra, imported only when an optimizer is built.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from types import ModuleType
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.nn.modules.batchnorm import SyncBatchNorm

from lightning_speedups._compat import before_batch_transfer
from lightning_speedups._errors import SpeedupConfigError, check_int, check_range, require
from lightning_speedups.optim.precise_bn import DEFAULT_BN_BATCHES, batchnorm_layers, recompute_batchnorm

__all__ = [
    "DEFAULT_BN_BATCHES",
    "DEFAULT_WARMUP_STEPS",
    "ModeSwitch",
    "check_no_scheduler",
    "check_schedule_free_config",
    "create_schedule_free_adamw",
    "create_schedule_free_sgd",
    "eval_weights_into_checkpoint",
    "fit_eval_weights",
    "fit_train_batches",
    "fit_train_weights",
    "in_train_mode",
    "is_schedule_free",
    "schedule_free_eval",
    "schedule_free_train",
]

# linear warm-up of the lr over the first optimizer steps (the authors recommend a warm-up; the package's default is
# none): long enough to tame the first steps, short enough to finish early in a run of a few epochs
DEFAULT_WARMUP_STEPS = 100
SHARDED_HINT = "its eval/train switch and checkpoint rewrite need whole parameters on every rank; use 'ddp'."


def _schedulefree(name: str) -> ModuleType:
    try:
        return require("schedulefree", "schedulefree", "Schedule-free optimizers")
    except ImportError as err:
        raise SpeedupConfigError(
            f"`name`={name!r} needs the optional package `schedulefree`, which is not installed. Allowed values: an "
            "optimizer without extra packages, such as 'adamw' or 'sgd'. HINT: pip install "
            '"lightning-speedups[schedulefree]"'
        ) from err


def _check_common(warmup_steps: int, r: float, weight_lr_power: float) -> None:
    check_int("warmup_steps", warmup_steps, 0, hint="warm-up is counted in optimizer steps.")
    check_range("r", r, 0, None)
    check_range("weight_lr_power", weight_lr_power, 0, None)


def _foreach(foreach: bool | None) -> bool:
    return hasattr(torch, "_foreach_mul_") if foreach is None else bool(foreach)


def create_schedule_free_adamw(
    params: Iterable[Any],
    lr: float = 0.0025,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    r: float = 0.0,
    weight_lr_power: float = 2.0,
    foreach: bool | None = None,
) -> torch.optim.Optimizer:
    """``schedulefree.AdamWScheduleFree``, checked, with a warm-up by default, returned in train mode.

    Registered as ``OptimizerConfig("schedule_free_adamw")``. Each param group keeps its own ``lr`` (base lr x
    ``lr_mult``) and ``weight_decay`` (0 in ``*/no_decay`` groups). ``betas[0]`` is the interpolation weight between
    ``z`` and the average (0.9; the authors suggest 0.95-0.98 for very long runs).

    Args:
        params: parameters or param groups.
        lr: peak learning rate, reached after ``warmup_steps`` (1x-10x a scheduled AdamW's lr, says the README).
        betas: ``(beta1, beta2)``; ``beta1`` in ``(0, 1)``.
        eps: added to the denominator.
        weight_decay: decoupled weight decay, taken at ``y``.
        warmup_steps: linear lr warm-up, in optimizer steps (default ``DEFAULT_WARMUP_STEPS``, 100).
        r: polynomial weighting power of the average.
        weight_lr_power: during warm-up, the average weights each point by ``lr ** weight_lr_power``.
        foreach: the multi-tensor kernel (``None``: where torch has one).

    Returns:
        The optimizer, already in train mode (``step()`` works at once).

    Raises:
        SpeedupConfigError: ``schedulefree`` is not installed, or an argument is out of range.

    Example::

        >>> net = nn.Linear(4, 2)
        >>> opt = create_schedule_free_adamw(net.parameters(), lr=0.01)
        >>> in_train_mode(opt), opt.param_groups[0]["warmup_steps"]
        (True, 100)
    """
    sf = _schedulefree("schedule_free_adamw")
    if len(tuple(betas)) != 2 or not 0 < betas[0] < 1 or not 0 <= betas[1] < 1:
        raise SpeedupConfigError(
            f"`betas`={betas!r} is out of range. Allowed values: (beta1, beta2) with beta1 in (0, 1) and beta2 in "
            "[0, 1). HINT: beta1 is the interpolation weight of schedule-free AdamW (0.9 by default); 0 would divide "
            "by zero when switching to the eval weights."
        )
    check_range("eps", eps, 0, None, low_inclusive=False)
    _check_common(warmup_steps, r, weight_lr_power)
    optimizer = sf.AdamWScheduleFree(
        params,
        lr=lr,
        betas=(float(betas[0]), float(betas[1])),
        eps=eps,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        r=r,
        weight_lr_power=weight_lr_power,
        foreach=_foreach(foreach),
    )
    optimizer.train()  # no state yet: only the flags change, so a plain training loop can step right away
    return optimizer


def create_schedule_free_sgd(
    params: Iterable[Any],
    lr: float = 1.0,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    r: float = 0.0,
    weight_lr_power: float = 2.0,
    foreach: bool | None = None,
) -> torch.optim.Optimizer:
    """``schedulefree.SGDScheduleFree``, checked, with a warm-up by default, returned in train mode.

    Registered as ``OptimizerConfig("schedule_free_sgd")``; ``momentum`` is the interpolation weight (``None`` in the
    config: 0.9). Use a learning rate 10x-50x a classical SGD's (the authors' advice).

    Args:
        params: parameters or param groups.
        lr: peak learning rate, reached after ``warmup_steps``.
        momentum: interpolation weight, in ``(0, 1)``.
        weight_decay: L2 penalty, taken at ``y``.
        warmup_steps: linear lr warm-up, in optimizer steps (default ``DEFAULT_WARMUP_STEPS``, 100).
        r: polynomial weighting power of the average.
        weight_lr_power: during warm-up, the average weights each point by ``lr ** weight_lr_power``.
        foreach: the multi-tensor kernel (``None``: where torch has one).

    Returns:
        The optimizer, already in train mode.

    Raises:
        SpeedupConfigError: ``schedulefree`` is not installed, or an argument is out of range.

    Example::

        >>> opt = create_schedule_free_sgd(nn.Linear(4, 2).parameters(), lr=0.5, warmup_steps=10)
        >>> type(opt).__name__, opt.param_groups[0]["momentum"]
        ('SGDScheduleFree', 0.9)
    """
    sf = _schedulefree("schedule_free_sgd")
    check_range(
        "momentum",
        momentum,
        0,
        1,
        low_inclusive=False,
        high_inclusive=False,
        hint="schedule-free SGD interpolates with its momentum; 0.9 is the authors' default.",
    )
    _check_common(warmup_steps, r, weight_lr_power)
    optimizer = sf.SGDScheduleFree(
        params,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        r=r,
        weight_lr_power=weight_lr_power,
        foreach=_foreach(foreach),
    )
    optimizer.train()
    return optimizer


# ---------------------------------------------------------------------------------------------------- modes
def is_schedule_free(optimizer: Any) -> bool:
    """Whether ``optimizer`` follows schedule-free's protocol: ``train()`` / ``eval()`` and a ``train_mode`` flag.

    Duck-typed, so an optimizer a user built in ``configure_optimizers`` (any ``schedulefree`` class, the wrapper
    included) counts too.

    Example::

        >>> is_schedule_free(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
        False
    """
    if not (callable(getattr(optimizer, "train", None)) and callable(getattr(optimizer, "eval", None))):
        return False
    if isinstance(getattr(optimizer, "train_mode", None), bool):
        return True
    return any("train_mode" in g for g in getattr(optimizer, "param_groups", ()))


def in_train_mode(optimizer: Any) -> bool:
    """Whether a schedule-free ``optimizer``'s parameters hold the train point ``y`` (else the average ``x``)."""
    flag = getattr(optimizer, "train_mode", None)
    if isinstance(flag, bool):
        return flag
    return any(g.get("train_mode", False) for g in optimizer.param_groups)


def _has_state(optimizer: Any) -> bool:
    """A switch moves the weights only once the optimizer has stepped (``z`` exists)."""
    return any(bool(s) for s in optimizer.state.values())


@dataclass(frozen=True)
class ModeSwitch:
    """What a switch did.

    Attributes:
        mode: ``"train"`` or ``"eval"``.
        optimizers: schedule-free optimizers whose weights moved (in the other mode before, with state).
        batchnorm_batches: batches run to refresh BatchNorm statistics at the eval weights (0: none).
    """

    mode: str
    optimizers: int
    batchnorm_batches: int = 0


def schedule_free_train(optimizers: Iterable[Any]) -> ModeSwitch:
    """Put every schedule-free optimizer of ``optimizers`` in train mode (others are skipped).

    Example::

        >>> opt = create_schedule_free_sgd(nn.Linear(2, 2).parameters(), lr=0.5)
        >>> opt.eval(); schedule_free_train([opt]).mode, in_train_mode(opt)
        ('train', True)
    """
    moved = 0
    for opt in optimizers:
        if is_schedule_free(opt) and not in_train_mode(opt):
            moved += _has_state(opt)
            opt.train()
    return ModeSwitch("train", moved)


def schedule_free_eval(
    optimizers: Iterable[Any],
    model: nn.Module | None = None,
    batches: Iterable[Any] | None = None,
    bn_batches: int = DEFAULT_BN_BATCHES,
    forward: Callable[[nn.Module, Any], Any] | None = None,
) -> ModeSwitch:
    """Put every schedule-free optimizer in eval mode (parameters = the average ``x``) and refresh BatchNorm.

    When a switch moved weights and ``model`` has BatchNorm layers, up to ``bn_batches`` of ``batches`` (training
    batches) run through ``model`` with only the BatchNorm layers in train mode, without gradients, so the running
    statistics match ``x`` rather than ``y`` (see :func:`~lightning_speedups.optim.recompute_batchnorm`).

    Args:
        optimizers: optimizers; those without schedule-free ``train()`` / ``eval()`` are skipped.
        model: the model the optimizers step (only for the BatchNorm refresh).
        batches: training batches for the refresh.
        bn_batches: how many batches at most; 0 turns the refresh off.
        forward: ``forward(model, batch)``; ``None`` finds the batch's input (see
            :func:`~lightning_speedups.optim.recompute_batchnorm`).

    Returns:
        A :class:`ModeSwitch` summary.

    Example::

        >>> net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        >>> opt = create_schedule_free_adamw(net.parameters(), lr=0.01)
        >>> net(torch.randn(8, 4)).sum().backward(); opt.step()
        >>> schedule_free_eval([opt], net, [torch.randn(8, 4) for _ in range(3)])
        ModeSwitch(mode='eval', optimizers=1, batchnorm_batches=3)
    """
    check_int("bn_batches", bn_batches, 0)
    moved = 0
    for opt in optimizers:
        if is_schedule_free(opt) and in_train_mode(opt):
            moved += _has_state(opt)
            opt.eval()
    used = 0
    if moved and bn_batches and model is not None and batches is not None:
        used = recompute_batchnorm(model, batches, bn_batches, forward)
    return ModeSwitch("eval", moved, used)


# ---------------------------------------------------------------------------------------------------- checkpoints
def eval_weights_into_checkpoint(module: nn.Module, optimizers: Sequence[Any], checkpoint: dict[str, Any]) -> int:
    """Make a Lightning checkpoint hold the eval weights ``x`` of every schedule-free optimizer in train mode.

    Lightning collects ``checkpoint["state_dict"]`` (tensors that share storage with the live parameters) and the
    optimizer states before it calls ``on_save_checkpoint``, and writes the file after it. So each such optimizer is
    switched to eval, copies of its parameters replace them in ``checkpoint["state_dict"]``, it is switched back to
    train, and its saved param groups are marked ``train_mode=False``, consistent with the weights. On resume the
    optimizer loads in eval mode and the next training step's ``train()`` restores the train point, exactly as the
    uninterrupted run continued. An optimizer whose saved state is already in eval mode (the other of the mixin and
    the callback got here first, or the model was already at ``x``) is left alone.

    Args:
        module: the LightningModule (parameter names are the ``state_dict`` keys).
        optimizers: ``trainer.optimizers``, in the order of ``checkpoint["optimizer_states"]``.
        checkpoint: the dict ``on_save_checkpoint`` receives.

    Returns:
        How many optimizers' weights were rewritten.

    Example::

        >>> net = nn.Linear(2, 2)
        >>> opt = create_schedule_free_adamw(net.parameters(), lr=0.1)
        >>> net(torch.ones(1, 2)).sum().backward(); opt.step()
        >>> ckpt = {"state_dict": net.state_dict(), "optimizer_states": [opt.state_dict()]}
        >>> eval_weights_into_checkpoint(net, [opt], ckpt), ckpt["optimizer_states"][0]["param_groups"][0]["train_mode"]
        (1, False)
        >>> in_train_mode(opt)  # the live optimizer trains on
        True
    """
    weights = checkpoint.get("state_dict")
    states = checkpoint.get("optimizer_states")
    if weights is None:
        return 0
    names: dict[int, list[str]] = defaultdict(list)
    for name, p in module.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    done = 0
    for i, opt in enumerate(optimizers):
        if not is_schedule_free(opt) or not in_train_mode(opt):
            continue
        saved = states[i] if states is not None and i < len(states) else None
        flags = [g["train_mode"] for g in saved.get("param_groups", ()) if "train_mode" in g] if saved else []
        if flags and not any(flags):
            continue
        missing = _swap_in_eval_weights(opt, names, weights)
        for group in saved.get("param_groups", ()) if saved else ():
            if "train_mode" in group:
                group["train_mode"] = False
        if missing:
            rank_zero_warn(
                f"Schedule-free: {missing} parameter(s) of {type(opt).__name__} have no key in the checkpoint's "
                "state_dict; they are saved at their train weights."
            )
        done += 1
    return done


def _swap_in_eval_weights(opt: Any, names: Mapping[int, list[str]], weights: dict[str, Any]) -> int:
    missing = 0
    with torch.no_grad():
        opt.eval()
        try:
            for group in opt.param_groups:
                for p in group["params"]:
                    if not opt.state.get(p):
                        continue  # never stepped: x == y, the saved tensor is right
                    keys = [k for k in names.get(id(p), ()) if k in weights]
                    missing += not keys
                    copy = p.detach().clone()
                    for key in keys:
                        weights[key] = copy
        finally:
            opt.train()
    return missing


# ---------------------------------------------------------------------------------------------------- Lightning steps
def check_schedule_free_config(name: str, scheduler_config: Any) -> None:
    """Refuse an LR scheduler config beside the schedule-free optimizer ``name`` (the mixin, at construction).

    Example::

        >>> check_schedule_free_config("schedule_free_sgd", None)  # no scheduler: nothing to refuse
    """
    if scheduler_config is not None:
        value = getattr(scheduler_config, "name", scheduler_config)
        raise SpeedupConfigError(
            f"`scheduler_config`={value!r} is set beside the schedule-free optimizer {name!r}, which replaces the LR "
            "schedule with its averaging (a schedule would fight the average's weights). Allowed values: None. "
            f"HINT: warm-up is built in: OptimizerConfig({name!r}, kwargs={{'warmup_steps': 500}})."
        )


def check_no_scheduler(trainer: Any) -> None:
    """Refuse an LR scheduler that steps a schedule-free optimizer of ``trainer`` (from ``configure_optimizers``)."""
    for config in trainer.lr_scheduler_configs:
        opt = getattr(config.scheduler, "optimizer", None)
        if opt is not None and is_schedule_free(opt):
            raise SpeedupConfigError(
                f"`lr_scheduler`={type(config.scheduler).__name__} steps the schedule-free optimizer "
                f"{type(opt).__name__}, which replaces the LR schedule with its averaging. Allowed values: no "
                "scheduler for a schedule-free optimizer. HINT: return the optimizer alone from configure_optimizers "
                "and use its `warmup_steps` for warm-up."
            )


def fit_train_weights(trainer: Any) -> ModeSwitch:
    """Before a training step: every schedule-free optimizer of ``trainer`` in train mode (a no-op when it is)."""
    return schedule_free_train(trainer.optimizers)


def fit_eval_weights(trainer: Any, pl_module: Any, bn_batches: int) -> ModeSwitch:
    """Before evaluation, predictions or the end of fit: the eval weights, BatchNorm refreshed from training batches.

    The refresh runs only when the switch moved weights, never in the sanity check, under the precision plugin's
    forward context, with the global RNG forked (drawing training batches must not change the run), and on every
    rank alike; plain BatchNorm statistics are then averaged over the ranks.
    """
    optimizers = trainer.optimizers
    if trainer.sanity_checking or not any(is_schedule_free(o) and in_train_mode(o) for o in optimizers):
        return schedule_free_eval(optimizers)
    batches = fit_train_batches(trainer, pl_module, bn_batches)
    try:
        with torch.random.fork_rng(devices=[]), trainer.precision_plugin.forward_context():
            switch = schedule_free_eval(optimizers, pl_module, batches, bn_batches)
    finally:
        batches.close()  # ends the loader's iterator (and its workers) now, not at garbage collection
    # decided by what every rank shares (the switch, the setting), so no rank waits in a reduce the others skip
    if switch.optimizers and bn_batches and trainer.world_size > 1:
        for m in batchnorm_layers(pl_module):
            if not isinstance(m, SyncBatchNorm):  # SyncBatchNorm's statistics are global already
                for buf in (m.running_mean, m.running_var):
                    buf.copy_(trainer.strategy.reduce(buf.clone(), reduce_op="mean"))
    return switch


def fit_train_batches(trainer: Any, pl_module: Any, limit: int) -> Generator[Any, None, None]:
    """Up to ``limit`` training batches, on the device, as the fit loop prepares them; none where that is unsafe."""
    loader = trainer.train_dataloader
    if not limit or loader is None:
        return
    if isinstance(loader, (Mapping, Sequence)) or (
        getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0)
    ):
        rank_zero_warn(
            "Schedule-free: BatchNorm statistics are not refreshed at the eval weights: the training data is several "
            "loaders, or a loader with persistent workers (a second iterator would reset the fit's). HINT: pass "
            "bn_batches=0 to silence this, or use one loader with persistent_workers=False."
        )
        return
    for batch in islice(loader, limit):
        batch = trainer.precision_plugin.convert_input(batch)
        batch = before_batch_transfer(pl_module, batch, dataloader_idx=0)
        yield trainer.strategy.batch_to_device(batch, dataloader_idx=0)
