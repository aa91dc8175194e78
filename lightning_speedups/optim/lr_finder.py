"""LR range test through Lightning's own ``Tuner.lr_find``, with several rules to read a learning rate off the curve.

Rules (all return a learning rate inside the searched range):

- ``steep``: the steepest descent of the loss per decade of lr (Lightning's ``_LRFinder.suggestion`` on log(lr)).
- ``valley``: the longest stretch where the loss keeps falling; a point two thirds of the way down it (fastai's
  default, robust to a noisy start).
- ``minimum``: a tenth of the learning rate at the loss minimum (the classic rule of thumb).
- ``slide``: walk a window back from the divergence until the slope of log(loss) at both ends agrees (within 0.05
  per e-fold of lr), take its left end (after fastai's ``slide``; slopes smoothed over a few points).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr
from lightning.pytorch.utilities.seed import isolate_rng

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range

if TYPE_CHECKING:
    import lightning as L
    from matplotlib.figure import Figure

__all__ = ["LR_RULES", "LRFinderResult", "suggest_lr", "suggest_from_curve", "apply_lr", "check_range_test_args"]


def _finite(lrs: Sequence[float], losses: Sequence[float]) -> tuple[list[float], list[float]]:
    pairs = [(float(a), float(b)) for a, b in zip(lrs, losses) if math.isfinite(a) and math.isfinite(b) and a > 0]
    if len(pairs) < 3:
        raise SpeedupConfigError(
            f"The LR range test produced {len(pairs)} usable points; the rules need at least 3. "
            "HINT: raise `num_training`, or lower `min_lr` if the loss diverged at once."
        )
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _steep(lrs: list[float], losses: list[float]) -> float:
    from lightning.pytorch.tuner.lr_finder import _LRFinder

    # Lightning's rule, fed log(lr): the slope per decade, as fastai does. Against linear lr the tiny spacing at
    # the start of an exponential sweep turns noise into the "steepest" point.
    finder = _LRFinder("exponential", lrs[0], lrs[-1], len(lrs))
    finder.results = {"lr": [math.log(x) for x in lrs], "loss": losses}
    skip_begin = min(10, len(lrs) // 5)  # Lightning skips 10 points; fewer on short tests
    log_lr = finder.suggestion(skip_begin=skip_begin, skip_end=1)
    return lrs[0] if log_lr is None else math.exp(log_lr)


def _valley(lrs: list[float], losses: list[float]) -> float:
    # longest strictly decreasing subsequence of the loss, O(n^2) dynamic programming (n is ~100)
    n = len(losses)
    length = [1] * n
    start = list(range(n))
    best_end = 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and length[j] + 1 > length[i]:
                length[i] = length[j] + 1
                start[i] = start[j]
        if length[i] > length[best_end]:
            best_end = i
    lo, hi = start[best_end], best_end
    return lrs[lo + (hi - lo) * 2 // 3]


def _minimum(lrs: list[float], losses: list[float]) -> float:
    i = min(range(len(losses)), key=losses.__getitem__)
    return max(lrs[0], lrs[i] / 10)


def _slide(lrs: list[float], losses: list[float], window: int = 15, threshold: float = 0.05) -> float:
    # slope of log(loss) per e-fold of lr, over +-h points so single noisy steps do not dominate
    log_loss = [math.log(max(x, 1e-12)) for x in losses]
    log_lr = [math.log(x) for x in lrs]
    n = len(lrs)
    h = max(1, n // 20)
    slope = []
    for i in range(n):
        a, b = max(0, i - h), min(n - 1, i + h)
        slope.append((log_loss[b] - log_loss[a]) / ((log_lr[b] - log_lr[a]) or 1e-12))
    window = min(window, max(1, n // 4))
    right, left = n - 1, n - 1 - window
    chosen = lrs[max(left, 0)]
    # slide left from the divergence until the slopes at both ends of the window agree: its left end is on the
    # straight part of the descent
    while left >= 0 and abs(slope[right] - slope[left]) > threshold:
        chosen = lrs[left]
        right, left = right - 1, left - 1
    return chosen


LR_RULES: dict[str, Callable[[list[float], list[float]], float]] = {
    "steep": _steep,
    "valley": _valley,
    "minimum": _minimum,
    "slide": _slide,
}


def suggest_from_curve(lrs: Sequence[float], losses: Sequence[float], rule: str = "valley") -> float:
    """Read a learning rate off an LR range-test curve with one of :data:`LR_RULES`.

    Non-finite points are dropped; the result always lies within ``[lrs[0], lrs[-1]]``.

    Example::

        >>> lrs = [10 ** (-6 + k / 10) for k in range(61)]
        >>> losses = [2.3 - 0.02 * k if k < 45 else 1.4 + 0.3 * (k - 45) for k in range(61)]
        >>> round(math.log10(suggest_from_curve(lrs, losses, "valley")), 1)
        -3.0
    """
    check_choice("rule", rule, LR_RULES)
    lr_list, loss_list = _finite(lrs, losses)
    lr = LR_RULES[rule](lr_list, loss_list)
    return float(min(max(lr, lr_list[0]), lr_list[-1]))


def _fix_lightning_debias(losses: Sequence[float], beta: float = 0.98) -> list[float]:
    """Undo an off-by-one in Lightning's smoothed loss.

    Lightning's ``_LRCallback`` divides the running average by ``1 - beta ** (global_step + 1)`` after the optimizer
    step has already incremented ``global_step``, so point ``k`` is scaled by ``(1 - b**(k+1)) / (1 - b**(k+2))``:
    the first point reads half the true loss, which fools the ``minimum`` rule. Valid for a test that starts at
    step 0 (as :func:`suggest_lr` and the ``LRFinder`` callback ensure); the factor tends to 1 after ~50 points.
    """
    return [x * (1 - beta ** (k + 2)) / (1 - beta ** (k + 1)) for k, x in enumerate(losses)]


@dataclass
class LRFinderResult:
    """The range test's curve, every rule's suggestion, and the chosen learning rate."""

    lrs: list[float]
    losses: list[float]
    rule: str
    lr: float
    suggestions: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_curve(cls, lrs: Sequence[float], losses: Sequence[float], rule: str) -> LRFinderResult:
        """Evaluate every rule on the curve and pick ``rule``'s suggestion."""
        suggestions = {name: suggest_from_curve(lrs, losses, name) for name in LR_RULES}
        return cls([float(x) for x in lrs], [float(x) for x in losses], rule, suggestions[rule], suggestions)

    def plot(self, path: str | os.PathLike[str] | None = None, ax: Any = None) -> Figure:
        """Loss against lr (log scale) with each rule's suggestion marked; saves a PNG when ``path`` is given."""
        from lightning_speedups.optim.plots import plot_lr_finder

        return plot_lr_finder(self, path=path, ax=ax)


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
        "Found no learning rate to update on the module. HINT: use SpeedupMixin (optimizer_config) or give the "
        "module an `lr` / `learning_rate` attribute or hparam; or pass update=False and read `result.lr`."
    )


def check_range_test_args(min_lr: float, max_lr: float, num_training: int, mode: str, rule: str) -> None:
    """Validate the range-test arguments shared by :func:`suggest_lr` and the ``LRFinder`` callback."""
    check_choice("rule", rule, LR_RULES)
    check_choice("mode", mode, ("exponential", "linear"))
    check_range("min_lr", min_lr, 0, None, low_inclusive=False)
    if not isinstance(max_lr, (int, float)) or max_lr <= min_lr:
        raise SpeedupConfigError(f"`max_lr`={max_lr!r} must be greater than `min_lr`={min_lr!r}.")
    if not isinstance(num_training, int) or isinstance(num_training, bool) or num_training < 5:
        raise SpeedupConfigError(
            f"`num_training`={num_training!r} must be an integer >= 5. HINT: 100 is a good default."
        )


def suggest_lr(
    model: L.LightningModule,
    datamodule: L.LightningDataModule | None = None,
    train_dataloaders: Any = None,
    *,
    rule: str = "valley",
    min_lr: float = 1e-6,
    max_lr: float = 1.0,
    num_training: int = 100,
    mode: str = "exponential",
    early_stop_threshold: float | None = 4.0,
    update: bool = True,
    trainer_kwargs: dict[str, Any] | None = None,
) -> LRFinderResult:
    """Run Lightning's LR range test on ``model`` and suggest a learning rate by ``rule``.

    The test runs in a throw-away Trainer inside a temporary directory (no files left behind); the model's weights,
    buffers and the RNG state are restored exactly afterwards. With ``update=True`` the suggestion is written into
    ``model.optimizer_config.lr`` (see :func:`apply_lr`).

    Args:
        model: the LightningModule (its ``configure_optimizers`` provides the optimizer the test drives).
        datamodule: data for the test (or ``train_dataloaders``).
        train_dataloaders: a training DataLoader instead of a datamodule.
        rule: ``"steep"``, ``"valley"``, ``"minimum"`` or ``"slide"``.
        min_lr, max_lr: the searched range.
        num_training: steps of the test.
        mode: ``"exponential"`` or ``"linear"`` lr increase.
        early_stop_threshold: stop once the loss exceeds this multiple of the best loss (``None``: never).
        update: write the suggestion into the model.
        trainer_kwargs: extra ``Trainer`` arguments (e.g. ``accelerator``, ``precision``).

    Returns:
        An :class:`LRFinderResult` with the curve, all rules' suggestions and the chosen ``lr``.

    Raises:
        SpeedupConfigError: bad arguments, or too few usable points on the curve.

    Note:
        Lightning's test uses one learning rate for all param groups; ``lr_multipliers`` apply on top of the
        suggested base lr afterwards.
    """
    import lightning as L
    from lightning.pytorch.tuner import Tuner

    check_range_test_args(min_lr, max_lr, num_training, mode, rule)
    if datamodule is None and train_dataloaders is None:
        raise SpeedupConfigError("suggest_lr needs `datamodule` or `train_dataloaders`.")
    kwargs: dict[str, Any] = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        max_steps=num_training,
        check_val_every_n_epoch=1_000_000,  # the test only needs training loss
        devices=1,
    )
    kwargs.update(trainer_kwargs or {})
    with isolate_rng(), tempfile.TemporaryDirectory(prefix="lr_find_") as tmp:
        trainer = L.Trainer(default_root_dir=tmp, **kwargs)
        finder = Tuner(trainer).lr_find(
            model,
            train_dataloaders=train_dataloaders,
            datamodule=datamodule,
            min_lr=min_lr,
            max_lr=max_lr,
            num_training=num_training,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=False,
        )
    if finder is None:
        raise SpeedupConfigError("The LR range test did not run (is `fast_dev_run` set in `trainer_kwargs`?).")
    result = LRFinderResult.from_curve(finder.results["lr"], _fix_lightning_debias(finder.results["loss"]), rule)
    if update:
        where = apply_lr(model, result.lr)
        rank_zero_info(f"LR finder ({rule}): lr = {result.lr:.3g} written to `{where}`.")
    elif not math.isfinite(result.lr):  # pragma: no cover - suggest_from_curve clamps to the range
        rank_zero_warn("LR finder produced no finite suggestion.")
    return result
