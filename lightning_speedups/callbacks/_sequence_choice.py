"""What :class:`~lightning_speedups.SequenceBatching` measures: whether packing is safe, and which batching is fastest.

- :func:`packing_problem`: packing is only for a model that takes ``position_ids`` and keeps documents apart; checked
  by signature, then by running the model on two documents packed into one row and on each alone.
- :func:`estimate_epoch_seconds`: the training step timed on a few batches of a batching's epoch (its shortest,
  middle and longest), a line through time against padded tokens, summed over the epoch's batches.
"""

from __future__ import annotations

import copy
import inspect
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn

from lightning_speedups.data.padding import pack_sequences

__all__ = ["batch_tokens", "estimate_epoch_seconds", "packing_problem", "training_copy"]


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
            together = _logits(model(input_ids=packed["input_ids"].to(device), position_ids=packed["position_ids"]
                                     .to(device)))
            alone = [
                _logits(model(input_ids=d[None].to(device), position_ids=torch.arange(len(d))[None].to(device)))
                for d in (a, b)
            ]
    except Exception as err:  # noqa: BLE001  (any failure of the user's forward means: not safe to pack)
        return f"`{name}(input_ids=..., position_ids=...)` failed on a packed row ({type(err).__name__}: {err})"
    if together is None or any(x is None for x in alone):
        return f"`{name}` returned no logits tensor to check that packed documents stay apart"
    expected = torch.cat([alone[0][0], alone[1][0]])  # type: ignore[index]
    if together[0].shape != expected.shape or not torch.allclose(together[0].float(), expected.float(), atol=1e-4,
                                                                  rtol=1e-3):
        return (
            f"`{name}` gives different outputs for a document packed beside another than for it alone: its attention "
            "crosses documents. HINT: build the mask with `packed_attention_mask(position_ids)`; a Hugging Face model "
            "keeps packed documents apart only without a KV cache (`model.config.use_cache = False`)"
        )
    return None


def batch_tokens(batch: Any) -> int:
    """The padded token count of a collated batch (the numel of its ``input_ids``, or of its first tensor)."""
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), Tensor):
        return batch["input_ids"].numel()
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
        return batch[0].numel()
    return batch.numel() if isinstance(batch, Tensor) else 0


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
    xs, ys = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _step_seconds(model, move_data_to_device(make_batch(epoch_batches[picks[0]]), device), 1)  # warm-up
        for i in picks:
            batch = move_data_to_device(make_batch(epoch_batches[i]), device)
            xs.append(float(padded_tokens[i]))
            ys.append(_step_seconds(model, batch, repeats))
    x, y = torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    if len(xs) > 1 and float(x.var()) > 0:
        slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
        slope = max(slope, 0.0)
        intercept = max(float(y.mean()) - slope * float(x.mean()), 0.0)
    else:
        slope, intercept = 0.0, float(y.mean())
    return len(epoch_batches) * intercept + slope * float(sum(padded_tokens))
