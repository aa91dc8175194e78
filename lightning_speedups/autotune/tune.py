"""``autotune()``: the steps of one tuning, top to bottom: read the run, try the cache, size the budget, run the
candidates, add the methods, build the plan and store it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_range
from lightning_speedups._inputs import first_batch, flat_tensors
from lightning_speedups.autotune.budget import (
    BUDGET_SHARE,
    IN_FIT_MIN_STEPS,
    IN_FIT_STEPS,
    MIN_BUDGET_S,
    InFitRecord,
    budget_note,
    in_fit_precision,
    precision_in_fit,
    run_candidates,
    short_run,
    size_step,
    too_short,
)
from lightning_speedups.autotune.candidates import ONLY_WHEN_NAMED
from lightning_speedups.autotune.data import device_twin
from lightning_speedups.autotune.kinds import model_kind
from lightning_speedups.autotune.methods import (
    check_methods,
    ema_choice,
    plan_methods,
    schedule_choice,
    schedule_warmup,
)
from lightning_speedups.autotune.plan import RunShape, TunePlan, build_plan
from lightning_speedups.autotune.trials import CANDIDATES, Choice, TrialContext
from lightning_speedups.measure import PlanCache, plan_key

__all__ = ["autotune", "list_candidates", "planned_steps"]


def list_candidates() -> list[str]:
    """Names of the choices autotune can make, in the order it measures them."""
    return list(CANDIDATES)


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
    verbose: bool = False,
    **trainer_kwargs: Any,
) -> TunePlan:
    """Measure the candidates on copies of ``model`` and return a :class:`TunePlan` (``model`` is not changed).

    Args:
        model: the LightningModule to tune (plain or :class:`~lightning_speedups.optim.SpeedupMixin`); its
            ``training_step`` is timed, with the first optimizer its ``configure_optimizers`` returns (AdamW, with a
            note, when that needs a fit).
        datamodule_or_loaders: a LightningDataModule, a training DataLoader, or ``None`` (the model's own).
        candidates: a subset of :func:`list_candidates` (default: all but ``"batch_size"``, which changes the
            optimisation: a larger batch is kept, with its lr scaled, only when its samples/s rises by more than the
            extra samples the measured gradient noise scale predicts; a note says so, and naming it measures it).
            A candidate the plan could not apply to
            this model and data is not tried, with a note: the batch size for a loader that cannot be rebuilt
            (custom sampler or batch_sampler, IterableDataset) or data with no ``batch_size`` to set; the fused /
            foreach kernel for a module that is not a SpeedupMixin; the batching for token data in a
            loader SequenceBatching cannot rebuild. ``"batching"`` is skipped without a note for data that holds
            no token tensors; for token data it estimates an epoch's training steps with the user's loader and
            with length-grouped batches, and keeps the faster by ``margin`` as a
            :class:`~lightning_speedups.callbacks.sequence_batching.SequenceBatching` callback.
        methods: time-to-accuracy methods to add (``["ema", "schedule"]``; ``[]`` for none). They need fewer steps
            rather than faster ones, so a trial cannot time their benefit. By default (``None``) a method is added
            only for the model kinds where the bench showed it reaching the target sooner and slowing no task
            (:mod:`lightning_speedups.autotune.kinds`; today none: each slowed an image CNN task), so by default
            both are left out with one note that says why. Named here, a method is added whatever the
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
        cache: read and write the plan cache (``cache_dir``, default ``~/.cache/lightning_speedups``). A cached
            plan is measured again when a candidate did not fit its budget and this call's ``budget_s`` is larger.
        no_bf16: never consider bf16 (to check a plan for CPUs without bf16 units on one that has them). Otherwise,
            on a CPU with bf16 units and a run of at least 100 steps (or when the budget cannot fit the offline
            comparison on such a run), bf16 is timed on the fit's own first steps: the plan holds a
            :class:`~lightning_speedups.callbacks.precision_trial.PrecisionTrial` and keeps ``precision="32-true"``.
        clock: seconds as a float (tests inject a fake one).
        verbose: also log :meth:`TunePlan.explain` (each choice's reason and every note, wrapped to 120 columns).
            Either way autotune logs :meth:`TunePlan.to_text`: a header, one line per choice and the number of notes.
        **trainer_kwargs: the Trainer arguments of the planned run (``max_epochs``/``max_steps`` size it); returned
            in the plan with the chosen precision.

    Raises:
        SpeedupConfigError: an unknown candidate or method, ``budget_s`` <= 0, ``margin`` < 0, ``verbose`` not a
            bool, no training data.
    """
    names = _check_arguments(candidates, budget_s, margin)
    check_bool("verbose", verbose)
    check_methods(methods)  # an unknown method raises before the data is read
    run = _read_run(model, datamodule_or_loaders, trainer_kwargs, clock)
    kind = model_kind(model, run.batch)  # one forward only where a user forward's source cannot be read
    method_names, methods_note = plan_methods(methods, kind)
    key = plan_key(
        model,
        run.shapes,
        {
            "candidates": names,
            "methods": method_names,
            "margin": margin,
            "no_bf16": no_bf16,
            "device": str(run.device),
            "kind": kind,
        },
    )
    store = PlanCache(cache_dir) if cache else None
    ctx = TrialContext(
        model,
        run.batch,
        run.device,
        run.steps,
        margin,
        deadline=float("inf"),
        plan={"precision": "32-true"},
        clock=clock,
        loader=run.loader,
        datamodule=run.datamodule,
        own_loader=run.own_loader,
        no_bf16=no_bf16,
    )
    if candidates is None:  # the candidates the default leaves out, each with its reason
        ctx.notes += [ONLY_WHEN_NAMED[n] for n in CANDIDATES if n in ONLY_WHEN_NAMED]
    cached = _from_cache(store, key, ctx, trainer_kwargs, run.shape, budget_s)
    if cached is not None:  # a second run on this machine and model skips the trials
        cached.set_up = run.datamodule
        cached.setup_s = run.setup_s
        _record_in_fit(cached, store, key)
        _log(cached, verbose)
        return cached
    start = clock()
    step_s, budget = _size_budget(ctx, budget_s, start)
    planned_run_s = run.steps * step_s if budget_s is None else None
    choices, skipped = _run_candidates(ctx, names, budget, planned_run_s)
    choices += _add_methods(ctx, method_names, methods_note, step_s, trainer_kwargs, kind)
    plan = build_plan(
        dict(ctx.plan), choices, trainer_kwargs, model, run.shape, checked=True, replacement=ctx.replacement
    )
    plan.notes = [*ctx.notes, *plan.notes]
    plan.trial_s = clock() - start
    plan.set_up = run.datamodule
    plan.setup_s = run.setup_s
    _store(store, key, plan, choices, ctx.notes, budget, skipped)
    _record_in_fit(plan, store, key)
    _log(plan, verbose)
    return plan


def _log(plan: TunePlan, verbose: bool) -> None:
    """Log the plan in short (one line per choice), and its reasons too when ``verbose``."""
    rank_zero_info(plan.to_text())
    reasons = plan.explain() if verbose else ""
    if reasons:
        rank_zero_info(reasons)


@dataclass(frozen=True)
class _Run:
    """The planned run as autotune reads it once: its training data, first batch, device and length."""

    loader: Any
    datamodule: L.LightningDataModule | None
    own_loader: bool  # the loader is the model's own train_dataloader(), not one the user passed
    batch: Any
    device: torch.device
    steps: int
    shapes: list[list[int]]
    shape: RunShape
    setup_s: float  # seconds of the DataModule's setup("fit") run to read it (0.0 without a DataModule)


def _read_run(model: L.LightningModule, data: Any, trainer_kwargs: dict[str, Any], clock: Callable[[], float]) -> _Run:
    dm = data if isinstance(data, L.LightningDataModule) else None
    loaders = None if dm is not None else data
    setup_s = 0.0
    if dm is not None:
        start = clock()
        dm.setup("fit")
        setup_s = clock() - start
    loader = _train_loader(model, dm, loaders)
    batch = first_batch(loader)  # the global RNG is left as it was; the loader object is not changed
    device = torch.device("cuda" if torch.cuda.is_available() and trainer_kwargs.get("accelerator") != "cpu" else "cpu")
    steps = planned_steps(loader, trainer_kwargs)
    shapes = [list(t.shape) for t in flat_tensors(batch)]
    return _Run(
        loader,
        dm,
        loaders is None and dm is None,
        batch,
        device,
        steps,
        shapes,
        _run_shape(loader, steps, shapes),
        setup_s,
    )


def _check_arguments(candidates: Sequence[str] | None, budget_s: float | None, margin: float) -> list[str]:
    """The candidates to try (default: all), once the arguments are checked."""
    if isinstance(candidates, str):
        raise SpeedupConfigError(
            f"`candidates`={candidates!r} is a string. Allowed values: a list of names from {list(CANDIDATES)!r}, "
            f"e.g. [{candidates!r}], or None for all."
        )
    names = [n for n in CANDIDATES if n not in ONLY_WHEN_NAMED] if candidates is None else list(candidates)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SpeedupConfigError(f"`candidates` has unknown names {unknown!r}. Allowed values: {list(CANDIDATES)!r}.")
    if budget_s is not None:
        check_range("budget_s", budget_s, 0.0, None, low_inclusive=False, hint="seconds of trials, e.g. 30")
    check_range("margin", margin, 0.0, None)
    return names


def _train_loader(model: L.LightningModule, datamodule: Any, train_dataloaders: Any) -> Any:
    if train_dataloaders is not None:
        return train_dataloaders
    source = datamodule if datamodule is not None else model  # a DataModule: set up by the caller
    try:
        return source.train_dataloader()
    except Exception as err:
        raise SpeedupConfigError(
            f"`datamodule_or_loaders`={type(source).__name__} gives no training data ({type(err).__name__}: {err}). "
            "Allowed values: a LightningDataModule, a DataLoader, or None when the model has train_dataloader()."
        ) from err


def planned_steps(loader: Any, trainer_kwargs: dict[str, Any]) -> int:
    """The optimizer steps a fit with ``trainer_kwargs`` runs on ``loader``: ``max_steps``, else the loader's length
    (100 when it has none) times ``max_epochs`` (10 when unset)."""
    if trainer_kwargs.get("max_steps", -1) not in (-1, None):
        return int(trainer_kwargs["max_steps"])
    try:
        per_epoch = len(loader)
    except TypeError:
        per_epoch = 100
    return max(1, int(per_epoch) * int(trainer_kwargs.get("max_epochs") or 10))


def _run_shape(loader: Any, steps: int, shapes: list[list[int]]) -> RunShape:
    """What the methods need to know of the planned run: the schedule's warm-up fraction, the user's batch size."""
    try:
        per_epoch: int | None = len(loader)
    except TypeError:
        per_epoch = None
    size = getattr(loader, "batch_size", None)
    base_batch = size if isinstance(size, int) else (shapes[0][0] if shapes and shapes[0] else None)
    return RunShape(schedule_warmup(per_epoch, steps), base_batch)


def _from_cache(
    store: PlanCache | None,
    key: str,
    ctx: TrialContext,
    trainer_kwargs: dict[str, Any],
    shape: RunShape,
    budget_s: float | None,
) -> TunePlan | None:
    """The plan the cache holds, rebuilt for this run: its callbacks, and the device twin of the data it kept;
    ``None`` on a miss: no cache, no entry, an entry written before its choices said whether they changed, or an
    entry whose budget skipped candidates when this call gives a larger ``budget_s`` (the note's HINT says to)."""
    cached = store.get(key) if store is not None else None
    if cached is None or _larger_budget(cached, budget_s):
        return None
    try:
        choices = [Choice.from_dict(c) for c in cached["choices"]]
    except (KeyError, TypeError):
        return None  # an older entry: measured again, and overwritten
    settings = dict(cached["settings"])
    replacement = None
    missing = ""
    if settings.get("device_data"):
        replacement = device_twin(ctx)
        if replacement is None:
            settings["device_data"] = False
            missing = "the cached plan keeps the data on the device, but this data has no device twin: not applied"
    plan = build_plan(settings, choices, trainer_kwargs, ctx.model, shape, checked=False, replacement=replacement)
    plan.from_cache = True
    plan.notes = [*cached.get("notes", []), *plan.notes, f"plan from the cache ({key})"]
    if missing:
        plan.notes.append(missing)
    return plan


def _larger_budget(cached: dict[str, Any], budget_s: float | None) -> bool:
    """Whether ``budget_s`` asks for more trial time than the cached entry had when candidates did not fit (an
    entry that does not record its budget counts as one that may have skipped some)."""
    if budget_s is None or not cached.get("skipped", [None]):
        return False
    return float(budget_s) > float(cached.get("budget_s", 0.0)) * (1.0 + 1e-9)


def _size_budget(ctx: TrialContext, budget_s: float | None, start: float) -> tuple[float, float]:
    """The unchanged model's median step (seconds) and the trial budget: ``budget_s``, else 5% of the planned run
    at that step (data time not counted); ``ctx``'s deadline is set ``start`` + the budget. With the default budget,
    a run whose untimed first step already shows it too short (:func:`~lightning_speedups.autotune.budget.too_short`)
    spends no timed step: that first call, an upper bound of the step, sizes it."""
    enough_s = MIN_BUDGET_S / (BUDGET_SHARE * max(ctx.planned_steps, 1)) if budget_s is None else 0.0
    step_s = size_step(ctx, enough_s)
    budget = BUDGET_SHARE * ctx.planned_steps * step_s if budget_s is None else budget_s
    ctx.deadline = start + budget
    return step_s, budget


def _run_candidates(
    ctx: TrialContext, names: list[str], budget: float, planned_run_s: float | None
) -> tuple[list[Choice], list[str]]:
    """The candidates' choices and the names the budget could not fit; one note first on those. Precision is timed
    in the fit where :func:`~lightning_speedups.autotune.budget.precision_in_fit` holds, or where the budget could
    not fit it on a run long enough for the in-fit trial; either way the in-fit check's step comes out of the budget
    first. A run too short for any trial to pay back (a default budget below
    :data:`~lightning_speedups.autotune.budget.MIN_BUDGET_S`) tries nothing, with one note."""
    if planned_run_s is not None and too_short(ctx.planned_steps, ctx.step_s):
        return [], short_run(ctx, names)
    in_fit_s = IN_FIT_STEPS * ctx.step_s  # the check of one bf16 step on a copy: it trains nothing
    in_fit = "precision" in names and precision_in_fit(ctx) and ctx.budget_left() >= in_fit_s
    if in_fit:
        ctx.deadline -= in_fit_s
    choices, skipped = run_candidates(ctx, [n for n in names if not (in_fit and n == "precision")])
    if in_fit:
        choices.insert(0, in_fit_precision(ctx, by_default=True))
    fallback = ctx.planned_steps >= IN_FIT_MIN_STEPS and not ctx.no_bf16 and ctx.budget_left() >= in_fit_s
    if any(s.name == "precision" for s in skipped) and fallback:
        skipped = [s for s in skipped if s.name != "precision"]  # timed on the fit's own steps instead
        choices.insert(0, in_fit_precision(ctx))
    measured = bool(choices)  # the in-fit trial measures too: the note must not open with "nothing measured"
    if skipped:
        ctx.notes.insert(0, budget_note(skipped, budget, planned_run_s, measured=measured))
    return choices, [s.name for s in skipped]


def _add_methods(
    ctx: TrialContext,
    names: list[str],
    methods_note: str | None,
    step_s: float,
    trainer_kwargs: dict[str, Any],
    kind: str,
) -> list[Choice]:
    """The methods' choices (each with its evidence for a ``kind`` model), recorded in ``ctx.plan``; a method the
    run cannot take is left out with its note, after the note on the methods the model kind left out."""
    if methods_note:
        ctx.notes.append(methods_note)
    made: list[Choice] = []
    for name in names:
        if name == "ema":
            choice, note = ema_choice(ctx.model, ctx.device, step_s, trainer_kwargs, ctx.clock, kind)
        else:
            choice, note = schedule_choice(ctx.model, trainer_kwargs, kind, ctx.planned_steps)
        if choice is None:
            ctx.notes.append(str(note))
            continue
        made.append(choice)
        ctx.plan[name] = choice.chosen
    return made


def _store(
    store: PlanCache | None,
    key: str,
    plan: TunePlan,
    choices: list[Choice],
    notes: list[str],
    budget: float,
    skipped: list[str],
) -> None:
    """Keep the measured plan for the next run: plain JSON, the settings but never the twin of the data, with the
    trial budget and the candidates it could not fit (a later call with a larger ``budget_s`` measures again)."""
    if store is not None:
        store.put(
            key,
            {
                "settings": plan.settings,
                "choices": [c.as_dict() for c in choices],
                "notes": notes,
                "budget_s": float(budget),
                "skipped": skipped,
            },
        )


def _record_in_fit(plan: TunePlan, store: PlanCache | None, key: str) -> None:
    """Let the plan's in-fit precision trial write its decision into the cached plan, once the fit makes it."""
    if store is None:
        return
    from lightning_speedups.callbacks.precision_trial import PrecisionTrial

    for cb in plan.callbacks:
        if isinstance(cb, PrecisionTrial):
            cb.on_decision = InFitRecord(str(store.path.parent), key)
