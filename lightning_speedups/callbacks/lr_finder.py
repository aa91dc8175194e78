"""``LRFinder`` callback: Lightning's LR range test at the start of ``fit``, with a choice of suggestion rule."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.parsing import lightning_hasattr
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import refuse_sharded
from lightning_speedups.optim.lr_finder import (
    LRFinderResult,
    apply_lr,
    check_range_test_args,
    result_from_range_test,
    suggest_lr,
)

__all__ = ["LRFinder"]


class LRFinder(LearningRateFinder):
    """Run an LR range test when ``fit`` starts, pick a learning rate by ``rule`` and train with it.

    It reuses Lightning's ``LearningRateFinder`` (which saves and restores the model, optimizer and loops around the
    test), runs its ``num_training_steps`` over as many epochs of the data as they need (without validating in
    between), reports a test that stopped early anyway (a diverging loss) in ``result.stop_reason`` and a warning,
    reads the curve with one of the rules of :func:`~lightning_speedups.optim.lr_finder.suggest_lr`, writes the
    result into ``pl_module.optimizer_config.lr`` (or ``lr`` / ``learning_rate``), and rebuilds the optimizer and
    scheduler so the run starts from the suggested learning rate. Resumed runs (``ckpt_path``) skip the test.

    Args:
        rule: ``"steep"``, ``"valley"``, ``"minimum"`` or ``"slide"``.
        min_lr, max_lr: the searched range.
        num_training_steps: steps of the test.
        mode: ``"exponential"`` or ``"linear"``.
        early_stop_threshold: stop once the loss exceeds this multiple of the best (``None``: never).
        plot_path: save the range-test plot there (PNG; needs matplotlib).

    Attributes:
        result: the :class:`LRFinderResult` (curve, every rule's suggestion, chosen ``lr``) after the test.

    Example::

        >>> from lightning_speedups.demo import DemoClassifier, DigitsDataModule
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[LRFinder(rule="valley")], logger=False)
        >>> trainer.fit(DemoClassifier(), DigitsDataModule())  # a real range test + epoch  # doctest: +SKIP
    """

    def __init__(
        self,
        rule: str = "valley",
        min_lr: float = 1e-6,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        plot_path: str | None = None,
    ) -> None:
        check_range_test_args(min_lr, max_lr, num_training_steps, mode, rule)
        super().__init__(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training_steps,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=False,
        )
        self.rule = rule
        self.num_training_steps = num_training_steps
        self.early_stop_threshold = early_stop_threshold
        self.plot_path = plot_path
        self.result: LRFinderResult | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        has_lr = getattr(pl_module, "optimizer_config", None) is not None or any(
            lightning_hasattr(pl_module, a) for a in ("lr", "learning_rate")
        )
        if stage == "fit":
            refuse_sharded(
                trainer,
                "LRFinder",
                "the range test saves, trains and restores the whole model, which a "
                "sharded strategy splits over the ranks; run `suggest_lr` on one device and pass the rate.",
            )
        if stage == "fit" and not has_lr:
            raise SpeedupConfigError(
                f"LRFinder found no learning rate to set on {type(pl_module).__name__}. Allowed values: a module with "
                "`optimizer_config` (SpeedupMixin) or an `lr` / `learning_rate` attribute or hparam. HINT: use "
                "SpeedupMixin."
            )

    @override
    def lr_find(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None or trainer.global_step != 0:
            rank_zero_info("LRFinder: resumed run, keeping the checkpoint's learning rate.")
            return
        with _steps_not_epochs(trainer):
            super().lr_find(trainer, pl_module)
        finder = self.optimal_lr
        if finder is None or not finder.results:  # fast_dev_run: Lightning skips the test
            return
        self.result = result_from_range_test(
            finder.results, self.rule, self.num_training_steps, self.early_stop_threshold
        )
        where = apply_lr(pl_module, self.result.lr)
        # the optimizer and scheduler were built with the old lr: rebuild them (no step has run yet)
        trainer.strategy.setup_optimizers(trainer)
        rank_zero_info(f"LRFinder ({self.rule}): lr = {self.result.lr:.3g} written to `{where}`.")
        if self.plot_path is not None and trainer.is_global_zero:
            self.result.plot(os.fspath(self.plot_path))

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"lr": None if self.result is None else self.result.lr, "rule": self.rule}


@contextmanager
def _steps_not_epochs(trainer: L.Trainer) -> Iterator[None]:
    """Let the range test run its steps over as many epochs as they need, without validation in between.

    Lightning's test runs the fit loop with ``max_steps`` set, but under the Trainer's ``max_epochs``: a 40-batch epoch
    with ``max_epochs=1`` ended a 100-step test at step 40, covering only the low end of the range.
    """
    loop = trainer.fit_loop
    max_epochs = loop.max_epochs
    every = trainer.check_val_every_n_epoch
    loop.max_epochs = -1  # the test's max_steps (and a diverging loss) end it
    trainer.check_val_every_n_epoch = 1_000_000  # the test only needs the training loss
    try:
        yield
    finally:
        loop.max_epochs = max_epochs
        trainer.check_val_every_n_epoch = every


register_technique(
    TechniqueInfo(
        name="lr_finder",
        callback=LRFinder,
        functional=suggest_lr,
        summary="LR range test (Lightning's) with steep / valley / minimum / slide rules, written into the config",
        ways=(3,),
        bench=None,
    )
)
