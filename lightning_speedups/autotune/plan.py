"""What autotune returns: the :class:`TunePlan` (callbacks, Trainer arguments, settings, evidence), and how it is
built from the settings the trials kept, freshly measured or read back from the cache."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from lightning_speedups.autotune.budget import IN_FIT
from lightning_speedups.autotune.methods import method_callbacks
from lightning_speedups.autotune.trials import Choice
from lightning_speedups.callbacks.batch_size.loaders import fit_loader_problem, rebuild_loader
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.callbacks.optimizer_kernel import OptimizerKernel
from lightning_speedups.optim import SpeedupMixin, scale_lr
from lightning_speedups.optim.lr_scaling import auto_lr_rule_for_name

__all__ = ["WIDTH", "RunShape", "TunePlan", "build_plan"]

WIDTH = 120  # the columns of every line autotune logs (TunePlan.to_text, and explain by default)


@dataclass
class TunePlan:
    """What autotune kept: callbacks, Trainer arguments, settings for the model and data, and the evidence.

    Unpacks as ``callbacks, trainer_kwargs = plan``; call :meth:`apply` to set the batch size (with LR scaling) and the
    optimizer kernel on the model and datamodule. When the data trial kept device-resident data, fit with
    ``plan.datamodule`` (or ``plan.train_dataloaders``) instead of the original; when the data is a plain
    ``DataLoader`` and the plan enlarged the batch, :meth:`apply` sets ``plan.train_dataloaders`` to a rebuilt loader
    at the planned size: fit with ``plan.datamodule or plan.train_dataloaders or data``. :meth:`to_text` is the short
    form autotune logs (one line per choice); :meth:`explain` gives the reasons and every note.
    """

    settings: dict[str, Any]
    choices: list[Choice]
    callbacks: list[L.Callback] = field(default_factory=list)
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    from_cache: bool = False
    trial_s: float = 0.0
    datamodule: Any = None  # a device-resident twin of the data, when the data trial kept one: fit with it
    train_dataloaders: Any = None
    # the user's DataModule on which autotune ran ``setup("fit")`` to read its batches, and the seconds it took:
    # after apply, the fit reuses it instead of running it again
    set_up: Any = field(default=None, repr=False, compare=False)
    setup_s: float = 0.0

    def __iter__(self) -> Iterator[Any]:
        return iter((self.callbacks, self.trainer_kwargs))

    @property
    def gain(self) -> float:
        """The product of the changed choices' measured step-time ratios, an estimate of the whole plan's gain.

        It multiplies the trials' gains and the methods' per-step costs (the EMA's update, below 1), so a kept
        method's cost is not left out. A precision timed in the fit (``"in-fit trial"``) counts 1.0 until the fit has
        decided, then its measured ratio when it kept bf16."""
        total = 1.0
        for choice in self.choices:
            if choice.name == "precision" and choice.chosen == IN_FIT:
                total *= self._in_fit_precision_gain()
            else:
                total *= choice.gain if choice.changed else 1.0
        return total

    def _in_fit_precision_gain(self) -> float:
        from lightning_speedups.callbacks.precision_trial import BF16, PrecisionTrial

        trial = next((cb for cb in self.callbacks if isinstance(cb, PrecisionTrial)), None)
        return float(trial.ratio[1]) if trial is not None and trial.kept == BF16 else 1.0

    def apply(self, model: L.LightningModule, datamodule: Any = None) -> L.LightningModule:
        """Set what cannot travel in callbacks: the batch size (and its LR scaling) and the optimizer kernel.

        The larger batch goes where the run reads it: the device twin (``plan.train_dataloaders`` /
        ``plan.datamodule``) when the data trial kept one, else a plain ``DataLoader`` passed as ``datamodule`` is
        rebuilt at the planned size as ``plan.train_dataloaders`` (fit with that one: a DataLoader cannot be
        re-batched in place), else the ``batch_size`` attribute of the datamodule or the model. A
        :class:`SpeedupMixin` model's lr follows by its optimizer's rule (square root for Adam-type, linear for SGD;
        a config with its own ``lr_scaling`` follows the batch it is built with); a plain module's follows through
        the schedule method's peak. When the batch cannot be set, nothing is scaled and a note says why. The fused /
        foreach kernel is set on a SpeedupMixin model's ``optimizer_config``; a plain module, whose own
        ``configure_optimizers`` builds the optimizer, gets it from the plan's
        :class:`~lightning_speedups.callbacks.optimizer_kernel.OptimizerKernel` at the fit's start. Call it once,
        before the fit.

        When ``datamodule`` is the DataModule autotune read (it ran its ``setup("fit")`` to get batches) and the fit
        uses it, the fit's first ``setup("fit")`` is skipped, so the user's setup does not run twice: what it
        built is already there. Any other stage, and every later call, runs the DataModule's own ``setup``.
        """
        scale = int(self.settings.get("batch_scale", 1))
        impl = self.settings.get("implementation")
        if scale > 1:
            old = self._rebatch(model, datamodule, scale)
            if old is None:  # no larger batch: the schedule's peak must not follow one
                for cb in self.callbacks:
                    if isinstance(cb, FastSchedule) and cb.batch_size is not None:
                        cb.base_batch_size = cb.batch_size = None
            elif isinstance(model, SpeedupMixin) and model.optimizer_config.lr_scaling is None:
                # keep the LR right for the larger batch: sqrt rule for Adam-type optimizers, linear for SGD (a
                # config with its own `lr_scaling` already follows the batch it is built with)
                cfg = model.optimizer_config
                rule = auto_lr_rule_for_name(cfg.name)
                model.optimizer_config = dataclasses.replace(cfg, lr=scale_lr(cfg.lr, old * scale, old, rule))
        if impl and isinstance(model, SpeedupMixin):
            model.optimizer_config = dataclasses.replace(model.optimizer_config, implementation=impl)
        elif impl and not any(isinstance(cb, OptimizerKernel) for cb in self.callbacks):
            self.callbacks.append(OptimizerKernel(impl))  # a plan built without the model: its optimizer is its own
        if self.reuses_setup(datamodule):
            datamodule.setup = _SetUpOnce(datamodule)
            self.notes.append(f"{type(datamodule).__name__}.setup('fit') already ran for autotune: the fit reuses it")
        return model

    def fit(self, model: L.LightningModule, data: Any = None, **trainer_kwargs: Any) -> L.Trainer:
        """Fit ``model`` on ``data`` with the plan, in one call: :meth:`apply`, a Trainer with the plan's callbacks
        and arguments (``trainer_kwargs`` added: a ``callbacks`` list joins the plan's, other arguments override),
        and the data the plan keeps (its device twin, or the loader it rebuilt at the planned batch size) else
        ``data``. Returns the Trainer, so ``trainer.callback_metrics`` holds the run's last metrics.

        Example::

            >>> plan = autotune(model, data, max_epochs=3)  # doctest: +SKIP
            >>> trainer = plan.fit(model, data)  # doctest: +SKIP
        """
        extra = list(trainer_kwargs.pop("callbacks", None) or [])
        self.apply(model, data)
        trainer = L.Trainer(callbacks=[*self.callbacks, *extra], **{**self.trainer_kwargs, **trainer_kwargs})
        fit_data = self.datamodule or self.train_dataloaders or data
        if isinstance(fit_data, L.LightningDataModule):
            trainer.fit(model, datamodule=fit_data)
        else:
            trainer.fit(model, fit_data)
        return trainer

    def reuses_setup(self, datamodule: Any) -> bool:
        """Whether a fit with ``datamodule``, after :meth:`apply`, reuses the ``setup("fit")`` autotune ran on it
        (``setup_s`` seconds): it is the DataModule autotune read, and the plan keeps no device twin of it."""
        return datamodule is not None and datamodule is self.set_up and self.datamodule is None

    def _rebatch(self, model: L.LightningModule, data: Any, scale: int) -> int | None:
        """Set the batch ``scale`` times larger where the run reads it; the old batch size, or ``None`` (noted)."""
        twin = self.train_dataloaders
        if twin is not None and not isinstance(twin, DataLoader):  # the device twin the data trial kept
            old = int(twin.batch_size)
            twin.batch_size = old * scale
            return old
        if isinstance(data, DataLoader):
            problem = fit_loader_problem(data)
            if problem is not None or not isinstance(data.batch_size, int):
                self.notes.append(
                    f"batch x{scale} not applied: the training data is {problem or 'unbatched'}, which "
                    "cannot be rebuilt at another batch size"
                )
                return None
            self.train_dataloaders = rebuild_loader(data, data.batch_size * scale)
            return data.batch_size
        holder = next((h for h in (self.datamodule, data, model) if h is not None and hasattr(h, "batch_size")), None)
        if holder is None:
            self.notes.append(f"batch x{scale} not applied: no `batch_size` attribute on the datamodule or model")
            return None
        old = int(holder.batch_size)
        holder.batch_size = old * scale
        return old

    def to_text(self) -> str:
        """The plan in short, as autotune logs it: a header, one line per choice (its name, what was chosen, the
        measured speedup with its interval and rounds, and what it costs or ``kept``), then one line that counts the
        notes and points to :meth:`explain`, which gives the reasons. Every line fits in 120 columns.

        Example::

            >>> plan = TunePlan({}, [Choice("channels_last", False, trials=3, note="within noise")], notes=["a note"])
            >>> print(plan.to_text())
            autotune plan (0.0s of trials): 1 choice, estimated 1.00x per step
              channels_last  False           1.00x [1.00, 1.00]  3 rounds  kept
              1 note: plan.explain() shows it and the reason for each choice
        """
        count = f"{len(self.choices)} choice{'' if len(self.choices) == 1 else 's'}"
        lines = [_fit(f"autotune plan ({self._source()}): {count}, estimated {self.gain:.2f}x per step")]
        for c in self.choices:
            lines.append(
                _fit(
                    f"  {c.name:<14} {_shown(c):<14} {c.gain:5.2f}x [{c.interval[0]:.2f}, {c.interval[1]:.2f}] "
                    f"{_rounds(c.trials):>9}  {self._outcome(c)}"
                )
            )
        notes = len(self.notes) + len(self._fit_notes())
        if notes:
            them = "it" if notes == 1 else "them"
            lines.append(
                f"  {notes} note{'' if notes == 1 else 's'}: plan.explain() shows {them} and the reason for each choice"
            )
        elif any(c.note for c in self.choices):
            lines.append("  plan.explain() shows the reason for each choice")
        return "\n".join(lines)

    def explain(self, width: int | None = WIDTH) -> str:
        """The reasons behind the plan: per choice its measurement and note, every note of the plan (what was not
        tried or not applied, and why), and the decisions the fit's own trials made (the optimizer race's, the in-fit
        precision trial's) once a fit with the plan has run. Each entry is wrapped to ``width`` columns with a hanging
        indent; ``width=None`` keeps one line per entry (to search or store them). ``autotune(..., verbose=True)``
        logs it after :meth:`to_text`.

        Example::

            >>> plan = TunePlan({}, [Choice("channels_last", False, trials=3, note="within noise")], notes=["a note"])
            >>> print(plan.explain())
              channels_last = False: 1.00x [1.00, 1.00] in 3 rounds; within noise
              note: a note
        """
        entries: list[str] = []
        for c in self.choices:
            measured = f"{c.gain:.2f}x [{c.interval[0]:.2f}, {c.interval[1]:.2f}] in {_rounds(c.trials)}"
            entries.append(f"{c.name} = {_shown(c)}: {measured}" + (f"; {c.note}" if c.note else ""))
        entries += [f"note: {n}" for n in self.notes]
        entries += self._fit_notes()
        if width is None:
            return "\n".join(f"  {e}" for e in entries)
        return "\n".join(
            textwrap.fill(
                e,
                width,
                initial_indent="  ",
                subsequent_indent="      ",  # a hanging indent: an entry's first line stands out
                break_long_words=False,  # a path or a name stays whole, even past the width
                break_on_hyphens=False,  # `bf16-mixed` is one word
            )
            for e in entries
        )

    def _source(self) -> str:
        return "cached" if self.from_cache else f"{self.trial_s:.1f}s of trials"

    def _outcome(self, choice: Choice) -> str:
        """What a choice does to the run, in a few words: decided in the fit (and what it kept, once it has), its
        per-step cost (a method below 1x), ``changed`` or ``kept``."""
        if choice.name == "precision" and choice.chosen == IN_FIT:
            trial = self._callback("PrecisionTrial")
            kept = getattr(trial, "kept", None)
            return f"the fit kept {kept}" if kept else "timed on the fit's first steps"
        race = self._callback("OptimizerRace") if choice.name == "optimization" else None
        if race is not None:
            return _race_outcome(race)
        if not choice.changed:
            return "kept"
        if choice.gain < 1.0:  # a method that only costs per step (the EMA's update): its gain is in the epochs
            return f"changed, costs {1.0 / choice.gain - 1.0:.1%} per step"
        return "changed"

    def _callback(self, name: str) -> Any:
        """The plan's callback of class ``name`` (by name: importing it here would load what the plan may not use)."""
        return next((cb for cb in self.callbacks if type(cb).__name__ == name), None)

    def _fit_notes(self) -> list[str]:
        """What the fit's own trials decided, once a fit with the plan has run: the race's decision and its notes, the
        in-fit precision trial's decision."""
        notes: list[str] = []
        for cb in self.callbacks:
            if type(cb).__name__ == "OptimizerRace":
                notes += [f"race: {n}" for n in [getattr(cb, "note", ""), *getattr(cb, "notes", [])] if n]
            elif type(cb).__name__ == "PrecisionTrial" and getattr(cb, "note", ""):
                notes.append(f"PrecisionTrial: {cb.note}")
        return notes


def _rounds(count: int) -> str:
    return f"{count} round{'' if count == 1 else 's'}"


def _shown(choice: Choice) -> str:
    """The chosen option as the plan prints it: the batch size as a multiple of the user's batch."""
    return f"x{choice.chosen}" if choice.name == "batch_size" else str(choice.chosen)


def _race_outcome(race: Any) -> str:
    """The race's decision in a few words: the winner, and the gap behind it with its interval (the winner's, or where
    the module's own optimizer was kept, the best other arm's)."""
    winner = getattr(race, "winner", None)
    if winner is None:
        return "raced on the fit's first steps"
    gaps = getattr(race, "gaps", {})
    name = winner if winner in gaps else max(gaps, key=lambda n: gaps[n][1], default=None)
    if name is None:
        return f"the race kept {winner}"
    low, mid, high = gaps[name]
    gap = f"{getattr(race, 'scored_on', 'loss')} {mid:+.1%} [{low:+.1%}, {high:+.1%}]"
    return f"the race chose {winner}: {gap}" if name == winner else f"the race kept {winner} (best: {name} {gap})"


def _fit(line: str) -> str:
    """``line`` cut to :data:`WIDTH` columns (only an unusually long option name needs it)."""
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


class _SetUpOnce:
    """A DataModule's ``setup`` until its next call: autotune already ran ``setup("fit")``, so a ``"fit"`` call is
    skipped; any other stage runs the DataModule's own. Either way the DataModule's own ``setup`` is back after it.
    A plain object (not a closure), so the DataModule still pickles, as ``ddp_spawn`` needs."""

    def __init__(self, datamodule: Any) -> None:
        self.datamodule = datamodule

    def __call__(self, stage: str | None = None) -> None:
        if self.datamodule.__dict__.get("setup") is self:
            del self.datamodule.setup
        if stage != "fit":
            self.datamodule.setup(stage)


@dataclass(frozen=True)
class RunShape:
    """What the methods need to know of the planned run: the schedule's warm-up fraction and the user's batch size
    (``None``: unknown)."""

    warmup: float
    base_batch: int | None


def build_plan(
    settings: dict[str, Any],
    choices: list[Choice],
    trainer_kwargs: dict[str, Any],
    model: Any,
    shape: RunShape,
    *,
    checked: bool,
    replacement: tuple[str, Any] | None = None,
) -> TunePlan:
    """The plan of ``settings``: their callbacks (the methods' too), the Trainer arguments with the precision, and
    the device twin of the data (``replacement``, ``(kind, twin)``) where the fit reads it. ``checked``: the
    methods' blockers were just run on this model and these Trainer arguments."""
    callbacks: list[L.Callback] = []
    if settings.get("batching"):  # first: it swaps the loader at the fit's start, before anything reads its length
        from lightning_speedups.callbacks.sequence_batching import SequenceBatching

        callbacks.append(SequenceBatching(strategy=settings["batching"]))
    if settings.get("precision_trial"):  # the budget could not fit the precision comparison: the fit's steps do
        from lightning_speedups.callbacks.precision_trial import PrecisionTrial

        callbacks.append(PrecisionTrial())
    if settings.get("channels_last"):
        from lightning_speedups.callbacks.channels_last import ChannelsLast

        callbacks.append(ChannelsLast())
    if settings.get("optimizer_race"):
        from lightning_speedups.callbacks.optimizer_race import OptimizerRace

        callbacks.append(OptimizerRace())
    if settings.get("compile"):
        from lightning_speedups.callbacks.compile import TorchCompile

        callbacks.append(TorchCompile())
    notes: list[str] = []
    if settings.get("implementation") and model is not None and not isinstance(model, SpeedupMixin):
        # the module's own configure_optimizers builds its optimizer: the kernel is set at the fit's start
        callbacks.append(OptimizerKernel(settings["implementation"]))
    callbacks += method_callbacks(
        settings, trainer_kwargs, notes, model, shape.warmup, shape.base_batch, checked=checked
    )
    kwargs = dict(trainer_kwargs)
    kwargs["precision"] = settings.get("precision", "32-true")
    kind, twin = replacement or (None, None)
    plan = TunePlan(settings, choices, callbacks, kwargs, notes)
    if kind == "datamodule":
        plan.datamodule = twin
    elif kind == "loader":
        plan.train_dataloaders = twin
    return plan
