"""Quantization benchmark on the digits demo: int8 inference latency, size and accuracy after PTQ and after QAT.

An MLP (1024 -> H -> H -> 10) is trained in float32 and, from the same initialisation and batches, with QAT fake
quantization; both are converted with :func:`quantize_for_inference`. Reported: fp32 vs int8 latency ratio on a batch
of 64, model size ratio, accuracy of each int8 model against the fp32 one, and what QAT costs in training time
(ratio < 1: QAT is slower to train). Run ``python -m lightning_speedups.benchmarks.quantization [--full]``.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.demo import load_digits_tensors
from lightning_speedups.functional.quantization import prepare_qat, quantize_for_inference
from lightning_speedups.measure import median

__all__ = ["run"]


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = load_digits_tensors(size=32, channels=1)
    x = (x.float() / 255.0 - 0.21) / 0.34
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x = x[perm]
    y = y[perm]
    n_train = int(0.8 * len(x))
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _mlp(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(1024, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )


def _train_epoch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, epoch: int) -> float:
    model.train()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))  # same batches for both models
    start = time.perf_counter()
    for i in range(0, len(x), 64):
        idx = order[i : i + 64]
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - start


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(1) == y).float().mean())


def run(quick: bool = True) -> list[BenchRow]:
    """Train fp32 and QAT MLPs on digits, convert both to int8, return the benchmark rows."""
    # long: a benchmark script: one measurement after another, read top to bottom
    hidden, epochs, backend = (1024, 3, "eager_dynamic") if quick else (4096, 6, "auto")
    xtr, ytr, xva, yva = _data()
    torch.manual_seed(0)
    fp32 = _mlp(hidden)
    qat = copy.deepcopy(fp32)
    prepare_qat(qat)  # fake quantization from the start, same init and batches as the fp32 run
    opts = {"fp32": torch.optim.Adam(fp32.parameters(), 1e-3), "qat": torch.optim.Adam(qat.parameters(), 1e-3)}
    times: dict[str, list[float]] = {"fp32": [], "qat": []}
    for epoch in range(epochs):  # interleaved epochs: machine noise hits both alike
        times["fp32"].append(_train_epoch(fp32, opts["fp32"], xtr, ytr, epoch))
        times["qat"].append(_train_epoch(qat, opts["qat"], xtr, ytr, epoch))
    acc_fp32 = _accuracy(fp32, xva, yva)
    acc_qat_fake = _accuracy(qat, xva, yva)

    example = xva[:64]
    repeats = 7 if quick else 15
    ptq_model, ptq = quantize_for_inference(fp32, example, backend, repeats=repeats)
    qat_model, qrep = quantize_for_inference(qat, example, backend, repeats=repeats)
    acc_ptq = _accuracy(ptq_model, xva, yva)
    acc_qat = _accuracy(qat_model, xva, yva)
    shape = f"MLP 1024-{hidden}-{hidden}-10, batch 64"

    def note(speedup: float) -> str:
        return "no speedup" if speedup <= 1.0 else ""

    return [
        BenchRow(
            "qat",
            f"int8 PTQ ({ptq.backend})",
            "inference latency",
            ptq.latency_before_s,
            ptq.latency_after_s,
            ptq.speedup,
            "s",
            acc_fp32,
            acc_ptq,
            note(ptq.speedup) or shape,
            {"size_ratio": ptq.size_ratio, "max_abs_diff": ptq.max_abs_diff, "candidates": ptq.candidates},
        ),
        BenchRow(
            "qat",
            f"int8 after QAT ({qrep.backend})",
            "inference latency",
            qrep.latency_before_s,
            qrep.latency_after_s,
            qrep.speedup,
            "s",
            acc_fp32,
            acc_qat,
            note(qrep.speedup) or shape,
            {"size_ratio": qrep.size_ratio, "max_abs_diff": qrep.max_abs_diff},
        ),
        BenchRow(
            "qat",
            "int8 model size",
            "state_dict bytes",
            ptq.size_before_bytes,
            ptq.size_after_bytes,
            ptq.size_ratio,
            "bytes",
            acc_fp32,
            acc_ptq,
            "ratio = times smaller",
        ),
        BenchRow(
            "qat",
            "QAT training cost",
            "epoch time",
            median(times["fp32"]),
            median(times["qat"]),
            median(times["fp32"]) / median(times["qat"]),
            "s",
            acc_fp32,
            acc_qat_fake,
            "ratio < 1: QAT trains slower (fake quantization); it buys int8 accuracy, not training speed",
            {"epochs": epochs},
        ),
    ]


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
