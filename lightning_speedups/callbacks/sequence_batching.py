"""SequenceBatching callback: rebuild the training loader so batches of token sequences carry little padding."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_speedups._compat import (
    fit_source_dataloader,
    reload_train_dataloader,
    set_fit_train_loader,
    train_dataloader_built,
)
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_choice, check_int
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._tokens import token_ids
from lightning_speedups.callbacks._sequence_choice import (
    batching_sampler,
    check_sequence_loader,
    loader_epoch_seconds,
    own_collate_reason,
    packing_problem,
    sampler_epoch_seconds,
    training_copy,
)
from lightning_speedups.data._sampler_base import SequenceBatchSampler
from lightning_speedups.data.padding import pack_collate, pad_collate, sequence_lengths, token_tensor
from lightning_speedups.data.sequence_loader import SequenceLoader

__all__ = ["STRATEGIES", "SequenceBatching"]

STRATEGIES = ("auto", "length_grouped", "token_budget", "packed")


class SequenceBatching(Callback):
    """Rebuild the training DataLoader of token sequences with length-aware batches and dynamic padding.

    At ``setup`` it reads the training loader (from ``train_dataloader()`` or the loader passed to ``fit``), checks
    that its samples hold token tensors, reads every sample's length once (or takes ``lengths``) and checks the
    strategy's arguments; everything that can be wrong raises there, before any step. At ``on_fit_start`` it
    replaces the loader (as the batch-size finder does) with the same dataset in new batches:

    - ``"length_grouped"``: :class:`~lightning_speedups.data.LengthGroupedSampler` at your batch size +
      :func:`pad_collate`;
    - ``"token_budget"``: :class:`~lightning_speedups.data.TokenBudgetBatchSampler` + :func:`pad_collate`; the default
      ``max_tokens`` keeps the real tokens per step of your batch size (batch size x mean length);
    - ``"packed"``: :class:`~lightning_speedups.data.PackedBatchSampler` + :func:`pack_collate`: documents packed into
      rows of ``block_size`` (``position_ids`` restart per document, no ``attention_mask``). Only for a model whose
      ``forward`` takes ``position_ids`` and keeps packed documents apart, which ``setup`` checks by running it on
      two documents packed and alone; otherwise it refuses, naming the module and the reason;
    - ``"auto"``: times the training step on a few batches of your loader, of ``"length_grouped"`` and (with a
      ``block_size``, where it is safe) of ``"packed"`` (on a copy of the model, at ``on_fit_start``), prices a whole
      epoch with them, and keeps the fastest, your own loader included (so it never makes an epoch slower than it
      measured). When the lengths it read leave nothing to save (every sample the same length, and your loader's
      batches no wider than padded batches would be: fixed-length windows of a token stream), it keeps your loader
      without timing anything, and says so in one line. Not ``"token_budget"``: its batches change the optimisation,
      not only the speed (on the sequences bench task it reached a lower accuracy than pad-to-max), so it is yours to
      choose. Under DDP rank 0 decides.

    Your ``collate_fn``: one that only pads (to the batch's or the data set's longest sample) is replaced by
    :func:`pad_collate`. One that does more (masks tokens for a masked LM, builds labels or fields, as Hugging Face's
    data collators do) keeps batching the new batches, as HF's ``group_by_length`` keeps the collator; ``setup``
    tells the two apart by collating the first samples both ways and says which it found. Packing builds its rows
    itself, so it is refused for such a collate (``"auto"`` leaves packing out).

    Resume: the strategy, the seed, the epoch and the batches already trained are saved in the checkpoint, so a run
    resumed mid-epoch (also after a SIGKILL, from its last checkpoint) trains exactly the batches the uninterrupted
    run would have. Under DDP the samplers shard themselves: ranks take turns over batches of neighbouring lengths
    (balanced tokens per step) and all get the same number of batches.

    Args:
        strategy: one of ``"auto"``, ``"length_grouped"``, ``"token_budget"``, ``"packed"``.
        batch_size: samples per batch for ``"length_grouped"`` (default: the loader's).
        max_tokens: the padded-token budget per batch for ``"token_budget"``.
        block_size: tokens per packed row (``"packed"``; required for it, and ``"auto"`` tries packing only then).
        rows: packed rows per batch (default: the real tokens per step of your batch size, in rows).
        lengths: one length per training sample (default: read once from the dataset, timed, and cached).
        pad_value: the padding token id.
        multiple_of: padded lengths are rounded up to this.
        shuffle: new random batches every epoch.
        seed: seeds the batch order (epoch ``e`` uses ``(seed, e)``).

    Raises:
        SpeedupConfigError: bad arguments (in ``__init__``); at ``setup``: image or other non-token data, ``lengths``
            of the wrong count, a ``max_tokens`` below the longest sample, a loader that cannot be rebuilt, or
            ``"packed"`` on a model that cannot keep documents apart.

    Example::

        >>> trainer = L.Trainer(callbacks=[SequenceBatching("length_grouped")], logger=False)
    """

    def __init__(
        self,
        strategy: str = "auto",
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        block_size: int | None = None,
        rows: int | None = None,
        lengths: Sequence[int] | None = None,
        pad_value: int = 0,
        multiple_of: int = 8,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.strategy = check_choice("strategy", strategy, STRATEGIES)
        self.batch_size = check_int("batch_size", batch_size, 1, optional=True)
        self.max_tokens = check_int("max_tokens", max_tokens, 1, optional=True)
        self.block_size = check_int("block_size", block_size, 1, optional=True)
        self.rows = check_int("rows", rows, 1, optional=True)
        self.pad_value = check_int("pad_value", pad_value)
        self.multiple_of = check_int("multiple_of", multiple_of, 1)
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed)
        if strategy == "packed" and block_size is None:
            raise SpeedupConfigError(
                "`block_size`=None with `strategy`='packed'. Allowed values: an integer >= 1 (tokens per packed row). "
                "HINT: your model's context length."
            )
        self._given_lengths = None if lengths is None else [int(n) for n in lengths]
        self.chosen: str | None = None  # the strategy in use ("original": your own loader was fastest)
        self.estimates: dict[str, float] = {}  # auto: measured seconds per epoch, per candidate
        self.lengths: list[int] = []
        self.loader: SequenceLoader | None = None
        self._source: DataLoader | None = None
        self._pack_problem: str | None = None
        self._tuple_mask = True
        self._own_collate: str | None = None  # why the loader's collate_fn batches the new batches too
        self._note: str | None = None  # auto: why nothing was timed (the lengths leave nothing to save)
        self._consumed = 0
        self._restored: dict[str, Any] | None = None

    # ------------------------------------------------------------------ setup: every check before any step
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        loader = fit_source_dataloader(trainer)
        if isinstance(loader, SequenceLoader):
            raise SpeedupConfigError(
                "`train_dataloaders` is a SequenceLoader already. Allowed values: a plain DataLoader. HINT: use either "
                "SequenceBatching or your own sequence sampler, not both."
            )
        self._source = check_sequence_loader(loader)
        dataset = self._source.dataset
        token_tensor(dataset[0])  # image or other non-token data raises here, naming what it found
        self._tuple_mask = self._keeps_arity(dataset)
        self._own_collate = own_collate_reason(self._source, self.pad_value, self._tuple_mask)
        if self._own_collate is not None:
            rank_zero_info(f"SequenceBatching: {self._own_collate}; the new batches go through it too.")
        found = sequence_lengths(dataset, self._given_lengths)
        self.lengths = found.lengths
        if found.source == "read":
            rank_zero_info(f"SequenceBatching: read {len(self.lengths)} sample lengths in {found.seconds:.2f}s.")
        self._batch = self.batch_size or self._source.batch_size
        if self._batch is None and self.strategy in ("auto", "length_grouped") and self.batch_size is None:
            raise SpeedupConfigError(
                "`batch_size`=None and the train DataLoader has no batch_size. Allowed values: an integer >= 1."
            )
        if self.strategy == "token_budget":
            self._sampler("token_budget")  # a budget below the longest sample raises here
        if self.strategy != "auto":  # auto runs the step on every candidate's batches anyway
            self._trial_step(trainer, pl_module, self.strategy)
        self._pack_problem = None
        if self.block_size is not None and self.strategy in ("packed", "auto"):
            docs = [token_tensor(dataset[i]) for i in range(min(2, len(dataset)))]
            if self._own_collate is not None:  # packed rows are built by pack_collate, never by the user's collate
                own = self._own_collate
                self._pack_problem = f"packed rows would not go through the loader's collate_fn, and {own}"
            elif len(docs) == 2:
                self._pack_problem = packing_problem(pl_module, trainer, docs)
            else:
                self._pack_problem = "one document"
            if self._pack_problem is not None and self.strategy == "packed":
                hint = (
                    " HINT: to pack, leave `collate_fn` out of the DataLoader: pack_collate builds `input_ids`, "
                    "`labels` (-100 at each document's first token) and `position_ids` itself."
                    if self._own_collate is not None
                    else ""
                )
                raise SpeedupConfigError(
                    f"`strategy`='packed' cannot be used: {self._pack_problem}. Allowed values: 'length_grouped', "
                    f"'token_budget', 'auto'.{hint}"
                )

    def _sampler(self, strategy: str) -> SequenceBatchSampler:
        return batching_sampler(
            strategy,
            self.lengths,
            self._batch or 1,
            max_tokens=self.max_tokens,
            block_size=self.block_size,
            rows=self.rows,
            multiple_of=self.multiple_of,
            drop_last=bool(self._source and self._source.drop_last),
            shuffle=self.shuffle,
            seed=self.seed,
        )

    def _collate(self, strategy: str) -> Callable[[list[Any]], Any]:
        if strategy == "packed":
            assert self.block_size is not None
            return pack_collate(self.block_size, self.pad_value)
        if self._own_collate is not None and self._source is not None:
            return self._source.collate_fn  # it does more than pad (masking, labels): the new batches keep it
        return pad_collate(self.pad_value, self.multiple_of, tuple_mask=self._tuple_mask)

    def _trial_step(self, trainer: L.Trainer, pl_module: L.LightningModule, strategy: str) -> None:
        """Run ``training_step`` once, without gradients, on a copy of the module and a batch of ``strategy``, so a
        module that cannot take the new batches is refused at ``setup()``, not at its first real step."""
        if strategy == "packed":  # packing_problem runs the model on packed rows itself
            return
        assert self._source is not None
        indices = self._sampler(strategy).batches()[0]
        batch = self._collate(strategy)([self._source.dataset[i] for i in indices])
        model = training_copy(pl_module, trainer)
        # setup() runs before the strategy moves the module: the batch goes where the copy's weights are
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.training_step(move_data_to_device(batch, device), 0)
        except Exception as err:  # noqa: BLE001  (any failure means: this module cannot train on these batches)
            raise SpeedupConfigError(
                f"`strategy`={strategy!r}: `{type(pl_module).__name__}.training_step` failed on a {strategy} batch "
                f"({type(err).__name__}: {err}). Allowed values: a module whose training_step takes batches padded "
                "per batch (per-token labels padded with -100, tuples of the sample's arity). HINT: check how the "
                "step uses padded fields, or pass `pad_value`."
            ) from err
        finally:
            del model

    def _keeps_arity(self, dataset: Any) -> bool:
        """Whether tuple batches may gain an ``attention_mask``: not when the user's own collate gives tuples of the
        sample's arity (a ``training_step`` that unpacks ``x, y = batch`` must keep working)."""
        assert self._source is not None
        samples = [dataset[i] for i in range(min(2, len(dataset)))]
        try:
            theirs = self._source.collate_fn(samples)
        except Exception:  # noqa: BLE001  (e.g. default_collate cannot stack tokens of different lengths)
            return True
        ours = pad_collate(self.pad_value, self.multiple_of)(samples)
        return not (isinstance(theirs, (tuple, list)) and isinstance(ours, tuple) and len(theirs) != len(ours))

    # ------------------------------------------------------------------ fit start: choose and swap the loader
    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._source is None:
            return
        if self._restored is not None:
            self.chosen = self._restored["strategy"]
        elif self.strategy == "auto":
            self.chosen = trainer.strategy.broadcast(
                self._measure(trainer, pl_module) if trainer.is_global_zero else None, src=0
            )
        else:
            self.chosen = self.strategy
        if self.chosen == "original":
            if self._note is not None:
                rank_zero_info(f"SequenceBatching: {self._note}.")
            else:
                rank_zero_info(f"SequenceBatching: your loader was fastest ({self._estimates_text()}); kept it.")
            return
        sampler = self._sampler(self.chosen)
        if self._restored is not None and self._restored.get("sampler"):
            sampler.load_state_dict(self._restored["sampler"])
        src = self._source
        kwargs: dict[str, Any] = {"num_workers": src.num_workers, "pin_memory": src.pin_memory}
        if src.num_workers > 0:
            kwargs.update(
                persistent_workers=src.persistent_workers,
                prefetch_factor=src.prefetch_factor,
                worker_init_fn=src.worker_init_fn,
                multiprocessing_context=src.multiprocessing_context,
            )
        self.loader = SequenceLoader(src.dataset, sampler, self._collate(self.chosen), **kwargs)
        set_fit_train_loader(trainer, self.loader)
        if train_dataloader_built(trainer):  # an earlier callback's trial loop built it already: rebuild
            reload_train_dataloader(trainer)
        extra = f" ({self._estimates_text()})" if self.estimates else ""
        rank_zero_info(f"SequenceBatching: {self.chosen}, {len(sampler)} batches per epoch per rank{extra}.")

    def _estimates_text(self) -> str:
        return ", ".join(f"{k} {v:.2f}s/epoch" for k, v in sorted(self.estimates.items(), key=lambda kv: kv[1]))

    def _nothing_to_save(self) -> str | None:
        """Why no batching can beat the user's loader, without timing (``None``: the candidates are timed): every
        sample has one length and the loader's first batch is no wider than a padded batch of them would be."""
        assert self._source is not None
        lengths = self.lengths
        if not lengths or min(lengths) != max(lengths):
            return None
        size = min(len(lengths), self._batch or 1)
        try:
            with torch.random.fork_rng(devices=[]):
                ids = token_ids(self._source.collate_fn([self._source.dataset[i] for i in range(size)]))
        except Exception:  # noqa: BLE001  (a collate that cannot batch them: time as usual)
            return None
        padded = math.ceil(lengths[0] / self.multiple_of) * self.multiple_of  # what pad_collate would give
        if ids is None or ids.dim() < 2 or ids.shape[1] > padded:
            return None
        pads = 1.0 - size * lengths[0] / max(ids.numel(), 1)
        return (
            f"every sample has {lengths[0]} tokens and your loader pads {100 * pads:.0f}% of a batch: no batching can "
            "save padding, so nothing was timed; kept your loader"
        )

    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str:
        """Time the training step on batches of each candidate; the fastest estimated epoch wins (nothing is timed
        when the lengths leave nothing to save)."""
        assert self._source is not None
        self.estimates = {}
        self._note = self._nothing_to_save()
        if self._note is not None:
            return "original"
        device = trainer.strategy.root_device
        model = training_copy(pl_module, trainer).to(device)
        dataset = self._source.dataset
        # not "token_budget": its length-sorted batches of varying sample counts change the optimisation (it reached
        # a lower accuracy than pad-to-max on the sequences bench task), and auto may only change the speed
        candidates = ["length_grouped"]
        if self.block_size is not None and self._pack_problem is None:
            candidates.append("packed")
        elif self.block_size is not None:
            rank_zero_info(f"SequenceBatching: packing not tried: {self._pack_problem}.")
        try:
            self.estimates["original"] = loader_epoch_seconds(model, device, self._source)
        except Exception as err:  # noqa: BLE001  (e.g. default_collate on samples of different lengths)
            rank_zero_info(
                f"SequenceBatching: your loader was not timed: it cannot batch these samples "
                f"({type(err).__name__}: {err})."
            )
        for name in candidates:
            self.estimates[name] = sampler_epoch_seconds(
                model,
                device,
                dataset,
                self._sampler(name),
                self._collate(name),
                multiple_of=self.multiple_of,
                block_size=self.block_size if name == "packed" else None,
            )
        del model
        # the user's own loader must be beaten by a clear margin: its estimate comes from fewer batches
        best = min(self.estimates, key=lambda k: self.estimates[k] * (1.0 if k == "original" else 1.05))
        return best

    # ------------------------------------------------------------------ resume
    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._consumed = trainer.fit_loop.epoch_loop.batch_progress.current.ready

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._consumed = batch_idx + 1

    @override
    def state_dict(self) -> dict[str, Any]:
        sampler = self.loader.batch_sampler if self.loader is not None else None
        return {
            "strategy": self.chosen,
            "estimates": dict(self.estimates),
            "note": self._note,
            "sampler": sampler.state_dict(consumed=self._consumed) if sampler is not None else None,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("strategy") is not None:
            self._restored = dict(state_dict)
            self.estimates = dict(state_dict.get("estimates") or {})
            self._note = state_dict.get("note")


register_technique(
    TechniqueInfo(
        name="sequence_batching",
        callback=SequenceBatching,
        functional=pad_collate,
        summary="Token sequences in batches of similar length (or packed), padded per batch: little compute on pads",
        ways=(6, 7),
        bench="lightning_speedups.benchmarks.sequences:run",
    )
)
