"""What :class:`~lightning_speedups.SequenceBatching` measures: whether packing is safe, and which batching is fastest.

- :func:`packing_problem`: packing is only for a model that takes ``position_ids`` and keeps documents apart; checked
  by signature, then by running the model on two documents packed into one row and on each alone.
- :func:`estimate_epoch_seconds`: the training step timed on a few batches of a batching's epoch (its shortest,
  middle and longest), a line through time against padded tokens, summed over the epoch's batches.
- :func:`own_collate_reason`: whether the user's ``collate_fn`` does more than pad (masking, labels it builds), so
  that re-batched samples must still go through it rather than through :func:`pad_collate`;
- :func:`estimate_batchings`: those estimates for the user's own loader and for length-grouped and token-budget
  batches of its dataset, without a Trainer (what ``SequenceBatching("auto")`` weighs, packing aside; autotune's
  ``"batching"`` candidate calls it), with :func:`batching_sampler` building each batching's sampler.
"""

from __future__ import annotations

import copy
import inspect
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)
from torch.utils.data.distributed import DistributedSampler

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._tokens import token_ids
from lightning_speedups.data.padding import pack_sequences, pad_collate, token_tensor
from lightning_speedups.data.samplers import (
    LengthGroupedSampler,
    PackedBatchSampler,
    SequenceBatchSampler,
    TokenBudgetBatchSampler,
)

__all__ = [
    "batching_sampler",
    "check_sequence_loader",
    "estimate_batchings",
    "estimate_epoch_seconds",
    "loader_epoch_seconds",
    "own_collate_reason",
    "own_collate_width",
    "packing_problem",
    "padded_tokens",
    "sampler_epoch_seconds",
    "training_copy",
]


def training_copy(pl_module: nn.Module, trainer: Any) -> nn.Module:
    """A train-mode deep copy of the module that leaves the attached Trainer out (its ``self.log`` only warns)."""
    clone = copy.deepcopy(pl_module, {id(trainer): None})
    return clone.train()


def _logits(out: Any) -> Tensor | None:
    if isinstance(out, Tensor):
        return out
    if isinstance(out, Mapping) and isinstance(out.get("logits"), Tensor):
        return out["logits"]
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, Tensor) else None


def _forward_takes(module: nn.Module, name: str) -> bool:
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def packing_problem(pl_module: nn.Module, trainer: Any, docs: Sequence[Tensor]) -> str | None:
    """Why packing cannot be used with this module, or ``None`` when it keeps packed documents apart.

    The module is called as ``module(input_ids=..., position_ids=...)`` on two documents packed into one row and on
    each document alone; the logits of every token must agree, else one document saw the other.
    """
    name = type(pl_module).__name__
    if not _forward_takes(pl_module, "position_ids"):
        return f"`{name}.forward` takes no `position_ids`, so it cannot tell where a packed document starts"
    a, b = (d[: max(2, min(len(d), 16))] for d in docs[:2])
    packed = pack_sequences([a, b], block_size=len(a) + len(b))
    model = training_copy(pl_module, trainer).eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            together = _logits(
                model(input_ids=packed["input_ids"].to(device), position_ids=packed["position_ids"].to(device))
            )
            alone = [
                _logits(model(input_ids=d[None].to(device), position_ids=torch.arange(len(d))[None].to(device)))
                for d in (a, b)
            ]
    except Exception as err:  # noqa: BLE001  (any failure of the user's forward means: not safe to pack)
        return f"`{name}(input_ids=..., position_ids=...)` failed on a packed row ({type(err).__name__}: {err})"
    if together is None or any(x is None for x in alone):
        return f"`{name}` returned no logits tensor to check that packed documents stay apart"
    expected = torch.cat([alone[0][0], alone[1][0]])  # type: ignore[index]
    if together[0].shape != expected.shape or not torch.allclose(
        together[0].float(), expected.float(), atol=1e-4, rtol=1e-3
    ):
        return (
            f"`{name}` gives different outputs for a document packed beside another than for it alone: its attention "
            "crosses documents. HINT: build the mask with `packed_attention_mask(position_ids)`; a Hugging Face model "
            "keeps packed documents apart only without a KV cache (`model.config.use_cache = False`)"
        )
    return None


def _step_seconds(model: nn.Module, batch: Any, repeats: int) -> float:
    step = getattr(model, "training_step", None)
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        out = step(batch, 0) if callable(step) else model(batch)
        loss = out["loss"] if isinstance(out, Mapping) else out
        loss.backward()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def estimate_epoch_seconds(
    model: nn.Module,
    device: torch.device,
    epoch_batches: Sequence[Sequence[int]],
    make_batch: Callable[[Sequence[int]], Any],
    padded_tokens: Sequence[int],
    probes: int = 3,
    repeats: int = 2,
) -> float:
    """Seconds of training steps for one epoch of ``epoch_batches`` (forward and backward, no data loading).

    The steps of ``probes`` batches spread over the padded sizes (smallest to largest) are timed (best of
    ``repeats``); a least-squares line of time against padded tokens then prices every batch of the epoch.
    """
    order = sorted(range(len(epoch_batches)), key=lambda i: padded_tokens[i])
    picks = sorted({order[round(q * (len(order) - 1))] for q in torch.linspace(0, 1, probes).tolist()})
    xs = []
    ys = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _step_seconds(model, move_data_to_device(make_batch(epoch_batches[picks[0]]), device), 1)  # warm-up
        for i in picks:
            batch = move_data_to_device(make_batch(epoch_batches[i]), device)
            xs.append(float(padded_tokens[i]))
            ys.append(_step_seconds(model, batch, repeats))
    x = torch.tensor(xs, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64)
    if len(xs) > 1 and float(x.var()) > 0:
        slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
        slope = max(slope, 0.0)
        intercept = max(float(y.mean()) - slope * float(x.mean()), 0.0)
    else:
        slope = 0.0
        intercept = float(y.mean())
    return len(epoch_batches) * intercept + slope * float(sum(padded_tokens))


def batching_sampler(
    strategy: str,
    lengths: Sequence[int],
    batch_size: int,
    *,
    max_tokens: int | None = None,
    block_size: int | None = None,
    rows: int | None = None,
    multiple_of: int = 8,
    drop_last: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
) -> SequenceBatchSampler:
    """The batch sampler of a ``SequenceBatching`` strategy, with its defaults.

    ``"length_grouped"``: ``batch_size`` samples of similar length. ``"token_budget"``: ``max_tokens`` padded tokens,
    by default the real tokens of ``batch_size`` mean-length samples (and room for the longest one). ``"packed"``:
    ``rows`` rows of ``block_size``, by default the real tokens of ``batch_size`` mean-length samples in rows. The
    defaults keep the tokens per optimizer step of the user's batches, so their learning rate still fits.
    """
    mean = sum(lengths) / len(lengths)
    common: dict[str, Any] = {"shuffle": shuffle, "seed": seed, "rank": rank, "world_size": world_size}
    if strategy == "length_grouped":
        return LengthGroupedSampler(lengths, batch_size, drop_last=drop_last, **common)
    if strategy == "token_budget":
        if max_tokens is None:
            longest = math.ceil(max(lengths) / multiple_of) * multiple_of
            max_tokens = max(longest, math.ceil(batch_size * mean))
        return TokenBudgetBatchSampler(lengths, max_tokens, multiple_of=multiple_of, **common)
    if strategy == "packed" and block_size is not None:
        return PackedBatchSampler(lengths, block_size, rows or max(1, round(batch_size * mean / block_size)), **common)
    raise SpeedupConfigError(
        f"`strategy`={strategy!r} (block_size={block_size!r}) has no sampler. Allowed values: 'length_grouped', "
        "'token_budget', or 'packed' with a block_size."
    )


def padded_tokens(lengths: Sequence[int], batch: Sequence[int], multiple_of: int, block_size: int | None) -> int:
    """Tokens a batch occupies once collated: padded to its longest sample, or (packed) whole rows."""
    if block_size is not None:
        return math.ceil(sum(lengths[i] for i in batch) / block_size) * block_size
    return math.ceil(max(lengths[i] for i in batch) / multiple_of) * multiple_of * len(batch)


def _padded(batch: Any) -> int:
    """The positions of a collated batch's token tensor (0 when it holds none)."""
    ids = token_ids(batch)
    return 0 if ids is None else ids.numel()


def loader_epoch_seconds(model: nn.Module, device: torch.device, loader: Any, probes: int = 3) -> float:
    """Estimated seconds of training steps for one epoch of ``loader`` as it is, from its first ``probes`` batches."""
    it = iter(loader)
    first = [next(it) for _ in range(min(probes, len(loader)))]
    per_batch = estimate_epoch_seconds(
        model,
        device,
        [[i] for i in range(len(first))],
        lambda i: first[i[0]],
        [_padded(b) for b in first],
        probes=len(first),
    ) / len(first)
    return per_batch * len(loader)


def sampler_epoch_seconds(
    model: nn.Module,
    device: torch.device,
    dataset: Any,
    sampler: SequenceBatchSampler,
    collate: Callable[[list[Any]], Any],
    *,
    multiple_of: int = 8,
    block_size: int | None = None,
    probes: int = 3,
) -> float:
    """Estimated seconds of training steps for one epoch of ``sampler``'s batches of ``dataset``, collated."""
    lengths = sampler.lengths.tolist()
    batches = sampler.batches()
    padded = [padded_tokens(lengths, b, multiple_of, block_size) for b in batches]
    return estimate_epoch_seconds(
        model, device, batches, lambda idx: collate([dataset[i] for i in idx]), padded, probes
    )


def estimate_batchings(
    model: nn.Module,
    device: torch.device,
    loader: Any,
    lengths: Sequence[int],
    strategies: Sequence[str] = ("length_grouped",),
    *,
    pad_value: int = 0,
    multiple_of: int = 8,
    probes: int = 3,
    keep_collate: bool | None = None,
) -> dict[str, float]:
    """Estimated seconds of training steps per epoch: ``"original"`` (``loader`` as it is) and each of ``strategies``
    (:func:`batching_sampler` on one rank with :func:`pad_collate`, or with the loader's own ``collate_fn`` where
    :func:`own_collate_reason` says it does more than pad), on ``model`` (a training copy) on ``device``.
    ``keep_collate``: that decision when the caller has made it already (``None``: made here).

    Example::

        >>> estimate_batchings(copy_of_model, torch.device("cpu"), loader, lengths)  # doctest: +SKIP
        {'original': 2.1, 'length_grouped': 1.2, 'token_budget': 1.1}
    """
    estimates = {"original": loader_epoch_seconds(model, device, loader, probes)}
    if keep_collate is None:
        keep_collate = own_collate_reason(loader, pad_value) is not None
    collate = loader.collate_fn if keep_collate else pad_collate(pad_value, multiple_of)
    for name in strategies:
        sampler = batching_sampler(
            name,
            lengths,
            int(loader.batch_size),
            multiple_of=multiple_of,
            drop_last=bool(loader.drop_last),
            rank=0,
            world_size=1,
        )
        estimates[name] = sampler_epoch_seconds(
            model, device, loader.dataset, sampler, collate, multiple_of=multiple_of, probes=probes
        )
    return estimates


def check_sequence_loader(loader: Any) -> DataLoader:
    """The user's train loader, if it is a plain DataLoader over a map-style dataset that can be re-batched."""
    if not isinstance(loader, DataLoader):
        raise SpeedupConfigError(
            f"`train_dataloaders` is a {type(loader).__name__}. Allowed values: a torch DataLoader over a map-style "
            "dataset of token samples. HINT: use either SequenceBatching or your own sequence sampler, not both."
        )
    if isinstance(loader.dataset, IterableDataset):
        raise SpeedupConfigError(
            "`train_dataloaders` reads an IterableDataset, whose samples cannot be grouped by length. Allowed values: "
            "a DataLoader over a map-style dataset."
        )
    custom_batches = type(loader.batch_sampler) not in (BatchSampler, type(None))
    if custom_batches or not isinstance(loader.sampler, (RandomSampler, SequentialSampler, DistributedSampler)):
        custom = loader.batch_sampler if custom_batches else loader.sampler
        raise SpeedupConfigError(
            f"`train_dataloaders` has a custom sampler ({type(custom).__name__}) that SequenceBatching would "
            "replace. Allowed values: a DataLoader with shuffle=True/False and no custom sampler or batch_sampler."
        )
    return loader


_OTHER = "has other values than a padded batch's"
_COMPARED = 8  # samples both collates batch when :func:`own_collate_reason` compares them


def _joined(why: str) -> str:
    return why if why.startswith("[") else f" {why}"


def _padding_only(theirs: Any, ours: Any, real: Tensor) -> str | None:
    """Where ``theirs`` differs from ``ours`` other than in its padding (``None``: nowhere). ``real`` marks the
    samples' own tokens, ``(batch, longest)``: per-token tensors must agree there and hold one value elsewhere (any
    width, any pad value); other tensors must be equal; a dict key or tuple field that ``ours`` lacks is a change."""
    if isinstance(theirs, Tensor) and isinstance(ours, Tensor):
        per_token = theirs.dim() >= 2 and ours.dim() >= 2 and theirs.shape[0] == ours.shape[0] == real.shape[0]
        if not per_token or theirs.shape[2:] != ours.shape[2:] or min(theirs.shape[1], ours.shape[1]) < real.shape[1]:
            if theirs.shape != ours.shape:
                return f"has shape {tuple(theirs.shape)} where padding gives {tuple(ours.shape)}"
            return None if torch.equal(theirs, ours) else _OTHER
        width = real.shape[1]
        mask = real.reshape(*real.shape, *([1] * (theirs.dim() - 2))).expand_as(theirs[:, :width])
        if not torch.equal(theirs[:, :width][mask], ours[:, :width][mask]):
            return _OTHER
        padding = torch.cat([theirs[:, :width][~mask].flatten(), theirs[:, width:].flatten()])
        return None if padding.numel() == 0 or bool((padding == padding[0]).all()) else _OTHER
    if isinstance(theirs, Mapping) and isinstance(ours, Mapping):
        if type(theirs) is not type(ours):  # e.g. a BatchEncoding, read as `batch.input_ids` or moved by its `.to()`
            return f"is a {type(theirs).__name__} where padding gives a {type(ours).__name__}"
        missing = [k for k in theirs if k not in ours]
        if missing:
            return f"adds keys {missing!r}"
        for key in theirs:
            why = _padding_only(theirs[key], ours[key], real)
            if why is not None:
                return f"[{key!r}]{_joined(why)}"
        return None
    if isinstance(theirs, (tuple, list)) and isinstance(ours, (tuple, list)):
        if len(theirs) > len(ours):
            return f"has {len(theirs)} fields where padding gives {len(ours)}"
        for i, (a, b) in enumerate(zip(theirs, ours)):
            why = _padding_only(a, b, real)
            if why is not None:
                return f"[{i}]{_joined(why)}"
        return None
    kinds = (Tensor, Mapping, (tuple, list))
    if any(isinstance(theirs, k) != isinstance(ours, k) for k in kinds):
        return f"is a {type(theirs).__name__} where padding gives a {type(ours).__name__}"
    try:
        return None if theirs == ours else _OTHER
    except Exception:  # noqa: BLE001  (objects that cannot be compared: not provably the same)
        return f"holds a {type(theirs).__name__} that cannot be compared"


def own_collate_reason(loader: Any, pad_value: int = 0, tuple_mask: bool = False) -> str | None:
    """Why the loader's ``collate_fn`` must batch re-grouped samples itself (``None``: :func:`pad_collate` may
    replace it, which pads each batch to its own longest sample).

    A collate that only pads (to the batch's or the data set's longest sample, with any pad value) can be replaced.
    One that does more (masks tokens for a masked LM, builds labels, adds fields, draws random numbers) cannot: the
    new batches keep it, as Hugging Face's ``group_by_length`` keeps the data collator. It is told by collating the
    first samples with both (the global RNG left as it was) and comparing them up to the padded width.

    Example::

        >>> from torch.utils.data import DataLoader
        >>> data = [torch.tensor([5, 6, 7]), torch.tensor([8])]
        >>> own_collate_reason(DataLoader(data, collate_fn=pad_collate(multiple_of=1))) is None
        True
        >>> masked = lambda xs: {**pad_collate()(xs), "labels": torch.zeros(len(xs), 8)}
        >>> own_collate_reason(DataLoader(data, collate_fn=masked))
        "`collate_fn` does more than pad: its batch adds keys ['labels']"
    """
    collate = getattr(loader, "collate_fn", None)
    if collate is None or collate is default_collate:
        return None  # the default cannot batch tokens of different lengths: nothing to keep
    dataset = loader.dataset
    samples = [dataset[i] for i in range(min(_COMPARED, len(dataset)))]
    with torch.random.fork_rng(devices=[]):
        try:
            theirs = collate(samples)
        except Exception:  # noqa: BLE001  (a collate that cannot batch these samples cannot be the one to keep)
            return None
    try:
        ours = pad_collate(pad_value, 1, tuple_mask=tuple_mask)(samples)
    except Exception as err:  # noqa: BLE001  (e.g. a field default_collate cannot stack): only theirs batches them
        why = f"padding alone cannot batch these samples ({type(err).__name__}: {err})"
        return f"`collate_fn` does more than pad: {why}"
    if isinstance(samples[0], Tensor) and isinstance(theirs, Tensor):
        ours = ours["input_ids"]  # bare token tensors: pad_collate's dict against the user's tensor
    lengths = torch.tensor([len(token_tensor(sample)) for sample in samples])
    real = torch.arange(int(lengths.max())) < lengths[:, None]
    why = _padding_only(theirs, ours, real)
    return None if why is None else f"`collate_fn` does more than pad: its batch{_joined(why)}"


def own_collate_width(loader: Any, lengths: Sequence[int]) -> int | None:
    """The width the loader's ``collate_fn`` pads the shortest samples to, when it is wider than they need (it pads
    every batch to one width: no batching can save padding through it); ``None`` when it pads to what they need."""
    shortest = sorted(range(len(lengths)), key=lambda i: lengths[i])[: max(1, int(loader.batch_size or 1))]
    try:
        with torch.random.fork_rng(devices=[]):
            ids = token_ids(loader.collate_fn([loader.dataset[i] for i in shortest]))
    except Exception:  # noqa: BLE001  (it batched the first samples; whatever stops it here, no width is known)
        return None
    need = max(lengths[i] for i in shortest)
    width = None if ids is None or ids.dim() < 2 else int(ids.shape[1])
    return width if width is not None and width > math.ceil(need / 64) * 64 else None  # rounding up is not fixed
