"""``autotune``: measure what speeds up *this* model on *this* machine, and return the plan.

Where a recipe encodes choices that were right on the machine it was tuned on, ``autotune`` measures each one on the
user's model, data and hardware: every candidate runs a few training steps of a copy of the model, timed
interleaved against the current plan (:func:`~lightning_speedups.measure.compare`), and is kept only when it beats
the plan by ``margin`` beyond noise. Candidates (in order): precision, channels_last, the data path
(device-resident data vs the DataLoader), batch size (with LR scaling; a doubled batch must raise samples/s by 1.5x
and the margin, because it needed 1.5x the samples to the target on the bench tasks), the fused/foreach optimizer
(compared only where the optimizer step is a large enough share of a training step to pay the margin even at zero
cost, and only for a :class:`~lightning_speedups.optim.SpeedupMixin` model, whose ``optimizer_config`` the plan can
set: a plain module's ``configure_optimizers`` is its own code, so the plan notes where to pass ``fused=True``
instead of rewriting it) and ``torch.compile`` (kept only where its measured compile time is paid back within the
planned run). The trials take at most 5% of the planned run, or ``budget_s``. Plans are cached on disk (plain
JSON, keyed by machine and model signature), so a second run skips the trials.

Beyond faster steps, the plan adds time-to-accuracy ``methods`` (the EMA of the weights and a schedule for time to
target) that reached the target sooner on both end-to-end bench tasks; a few steps cannot time their benefit, so
their evidence is the bench's and only their per-step cost is measured here (``methods=[]`` leaves them out).

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

from lightning_speedups._autotune_cache import PlanCache, plan_key
from lightning_speedups._autotune_methods import (
    check_methods,
    ema_choice,
    method_callbacks,
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
            foreach kernel for a module that is not a :class:`SpeedupMixin`.
        methods: time-to-accuracy methods to add (default: all, ``["ema", "schedule"]``; ``[]`` for none). They
            need fewer steps rather than faster ones, so a trial cannot time their benefit: each is in the default
            plan because it reached the target sooner on both end-to-end bench tasks (see
            :mod:`lightning_speedups._autotune_methods`), and its per-step cost is measured and reported. ``"ema"``
            adds :class:`~lightning_speedups.callbacks.ema.EMA` (decay 0.99 with warm-up): validation and checkpoints
            then use the averaged weights. It is left out, with a note, when ``trainer_kwargs`` already has an
            averaging callback or a sharded strategy. ``"schedule"`` adds
            :class:`~lightning_speedups.callbacks.fast_schedule.FastSchedule` on the model's optimizer: a warm-up of a
            quarter epoch (at most 5% of the run) to 3x its lr, then a linear decay to the end of the planned run
            (a plain module's peak also follows a batch the plan enlarged, by the square-root rule). It is left out,
            with a note, when ``configure_optimizers`` returns a scheduler (or cannot be called outside a fit), under
            manual optimization, without ``max_epochs``/``max_steps``, or when a callback already sets the lr.
        budget_s: trial time; default 5% of the planned run (estimated from a first timed step, without data
            time). Candidates are tried in order, each with an even share of what is left but at least one
            comparison; once what is left cannot fit one comparison, the rest are not tried (with a note).
        margin: a candidate must beat the current plan by this fraction beyond noise.
        cache: read and write the plan cache (``cache_dir``, default ``~/.cache/lightning_speedups``).
        no_bf16: never consider bf16 (to check a plan for CPUs without bf16 units on one that has them).
        clock: seconds as a float (tests inject a fake one).
        **trainer_kwargs: the Trainer arguments of the planned run (``max_epochs``/``max_steps`` size it); returned
            in the plan with the chosen precision.

    Raises:
        SpeedupConfigError: an unknown candidate or method, ``budget_s`` <= 0, ``margin`` < 0, no training data.
    """
    names = list(CANDIDATES) if candidates is None else list(candidates)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SpeedupConfigError(f"`candidates` has unknown names {unknown!r}. Allowed values: {list(CANDIDATES)!r}.")
    method_names = check_methods(methods)
    if budget_s is not None:
        check_range("budget_s", budget_s, 0.0, None, low_inclusive=False, hint="seconds of trials, e.g. 30")
    check_range("margin", margin, 0.0, None)
    dm = datamodule_or_loaders if isinstance(datamodule_or_loaders, L.LightningDataModule) else None
    loaders = None if dm is not None else datamodule_or_loaders
    loader = _train_loader(model, dm, loaders)
    batch = first_batch(loader)  # the global RNG is left as it was; the loader object is not changed
    device = torch.device("cuda" if torch.cuda.is_available() and trainer_kwargs.get("accelerator") != "cpu" else "cpu")
    steps = _planned_steps(loader, trainer_kwargs)
    shapes = [list(t.shape) for t in flat_tensors(batch)]
    shape = _run_shape(loader, steps, shapes)
    key = plan_key(model, shapes, {"candidates": names, "methods": method_names, "margin": margin, "no_bf16": no_bf16,
                                   "device": str(device)})
    store = PlanCache(cache_dir) if cache else None
    cached = store.get(key) if store is not None else None
    if cached is not None:
        settings = dict(cached["settings"])
        missing = ""
        if settings.get("device_data"):
            from lightning_speedups._autotune_trials import _device_twin

            ctx0 = TrialContext(model, batch, device, steps, margin, 0.0, {}, clock, loader=loader, datamodule=dm)
            twin = _device_twin(ctx0)
            if twin is not None:
                settings["_replacement"] = twin
            else:
                settings["device_data"] = False
                missing = "the cached plan keeps the data on the device, but this data has no device twin: not applied"
        plan = _build(settings, [Choice(**c) for c in cached["choices"]], trainer_kwargs, model, shape, checked=False)
        plan.from_cache, plan.notes = True, [*cached.get("notes", []), *plan.notes, f"plan from the cache ({key})"]
        if missing:
            plan.notes.append(missing)
        return plan
    start = clock()
    own = dm is None and loaders is None  # the model's own train_dataloader()
    ctx = TrialContext(model, batch, device, steps, margin, deadline=float("inf"), plan={"precision": "32-true"},
                       clock=clock, loader=loader, datamodule=dm, own_loader=own)  # fmt: skip
    ctx.plan["no_bf16"] = no_bf16
    from lightning_speedups._autotune_trials import make_step

    one = make_step(ctx, ctx.plan)
    one()  # untimed: first-call costs
    times = []
    for _ in range(3):  # the median of three: one slow step on a busy machine must not size the budget
        t0 = clock()
        one()
        times.append(clock() - t0)
    step_s = sorted(times)[1]
    budget_given = budget_s
    if budget_s is None:  # 5% of the planned run, from the median step of the unchanged model (data time not counted)
        budget_s = 0.05 * steps * step_s
    ctx.deadline = start + budget_s
    # one comparison needs about (warm-up + 5 rounds) x 2 options of a step: below that a trial only spends time
    need_s = 2 * (1 + 5) * step_s
    choices: list[Choice] = []
    too_small: list[str] = []
    left_at_skip = 0.0
    for i, name in enumerate(names):
        left = ctx.budget_left()
        if left < need_s and name != "compile":  # compile explains its own threshold
            if not too_small:  # the budget only shrinks: what was left when the first one did not fit
                left_at_skip = left
            too_small.append(name)
            continue
        # an even share of what is left, but at least one comparison: a small budget goes to the candidates in order
        # (the largest effects first) instead of being split into shares too small for any of them
        share = max(1.0 / (len(names) - i), min(1.0, need_s / max(left, 1e-12)))
        choice = CANDIDATES[name](ctx, share)
        if choice is not None:
            choices.append(choice)
    if too_small:
        ctx.notes.insert(
            0,
            f"{', '.join(too_small)} not tried: what was left of the trial budget ({max(left_at_skip, 0.0):.2f}s of "
            f"{budget_s:.2f}s"
            + (f", 5% of a planned run of about {steps * step_s:.1f}s" if budget_given is None else "")
            + f") is below the {need_s:.2f}s one comparison needs. HINT: pass a larger `budget_s`; the plan is "
            "cached, so later runs skip the trials.",
        )
    if "ema" in method_names:
        choice, note = ema_choice(model, device, step_s, trainer_kwargs, clock)
        if choice is not None:
            choices.append(choice)
            ctx.plan["ema"] = choice.chosen
        else:
            ctx.notes.append(str(note))
    if "schedule" in method_names:
        choice, note = schedule_choice(model, trainer_kwargs)
        if choice is not None:
            choices.append(choice)
            ctx.plan["schedule"] = choice.chosen
        else:
            ctx.notes.append(str(note))
    settings = {k: v for k, v in ctx.plan.items() if k != "no_bf16"}
    plan = _build(settings, choices, trainer_kwargs, model, shape, checked=True)
    plan.notes, plan.trial_s = [*ctx.notes, *plan.notes], clock() - start
    if store is not None:
        plain = {k: v for k, v in settings.items() if not k.startswith("_")}  # JSON only: no loader objects
        store.put(key, {"settings": plain, "choices": [c.as_dict() for c in choices], "notes": ctx.notes})
    rank_zero_info(plan.to_text())
    return plan


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
