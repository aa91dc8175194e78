"""The gradient noise scale: how many more samples a larger batch needs to reach the same loss.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training") model the samples a run needs to reach a loss,
with the learning rate tuned for each batch size, as ``E(B) = E_min * (1 + B / B_noise)``: far below the noise
scale ``B_noise`` a larger batch needs no more samples, far above it twice the batch needs twice the samples. They
estimate ``B_noise`` by ``B_simple = tr(Sigma) / |G|^2`` (the per-sample gradient variance over the squared true
gradient) from gradients of independent batches. So doubling the batch (with its lr scaled) costs
:func:`doubling_sample_cost` ``= (1 + 2r) / (1 + r)`` times the samples, ``r = B / B_simple``: a larger batch pays
only when its samples/s rises by more than that.

:func:`gradient_noise_scale` measures it from ``n`` batches of one size on a plain ``nn.Module``: with the batch
gradients ``G_i``, the mean of ``G_i . G_j`` over pairs ``i != j`` estimates ``|G|^2`` without bias, and the mean of
``|G_i|^2`` minus that estimates ``tr(Sigma) / B``. A jackknife over the batches gives the upper bound of ``r`` the
decision uses (the measurement is taken before training, where the noise scale is smallest: it errs toward the
larger cost). Large models are sketched (a count sketch keeps every inner product in expectation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["NoiseScale", "doubling_sample_cost", "gradient_noise_scale"]

SKETCH_DIM = 2**20  # models with more parameters are sketched to this many numbers per batch gradient


def doubling_sample_cost(ratio: float) -> float:
    """Samples to the same loss at twice the batch over at the batch, for ``ratio`` = batch / noise scale
    (``(1 + 2 r) / (1 + r)``: 1.0 far below the noise scale, 2.0 far above it; ``inf`` counts as far above).

    Example::

        >>> doubling_sample_cost(0.0), round(doubling_sample_cost(1.0), 3), doubling_sample_cost(math.inf)
        (1.0, 1.5, 2.0)
    """
    if math.isinf(ratio):
        return 2.0
    r = max(ratio, 0.0)
    return (1.0 + 2.0 * r) / (1.0 + r)


@dataclass
class NoiseScale:
    """What :func:`gradient_noise_scale` measured at ``batch_size`` from ``batches`` batches.

    ``grad_sq``: the estimate of ``|G|^2``; ``noise``: of ``tr(Sigma) / batch_size``; ``ratio``: of ``batch_size /
    B_simple`` (``grad_sq / noise``) and ``ratio_high`` its upper bound (the estimate plus ``z`` jackknife standard
    errors, ``inf`` when the batches cannot bound it).
    """

    batch_size: int
    batches: int
    grad_sq: float
    noise: float
    ratio: float
    ratio_high: float

    @property
    def b_simple(self) -> float:
        """The noise scale ``B_simple`` in samples (``inf`` when no signal was measured)."""
        return self.batch_size / self.ratio if self.ratio > 0 else math.inf

    def doubling_cost(self, scale: int = 1) -> float:
        """The upper bound of the samples a doubling from ``scale`` x ``batch_size`` needs, over that batch's."""
        return doubling_sample_cost(self.ratio_high * scale)


def _sketch(grads: list[torch.Tensor], dim: int, seed: int = 0) -> torch.Tensor:
    """The gradients as one vector: flat when they hold at most ``dim`` numbers, else a count sketch of ``dim``
    buckets (each number added with a seeded random sign to a seeded random bucket: inner products are kept in
    expectation)."""
    total = sum(g.numel() for g in grads)
    if total <= dim:
        return torch.cat([g.reshape(-1).float() for g in grads])
    out = torch.zeros(dim, device=grads[0].device)
    for k, g in enumerate(grads):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + k)
        bucket = torch.randint(dim, (g.numel(),), generator=gen).to(g.device)
        sign = (torch.randint(2, (g.numel(),), generator=gen) * 2 - 1).to(g.device, torch.float32)
        out.index_add_(0, bucket, g.reshape(-1).float() * sign)
    return out


def _ratio(gram: torch.Tensor) -> tuple[float, float, float]:
    """``(|G|^2, tr(Sigma) / B, ratio)`` from the Gram matrix of the batch gradients."""
    n = gram.shape[0]
    diag = torch.diagonal(gram)
    grad_sq = float((gram.sum() - diag.sum()) / (n * (n - 1)))
    noise = float(diag.mean()) - grad_sq
    return grad_sq, noise, (grad_sq / noise if noise > 0 else math.inf)


def gradient_noise_scale(
    model: nn.Module,
    batches: Iterable[Any],
    loss: Callable[[nn.Module, Any, int], torch.Tensor],
    *,
    z: float = 2.0,
    sketch_dim: int = SKETCH_DIM,
) -> NoiseScale | None:
    """Measure the gradient noise scale of ``model`` from ``batches`` (at least 3, all of one size, on the model's
    device): one backward pass of ``loss(model, batch, index)`` each, the gradients kept as vectors (sketched for
    large models). The model's gradients are left as they were; its weights are not changed (no optimizer step),
    but its buffers are (batch-norm statistics: pass a copy).

    Returns:
        A :class:`NoiseScale`, or ``None`` when fewer than 3 batches of the first batch's size came or the
        per-batch gradients show no noise to measure.

    Example::

        >>> torch.manual_seed(0) and None
        >>> net = nn.Linear(8, 1)
        >>> data = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(6)]
        >>> mse = lambda m, b, i: nn.functional.mse_loss(m(b[0]), b[1])
        >>> scale = gradient_noise_scale(net, data, mse)
        >>> scale.batches, scale.batch_size, 1.0 <= scale.doubling_cost() <= 2.0
        (6, 16, True)
    """
    from lightning.pytorch.utilities.data import extract_batch_size

    params = [p for p in model.parameters() if p.requires_grad]
    saved = [None if p.grad is None else p.grad.detach().clone() for p in params]
    vectors: list[torch.Tensor] = []
    size = None
    try:
        for i, batch in enumerate(batches):
            n = extract_batch_size(batch)
            size = n if size is None else size
            if n != size:
                continue  # a last, partial batch: the estimate needs one batch size
            for p in params:
                p.grad = None
            loss(model, batch, i).backward()
            grads = [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in params]
            vectors.append(_sketch(grads, sketch_dim))
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    if len(vectors) < 3 or size is None:
        return None
    stacked = torch.stack(vectors).double()
    gram = stacked @ stacked.T
    grad_sq, noise, ratio = _ratio(gram)
    if noise <= 0:
        return None
    keep = torch.ones(len(vectors), dtype=torch.bool)
    loo = []
    for j in range(len(vectors)):  # jackknife: the ratio without batch j
        keep[j] = False
        loo.append(_ratio(gram[keep][:, keep])[2])
        keep[j] = True
    n = len(loo)
    if any(math.isinf(r) for r in loo):
        high = math.inf
    else:
        mean = sum(loo) / n
        se = math.sqrt((n - 1) / n * sum((r - mean) ** 2 for r in loo))
        high = max(ratio, 0.0) + z * se
    return NoiseScale(size, len(vectors), grad_sq, noise, ratio, high)
