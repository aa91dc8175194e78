"""autotune's data-path candidate: device-resident data against the user's DataLoader, when a twin can keep its
transforms (the demo datamodule protocol, or a plain ``TensorDataset``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import lightning_speedups.autotune.candidates  # noqa: F401  (registers batch_size, which this candidate goes before)
from lightning_speedups.autotune.trials import Choice, TrialContext, register_candidate

__all__ = ["device_twin"]


def device_twin(ctx: TrialContext) -> tuple[str, Any] | None:
    """``(kind, twin)``: a device-resident twin of the training data (kind ``"datamodule"`` or ``"loader"``), the
    pair the plan keeps as ``ctx.replacement``; ``None`` when no twin can keep the user's transforms."""
    from torch.utils.data import TensorDataset

    from lightning_speedups.data import DeviceDataLoader

    dm = ctx.datamodule
    if dm is not None and all(hasattr(dm, a) for a in ("train_images", "train_labels", "transforms")):
        from lightning_speedups.recipes import device_datamodule

        twin = device_datamodule(dm, batch_size=int(getattr(dm, "batch_size", 64)))
        return "datamodule", twin  # the demo protocol: its transforms become a BatchAugment on the device
    dataset = getattr(ctx.loader, "dataset", None)
    if type(dataset) is TensorDataset:  # no per-sample transform to lose
        loader = DeviceDataLoader(*dataset.tensors, batch_size=ctx.loader.batch_size, shuffle=True, device=ctx.device)
        return "loader", loader
    return None


def _data_blocker(ctx: TrialContext) -> str | None:
    if ctx.plan.get("batching"):  # SequenceBatching rebuilds the host DataLoader: a device twin would hide it
        return (
            f"data path not tried: the plan batches the data with SequenceBatching "
            f"({ctx.plan['batching']}), which rebuilds the host DataLoader"
        )
    if device_twin(ctx) is None:
        dataset = getattr(ctx.loader, "dataset", None)
        what = "no dataset" if dataset is None else f"a {type(dataset).__name__}"
        return (
            f"data path not tried: the training loader reads {what}, whose per-sample code (`__getitem__`, "
            "transforms, collate) a device twin cannot run; only a TensorDataset's tensors, or a DataModule with "
            "`train_images`, `train_labels` and `transforms`, are moved to the device. HINT: lightning_speedups.data."
            "DeviceDataLoader holds tensors on the device"
        )
    return None


def _data(ctx: TrialContext, share: float) -> Choice | None:
    twin = device_twin(ctx)
    if twin is None:  # the blocker said why
        return None
    kind, replacement = twin
    step = ctx.step(ctx.plan)  # the step as the earlier trials left the plan: data's share of the final step
    scale = int(ctx.plan.get("batch_scale", 1))

    def loop(loader: Any) -> Callable[[], None]:
        state: dict[str, Any] = {"it": None}

        def fetch_and_step() -> None:  # the batches of one step fetched (a fresh pass when exhausted), one step
            with torch.random.fork_rng(devices=[]):
                for _ in range(scale):  # a step at batch_scale k takes k of the loader's batches
                    if state["it"] is None:
                        state["it"] = iter(loader)
                    try:
                        next(state["it"])
                    except StopIteration:
                        state["it"] = iter(loader)
                        next(state["it"])
            step()

        return fetch_and_step

    if kind == "datamodule":
        replacement.trainer = None
        twin_loader = replacement.train_dataloader()
    else:
        twin_loader = replacement
    result = ctx.compare({"current": loop(ctx.loader), "device": loop(twin_loader)}, "current", share)
    keep = result.winner == "device"
    ctx.plan["device_data"] = keep
    if keep:
        ctx.replacement = twin
    lo, mid, hi = result.ratios["device"]
    note = result.note or (f"data on the device: {mid:.2f}x per step" if keep else "the loader is not the bottleneck")
    return Choice("data", keep, [False, True], mid if keep else 1.0, (lo, hi), result.trials, note, changed=keep)


register_candidate(
    "data", _data, before="batch_size", applies=lambda ctx: ctx.loader is not None, blocker=_data_blocker
)
