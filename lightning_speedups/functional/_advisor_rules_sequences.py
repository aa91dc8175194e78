"""The advisor's sequence rule: much of each training batch is padding, computed on and thrown away.

Kept beside :mod:`lightning_speedups.functional._advisor_rules` (same registry, registered after its rules). The
evidence is counted on the batches of the timed window (``Measurements.tokens`` / ``padded_tokens``: an attention
mask's zeros, or the pad token when the advisor is given ``pad_value``); image batches leave both at 0 and the rule
silent.
"""

from __future__ import annotations

from lightning_speedups.functional._advisor_records import AdvisorThresholds, Finding, Measurements
from lightning_speedups.functional._advisor_rules import _has_callback, _r, _severity, advisor_rule

__all__ = ["padding_waste"]


@advisor_rule
def padding_waste(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """More than ``th.pad_fraction`` of the training batches' token positions are padding."""
    pad = m.pad_fraction
    if pad is None or pad <= th.pad_fraction:
        return None
    # the model computes on every position: removing the padding saves up to that share of the step (Amdahl)
    score = m.compute_share * pad
    if _has_callback(m, "SequenceBatching"):
        fix = (
            "`SequenceBatching` is on and this much padding is left: give it `strategy=\"token_budget\"`, or "
            "`strategy=\"packed\"` with `block_size=` when the model keeps packed documents apart (it checks)."
        )
    else:
        fix = (
            "Batch similar lengths together: `SequenceBatching(strategy=\"length_grouped\")` (or "
            "`strategy=\"auto\"`, which measures), or in your own DataLoader `collate_fn=pad_collate()` with "
            "`batch_sampler=LengthGroupedSampler(lengths, batch_size)`, both from `lightning_speedups`."
        )
    return Finding(
        "padding",
        f"{pad:.0%} of the training batches' token positions are padding (measured over the timed batches)",
        _severity(score),
        score,
        {"pad_fraction": _r(pad), "tokens": m.tokens, "padded_tokens": m.padded_tokens, "batch_size": m.batch_size},
        fix,
        f"up to {1 / max(1e-9, 1 - pad):.2f}x real tokens/s if all padding is removed (length grouping leaves a few "
        "percent; not measured)",
    )
