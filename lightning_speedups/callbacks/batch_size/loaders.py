"""Where the batch size lives and the loaders that carry it: the finder's work on the live trainer's data.

:func:`batch_size_holders` finds the attribute the finder sets (model, datamodule, their hparams);
:func:`rebuild_loader` re-batches a plain ``DataLoader`` passed to ``fit()`` (:func:`fit_loader_problem` says when it
cannot); :func:`dataset_len` and :func:`epoch_samples` size the ladder and the epoch the sizes are ranked by.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from lightning_speedups._compat import fit_source_dataloader, fit_source_instance

__all__ = ["batch_size_holders", "dataset_len", "epoch_samples", "fit_loader_problem", "rebuild_loader"]


def rebuild_loader(dl: DataLoader, batch_size: int) -> DataLoader:
    """The same plain ``DataLoader`` at another batch size (shuffle, workers, collate and pinning kept)."""
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size,
        shuffle=isinstance(dl.sampler, RandomSampler),
        num_workers=dl.num_workers,
        collate_fn=dl.collate_fn,
        pin_memory=dl.pin_memory,
        drop_last=dl.drop_last,
        timeout=dl.timeout,
        worker_init_fn=dl.worker_init_fn,
        generator=dl.generator,
        persistent_workers=dl.persistent_workers,
    )
    if dl.num_workers > 0:
        kwargs.update(prefetch_factor=dl.prefetch_factor, multiprocessing_context=dl.multiprocessing_context)
    return DataLoader(dl.dataset, **kwargs)


def fit_loader_problem(instance: Any) -> str | None:
    """Why a dataloader passed to ``fit()`` cannot be re-batched, or ``None`` when it can."""
    if not isinstance(instance, DataLoader) or type(instance) is not DataLoader:
        return f"a `{type(instance).__name__}`"
    if isinstance(instance.dataset, IterableDataset):
        return "a DataLoader over an IterableDataset"
    if type(instance.batch_sampler) is not BatchSampler or type(instance.sampler) not in (
        RandomSampler,
        SequentialSampler,
    ):
        return "a DataLoader with a custom sampler or batch_sampler"
    return None


def dataset_len(trainer: L.Trainer, fit_loader: DataLoader | None, probe: bool = False) -> int | None:
    """Training samples per device: of the loader passed to ``fit``, else the datamodule's ``train_set``, else (with
    ``probe``) of the dataset behind the train dataloader; ``None`` when unknown (an iterable dataset)."""
    world = max(1, trainer.world_size)
    dataset: Any = None
    if fit_loader is not None:
        dataset = fit_loader.dataset
    elif trainer.datamodule is not None and fit_source_instance(trainer) is trainer.datamodule:
        dataset = getattr(trainer.datamodule, "train_set", None)
    if dataset is None and probe:
        dataset = getattr(fit_source_dataloader(trainer), "dataset", None)
    try:
        return None if dataset is None else len(dataset) // world
    except TypeError:
        return None


def epoch_samples(trainer: L.Trainer, fit_loader: DataLoader | None, length: int | None) -> int | None:
    """``length`` (training samples per device) when the training loader keeps its last partial batch
    (``drop_last=False``, the default), so an epoch's cost includes that batch; ``None`` when it drops it."""
    if length is None:
        return None
    loader = fit_loader if fit_loader is not None else fit_source_dataloader(trainer)
    return None if getattr(loader, "drop_last", False) else length


def batch_size_holders(trainer: L.Trainer, pl_module: L.LightningModule, name: str) -> list[Any]:
    """Objects holding ``name``: model, datamodule, then their hparams (all are kept in sync)."""
    holders: list[Any] = []
    dm = trainer.datamodule
    for obj in (pl_module, dm):
        if obj is not None and hasattr(obj, name) and not isinstance(getattr(type(obj), name, None), property):
            holders.append(obj)
    for obj in (pl_module, dm):
        hp = getattr(obj, "hparams", None) if obj is not None else None
        if hp is not None and name in hp:
            holders.append(hp)
    return holders
