"""Muon for the hidden matrices, AdamW for everything else, as one optimizer Lightning can schedule and checkpoint.

Muon (Keller Jordan, 2024) replaces each hidden weight matrix's momentum update by its nearest semi-orthogonal
matrix (a few Newton-Schulz iterations), which set the modded-nanogpt and airbench speedrun records. It is meant for
the matrices inside the network only: the token embedding, the output head and every bias, norm or other vector train
with AdamW (Keller Jordan's ``MuonWithAuxAdam`` and OLMo-core split the parameters the same way).

:class:`MuonWithAdamW` is that hybrid as a single ``torch.optim.Optimizer``: every param group carries ``use_muon``
(and ``muon_kind``: ``"matrix"`` or ``"conv"``), the 2-D groups are stepped by :class:`torch.optim.Muon` itself and the
rest by :class:`torch.optim.AdamW`, so LR schedulers, ``lr_mult`` groups, gradient clipping, GradScaler, checkpoints
and DDP see one optimizer. With ``adjust_lr_fn="match_rms_adamw"`` (the default here, the Moonlight report) each
matrix's update is scaled to the RMS an AdamW update has, so one learning rate and weight decay serve both parts and
the AdamW lr a user already has carries over.

Convolution kernels are matrices too when viewed as ``(out_channels, in_channels * kh * kw)`` (airbench does this);
torch's Muon takes 2-D tensors only, so ``conv="muon"`` steps them here with the same update on that view. The default
``conv="adamw"`` keeps them on AdamW (see ``docs/evidence.md``, section "Fewer steps", for the measurement).

Which tensor goes where (:func:`assign_muon`):

- Muon: 2-D weights of the layers inside the network (``nn.Linear``, HF ``Conv1D``, attention projections, RNN
  matrices), and with ``conv="muon"`` convolution kernels other than the first one (the input stem);
- AdamW: embeddings and anything tied to one, the output head (by name, or the last linear layer registered), every
  tensor that is not 2-D (biases, norm weights, position embeddings, class tokens).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups._heads import find_heads, is_linear_like

__all__ = [
    "ADJUST_LR_FNS",
    "CONV_MODES",
    "MuonAssignment",
    "MuonWithAdamW",
    "NS_DTYPES",
    "assign_muon",
    "newton_schulz_dtype",
    "muon_from_optimizer",
    "muon_param_groups",
]

ADJUST_LR_FNS = ("match_rms_adamw", "original", "spectral_unclamped")
NS_DTYPES = ("auto", "bfloat16", "float32")
CONV_MODES = ("adamw", "muon")
_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
# Newton-Schulz quintic coefficients from Keller Jordan's Muon post (the ones torch.optim.Muon uses)
_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


@dataclass
class MuonAssignment:
    """Which parameters :func:`assign_muon` gave to Muon and to AdamW, by name, with the reason for each AdamW one.

    Attributes:
        muon: names of the matrices (and conv kernels with ``conv="muon"``) Muon steps.
        adamw: ``{name: reason}`` for the rest (``"embedding"``, ``"head"``, ``"tied embedding"``, ``"conv"``,
            ``"input conv"``, ``"not 2-D"``).
        conv: the convolution policy used (``"adamw"`` or ``"muon"``).
    """

    muon: list[str] = field(default_factory=list)
    adamw: dict[str, str] = field(default_factory=dict)
    conv: str = "adamw"

    def to_text(self) -> str:
        """One line: the Muon matrices (names folded over layer indices) and the AdamW tensors counted by reason.

        :meth:`details` lists every name."""
        reasons: dict[str, int] = {}
        for why in self.adamw.values():
            reasons[why] = reasons.get(why, 0) + 1
        adamw = ", ".join(f"{count} {why}" for why, count in reasons.items())
        return (
            f"Muon: {len(self.muon)} matrices ({_fold(self.muon, 1)}); AdamW: {len(self.adamw)} ({adamw or 'none'}); "
            f"convs on {'Muon' if self.conv == 'muon' else 'AdamW'}"
        )

    def details(self) -> str:
        """Every tensor by name, one line each: ``muon  name`` or ``adamw name  (reason)``."""
        lines = [f"muon  {name}" for name in self.muon]
        lines += [f"adamw {name}  ({why})" for name, why in self.adamw.items()]
        return "\n".join(lines)


def _fold(names: list[str], limit: int) -> str:
    """Names with numeric path parts folded to ``*`` (``blocks.*.qkv.weight``), the first ``limit`` kinds shown."""
    folded = list(dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", ".*", n) for n in names))
    shown = ", ".join(folded[:limit])
    return shown + (f", +{len(folded) - limit} more" if len(folded) > limit else "")


def _owners(module: nn.Module) -> dict[int, tuple[nn.Parameter, list[tuple[str, nn.Module]]]]:
    """``id(param) -> (param, [(qualified name, owning module), ...])``: every module that holds it (tied twice)."""
    owners: dict[int, tuple[nn.Parameter, list[tuple[str, nn.Module]]]] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for p_name, p in mod.named_parameters(recurse=False):
            owners.setdefault(id(p), (p, []))[1].append((f"{mod_name}.{p_name}" if mod_name else p_name, mod))
    return owners


def _head_modules(module: nn.Module) -> list[str]:
    """Names of the output heads: by name or by a tie to an embedding (:func:`find_heads`), else the last linear
    layer (the width rule would need a forward; the last linear layer is the head of the models that lack the rest)."""
    heads = [h.name for h in find_heads(module, max_depth=1)]
    if heads:
        return heads
    linears = [n for n, m in module.named_modules() if is_linear_like(m)]
    return linears[-1:]


def assign_muon(module: nn.Module, conv: str = "adamw") -> tuple[dict[int, str], MuonAssignment]:
    """Decide, per parameter of ``module``, whether Muon or AdamW steps it.

    Args:
        module: the model (names and module types drive the split; tied weights are seen through every owner).
        conv: ``"adamw"`` (convolution kernels on AdamW) or ``"muon"`` (as ``(out, in * k...)`` matrices, except the
            first convolution registered, the input stem).

    Returns:
        ``({id(param): "matrix" | "conv" | "adamw"}, MuonAssignment)``.

    Raises:
        SpeedupConfigError: ``conv`` not in :data:`CONV_MODES`, or no parameter Muon could take.

    Example::

        >>> net = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 10))
        >>> kinds, report = assign_muon(net)
        >>> report.muon, report.adamw
        (['1.weight'], {'0.weight': 'embedding', '1.bias': 'not 2-D', '3.weight': 'head', '3.bias': 'head'})
    """
    check_choice("conv", conv, CONV_MODES)
    heads = _head_modules(module)
    first_conv = next((n for n, m in module.named_modules() if isinstance(m, _CONVS)), None)
    kinds: dict[int, str] = {}
    report = MuonAssignment(conv=conv)
    for pid, (p, holders) in _owners(module).items():
        name = holders[0][0]
        why = _adamw_reason(p, holders, heads, conv, first_conv)
        if why is None:
            kinds[pid] = "conv" if p.ndim > 2 else "matrix"
            report.muon.append(name)
        else:
            kinds[pid] = "adamw"
            report.adamw[name] = why
    if not report.muon:
        raise SpeedupConfigError(
            f"`name`='muon' found no hidden matrix to orthogonalise in {type(module).__name__} (every parameter is an "
            "embedding, the output head, a vector or a convolution kernel). Allowed values: a model with 2-D weights "
            "inside the network, or another optimizer. HINT: for a CNN try OptimizerConfig('muon', kwargs={'conv': "
            "'muon'}); otherwise use 'adamw'."
        )
    return kinds, report


def _adamw_reason(
    p: torch.Tensor,
    holders: list[tuple[str, nn.Module]],
    heads: list[str],
    conv: str,
    first_conv: str | None,
) -> str | None:
    """Why AdamW steps ``p`` (``None``: Muon does)."""
    modules = [n.rsplit(".", 1)[0] if "." in n else "" for n, _ in holders]
    if any(isinstance(m, _EMBEDDINGS) for _, m in holders):
        return "embedding" if len(holders) == 1 else "tied embedding"
    if any(m == h or m.startswith(h + ".") for m in modules for h in heads):
        return "head"
    if any(isinstance(m, _CONVS) for _, m in holders) and p.ndim > 2:
        if conv == "adamw":
            return "conv"
        return "input conv" if first_conv in modules else None
    if p.ndim != 2:
        return "not 2-D"
    return None


def _split_group(group: Mapping[str, Any], kinds: Mapping[int, str]) -> list[dict[str, Any]]:
    """One user group split by kind: ``name`` gets ``/muon`` or ``/muon_conv`` for the Muon parts."""
    parts: dict[str, list[torch.Tensor]] = {}
    for p in group["params"]:
        parts.setdefault(kinds.get(id(p), "adamw"), []).append(p)
    out = []
    for kind in ("adamw", "matrix", "conv"):
        if kind not in parts:
            continue
        new = {k: v for k, v in group.items() if k != "params"}
        new["params"] = parts[kind]
        new["use_muon"] = kind != "adamw"
        new["muon_kind"] = kind
        if kind != "adamw" and "name" in new:
            new["name"] = f"{new['name']}/{'muon' if kind == 'matrix' else 'muon_conv'}"
        out.append(new)
    return out


def muon_param_groups(
    module: nn.Module, groups: Iterable[Mapping[str, Any]], conv: str = "adamw"
) -> tuple[list[dict[str, Any]], MuonAssignment]:
    """Split the param groups of ``module`` (as :func:`~lightning_speedups.optim.build_param_groups` or a user built
    them) into Muon and AdamW groups, keeping every group's own settings (lr, weight decay, ``lr_mult``, name).

    Example::

        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> groups, report = muon_param_groups(net, [{"params": list(net.parameters()), "lr": 0.01}])
        >>> [(len(g["params"]), g["use_muon"]) for g in groups]
        [(3, False), (1, True)]
    """
    kinds, report = assign_muon(module, conv)
    out = [part for g in groups for part in _split_group(g, kinds)]
    return out, report


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer: :class:`torch.optim.Muon` on the groups with ``use_muon=True``, AdamW on the others.

    Build it with :func:`~lightning_speedups.optim.create_optimizer` (``OptimizerConfig("muon", ...)``), from a
    user's optimizer with :func:`muon_from_optimizer`, or directly from groups that carry ``use_muon``.

    Args:
        params: param groups; each may set ``use_muon`` (default ``False``) and ``muon_kind`` (``"matrix"`` or
            ``"conv"``, default from the tensors' shape).
        lr: learning rate of both parts (with ``adjust_lr_fn="match_rms_adamw"`` the same lr suits both).
        weight_decay: decoupled weight decay of both parts.
        momentum: Muon's momentum (0.95, Nesterov).
        nesterov: Nesterov momentum for Muon.
        betas: AdamW's betas.
        eps: AdamW's epsilon.
        adjust_lr_fn: how Muon scales each matrix's update (see :class:`torch.optim.Muon`): ``"match_rms_adamw"``
            (the RMS of an AdamW update, so AdamW's lr carries over), ``"original"`` (Keller Jordan's, which wants
            lrs near 0.02) or ``"spectral_unclamped"``.
        ns_steps: Newton-Schulz iterations.
        ns_dtype: the dtype of the Newton-Schulz iterations: ``"bfloat16"`` (torch's Muon, fast where bf16 matmuls
            are), ``"float32"`` (CPUs without bf16 units emulate bf16 at a fraction of fp32's speed), or ``"auto"``:
            bf16 on a GPU, and on a CPU whichever of the two :func:`newton_schulz_dtype` times faster on it.
        warmup_steps: the first steps ramp every group's lr linearly up to its value (on top of any scheduler); a
            short warm-up keeps Muon's first, largest updates from spiking the loss. 0 disables it.
        fused: AdamW's fused kernel (``None``: torch's default).
        foreach: AdamW's foreach kernel (``None``: torch's default).

    Example::

        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> groups, _ = muon_param_groups(net, [{"params": list(net.parameters())}])
        >>> opt = MuonWithAdamW(groups, lr=1e-3, warmup_steps=0)
        >>> net(torch.randn(3, 4)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[net[0].weight]), sorted(opt.state[net[2].weight])
        (['momentum_buffer'], ['exp_avg', 'exp_avg_sq', 'step'])
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adjust_lr_fn: str = "match_rms_adamw",
        ns_steps: int = 5,
        ns_dtype: str = "auto",
        warmup_steps: int = 10,
        fused: bool | None = None,
        foreach: bool | None = None,
    ) -> None:
        check_range("lr", lr, 0, None, low_inclusive=False)
        check_range("weight_decay", weight_decay, 0, None)
        check_range("momentum", momentum, 0, 1, high_inclusive=False)
        check_choice("adjust_lr_fn", adjust_lr_fn, ADJUST_LR_FNS)
        check_int("ns_steps", ns_steps, 1, 99)
        check_choice("ns_dtype", ns_dtype, NS_DTYPES)
        check_int("warmup_steps", warmup_steps, 0)
        self._adamw = torch.optim.AdamW([torch.zeros(1)], lr=lr, betas=betas, eps=eps, fused=fused, foreach=foreach)
        self._muon = torch.optim.Muon([torch.zeros(1, 1)], lr=lr, momentum=momentum, adjust_lr_fn=adjust_lr_fn)
        defaults = dict(self._adamw.defaults)
        defaults.update(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            ns_coefficients=_NS_COEFFICIENTS,
            ns_dtype=ns_dtype,
            use_muon=False,
            warmup_steps=warmup_steps,
            steps_taken=0,
        )
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; ``use_muon=True`` groups must hold matrices (2-D) or, with ``muon_kind="conv"``, kernels."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if not group["use_muon"]:
            group["muon_kind"] = "adamw"
            return
        dims = {p.ndim for p in group["params"]}
        group.setdefault("muon_kind", "matrix" if dims <= {2} else "conv")
        if (group["muon_kind"] == "matrix" and dims - {2}) or (group["muon_kind"] == "conv" and min(dims) < 3):
            raise SpeedupConfigError(
                f"`use_muon`=True on a group {group.get('name', '')!r} whose tensors have {sorted(dims)} dimensions "
                f"as muon_kind={group['muon_kind']!r}. Allowed values: 2-D matrices (muon_kind='matrix') or "
                "convolution kernels of 3+ dimensions (muon_kind='conv'). HINT: build the groups with "
                "muon_param_groups(model, groups)."
            )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step of both parts (the closure, if any, is evaluated once, first)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        saved = [g["lr"] for g in self.param_groups]
        for g in self.param_groups:
            g["lr"] = g["lr"] * _warmup_factor(g)
            g["steps_taken"] += 1
        try:
            adamw = [g for g in self.param_groups if g["muon_kind"] == "adamw"]
            muon = [(g, _ns_dtype(g)) for g in self.param_groups if g["muon_kind"] != "adamw"]
            self._step_part(self._adamw, adamw)
            # matrices with bf16 Newton-Schulz: torch's own Muon; kernels and fp32 iterations: our step
            self._step_part(self._muon, [g for g, d in muon if g["muon_kind"] == "matrix" and d == torch.bfloat16])
            for g, dtype in muon:
                if g["muon_kind"] == "conv" or dtype != torch.bfloat16:
                    self._own_step(g, dtype)
        finally:
            for g, lr in zip(self.param_groups, saved):
                g["lr"] = lr
        return loss

    def _step_part(self, inner: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> None:
        # the inner optimizer steps our groups (shared dicts) and our state, whatever replaced them since (a resume,
        # a rebuild after pruning): it never holds a parameter of its own
        if not groups:
            return
        inner.param_groups = groups
        inner.state = self.state
        inner.step()

    def _own_step(self, group: dict[str, Any], dtype: torch.dtype) -> None:
        """Muon's update, as ``torch.optim.Muon`` makes it, with the Newton-Schulz iterations in ``dtype``; a kernel is
        viewed as its ``(out, in * k...)`` matrix (torch's Muon takes 2-D tensors only)."""
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad.reshape(p.shape[0], -1)
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad)
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - group["momentum"])
            update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
            update = _orthogonalize(update, group["ns_steps"], group["eps"], dtype)
            p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(update.view_as(p), alpha=-group["lr"] * _lr_ratio(group["adjust_lr_fn"], update.shape))


# device type -> the Newton-Schulz dtype "auto" chose there (measured once per process on a CPU)
_NS_CHOICE: dict[str, torch.dtype] = {}


def _ns_dtype(group: Mapping[str, Any]) -> torch.dtype:
    if group["ns_dtype"] != "auto":
        return getattr(torch, group["ns_dtype"])
    return newton_schulz_dtype(group["params"][0].device)


def newton_schulz_dtype(device: torch.device | str, size: tuple[int, int] = (256, 1024)) -> torch.dtype:
    """The faster dtype for Muon's Newton-Schulz iterations on ``device``: bf16 on a GPU; on a CPU, timed once.

    A CPU with bf16 units (AMX, AVX512-BF16) runs the iterations' matmuls in bf16 faster than in fp32, one without
    them emulates bf16 several times slower. One iteration set on a ``size`` matrix in each dtype (after a warm-up
    pass, the faster of three) decides, and the choice is kept for the process.

    Example::

        >>> newton_schulz_dtype("cpu") in (torch.bfloat16, torch.float32)
        True
    """
    device = torch.device(device)
    if device.type != "cpu":
        return torch.bfloat16
    if "cpu" not in _NS_CHOICE:
        matrix = torch.randn(size, generator=torch.Generator().manual_seed(0))
        seconds = {}
        for dtype in (torch.float32, torch.bfloat16):
            _orthogonalize(matrix, 5, 1e-7, dtype)
            times = []
            for _ in range(3):
                start = time.perf_counter()
                _orthogonalize(matrix, 5, 1e-7, dtype)
                times.append(time.perf_counter() - start)
            seconds[dtype] = min(times)
        _NS_CHOICE["cpu"] = min(seconds, key=seconds.__getitem__)
    return _NS_CHOICE["cpu"]


def _warmup_factor(group: Mapping[str, Any]) -> float:
    warm = group["warmup_steps"]
    return 1.0 if group["steps_taken"] >= warm else (group["steps_taken"] + 1) / (warm + 1)


def _lr_ratio(adjust_lr_fn: str, shape: torch.Size) -> float:
    """The update scale ``torch.optim.Muon`` applies for ``adjust_lr_fn`` (its documented formulas)."""
    rows = shape[0]
    cols = shape[1]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr_fn == "spectral_unclamped":
        return math.sqrt(rows / cols)
    return math.sqrt(max(1.0, rows / cols))


def _orthogonalize(matrix: torch.Tensor, steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """The nearest semi-orthogonal matrix, approximately: Newton-Schulz's quintic iteration in ``dtype``, with the
    same operations as ``torch.optim.Muon`` (in bf16, a kernel steps exactly as its matrix would there)."""
    a, b, c = _NS_COEFFICIENTS
    x = matrix.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def muon_from_optimizer(
    optimizer: torch.optim.Optimizer, module: nn.Module, conv: str = "adamw", **kwargs: Any
) -> MuonWithAdamW:
    """The user's optimizer as a Muon hybrid: the same groups (lr, weight decay, names) split into Muon and AdamW.

    Adam-type ``betas`` and ``eps`` carry over to the AdamW part; each group's lr and weight decay to both parts
    (with ``adjust_lr_fn="match_rms_adamw"`` an Adam-type lr suits Muon too). The new optimizer's
    ``group_sources[i]`` is the index of the user's group that its group ``i`` came from (for the LR schedulers). To
    train at another lr, scale the result with :func:`~lightning_speedups.optim.lr_scaling.scale_optimizer_lrs`.

    Args:
        optimizer: the optimizer ``configure_optimizers`` built (its state is not carried: call it before training).
        module: the model whose parameters ``optimizer`` holds.
        conv: see :func:`assign_muon`.
        kwargs: :class:`MuonWithAdamW` arguments (``momentum``, ``adjust_lr_fn``, ``warmup_steps``...).

    Example::

        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> muon = muon_from_optimizer(torch.optim.AdamW(net.parameters(), lr=3e-3), net)
        >>> [(g["lr"], g["use_muon"]) for g in muon.param_groups], muon.group_sources
        ([(0.003, False), (0.003, True)], [0, 0])
    """
    base = optimizer.defaults
    kinds, report = assign_muon(module, conv)
    split: list[dict[str, Any]] = []
    sources: list[int] = []
    for index, group in enumerate(optimizer.param_groups):
        parts = _split_group({k: v for k, v in group.items() if k in _CARRIED_GROUP_KEYS}, kinds)
        split += parts
        sources += [index] * len(parts)
    args: dict[str, Any] = {"lr": float(base.get("lr", 1e-3)), "weight_decay": base.get("weight_decay", 0.0)}
    if "betas" in base:
        args["betas"] = tuple(base["betas"])
    if "eps" in base:
        args["eps"] = base["eps"]
    args.update(kwargs)
    muon = MuonWithAdamW(split, **args)
    muon.assignment = report  # type: ignore[attr-defined]
    muon.group_sources = sources  # type: ignore[attr-defined]
    return muon


# what a user's param group carries into the hybrid (the rest are the user optimizer's own settings)
_CARRIED_GROUP_KEYS = (
    "params",
    "lr",
    "weight_decay",
    "name",
    "lr_mult",
    "initial_lr",
    "max_lr",
    "min_lr",
    "betas",
    "max_momentum",
    "base_momentum",
)


def create_muon(
    param_groups: list[dict[str, Any]],
    module: nn.Module | None = None,
    conv: str = "adamw",
    fused: bool | None = None,
    foreach: bool | None = None,
    **kwargs: Any,
) -> MuonWithAdamW:
    """Registry factory for ``"muon"``: split the groups of ``module`` and report the split once (rank 0).

    ``conv`` and the :class:`MuonWithAdamW` arguments come from ``OptimizerConfig.kwargs``; ``fused`` / ``foreach``
    choose the AdamW part's kernel (``implementation``)."""
    if module is None:
        raise SpeedupConfigError(
            "`name`='muon' needs the module, not a list of parameters: the split into hidden matrices (Muon) and "
            "embeddings, head and vectors (AdamW) reads the module's layers. Allowed values: "
            "create_optimizer(model, OptimizerConfig('muon', ...))."
        )
    groups, report = muon_param_groups(module, param_groups, conv)
    optimizer = MuonWithAdamW(groups, fused=fused, foreach=foreach, **kwargs)
    optimizer.assignment = report  # type: ignore[attr-defined]
    _report_once(report)
    return optimizer


_REPORTED: list[str] = []


def _report_once(report: MuonAssignment) -> None:
    """Say the split once: a rebuild of the same optimizer (a resume, a pruning rebuild) that splits alike is quiet."""
    text = report.to_text()
    if _REPORTED and _REPORTED[-1] == text:
        return
    _REPORTED[:] = [text]
    rank_zero_info(f"[lightning-speedups] muon: {text}")
