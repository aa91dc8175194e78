"""``autotune``: measure what speeds up *this* model on *this* machine, and return the plan.

Where a recipe encodes choices that were right on the machine it was tuned on, ``autotune`` measures each one on the
user's model, data and hardware: every candidate runs a few training steps of a copy of the model, timed
interleaved against the current plan (:func:`~lightning_speedups.measure.compare`), and is kept only when it beats
the plan by ``margin`` beyond noise. Candidates (in order): length-aware batching for token data (``"batching"``:
the epoch's training steps estimated with the user's loader and with length-grouped and token-budget batches, the
winner kept as a :class:`~lightning_speedups.callbacks.sequence_batching.SequenceBatching`; skipped silently for
other data), precision, channels_last, the data path (device-resident data vs the DataLoader), batch size (with LR
scaling; a doubled batch must raise samples/s by 1.5x and the margin, because it needed 1.5x the samples to the
target on the bench tasks), the fused/foreach optimizer (compared only where the optimizer step is a large enough
share of a training step to pay the margin even at zero cost, and only for a
:class:`~lightning_speedups.optim.SpeedupMixin` model, whose ``optimizer_config`` the plan can set: a plain module's
``configure_optimizers`` is its own code, so the plan notes where to pass ``fused=True`` instead of rewriting it) and
``torch.compile`` (kept only where its measured compile time is paid back within the planned run).

The trials take at most 5% of the planned run, or ``budget_s``, counted from the three steps that size it. A
comparison is admitted when what is left covers the least it can take (the candidate's warm-up and 3 rounds of it
and the plan: ``(1 + 2 x 3)`` steps of the current plan; the first one reuses the warm sizing copy as its baseline)
and stops as soon as its interval clears or misses the margin, so a 2x effect on a run of minutes is measured
within 5% of it. What the budget could not fit is named in one note, with what was left, what one comparison needs
and the ``budget_s`` that would fit it. Plans are cached on disk (plain JSON, keyed by machine, model signature and
options), so a second run skips the trials.

Beyond faster steps, the plan adds time-to-accuracy ``methods`` (the EMA of the weights and a schedule for time to
target) for the model kinds where they reached the target sooner on the end-to-end bench: image CNNs only, today
(:mod:`lightning_speedups._autotune_kinds`). A transformer, recurrent or MLP model gets neither by default, with a
note; ``methods=["ema"]`` still adds one. A few steps cannot time their benefit, so their evidence is the bench's and
only their per-step cost is measured here (``methods=[]`` leaves them out).

Example::

    >>> from lightning_speedups.demo import DemoClassifier, DigitsDataModule
    >>> model, data = DemoClassifier(width=8), DigitsDataModule(batch_size=32)
    >>> plan = autotune(model, data, max_epochs=2, budget_s=5, cache=False)  # doctest: +SKIP
    >>> callbacks, trainer_kwargs = plan  # doctest: +SKIP
    >>> plan.apply(model, data)  # doctest: +SKIP
    >>> L.Trainer(callbacks=callbacks, **trainer_kwargs).fit(model, data)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

import lightning_speedups._autotune_batching  # noqa: F401  (registers the "batching" candidate)
import lightning_speedups._autotune_compile  # noqa: F401  (registers the "compile" candidate)
from lightning_speedups._autotune_budget import budget_note, run_candidates, size_step
from lightning_speedups._autotune_cache import PlanCache, plan_key
from lightning_speedups._autotune_data import device_twin
from lightning_speedups._autotune_kinds import model_kind
from lightning_speedups._autotune_methods import (
    ema_choice,
    method_callbacks,
    plan_methods,
    schedule_choice,
    schedule_warmup,
)
from lightning_speedups._autotune_trials import CANDIDATES, Choice, TrialContext
from lightning_speedups._errors import SpeedupConfigError, check_range
from lightning_speedups._inputs import first_batch, flat_tensors
from lightning_speedups.callbacks._batch_size_trials import fit_loader_problem, rebuild_loader
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.optim import SpeedupMixin, scale_lr

__all__ = ["TunePlan", "autotune", "list_candidates"]


def list_candidates() -> list[str]:
    """Names of the choices autotune can make, in the order it measures them."""
    return list(CANDIDATES)


@dataclass
class TunePlan:
    """What autotune kept: callbacks, Trainer arguments, settings for the model and data, and the evidence.

    Unpacks as ``callbacks, trainer_kwargs = plan``; call :meth:`apply` to set the batch size (with LR scaling) and the
    optimizer kernel on the model and datamodule. When the data trial kept device-resident data, fit with
    ``plan.datamodule`` (or ``plan.train_dataloaders``) instead of the original; when the data is a plain
    ``DataLoader`` and the plan enlarged the batch, :meth:`apply` sets ``plan.train_dataloaders`` to a rebuilt loader
    at the planned size: fit with ``plan.datamodule or plan.train_dataloaders or data``.
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

    def __iter__(self) -> Iterator[Any]:
        return iter((self.callbacks, self.trainer_kwargs))

    @property
    def gain(self) -> float:
        """The product of the kept choices' measured step-time gains (an estimate of the whole plan's)."""
        total = 1.0
        for choice in self.choices:
            total *= max(choice.gain, 1.0) if choice.chosen not in (False, None, 1, "current") else 1.0
        return total

    def apply(self, model: L.LightningModule, datamodule: Any = None) -> L.LightningModule:
        """Set what cannot travel in callbacks: the batch size (and its LR scaling) and the optimizer kernel.

        The larger batch goes where the run reads it: the device twin (``plan.train_dataloaders`` /
        ``plan.datamodule``) when the data trial kept one, else a plain ``DataLoader`` passed as ``datamodule`` is
        rebuilt at the planned size as ``plan.train_dataloaders`` (fit with that one: a DataLoader cannot be
        re-batched in place), else the ``batch_size`` attribute of the datamodule or the model. A
        :class:`SpeedupMixin` model's lr follows by the square-root rule; a plain module's follows through the
        schedule method's peak. When the batch cannot be set, nothing is scaled and a note says why. The fused /
        foreach kernel is set on a SpeedupMixin model's ``optimizer_config``; autotune does not try it for a plain
        module, whose own ``configure_optimizers`` builds the optimizer. Call it once, before the fit.
        """
        scale = int(self.settings.get("batch_scale", 1))
        impl = self.settings.get("implementation")
        if scale > 1:
            old = self._rebatch(model, datamodule, scale)
            if old is None:  # no larger batch: the schedule's peak must not follow one
                for cb in self.callbacks:
                    if isinstance(cb, FastSchedule) and cb.batch_size is not None:
                        cb.base_batch_size = cb.batch_size = None
            elif isinstance(model, SpeedupMixin):  # keep the LR right for the larger batch (sqrt rule)
                cfg = model.optimizer_config
                model.optimizer_config = dataclasses.replace(cfg, lr=scale_lr(cfg.lr, old * scale, old, "sqrt"))
        if impl and isinstance(model, SpeedupMixin):
            model.optimizer_config = dataclasses.replace(model.optimizer_config, implementation=impl)
        elif impl:
            self.notes.append(f"optimizer {impl!r} not applied: the model's own configure_optimizers owns it")
        return model

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
                self.notes.append(f"batch x{scale} not applied: the training data is {problem or 'unbatched'}, which "
                                  "cannot be rebuilt at another batch size")  # fmt: skip
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
        lines = [f"autotune plan ({'cached' if self.from_cache else f'{self.trial_s:.1f}s of trials'}):"]
        for c in self.choices:
            lines.append(f"  {c.name:<14} {c.chosen!s:<12} {c.gain:5.2f}x [{c.interval[0]:.2f}, {c.interval[1]:.2f}] "
                         f"{c.trials} rounds  {c.note}")  # fmt: skip
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _train_loader(model: L.LightningModule, datamodule: Any, train_dataloaders: Any) -> Any:
    if train_dataloaders is not None:
        return train_dataloaders
    source = datamodule if datamodule is not None else model
    if datamodule is not None and hasattr(datamodule, "setup"):
        datamodule.setup("fit")
    try:
        return source.train_dataloader()
    except Exception as err:
        raise SpeedupConfigError(
            f"`datamodule_or_loaders`={type(source).__name__} gives no training data ({type(err).__name__}: {err}). "
            "Allowed values: a LightningDataModule, a DataLoader, or None when the model has train_dataloader()."
        ) from err


def _planned_steps(loader: Any, trainer_kwargs: dict[str, Any]) -> int:
    if trainer_kwargs.get("max_steps", -1) not in (-1, None):
        return int(trainer_kwargs["max_steps"])
    try:
        per_epoch = len(loader)
    except TypeError:
        per_epoch = 100
    return max(1, int(per_epoch) * int(trainer_kwargs.get("max_epochs") or 10))


def autotune(
    model: L.LightningModule,
    datamodule_or_loaders: Any = None,
    *,
    candidates: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    budget_s: float | None = None,
    margin: float = 0.05,
    cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    no_bf16: bool = False,
    clock: Any = time.perf_counter,
    **trainer_kwargs: Any,
) -> TunePlan:
    """Measure the candidates on copies of ``model`` and return a :class:`TunePlan` (``model`` is not changed).

    Args:
        model: the LightningModule to tune (plain or :class:`SpeedupMixin`); its ``training_step`` is timed, with
            the first optimizer its ``configure_optimizers`` returns (AdamW, with a note, when that needs a fit).
        datamodule_or_loaders: a LightningDataModule, a training DataLoader, or ``None`` (the model's own).
        candidates: a subset of :func:`list_candidates` (default: all). A candidate the plan could not apply to
            this model and data is not tried, with a note: the batch size for a loader that cannot be rebuilt
            (custom sampler or batch_sampler, IterableDataset) or data with no ``batch_size`` to set; the fused /
            foreach kernel for a module that is not a :class:`SpeedupMixin`; the batching for token data in a
            loader SequenceBatching cannot rebuild. ``"batching"`` is skipped without a note for data that holds
            no token tensors; for token data it estimates an epoch's training steps with the user's loader and
            with length-grouped and token-budget batches, and keeps the fastest by ``margin`` as a
            :class:`~lightning_speedups.callbacks.sequence_batching.SequenceBatching` callback.
        methods: time-to-accuracy methods to add (``["ema", "schedule"]``; ``[]`` for none). They need fewer steps
            rather than faster ones, so a trial cannot time their benefit. By default (``None``) a method is added
            only for the model kinds where the bench showed it reaching the target sooner
            (:mod:`lightning_speedups._autotune_kinds`: today image CNNs, ``"conv"``); for a transformer,
            recurrent or MLP model both are left out with one note. Named here, a method is added whatever the
            kind, and its note says which evidence applies to this model. Its per-step cost is measured and
            reported. ``"ema"`` adds :class:`~lightning_speedups.callbacks.ema.EMA` (decay 0.99 with warm-up):
            validation and checkpoints then use the averaged weights. It is left out, with a note, when
            ``trainer_kwargs`` already has an averaging callback or a sharded strategy. ``"schedule"`` adds
            :class:`~lightning_speedups.callbacks.fast_schedule.FastSchedule` on the model's optimizer: a warm-up
            of a quarter epoch (at most 5% of the run) to 3x its lr, then a linear decay to the end of the planned
            run (a plain module's peak also follows a batch the plan enlarged, by the square-root rule). It is left
            out, with a note, when ``configure_optimizers`` returns a scheduler (or cannot be called outside a
            fit), under manual optimization, without ``max_epochs``/``max_steps``, or when a callback already sets
            the lr.
        budget_s: trial time, counted from before the sizing steps (one untimed and three timed steps of the
            unchanged model); default 5% of the planned run, estimated from the median sizing step, without data
            time. Candidates are tried in order, each only when what is left covers the least one decision of it
            takes (a plain comparison: the candidate's warm-up and 3 rounds of it and the plan, 7 steps), with an
            even share of what is left but at least that; a comparison stops as soon as its interval clears or
            misses ``margin``. One note names the candidates that did not fit, what was left and what they need,
            and the ``budget_s`` that would fit the cheapest; it opens with "nothing measured" when nothing was.
        margin: a candidate must beat the current plan by this fraction beyond noise.
        cache: read and write the plan cache (``cache_dir``, default ``~/.cache/lightning_speedups``).
        no_bf16: never consider bf16 (to check a plan for CPUs without bf16 units on one that has them).
        clock: seconds as a float (tests inject a fake one).
        **trainer_kwargs: the Trainer arguments of the planned run (``max_epochs``/``max_steps`` size it); returned
            in the plan with the chosen precision.

    Raises:
        SpeedupConfigError: an unknown candidate or method, ``budget_s`` <= 0, ``margin`` < 0, no training data.
    """
    names = _check_candidates(candidates)
    if budget_s is not None:
        check_range("budget_s", budget_s, 0.0, None, low_inclusive=False, hint="seconds of trials, e.g. 30")
    check_range("margin", margin, 0.0, None)
    kind = model_kind(model)
    method_names, methods_note = plan_methods(methods, kind)
    dm = datamodule_or_loaders if isinstance(datamodule_or_loaders, L.LightningDataModule) else None
    loaders = None if dm is not None else datamodule_or_loaders
    loader = _train_loader(model, dm, loaders)
    batch = first_batch(loader)  # the global RNG is left as it was; the loader object is not changed
    device = torch.device("cuda" if torch.cuda.is_available() and trainer_kwargs.get("accelerator") != "cpu" else "cpu")
    steps = _planned_steps(loader, trainer_kwargs)
    shapes = [list(t.shape) for t in flat_tensors(batch)]
    shape = _run_shape(loader, steps, shapes)
    key = plan_key(model, shapes, {"candidates": names, "methods": method_names, "margin": margin, "no_bf16": no_bf16,
                                   "device": str(device), "kind": kind})  # fmt: skip
    store = PlanCache(cache_dir) if cache else None
    ctx = TrialContext(model, batch, device, steps, margin, deadline=float("inf"), plan={"precision": "32-true"},
                       clock=clock, loader=loader, datamodule=dm, own_loader=loaders is None and dm is None)
    cached = store.get(key) if store is not None else None
    if cached is not None:
        return _cached_plan(cached, ctx, key, trainer_kwargs, shape)
    start = clock()
    ctx.plan["no_bf16"] = no_bf16
    step_s = size_step(ctx)
    # 5% of the planned run, from the median step of the unchanged model (data time not counted)
    budget = 0.05 * steps * step_s if budget_s is None else budget_s
    ctx.deadline = start + budget
    choices, skipped = run_candidates(ctx, names)
    if skipped:
        planned_run_s = steps * step_s if budget_s is None else None
        ctx.notes.insert(0, budget_note(skipped, budget, planned_run_s, measured=bool(choices)))
    if methods_note:
        ctx.notes.append(methods_note)
    choices += _method_choices(ctx, method_names, step_s, trainer_kwargs, kind)
    settings = {k: v for k, v in ctx.plan.items() if k != "no_bf16"}
    plan = _build(settings, choices, trainer_kwargs, model, shape, checked=True)
    plan.notes, plan.trial_s = [*ctx.notes, *plan.notes], clock() - start
    if store is not None:
        plain = {k: v for k, v in settings.items() if not k.startswith("_")}  # JSON only: no loader objects
        store.put(key, {"settings": plain, "choices": [c.as_dict() for c in choices], "notes": ctx.notes})
    rank_zero_info(plan.to_text())
    return plan


def _check_candidates(candidates: Sequence[str] | None) -> list[str]:
    names = list(CANDIDATES) if candidates is None else list(candidates)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SpeedupConfigError(f"`candidates` has unknown names {unknown!r}. Allowed values: {list(CANDIDATES)!r}.")
    return names


def _cached_plan(cached: dict[str, Any], ctx: TrialContext, key: str, trainer_kwargs: dict[str, Any],
                 shape: tuple[float, int | None]) -> TunePlan:
    """The plan the cache holds, rebuilt for this run: its callbacks, and the device twin of the data it kept."""
    settings = dict(cached["settings"])
    missing = ""
    if settings.get("device_data"):
        twin = device_twin(ctx)
        if twin is not None:
            settings["_replacement"] = twin
        else:
            settings["device_data"] = False
            missing = "the cached plan keeps the data on the device, but this data has no device twin: not applied"
    plan = _build(settings, [Choice(**c) for c in cached["choices"]], trainer_kwargs, ctx.model, shape,
                  checked=False)  # fmt: skip
    plan.from_cache, plan.notes = True, [*cached.get("notes", []), *plan.notes, f"plan from the cache ({key})"]
    if missing:
        plan.notes.append(missing)
    return plan


def _method_choices(ctx: TrialContext, names: list[str], step_s: float, trainer_kwargs: dict[str, Any],
                    kind: str) -> list[Choice]:
    """The methods' choices (each with its evidence for a ``kind`` model), recorded in ``ctx.plan``; a method the
    run cannot take is left out with its note."""
    made: list[Choice] = []
    for name in names:
        if name == "ema":
            choice, note = ema_choice(ctx.model, ctx.device, step_s, trainer_kwargs, ctx.clock, kind)
        else:
            choice, note = schedule_choice(ctx.model, trainer_kwargs, kind)
        if choice is None:
            ctx.notes.append(str(note))
            continue
        made.append(choice)
        ctx.plan[name] = choice.chosen
    return made


def _run_shape(loader: Any, steps: int, shapes: list[list[int]]) -> tuple[float, int | None]:
    """What the methods need to know of the planned run: the schedule's warm-up fraction, the user's batch size."""
    try:
        per_epoch: int | None = len(loader)
    except TypeError:
        per_epoch = None
    size = getattr(loader, "batch_size", None)
    base_batch = size if isinstance(size, int) else (shapes[0][0] if shapes and shapes[0] else None)
    return schedule_warmup(per_epoch, steps), base_batch


def _build(settings: dict[str, Any], choices: list[Choice], trainer_kwargs: dict[str, Any], model: Any,
           shape: tuple[float, int | None], checked: bool) -> TunePlan:
    callbacks: list[L.Callback] = []
    if settings.get("batching"):  # first: it swaps the loader at the fit's start, before anything reads its length
        from lightning_speedups.callbacks.sequence_batching import SequenceBatching

        callbacks.append(SequenceBatching(strategy=settings["batching"]))
    if settings.get("channels_last"):
        from lightning_speedups.callbacks.channels_last import ChannelsLast

        callbacks.append(ChannelsLast())
    if settings.get("compile"):
        from lightning_speedups.callbacks.compile import TorchCompile

        callbacks.append(TorchCompile())
    notes: list[str] = []
    if settings.get("implementation") and model is not None and not isinstance(model, SpeedupMixin):
        settings.pop("implementation")  # a plan cached before plain modules were left out of the kernel trial
        choices = [c for c in choices if c.name != "optimizer"]
        notes.append(f"optimizer kernel not applied: `{type(model).__name__}.configure_optimizers` builds its own")
    callbacks += method_callbacks(settings, trainer_kwargs, notes, model, *shape, checked=checked)
    kwargs = dict(trainer_kwargs)
    kwargs["precision"] = settings.get("precision", "32-true")
    for choice in choices:
        if isinstance(choice.interval, list):
            choice.interval = tuple(choice.interval)  # type: ignore[assignment]
    kind, replacement = settings.pop("_replacement", (None, None))
    plan = TunePlan(settings, choices, callbacks, kwargs, notes)
    if kind == "datamodule":
        plan.datamodule = replacement
    elif kind == "loader":
        plan.train_dataloaders = replacement
    return plan
