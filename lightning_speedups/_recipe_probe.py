"""The recipes' CPU probe: channels_last and bf16 timed on a copy of the model, and its on-disk cache.

A recipe that chooses the layout and the precision by measurement pays for the measurement: about a second on a
quiet machine for a small CNN, up to ``budget_s`` on a busy one. A run of a few seconds cannot afford that every
time, so the verdict is cached in the same plain-JSON file as :func:`~lightning_speedups.autotune.autotune`'s plans,
keyed by the machine, the model's parameter shapes, the example's shape and the candidates. The recipe reports the
seconds it spent (``Recipe.probe_s``) so benchmarks can count them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import check_choice
from lightning_speedups.functional.channels_last import apply_channels_last
from lightning_speedups.measure import PlanCache, plan_key

__all__ = ["cached_probe", "measure_cpu_layout_and_precision"]

PRECISIONS = ("32-true", "bf16-mixed")


def measure_cpu_layout_and_precision(
    model: nn.Module,
    example: torch.Tensor,
    batch_size: int = 64,
    repeats: int = 3,
    margin: float = 1.1,
    budget_s: float = 5.0,
    clock: Any = None,
    precisions: Sequence[str] = PRECISIONS,
) -> tuple[bool, str, dict[str, float]]:
    """Time a training step of copies of ``model`` on this CPU in fp32 / channels_last / bf16 / both; pick the best.

    Returns ``(channels_last, precision, {candidate: times faster than fp32 NCHW})``. The candidates run interleaved
    through :func:`lightning_speedups.measure.compare` (at least ``repeats`` shuffled rounds, more until every
    interval clears or misses ``margin`` or lies wholly below a clearer winner's, at most ``budget_s`` seconds;
    ``clock`` is injectable). A candidate is chosen only when it is clearly ``margin`` faster than fp32 NCHW; within
    noise the conservative fp32 / NCHW stays. The ratios are :class:`~lightning_speedups.measure.MeasuredRatio`
    values (conservative, with their median, interval and rounds). ``precisions`` limits the candidates
    (``("32-true",)``: the layout only, for a run whose precision is already chosen). About a second for a small CNN;
    the user's model is not touched. On a Xeon with AMX, bf16 + channels_last measured 2-3x faster for the demo CNN;
    on CPUs without bf16 units bf16 is ~10x slower, and channels_last helps some CPUs and not others: hence measure,
    not assume.
    """
    from lightning_speedups.measure import MeasuredRatio, compare, conservative_ratio, make_train_step, model_copy

    for p in precisions:
        check_choice("precisions", p, PRECISIONS)
    x = example.expand(batch_size, *example.shape[1:]).contiguous()
    y = torch.zeros(batch_size, dtype=torch.long)
    candidates = {}
    for cl, bf16 in ((False, False), (True, False), (False, True), (True, True)):
        if (cl and x.dim() != 4) or ("bf16-mixed" if bf16 else "32-true") not in precisions:
            continue
        m = model_copy(model).cpu()
        xi = x.contiguous(memory_format=torch.channels_last) if cl else x
        if cl:
            apply_channels_last(m, warn=False)  # 4-D tensors only (Module.to raises on a Conv3d's 5-D weight)
        name = ("channels_last" if cl else "nchw") + ("+bf16" if bf16 else "+fp32")
        candidates[name] = make_train_step(m, xi, y, autocast_dtype=torch.bfloat16 if bf16 else None)
    base = "nchw+fp32" if "32-true" in precisions else "nchw+bf16"
    conservative_first = [
        n for n in ("nchw+fp32", "channels_last+fp32", "nchw+bf16", "channels_last+bf16") if n in candidates
    ]
    ratios: dict[str, float] = {base: MeasuredRatio(1.0)}
    if len(candidates) == 1:
        return False, "bf16-mixed" if base.endswith("bf16") else "32-true", ratios
    cmp = compare(
        candidates,
        base,
        min_gain=margin - 1.0,
        budget_s=budget_s,
        min_rounds=max(2, repeats),
        prefer=conservative_first,
        clock=clock or time.perf_counter,
    )
    ratios.update({k: MeasuredRatio(conservative_ratio(cmp, k), cmp, k) for k in cmp.ratios})
    best = cmp.winner
    return best.startswith("channels_last"), "bf16-mixed" if best.endswith("bf16") else "32-true", ratios


def cached_probe(
    model: nn.Module,
    example: torch.Tensor,
    precisions: Sequence[str] = PRECISIONS,
    cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[bool, str, dict[str, float], float, bool]:
    """:func:`measure_cpu_layout_and_precision` through the plan cache.

    Returns ``(channels_last, precision, ratios, seconds spent, from_cache)``; a cached verdict costs only the read
    (its ratios come back as plain floats).
    """
    start = time.perf_counter()
    store = PlanCache(cache_dir) if cache else None
    key = plan_key(model, [list(example.shape)], {"probe": "recipe layout/precision", "precisions": list(precisions)})
    hit = store.get(key) if store is not None else None
    if hit is not None and isinstance(hit.get("settings"), dict):
        settings = hit["settings"]
        ratios = {k: float(v) for k, v in settings.get("ratios", {}).items()}
        return bool(settings["channels_last"]), str(settings["precision"]), ratios, time.perf_counter() - start, True
    channels_last, precision, ratios = measure_cpu_layout_and_precision(model, example, precisions=precisions)
    if store is not None:
        plain = {
            "channels_last": channels_last,
            "precision": precision,
            "ratios": {k: round(float(v), 4) for k, v in ratios.items()},
        }
        store.put(key, {"settings": plain, "choices": [], "notes": []})
    return channels_last, precision, ratios, time.perf_counter() - start, False
