"""autotune's ``"batching"`` candidate: length-aware batches for token data, kept as a SequenceBatching.

When the training data is a plain ``DataLoader`` whose samples hold token tensors, the training step's time for one
epoch is estimated for the user's loader as it is and for length-grouped batches of its dataset
(:func:`~lightning_speedups.callbacks._sequence_choice.estimate_batchings`, what ``SequenceBatching("auto")``
weighs; not token budgets, which change the optimisation as well as the speed). A batching whose estimated epoch
beats the user's by the margin goes into the plan as ``SequenceBatching(strategy=<winner>)``, which rebuilds the
loader at the fit's start. Data without token tensors is
skipped without a note; a loader that cannot be rebuilt, with one. Packing is not tried: it needs a model that keeps
packed documents apart and a block size, which ``SequenceBatching("packed", block_size=...)`` checks itself.

The estimate comes from ``SequenceBatching``'s own timing (the real clock, forward and backward), not from
``measure.compare``: an epoch of differently sized batches has no one step to pair.
"""

from __future__ import annotations

from typing import Any

import lightning_speedups.autotune.candidates  # noqa: F401  (registers precision, which this candidate goes before)
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.autotune.trials import Choice, TrialContext, register_candidate
from lightning_speedups.callbacks._sequence_choice import (
    check_sequence_loader,
    estimate_batchings,
    own_collate_reason,
    own_collate_width,
)
from lightning_speedups.data.padding import sequence_lengths, token_tensor
from lightning_speedups.measure import model_copy

__all__ = ["BATCHING_STEPS", "STRATEGIES", "token_loader"]

STRATEGIES = ("length_grouped",)  # not the token budget: it changes the optimisation (see SequenceBatching "auto")
# estimate_epoch_seconds' defaults: 3 batches, best of 2, after one warm-up step
_PROBES = 3
_REPEATS = 2
# the user's loader and each strategy: a warm-up step and 3 batches timed twice each
BATCHING_STEPS = (1 + len(STRATEGIES)) * (1 + _PROBES * _REPEATS)
_LENGTH_CHECK = 64  # samples read to see whether the lengths vary at all, before reading every one


def token_loader(loader: Any) -> bool:
    """Whether ``loader`` reads a dataset whose first sample holds a token tensor."""
    dataset = getattr(loader, "dataset", None)
    try:
        token_tensor(dataset[0])  # type: ignore[index]
    except Exception:  # noqa: BLE001  (no dataset, no item 0, or not token data: all mean "not token data")
        return False
    return True


def _same_lengths(dataset: Any) -> int | None:
    """The one length of up to 64 evenly spread samples, when they all have it (``None``: the lengths vary)."""
    n = len(dataset)
    picks = sorted({round(i * (n - 1) / max(_LENGTH_CHECK - 1, 1)) for i in range(min(n, _LENGTH_CHECK))})
    seen = {len(token_tensor(dataset[i])) for i in picks}
    return next(iter(seen)) if len(seen) == 1 else None


def _blocker(loader: Any) -> str | None:
    """Why the loader cannot be rebuilt with length-aware batches (``None``: it can)."""
    try:
        check_sequence_loader(loader)
    except SpeedupConfigError as err:
        return str(err).split(". Allowed values")[0]
    if loader.batch_size is None:
        return "`train_dataloaders` has its own batch_sampler, which SequenceBatching would replace"
    return None


def _batching(ctx: TrialContext, share: float) -> Choice | None:
    if not token_loader(ctx.loader):
        return None  # image or other non-token data: nothing to say (run_candidates skips it before this)
    why = _blocker(ctx.loader)
    if why is not None:
        ctx.notes.append(f"batching not tried: {why}")
        return None
    dataset = ctx.loader.dataset
    same = _same_lengths(dataset)
    if same is not None:
        ctx.notes.append(f"batching not tried: the samples read all have {same} tokens: there is no padding to save")
        return None
    lengths = sequence_lengths(dataset).lengths
    own = own_collate_reason(ctx.loader)
    width = own_collate_width(ctx.loader, lengths) if own is not None else None
    if width is not None:  # the new batches would go through it, and it pads them all to one width again
        ctx.notes.append(
            f"batching not tried: your collate_fn does more than pad ({own.split(': ', 1)[1]}), so the "
            f"new batches would go through it, and it pads even the shortest samples to {width} tokens: "
            "there is no padding to save. HINT: pad to each batch's longest sample in it"
        )
        return None
    model = model_copy(ctx.model, train=True).to(ctx.device)
    try:
        estimates = estimate_batchings(
            model, ctx.device, ctx.loader, lengths, STRATEGIES, probes=_PROBES, keep_collate=own is not None
        )
    except Exception as err:  # noqa: BLE001  (the user's training_step on a padded batch: any failure means "no")
        ctx.notes.append(
            f"batching not tried: the training step failed on a length-aware batch ({type(err).__name__}: {err})"
        )
        return None
    finally:
        del model
    original = estimates["original"]
    best = min(STRATEGIES, key=lambda k: estimates[k])
    gain = original / max(estimates[best], 1e-12)
    keep = gain > 1.0 + ctx.margin
    ctx.plan["batching"] = best if keep else None
    text = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(estimates.items(), key=lambda kv: kv[1]))
    note = (
        f"SequenceBatching({best!r}): an epoch's training steps estimated {gain:.2f}x faster ({text})"
        if keep
        else f"your loader kept: no batching beat it by the {ctx.margin:.0%} margin ({text})"
    )
    if own is not None:  # the new batches go through it too (SequenceBatching decides the same way)
        note += f"; the new batches go through your collate_fn, which does more than pad ({own.split(': ', 1)[1]})"
    return Choice(
        "batching",
        best if keep else None,
        [None, *STRATEGIES],
        gain if keep else 1.0,
        (gain, gain),
        _PROBES,
        note + "; estimated per epoch from 3 timed batches each, not interleaved",
        changed=keep,
    )


def _price(ctx: TrialContext) -> float:
    """:data:`BATCHING_STEPS`, or 0 when the trial has nothing to time and only notes why (so the note is not lost
    under the budget's)."""
    if _blocker(ctx.loader) is not None or _same_lengths(ctx.loader.dataset) is not None:
        return 0.0
    return BATCHING_STEPS


register_candidate(
    "batching", _batching, steps=_price, before="precision", applies=lambda ctx: token_loader(ctx.loader)
)
