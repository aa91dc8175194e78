"""``autotune``: measure what speeds up *this* model on *this* machine, and return the plan.

Where a recipe encodes choices that were right on the machine it was tuned on, :func:`autotune` measures each one on
the user's model, data and hardware: every candidate runs a few training steps of a copy of the model, timed
interleaved against the current plan (:func:`~lightning_speedups.measure.compare`), and is kept only when it beats
the plan by ``margin`` beyond noise. Candidates, in order (:func:`list_candidates`):

- ``"batching"``: length-aware batches for token data, kept as a
  :class:`~lightning_speedups.callbacks.sequence_batching.SequenceBatching` (skipped silently for other data);
- ``"precision"``, ``"channels_last"``;
- ``"data"``: device-resident data against the user's DataLoader;
- ``"batch_size"``, only when named in ``candidates``: a doubled batch trains with its learning rate scaled (square
  root for Adam-type optimizers, linear for SGD) and must raise samples/s by more than the extra samples it needs to
  the target, and the margin. That cost is measured from the gradient noise scale of a few of the user's batches
  (McCandlish et al. 2018: ``(1 + 2r) / (1 + r)``, ``r`` = batch / noise scale, between 1x and 2x); where it cannot
  be measured, or the lr cannot follow (a plain module's own ``configure_optimizers``), it is the bound
  :data:`BATCH_DOUBLING_COST` (2x: no fewer steps at the same learning rate). The default plan leaves it out (one
  note says so): a larger batch changes the optimisation, and the end-to-end bench measured the plan without it;
- ``"optimizer"``: the fused/foreach kernel, compared only where the optimizer step is a large enough share of a
  training step to pay the margin even at zero cost, and only for a
  :class:`~lightning_speedups.optim.SpeedupMixin` model, whose ``optimizer_config`` the plan can set (a plain
  module's ``configure_optimizers`` is its own code: the plan notes where to pass ``fused=True`` instead);
- ``"optimization"``: the module's optimizer raced in the fit against 3x its learning rate, Muon and schedule-free
  AdamW (:class:`~lightning_speedups.callbacks.optimizer_race.OptimizerRace`): no trial step, the race's arms train
  beside the fit's first steps and the winner trains on; left out, with a note, on a run too short for the race to fit
  in 10% of it;
- ``"compile"``: ``torch.compile``, kept only where its measured compile time is paid back within the planned run.

The trials take at most 5% of the planned run, or ``budget_s``, counted from the three steps that size it. A
comparison is admitted when what is left covers the least it can take (the candidate's warm-up and 3 rounds of it
and the plan: ``(1 + 2 x 3)`` steps of the current plan; the first one reuses the warm sizing copy as its baseline)
and stops as soon as its interval clears or misses the margin. What the budget could not fit is named in one note,
with what was left, what one comparison needs and the ``budget_s`` that would fit it. Plans are cached on disk
(:class:`~lightning_speedups.measure.PlanCache`: plain JSON, keyed by machine, model signature and options), so a
second run skips the trials.

Beyond faster steps, the plan adds time-to-accuracy ``methods`` (the EMA of the weights and a schedule for time to
target) by default only for the model kinds where they reached the target sooner on the end-to-end bench and slowed
no task (:mod:`lightning_speedups.autotune.kinds`): today no kind, since each slowed one image CNN task. A plan
without them says why in a note; ``methods=["ema"]`` still adds one. A few steps cannot time their benefit, so their
evidence is the bench's and only their per-step cost is measured here (``methods=[]`` leaves them out).

The modules: ``tune`` (the steps of :func:`autotune`), ``plan`` (:class:`TunePlan`), ``trials`` (the context, the
registry and the timed step), ``budget``, the candidates (``candidates``, ``batching``, ``data``, ``compile``),
``methods`` and ``kinds``, and ``optim`` (the user's optimizer, with a kernel).

Example::

    >>> from lightning_speedups.demo import DemoClassifier, DigitsDataModule
    >>> model, data = DemoClassifier(width=8), DigitsDataModule(batch_size=32)
    >>> plan = autotune(model, data, max_epochs=2, budget_s=5, cache=False)  # doctest: +SKIP
    >>> callbacks, trainer_kwargs = plan  # doctest: +SKIP
    >>> plan.apply(model, data)  # doctest: +SKIP
    >>> L.Trainer(callbacks=callbacks, **trainer_kwargs).fit(model, data)  # doctest: +SKIP
"""

# importing a candidate module registers it, in its place (each imports those it is placed relative to)
from lightning_speedups.autotune import batching, candidates, compile, data, optimization  # noqa: F401
from lightning_speedups.autotune.candidates import BATCH_DOUBLING_COST
from lightning_speedups.autotune.kinds import model_kind
from lightning_speedups.autotune.plan import TunePlan
from lightning_speedups.autotune.trials import Choice, TrialContext, register_candidate
from lightning_speedups.autotune.tune import autotune, list_candidates

__all__ = [
    "BATCH_DOUBLING_COST",
    "Choice",
    "TrialContext",
    "TunePlan",
    "autotune",
    "list_candidates",
    "model_kind",
    "register_candidate",
]
