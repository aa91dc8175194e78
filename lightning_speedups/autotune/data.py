"""autotune's data-path candidate: device-resident data against the user's DataLoader, when a twin can keep its
transforms (the demo datamodule protocol, or a plain ``TensorDataset``).

The twin is built once, by the trial: its copy of the training data to the device trains nothing when it is not
kept, so the trial's price counts it (:func:`twin_copy_s`), and the blocker only asks whether one could be built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import lightning_speedups.autotune.candidates  # noqa: F401  (registers batch_size, which this candidate goes before)
from lightning_speedups.autotune.trials import COMPARISON_STEPS, Choice, TrialContext, register_candidate

__all__ = ["TWIN_COPY_BYTES_PER_S", "device_twin", "twin_copy_s", "twin_tensors"]


def device_twin(ctx: TrialContext) -> tuple[str, Any] | None:
    """``(kind, twin)``: a device-resident twin of the training data (kind ``"datamodule"`` or ``"loader"``), the
    pair the plan keeps as ``ctx.replacement``; ``None`` when no twin can keep the user's transforms. Building it
    copies the training tensors to the device: :func:`twin_tensors` says which, without building it."""
    from lightning_speedups.data import DeviceDataLoader

    kind = _twin_kind(ctx)
    if kind == "datamodule":
        from lightning_speedups.recipes import device_datamodule

        dm = ctx.datamodule
        hflip = _batch_augment_flip(dm.transforms(train=True))
        twin = device_datamodule(dm, batch_size=int(getattr(dm, "batch_size", 64)), hflip=hflip)
        return "datamodule", twin  # the demo protocol: its transforms become a BatchAugment on the device
    if kind == "loader":
        tensors = ctx.loader.dataset.tensors
        loader = DeviceDataLoader(*tensors, batch_size=ctx.loader.batch_size, shuffle=True, device=ctx.device)
        return "loader", loader
    return None


def _twin_kind(ctx: TrialContext) -> str | None:
    """The kind of twin :func:`device_twin` would build (``None``: none can keep the transforms), without building
    it: the blocker asks before the budget is weighed, and must not spend a copy of the data to the device."""
    from torch.utils.data import TensorDataset

    dm = ctx.datamodule
    if dm is not None and all(hasattr(dm, a) for a in ("train_images", "train_labels", "transforms")):
        return None if _batch_augment_flip(dm.transforms(train=True)) is None else "datamodule"
    if type(getattr(ctx.loader, "dataset", None)) is TensorDataset:  # no per-sample transform to lose
        return "loader"
    return None


def twin_tensors(ctx: TrialContext) -> list[torch.Tensor]:
    """The tensors a device twin of the training data copies to ``ctx.device`` (none when it cannot be built)."""
    kind = _twin_kind(ctx)
    if kind == "datamodule":
        return [t for t in (ctx.datamodule.train_images, ctx.datamodule.train_labels) if isinstance(t, torch.Tensor)]
    if kind == "loader":
        return list(ctx.loader.dataset.tensors)
    return []


# host-to-device copies from pageable memory run at about 3-12 GB/s on PCIe GPUs: the slow end prices the twin
TWIN_COPY_BYTES_PER_S = 3e9


def twin_copy_s(ctx: TrialContext) -> float:
    """Seconds the device twin's copy of the training data costs (0 on a CPU, where the twin keeps the tensors)."""
    if ctx.device.type == "cpu":
        return 0.0
    return (
        sum(t.numel() * t.element_size() for t in twin_tensors(ctx) if t.device.type != ctx.device.type)
        / TWIN_COPY_BYTES_PER_S
    )


def _price(ctx: TrialContext) -> float:
    """A plain comparison and the twin's copy to the device (in plan steps): the copy trains nothing when the twin
    is not kept, so the budget counts it."""
    return COMPARISON_STEPS + twin_copy_s(ctx) / max(ctx.step_s, 1e-12)


# the per-sample transforms a BatchAugment repeats on the device (crop with padding, flip, then scale and normalise)
_TWIN_TRANSFORMS = ("RandomCrop", "RandomHorizontalFlip", "ToDtype", "Normalize")


def _batch_augment_flip(pipeline: Any) -> float | None:
    """The flip probability of a per-sample pipeline a BatchAugment can repeat on the device, or ``None`` when it
    holds a transform a BatchAugment does not have (the twin would train on other data)."""
    steps = list(getattr(pipeline, "transforms", [pipeline]))
    if any(type(t).__name__ not in _TWIN_TRANSFORMS for t in steps):
        return None
    return next((float(getattr(t, "p", 0.5)) for t in steps if type(t).__name__ == "RandomHorizontalFlip"), 0.0)


def _data_blocker(ctx: TrialContext) -> str | None:
    if ctx.plan.get("batching"):  # SequenceBatching rebuilds the host DataLoader: a device twin would hide it
        return (
            f"data path not tried: the plan batches the data with SequenceBatching "
            f"({ctx.plan['batching']}), which rebuilds the host DataLoader"
        )
    if _twin_kind(ctx) is None:
        dataset = getattr(ctx.loader, "dataset", None)
        what = "no dataset" if dataset is None else f"a {type(dataset).__name__}"
        return (
            f"data path not tried: the training loader reads {what}, whose per-sample code (`__getitem__`, "
            "transforms, collate) a device twin cannot run; only a TensorDataset's tensors, or a DataModule with "
            "`train_images`, `train_labels` and `transforms` of random crop, flip, scaling and normalisation only, "
            "are moved to the device. HINT: lightning_speedups.data.DeviceDataLoader holds tensors on the device"
        )
    return None


def _data(ctx: TrialContext, share: float) -> Choice | None:
    twin = device_twin(ctx)
    if twin is None:  # the blocker said why
        return None
    kind, replacement = twin
    if kind == "datamodule":
        replacement.trainer = None
        twin_loader = replacement.train_dataloader()
    else:
        twin_loader = replacement
    scale = int(ctx.plan.get("batch_scale", 1))
    if int(getattr(ctx.loader, "num_workers", 0) or 0) == 0:
        # the loader runs in the training process, one batch after another step: a step costs its fetch plus the
        # step, the same step for both. Only the fetches are timed, each with the plan's step added (its median,
        # ``ctx.step_s``), so a round costs two fetches rather than two fetches and two steps
        fns = {"current": _fetches(ctx, ctx.loader, scale), "device": _fetches(ctx, twin_loader, scale)}
        result = ctx.compare(fns, "current", share, returns_time=True)
    else:  # worker processes fetch while the step runs: only a fetch beside the real step shows what is left of it
        step = ctx.step(ctx.plan)
        fns = {"current": _fetches(ctx, ctx.loader, scale, step), "device": _fetches(ctx, twin_loader, scale, step)}
        result = ctx.compare(fns, "current", share)
    keep = result.winner == "device"
    ctx.plan["device_data"] = keep
    if keep:
        ctx.replacement = twin
    lo, mid, hi = result.ratios["device"]
    note = result.note or (f"data on the device: {mid:.2f}x per step" if keep else "the loader is not the bottleneck")
    return Choice("data", keep, [False, True], mid if keep else 1.0, (lo, hi), result.trials, note, changed=keep)


def _fetches(ctx: TrialContext, loader: Any, scale: int, step: Callable[[], None] | None = None) -> Callable[[], Any]:
    """One step's batches fetched from ``loader`` (``scale`` of them; a fresh pass when exhausted, the global RNG
    forked), then ``step`` when given; without ``step`` the call returns the fetch's seconds plus ``ctx.step_s``."""
    state: dict[str, Any] = {"it": None}

    def fetch() -> float | None:
        t0 = ctx.clock()
        with torch.random.fork_rng(devices=[]):
            for _ in range(scale):  # a step at batch_scale k takes k of the loader's batches
                if state["it"] is None:
                    state["it"] = iter(loader)
                try:
                    next(state["it"])
                except StopIteration:
                    state["it"] = iter(loader)
                    next(state["it"])
        if step is not None:
            step()
            return None
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()  # a device twin's augmentation runs asynchronously
        return ctx.clock() - t0 + ctx.step_s

    return fetch


register_candidate(
    "data",
    _data,
    steps=_price,
    before="batch_size",
    applies=lambda ctx: ctx.loader is not None,
    blocker=_data_blocker,
)
