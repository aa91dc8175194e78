"""LR range test through Lightning's own ``Tuner.lr_find``, with several rules to read a learning rate off the curve.

The rules (``steep``, ``valley``, ``minimum``, ``slide``) and :class:`LRFinderResult` live in
:mod:`lightning_speedups.optim.lr_curve` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import warnings
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr
from lightning.pytorch.utilities.seed import isolate_rng

from lightning_speedups._compat import undo_lr_find_debias
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups.optim.lr_curve import LR_RULES, LRFinderResult, range_test_stop, suggest_from_curve

# the older name of the fix for Lightning's smoothed-loss off-by-one (it relies on Lightning's LR callback)
_fix_lightning_debias = undo_lr_find_debias

if TYPE_CHECKING:
    import lightning as L

__all__ = [
    "LR_RULES",
    "LRFinderResult",
    "suggest_lr",
    "suggest_from_curve",
    "apply_lr",
    "check_range_test_args",
    "result_from_range_test",
]


def result_from_range_test(
    results: dict[str, list[float]], rule: str, planned_steps: int, early_stop_threshold: float | None
) -> LRFinderResult:
    """The :class:`LRFinderResult` of Lightning's range test (``_LRFinder.results``: ``lr`` and smoothed ``loss``).

    A test that ran fewer than ``planned_steps`` steps (the loss diverged, or the fit loop ended) is reported: the
    result's ``stop_reason``, ``steps_run`` and ``lr_covered`` say so, and a warning names the range covered, since
    its suggestion only comes from that part of the range.
    """
    losses = list(results["loss"])
    reason = range_test_stop(losses, planned_steps, early_stop_threshold)
    result = LRFinderResult.from_curve(results["lr"], undo_lr_find_debias(losses), rule, planned_steps, reason)
    if reason is not None:
        rank_zero_warn(
            f"LR finder: {result.coverage_text()}; the `{rule}` suggestion {result.lr:.3g} comes from "
            "that part of the range only."
        )
    return result


def apply_lr(module: Any, lr: float) -> str:
    """Write ``lr`` where the module reads its learning rate; return where it went.

    ``SpeedupMixin`` models get a validated copy of ``optimizer_config`` with the new ``lr``; other modules get
    ``lr`` / ``learning_rate`` (attribute or hparams), as Lightning's tuner does.
    """
    check_range("lr", lr, 0, None, low_inclusive=False)
    cfg = getattr(module, "optimizer_config", None)
    if dataclasses.is_dataclass(cfg) and hasattr(cfg, "lr"):
        module.optimizer_config = dataclasses.replace(cfg, lr=float(lr))  # type: ignore[type-var]
        return "optimizer_config.lr"
    if isinstance(cfg, dict):
        cfg["lr"] = float(lr)
        return "optimizer_config['lr']"
    for attr in ("lr", "learning_rate"):
        if lightning_hasattr(module, attr):
            lightning_setattr(module, attr, float(lr))
            return attr
    raise SpeedupConfigError(
        f"Found no learning rate to update on the module ({type(module).__name__}). Allowed values: a module with "
        "`optimizer_config` (SpeedupMixin) or an `lr` / `learning_rate` attribute or hparam. HINT: or pass "
        "update=False and read `result.lr`."
    )


def check_range_test_args(min_lr: float, max_lr: float, num_training_steps: int, mode: str, rule: str) -> None:
    """Validate the range-test arguments shared by :func:`suggest_lr` and the ``LRFinder`` callback."""
    check_choice("rule", rule, LR_RULES)
    check_choice("mode", mode, ("exponential", "linear"))
    check_range("min_lr", min_lr, 0, None, low_inclusive=False)
    check_range("max_lr", max_lr, min_lr, None, low_inclusive=False, hint="`max_lr` must be greater than `min_lr`.")
    check_int("num_training_steps", num_training_steps, 5, hint="100 is a good default.")


def _steps_from_alias(num_training_steps: int, num_training: int | None) -> int:
    """Resolve the deprecated ``num_training`` (Lightning's ``Tuner.lr_find`` name) to ``num_training_steps``."""
    if num_training is None:
        return num_training_steps
    warnings.warn(
        "suggest_lr(num_training=) is deprecated; use num_training_steps= (the name LRFinder and Lightning's "
        "LearningRateFinder use).",
        DeprecationWarning,
        stacklevel=3,
    )
    if num_training_steps != 100 and num_training_steps != num_training:
        raise SpeedupConfigError(
            f"`num_training`={num_training!r} and `num_training_steps`={num_training_steps!r} were both given. "
            "Allowed values: num_training_steps only (num_training is its deprecated alias)."
        )
    return num_training


def suggest_lr(
    model: L.LightningModule,
    datamodule: L.LightningDataModule | None = None,
    train_dataloaders: Any = None,
    *,
    rule: str = "valley",
    min_lr: float = 1e-6,
    max_lr: float = 1.0,
    num_training_steps: int = 100,
    mode: str = "exponential",
    early_stop_threshold: float | None = 4.0,
    update: bool = True,
    trainer_kwargs: dict[str, Any] | None = None,
    num_training: int | None = None,
) -> LRFinderResult:
    """Run Lightning's LR range test on ``model`` and suggest a learning rate by ``rule``.

    The test runs in a throw-away Trainer inside a temporary directory (no files left behind); the model's weights,
    buffers and the RNG state are restored exactly afterwards. It runs ``num_training_steps`` steps over as many
    epochs of the data as they need (a ``max_epochs`` in ``trainer_kwargs`` is ignored); a test that stops early
    anyway (a diverging loss) is reported in the result's ``stop_reason`` and a warning. With ``update=True`` the
    suggestion is written into ``model.optimizer_config.lr`` (see :func:`apply_lr`).

    Args:
        model: the LightningModule (its ``configure_optimizers`` provides the optimizer the test drives).
        datamodule: data for the test (or ``train_dataloaders``).
        train_dataloaders: a training DataLoader instead of a datamodule.
        rule: ``"steep"``, ``"valley"``, ``"minimum"`` or ``"slide"``.
        min_lr, max_lr: the searched range.
        num_training_steps: steps of the test (the same name as :class:`~lightning_speedups.LRFinder`'s).
        mode: ``"exponential"`` or ``"linear"`` lr increase.
        early_stop_threshold: stop once the loss exceeds this multiple of the best loss (``None``: never).
        update: write the suggestion into the model.
        trainer_kwargs: extra ``Trainer`` arguments (e.g. ``accelerator``, ``precision``).
        num_training: deprecated alias of ``num_training_steps`` (warns with a ``DeprecationWarning``).

    Returns:
        An :class:`LRFinderResult` with the curve, all rules' suggestions and the chosen ``lr``.

    Raises:
        SpeedupConfigError: bad arguments.
        SpeedupRuntimeError: the test produced too few usable points on the curve.

    Note:
        Lightning's test uses one learning rate for all param groups; ``lr_multipliers`` apply on top of the
        suggested base lr afterwards.
    """
    import lightning as L
    from lightning.pytorch.tuner import Tuner

    num_training_steps = _steps_from_alias(num_training_steps, num_training)
    check_range_test_args(min_lr, max_lr, num_training_steps, mode, rule)
    if datamodule is None and train_dataloaders is None:
        raise SpeedupConfigError(
            "suggest_lr needs `datamodule` or `train_dataloaders`. Allowed values: a LightningDataModule or a "
            "training DataLoader."
        )
    kwargs: dict[str, Any] = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        max_steps=num_training_steps,
        check_val_every_n_epoch=1_000_000,  # the test only needs training loss
        devices=1,
    )
    kwargs.update(trainer_kwargs or {})
    kwargs["max_epochs"] = -1  # as many passes over the data as the planned steps need: the steps end the test
    with isolate_rng(), tempfile.TemporaryDirectory(prefix="lr_find_") as tmp:
        trainer = L.Trainer(default_root_dir=tmp, **kwargs)
        finder = Tuner(trainer).lr_find(
            model,
            train_dataloaders=train_dataloaders,
            datamodule=datamodule,
            min_lr=min_lr,
            max_lr=max_lr,
            num_training=num_training_steps,  # Lightning's Tuner calls it num_training
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=False,
        )
    if finder is None:
        raise SpeedupConfigError(
            "The LR range test did not run. Allowed values: `trainer_kwargs` without `fast_dev_run`. HINT: Lightning "
            "skips the test under fast_dev_run."
        )
    result = result_from_range_test(finder.results, rule, num_training_steps, early_stop_threshold)
    if update:
        where = apply_lr(model, result.lr)
        rank_zero_info(f"LR finder ({rule}): lr = {result.lr:.3g} written to `{where}`.")
    elif not math.isfinite(result.lr):  # pragma: no cover - suggest_from_curve clamps to the range
        rank_zero_warn("LR finder produced no finite suggestion.")
    return result
