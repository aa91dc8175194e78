"""autotune's view of the user's optimizer: what ``configure_optimizers`` returns, and that optimizer with a kernel.

The trials time the step the Trainer will run, so they build the optimizer the way a fit does: the copy of the model
calls its own ``configure_optimizers`` (a plain LightningModule's or a SpeedupMixin's) and the first optimizer it
returns (in any form Lightning accepts) is the trial's. The fused/foreach candidates re-create that optimizer's class
with the same param groups and defaults plus ``fused=True`` / ``foreach=True``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import lightning as L
import torch
from torch import nn

from lightning_speedups._rebuild import with_implementation

__all__ = [
    "PlannedRun",
    "configured",
    "optimizers_of",
    "outside_fit_reason",
    "returns_scheduler",
    "trial_optimizer",
    "with_implementation",
]


def returns_scheduler(conf: Any) -> bool:
    """Whether a ``configure_optimizers`` return value (any form Lightning accepts) holds an LR scheduler."""
    if isinstance(conf, dict):
        return conf.get("lr_scheduler") is not None
    if isinstance(conf, (list, tuple)):
        if len(conf) == 2 and isinstance(conf[0], (list, tuple)):  # ([optimizers], [schedulers])
            return bool(conf[1])
        return any(returns_scheduler(c) for c in conf)
    return isinstance(conf, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))


def optimizers_of(conf: Any) -> list[Any]:
    """The optimizers in a ``configure_optimizers`` return value: an optimizer, a list/tuple of them,
    ``([optimizers], [schedulers])``, a dict with ``"optimizer"``, or a list of such dicts."""
    if isinstance(conf, torch.optim.Optimizer):
        return [conf]
    if isinstance(conf, dict):
        return optimizers_of(conf.get("optimizer"))
    if isinstance(conf, (list, tuple)):
        if len(conf) == 2 and isinstance(conf[0], (list, tuple)):
            return optimizers_of(conf[0])
        return [opt for c in conf for opt in optimizers_of(c)]
    return []


def _mixin_optimizer(model: nn.Module) -> torch.optim.Optimizer | None:
    """A SpeedupMixin's optimizer from its config alone, when its ``configure_optimizers`` needs a fit (a scheduler
    sized by the Trainer, ``lr_scaling`` without a batch size): the lr does not change a step's time."""
    from lightning_speedups.optim import SpeedupMixin, create_optimizer

    if not isinstance(model, SpeedupMixin):
        return None
    cfg = dataclasses.replace(model.optimizer_config, lr_scaling=None)
    return create_optimizer(model, cfg)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """What a ``configure_optimizers`` may ask of ``self.trainer`` before a fit, answered for the planned run.

    Outside a fit a LightningModule has no Trainer, so a ``configure_optimizers`` that sizes its scheduler by
    ``self.trainer.estimated_stepping_batches`` (the usual way with ``OneCycleLR`` or Hugging Face's
    ``get_linear_schedule_with_warmup``) raises. autotune attaches this stand-in to the *trial's copy* of the model
    and asks again, so the trials still time the user's optimizer. Any other attribute raises ``AttributeError``,
    and the trials fall back to AdamW with a note that names it.

    Example::

        >>> run = PlannedRun(estimated_stepping_batches=300)
        >>> run.max_steps, run.world_size, run.is_global_zero
        (300, 1, True)
    """

    estimated_stepping_batches: int
    accumulate_grad_batches: int = 1
    world_size: int = 1
    num_devices: int = 1
    num_nodes: int = 1
    global_rank: int = 0
    local_rank: int = 0
    global_step: int = 0
    current_epoch: int = 0
    is_global_zero: bool = True

    @property
    def max_steps(self) -> int:
        return self.estimated_stepping_batches


def _called(configure: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return configure()


def _has_trainer(model: Any) -> bool:
    try:
        model.trainer  # noqa: B018  (raises when none is attached)
    except RuntimeError:
        return False
    return True


def configured(model: nn.Module, planned_steps: int | None = None) -> Any:
    """What ``model.configure_optimizers()`` returns, called outside a fit (call it on a copy: it builds on the
    model's own parameters); it raises what stopped it.

    A LightningModule without a Trainer whose ``configure_optimizers`` fails (it read ``self.trainer``) is asked
    again with a :class:`PlannedRun` of ``planned_steps`` attached, then detached. When the stand-in was asked for
    something it does not answer, that ``AttributeError`` is raised; otherwise the first error is."""
    configure = model.configure_optimizers
    try:
        return _called(configure)
    except Exception as err:  # e.g. it reads self.trainer, which only a fit attaches
        if planned_steps is None or not isinstance(model, L.LightningModule) or _has_trainer(model):
            raise
        model.trainer = PlannedRun(planned_steps)  # type: ignore[assignment]
        try:
            return _called(configure)
        except AttributeError as planned_err:
            if PlannedRun.__name__ in str(planned_err):
                raise planned_err from err
            raise err from None
        except Exception:
            raise err from None
        finally:
            model.trainer = None  # type: ignore[assignment]


def outside_fit_reason(err: BaseException) -> str:
    """Why ``configure_optimizers`` could not run outside a fit, from the error :func:`configured` raised."""
    why = f"`configure_optimizers` cannot run outside a fit ({type(err).__name__}: {err})"
    if isinstance(err, AttributeError) and PlannedRun.__name__ in str(err):
        answered = ", ".join(f.name for f in dataclasses.fields(PlannedRun)) + ", max_steps"
        why += f"; before the fit autotune answers only self.trainer's {answered}"
    return why


def trial_optimizer(
    model: nn.Module, planned_steps: int | None = None
) -> tuple[torch.optim.Optimizer | None, str | None]:
    """``(optimizer, None)``: the first optimizer ``model.configure_optimizers()`` returns, built on ``model``'s own
    parameters (call it on the trial's copy); ``(None, why)`` when it cannot be built outside a fit.

    When ``configure_optimizers`` needs a Trainer and ``planned_steps`` is given, it is asked again with a
    :class:`PlannedRun` of that many steps (see :func:`configured`)."""
    if not callable(getattr(model, "configure_optimizers", None)):
        return None, f"`{type(model).__name__}` has no `configure_optimizers`"
    try:
        conf = configured(model, planned_steps)
    except Exception as err:
        try:
            fallback = _mixin_optimizer(model)
        except Exception:
            fallback = None
        if fallback is not None:
            return fallback, None
        return None, outside_fit_reason(err)
    found = optimizers_of(conf)
    if not found:
        return None, f"`configure_optimizers` returned no optimizer ({type(conf).__name__})"
    return found[0], None
