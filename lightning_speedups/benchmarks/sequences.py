"""Benchmark: batching variable-length sequences (dynamic padding, length grouping, token budgets, packing).

The task is real text that ships with Python: the blank-line separated paragraphs of the standard library's sources
(byte tokens, cut at 512), labelled by what they are (function, class, docstring or comment, other code); see
:mod:`lightning_speedups.benchmarks._sequence_tasks`. Most paragraphs are short and a few are long, so padding every
batch to the longest sample of the data set (the baseline, as many users do) wastes most of each batch.

Measured, for a small ``nn.TransformerEncoder`` classifier (AdamW), each strategy against pad-to-max:

- non-pad tokens/s of training steps: each strategy trains on its own batches in timed windows of a few steps,
  interleaved (A B C D A B C D ...) after a warm-up; the medians and their ratio;
- the pad fraction of one epoch's batches;
- time to the baseline's final accuracy: every strategy trains for the same epochs from the same initial weights; the
  runs advance in turns (one validation interval each, A B C D A B C D ...) so machine noise spreads over all of
  them; the clock counts training only (validation paused).

And for a tiny causal byte-level GPT on stdlib paragraphs (long ones cut into ``block_size`` pieces): packing
(:class:`~lightning_speedups.data.PackedBatchSampler` + :func:`~lightning_speedups.data.pack_collate`, the documents
kept apart by :func:`~lightning_speedups.data.packed_attention_mask`) vs per-document padding (each batch padded to its
longest document) with random batches, and with length-grouped batches.

Run: ``python -m lightning_speedups.benchmarks.sequences [--quick | --full] [--json PATH] [--threads N]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor

from lightning_speedups.benchmarks import _sequence_tasks as tasks
from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.data import (
    IGNORE_INDEX,
    LengthGroupedSampler,
    packed_attention_mask,
    pad_collate,
    pad_fraction,
)
from lightning_speedups.measure import interleaved_timings, median

__all__ = [
    "SIZES",
    "TARGETS",
    "BenchSize",
    "accuracy",
    "main",
    "run",
    "train_to_accuracy",
]

# the project's own goals for each measure: kept in each row's JSON (``extra["target"]``), not in its note
TARGETS = {"grouped_pad": 0.05, "tokens_per_s": 2.0, "time_to_accuracy": 1.8, "packing": 1.3}
BASELINE = tasks.BASELINE
Batches = tasks.Batches


@dataclass(frozen=True)
class BenchSize:
    """How big each part of the benchmark is (``quick``: about a minute on 2 cores; ``full``: a few minutes)."""

    per_class: int = 400  # training paragraphs per kind (4 kinds)
    val_per_class: int = 50
    max_len: int = 512
    batch_size: int = 16
    epochs: int = 1
    evals_per_epoch: int = 8
    d: int = 32
    heads: int = 2
    lr: float = 3e-3
    window_steps: int = 3  # training steps per timed window
    repeats: int = 5
    lm_docs: int = 1200
    lm_block: int = 512
    lm_batch: int = 16
    lm_d: int = 32
    lm_window_steps: int = 3
    lm_repeats: int = 5


SIZES = {
    "tiny": BenchSize(
        per_class=24,
        val_per_class=8,
        max_len=128,
        batch_size=8,
        evals_per_epoch=2,
        window_steps=1,
        repeats=2,
        lm_docs=48,
        lm_block=64,
        lm_batch=8,
        lm_window_steps=1,
        lm_repeats=2,
    ),
    "quick": BenchSize(),
    "full": BenchSize(
        per_class=1000,
        val_per_class=100,
        batch_size=32,
        epochs=2,
        window_steps=4,
        repeats=7,
        lm_docs=4000,
        lm_batch=32,
        lm_window_steps=4,
        lm_repeats=7,
    ),
}


# ------------------------------------------------------------------------------------------ timing
def _autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


class _Stream:
    """One strategy's training steps, epoch after epoch; each call trains ``steps`` batches and notes their tokens."""

    def __init__(
        self,
        dataset: Any,
        epochs: Callable[[int], Batches],
        collate: Any,
        step: Callable[[Any], None],
        steps: int,
        device: torch.device,
    ) -> None:
        self.dataset = dataset
        self.epochs = epochs
        self.collate = collate
        self.step = step
        self.steps = steps
        self.device = device
        self.tokens: list[int] = []
        self._epoch = 0
        self._queue = list[list[int]]()

    def __call__(self) -> None:
        real = 0
        for _ in range(self.steps):
            while not self._queue:
                self._queue = list(self.epochs(self._epoch))
                self._epoch += 1
            batch = tasks.collated(self.dataset, self.collate, self._queue.pop(0))
            real += tasks.real_tokens(batch)
            self.step(move_data_to_device(batch, self.device))
        self.tokens.append(real)


def _throughput(streams: dict[str, _Stream], repeats: int) -> dict[str, list[float]]:
    """Non-pad tokens/s of every timed window, the streams interleaved after one warm-up window each."""
    fns: dict[str, Callable[[], Any]] = dict(streams)
    times = interleaved_timings(fns, repeats=repeats, warmup=1)
    return {name: [tok / t for tok, t in zip(streams[name].tokens[1:], times[name])] for name in streams}


def _rate_row(
    variant: str, rates: dict[str, list[float]], base: str, name: str, note: str, extra: dict[str, Any]
) -> BenchRow:
    per_round = [c / b for b, c in zip(rates[base], rates[name])]
    b = median(rates[base])
    c = median(rates[name])
    return BenchRow(
        technique="sequence_batching",
        variant=variant,
        metric="non-pad tokens/s",
        baseline=b,
        candidate=c,
        ratio=c / b,
        unit="tokens/s",
        note=note,
        extra={**extra, "ratio_min": min(per_round), "ratio_max": max(per_round)},
    )


# ------------------------------------------------------------------------------------------ the classifier
def _cls_step(
    model: tasks.SnippetClassifier, opt: torch.optim.Optimizer, batch_size: int, dtype: torch.dtype | None = None
) -> Callable[[Any], None]:
    device = next(model.parameters()).device

    def step(batch: Any) -> None:
        ids, labels, mask = batch
        # summed over the batch / the nominal batch size: every sample weighs 1 / batch_size, also in a token-budget
        # batch of 90 short samples or 5 long ones (the mean would weigh each short sample 18x less); the same as the
        # mean for fixed-size batches
        with _autocast(device, dtype):
            logits = model(ids, mask)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum") / batch_size
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _new_classifier(
    task: tasks.SnippetTask, size: BenchSize, seed: int, device: torch.device
) -> tuple[Any, torch.optim.Optimizer]:
    torch.manual_seed(seed)  # the same initial weights for every strategy
    model = tasks.SnippetClassifier(len(task.classes), task.max_len, d=size.d, heads=size.heads).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=size.lr, weight_decay=0.01)


def accuracy(model: tasks.SnippetClassifier, val: tasks.Snippets, batch_size: int = 64) -> float:
    """Validation accuracy, batched by length (the same batches for every strategy), on the model's device."""
    collate = pad_collate()
    right = 0
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        for batch in LengthGroupedSampler(val.lengths, batch_size, shuffle=False):
            ids, labels, mask = move_data_to_device(tasks.collated(val, collate, batch), device)
            right += int((model(ids, mask).argmax(1) == labels).sum())
    model.train()
    return right / len(val)


class _TrainRun:
    """One strategy trained for ``size.epochs``; :meth:`advance` trains to the next validation point."""

    def __init__(
        self,
        task: tasks.SnippetTask,
        epochs: Callable[[int], Batches],
        collate: Any,
        size: BenchSize,
        seed: int,
        device: torch.device,
        dtype: torch.dtype | None,
    ) -> None:
        self.task = task
        self.collate = collate
        self.device = device
        self.model, opt = _new_classifier(task, size, seed, device)
        self.step = _cls_step(self.model, opt, size.batch_size, dtype)
        self.plan = [b for e in range(size.epochs) for b in epochs(e)]
        self.every = math.ceil(len(task.train) / size.evals_per_epoch)
        self.pos = self.seen = 0
        self.seconds = self.cpu = 0.0
        self.curve: list[tuple[float, float, int, float]] = []  # (train seconds, cpu seconds, samples seen, val acc)

    @property
    def done(self) -> bool:
        return self.pos >= len(self.plan)

    def advance(self) -> None:
        t0 = time.perf_counter()
        c0 = time.process_time()
        target = self.seen + self.every
        while self.pos < len(self.plan) and self.seen < target:
            batch = self.plan[self.pos]
            self.step(move_data_to_device(tasks.collated(self.task.train, self.collate, batch), self.device))
            self.pos = self.pos + 1
            self.seen = self.seen + len(batch)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        self.curve.append((self.seconds, self.cpu, self.seen, accuracy(self.model, self.task.val)))

    def reached(self, target: float) -> tuple[float, float] | None:
        """``(train seconds, cpu seconds)`` at the first validation at or above ``target``; ``None`` if never."""
        return next(((s, c) for s, c, _n, acc in self.curve if acc >= target - 1e-9), None)


def train_to_accuracy(
    task: tasks.SnippetTask,
    size: BenchSize,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> dict[str, _TrainRun]:
    """Train every strategy for ``size.epochs`` from the same weights, in turns (one validation interval each)."""
    strats = tasks.classifier_strategies(task.train.lengths, size.batch_size, size.max_len, seed)
    dev = torch.device(device)
    runs = {
        name: _TrainRun(task, epochs, collate, size, seed, dev, dtype) for name, (epochs, collate) in strats.items()
    }
    while not all(r.done for r in runs.values()):
        for r in runs.values():
            if not r.done:
                r.advance()
    return runs


def _classifier_rows(
    task: tasks.SnippetTask, size: BenchSize, seed: int, device: torch.device, dtype: torch.dtype | None
) -> list[BenchRow]:
    lengths = task.train.lengths
    strats = tasks.classifier_strategies(lengths, size.batch_size, size.max_len, seed)
    pads = {
        name: pad_fraction(lengths, epochs(0), multiple_of=size.max_len if name == BASELINE else 8)
        for name, (epochs, _c) in strats.items()
    }
    streams = {}
    for name, (epochs, collate) in strats.items():
        model, opt = _new_classifier(task, size, seed, device)
        streams[name] = _Stream(
            task.train, epochs, collate, _cls_step(model, opt, size.batch_size, dtype), size.window_steps, device
        )
    rates = _throughput(streams, size.repeats)
    runs = train_to_accuracy(task, size, seed, device, dtype)
    rows = []
    for name in strats:
        if name == BASELINE:
            continue
        note = f"pad {pads[BASELINE]:.0%} -> {pads[name]:.1%}"
        extra = {"pad_fraction_baseline": pads[BASELINE], "pad_fraction": pads[name], "target": TARGETS["tokens_per_s"]}
        rows.append(_rate_row(f"{name} vs {BASELINE}", rates, BASELINE, name, note, extra))
    return rows + _time_to_accuracy_rows(runs, size)


def _time_to_accuracy_rows(runs: dict[str, _TrainRun], size: BenchSize) -> list[BenchRow]:
    """One row per strategy: the train seconds it took to reach the baseline's final validation accuracy."""
    base_run = runs[BASELINE]
    target = base_run.curve[-1][3]
    base_at = base_run.reached(target)
    assert base_at is not None  # its own final accuracy
    rows = []
    for name, run in runs.items():
        if name == BASELINE:
            continue
        at = run.reached(target)
        ratio = base_at[0] / at[0] if at else math.nan
        note = f"train s to val acc {target:.1%} (validation paused); {size.epochs} epoch(s), same initial weights"
        if at is None:
            best = max(p[3] for p in run.curve)
            note = f"did not reach {target:.1%} in {size.epochs} epoch(s) (best {best:.1%}); " + note
        rows.append(
            BenchRow(
                technique="sequence_batching",
                variant=f"{name}: time to {BASELINE}'s final accuracy",
                metric="train seconds",
                baseline=base_at[0],
                candidate=at[0] if at else math.nan,
                ratio=ratio,
                unit="s",
                accuracy_baseline=target,
                accuracy_candidate=run.curve[-1][3],
                note=note,
                extra={
                    "cpu_ratio": base_at[1] / at[1] if at else math.nan,
                    "target": TARGETS["time_to_accuracy"],
                    "curves": {n: ([p[0] for p in r.curve], [p[3] for p in r.curve]) for n, r in runs.items()}
                    if name == "length-grouped"
                    else {},
                },
            )
        )
    return rows


# ------------------------------------------------------------------------------------------ the language model
def _lm_step(
    model: tasks.ByteGPT, opt: torch.optim.Optimizer, packed: bool, dtype: torch.dtype | None = None
) -> Callable[[Any], None]:
    device = next(model.parameters()).device

    def step(batch: dict[str, Tensor]) -> None:
        ids = batch["input_ids"]
        if packed:  # positions restart at every document; the mask keeps documents apart
            pos = batch["position_ids"]
            labels = batch["labels"]
            mask: Tensor | None = packed_attention_mask(pos)
        else:  # right padding: plain causal attention, padding skipped by the loss
            pos = torch.arange(ids.shape[1], device=device).expand_as(ids)
            mask = None
            labels = ids.masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        with _autocast(device, dtype):
            logits = model(ids, pos, mask)
        loss = tasks.lm_loss(logits.float(), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _lm_rows(
    size: BenchSize, seed: int, device: torch.device, dtype: torch.dtype | None
) -> tuple[list[BenchRow], dict[str, float]]:
    docs = tasks.lm_documents(size.lm_block, size.lm_docs, seed=seed)
    lengths = [len(d) for d in docs]
    strats = tasks.lm_strategies(lengths, size.lm_batch, size.lm_block, seed)
    streams = {}
    pads = {}
    for name, (epochs, collate) in strats.items():
        torch.manual_seed(seed)
        model = tasks.ByteGPT(size.lm_block, d=size.lm_d, heads=2).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        streams[name] = _Stream(
            docs, epochs, collate, _lm_step(model, opt, name == "packing", dtype), size.lm_window_steps, device
        )
        pads[name] = (
            tasks.packed_pad_fraction(lengths, epochs(0), size.lm_block)
            if name == "packing"
            else pad_fraction(lengths, epochs(0), multiple_of=8)
        )
    rates = _throughput(streams, size.lm_repeats)
    rows = []
    for base in [n for n in strats if n != "packing"]:
        note = f"ByteGPT(d={size.lm_d}), block {size.lm_block}; pad {pads[base]:.0%} -> {pads['packing']:.1%}"
        extra = {"pad_fraction_baseline": pads[base], "pad_fraction": pads["packing"], "target": TARGETS["packing"]}
        rows.append(_rate_row(f"LM packing vs {base}", rates, base, "packing", note, extra))
    return rows, tasks.length_stats(lengths, size.lm_block)


# ------------------------------------------------------------------------------------------ entry points
def run(
    quick: bool = True,
    *,
    tiny: bool = False,
    seed: int = 0,
    echo: bool = False,
    size: BenchSize | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> list[BenchRow]:
    """Measure the batching strategies on the stdlib-paragraph classifier and the packing of a tiny GPT.

    Args:
        quick: about a minute on 2 cores; ``False``: larger sizes, 2 epochs and more repeats (a few minutes).
        tiny: a few seconds, for tests (numbers meaningless).
        seed: data split, initial weights and batch orders.
        echo: print the length statistics while running.
        size: explicit sizes (overrides ``quick`` and ``tiny``).
        device: where the models train; batches are collated on the CPU (as a ``DataLoader`` does) and moved there
            before each step, so the collation's time is counted in every strategy's tokens/s.
        dtype: ``torch.bfloat16`` or ``torch.float16`` for autocast mixed precision; ``None``: fp32.

    Returns:
        :class:`BenchRow` s: non-pad tokens/s and time to the baseline's final accuracy of each strategy against
        pad-to-max, then packing against per-document padding; ``ratio`` > 1: the candidate is faster. Every row's
        ``extra["lengths"]`` holds the length statistics of its data.
    """
    size = size or SIZES["tiny" if tiny else "quick" if quick else "full"]
    task = tasks.snippet_task(size.max_len, size.per_class, size.val_per_class, seed=seed)
    stats = tasks.length_stats(task.train.lengths, size.max_len)
    if echo:
        print(f"classifier data: {len(task.train)} train / {len(task.val)} val paragraphs; {tasks.describe(stats)}")
    dev = torch.device(device)
    rows = _classifier_rows(task, size, seed, dev, dtype)
    lm_rows, lm_stats = _lm_rows(size, seed, dev, dtype)
    if echo:
        print(f"LM documents: {size.lm_docs} pieces of <= {size.lm_block} tokens; {tasks.describe(lm_stats)}")
    for row in rows:
        row.extra["lengths"] = stats
    for row in lm_rows:
        row.extra["lengths"] = lm_stats
    return rows + lm_rows


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lightning_speedups.benchmarks.sequences [--quick | --full] [--json PATH] [--threads N]``."""
    import argparse

    from lightning_speedups.benchmarks.runner import format_table, write_json
    from lightning_speedups.measure import machine_info

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="about a minute on 2 cores (the default)")
    mode.add_argument("--full", action="store_true", help="larger sizes, 2 epochs, more repeats (a few minutes)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows and the machine as JSON")
    parser.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine_info())
    start = time.perf_counter()
    rows = run(quick=not args.full, seed=args.seed, echo=True)
    print(format_table(rows))
    print(f"({'full' if args.full else 'quick'} mode, {time.perf_counter() - start:.1f} s)")
    if args.json:
        write_json(args.json, rows, {}, quick=not args.full)


if __name__ == "__main__":  # pragma: no cover
    main()
