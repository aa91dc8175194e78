"""Mask pruning that every parent module sees: weight masks as ``torch.nn.utils.parametrize`` parametrizations.

``torch.nn.utils.prune`` recomputes ``weight = weight_orig * weight_mask`` in a forward *pre-hook* of the pruned
module. A parent that reads the weight without calling the module (``nn.MultiheadAttention`` reads
``out_proj.weight``) gets a stale tensor from the previous step's graph, and the second ``backward`` fails.
A parametrization recomputes ``weight`` on every attribute access instead, so it is correct wherever the weight is
read, and the original ``nn.Parameter`` object is kept (optimizers and DDP need no rebuild).

Any weight tensor can be masked, not only ``weight``: recurrent layers' ``weight_ih_l0`` / ``weight_hh_l0`` are
masked the same way (their forward re-reads parametrized weights on every call). A mask stacks on a weight norm
(``torch.nn.utils.parametrizations.weight_norm``): cleaning and making permanent fold the mask into its ``(g, v)``
and keep the weight norm. Masks are keyed by :func:`mask_key`: the module's name for ``weight``, else the
parameter's name (``"rnn.weight_hh_l0"``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils import prune as torch_prune

from lightning_speedups._compat import is_weight_norm
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._structure import keep_metadata, register_state_dict_cleaner

__all__ = [
    "WeightMask",
    "attach_mask",
    "check_maskable",
    "clean_pruned_state_dict",
    "make_pruning_permanent",
    "mask_key",
    "masked_modules",
    "masked_tensor_names",
    "named_masks",
    "resolve_mask_key",
    "weight_mask",
]

# `<module>.parametrizations.<tensor>.<index>.mask`: a WeightMask's buffer in a state dict
_MASK_KEY = re.compile(r"^(?P<base>(?:.*\.)?)parametrizations\.(?P<name>[^.]+)\.(?P<index>\d+)\.mask$")


class WeightMask(nn.Module):
    """Parametrization ``weight -> weight * mask`` with the mask as a buffer (0 = pruned, 1 = kept)."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.mask


def weight_mask(module: nn.Module, name: str = "weight") -> torch.Tensor | None:
    """The pruning mask of ``module.<name>`` (a parametrization or a ``torch.nn.utils.prune`` hook), or ``None``.

    Example::

        >>> layer = nn.Linear(2, 2)
        >>> _ = attach_mask(layer, torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        >>> weight_mask(layer).tolist()
        [[1.0, 0.0], [1.0, 1.0]]
    """
    if parametrize.is_parametrized(module, name):
        for p in module.parametrizations[name]:  # type: ignore[index]
            if isinstance(p, WeightMask):
                return p.mask
    legacy = getattr(module, name + "_mask", None)  # masks made by torch.nn.utils.prune directly
    return legacy if isinstance(legacy, torch.Tensor) else None


def masked_tensor_names(module: nn.Module) -> list[str]:
    """Names of ``module``'s own tensors that carry a pruning mask (``["weight"]``, ``["weight_ih_l0", ...]``)."""
    names = []
    if parametrize.is_parametrized(module):
        plists = module.parametrizations.items()  # type: ignore[operator]
        names = [n for n, plist in plists if any(isinstance(p, WeightMask) for p in plist)]
    for buffer_name, _ in module.named_buffers(recurse=False):  # torch.nn.utils.prune's `<name>_orig` + `<name>_mask`
        base = buffer_name[: -len("_mask")]
        if buffer_name.endswith("_mask") and isinstance(module._parameters.get(base + "_orig"), torch.Tensor):
            names.append(base)
    return names


def masked_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{name: module}`` of every module with a masked weight tensor."""
    return {n: m for n, m in model.named_modules() if masked_tensor_names(m)}


def mask_key(module_name: str, name: str = "weight") -> str:
    """The key a mask is stored under: the module's name for ``weight``, else the parameter's name.

    Example::

        >>> mask_key("encoder.0"), mask_key("rnn", "weight_hh_l0")
        ('encoder.0', 'rnn.weight_hh_l0')
    """
    if name == "weight":
        return module_name
    return f"{module_name}.{name}" if module_name else name


def resolve_mask_key(model: nn.Module, key: str) -> tuple[nn.Module, str]:
    """``(module, tensor name)`` of a :func:`mask_key`; raises ``AttributeError`` for a name ``model`` lacks."""
    try:
        return model.get_submodule(key), "weight"
    except AttributeError:
        parent, _, name = key.rpartition(".")
        module = model.get_submodule(parent)
        if not isinstance(getattr(module, name, None), torch.Tensor):
            raise AttributeError(f"{type(module).__name__} has no tensor {name!r} (mask key {key!r})") from None
        return module, name


def named_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{mask_key: mask}`` of every masked tensor of ``model`` (the masks themselves, not copies)."""
    out: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        for name in masked_tensor_names(module):
            out[mask_key(module_name, name)] = weight_mask(module, name)  # type: ignore[assignment]
    return out


def check_maskable(module_name: str, module: nn.Module, name: str = "weight") -> None:
    """Raise unless a mask can stack on ``module.<name>``'s parametrizations (none, a mask, or a weight norm).

    Raises:
        SpeedupConfigError: another parametrization (spectral norm, orthogonal, ...) transforms the weight; a mask on
            top would not survive cleaning or making the pruning permanent.
    """
    if not parametrize.is_parametrized(module, name):
        return
    others = [p for p in module.parametrizations[name] if not isinstance(p, WeightMask)]  # type: ignore[index]
    if all(is_weight_norm(p) for p in others) and len(others) <= 1:
        return
    kinds = sorted({type(p).__name__ for p in others})
    where = f"`{mask_key(module_name, name)}` ({type(module).__name__})" if module_name else type(module).__name__
    raise SpeedupConfigError(
        f"{where} has the parametrizations {kinds!r} on `{name}`: "
        "a pruning mask stacks only on a weight norm. Allowed values: weights that are plain or weight-normed. "
        f"HINT: pass ignored_layers=[{module_name!r}] to leave it dense."
    )


def attach_mask(module: nn.Module, mask: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """Mask ``module.<name>`` in place; an existing mask is narrowed (a pruned weight stays pruned). Returns it.

    On a weight-normed tensor the mask is stacked after the weight norm: ``weight = mask * g * v / ||v||``.
    """
    tensor = getattr(module, name)
    mask = mask.to(device=tensor.device, dtype=tensor.dtype)
    current = weight_mask(module, name)
    if current is not None:
        current.copy_(mask * current)  # in place: no second parametrization, no memory growth
        return current
    check_maskable("", module, name)
    parametrize.register_parametrization(module, name, WeightMask(mask))
    return weight_mask(module, name)  # type: ignore[return-value]


def weight_norm_originals(model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """``{mask_key: {"original0": g, "original1": v}}`` (copies) of every masked, weight-normed tensor of ``model``.

    A cleaned state dict folds the mask into ``g`` and ``v``, which changes ``||v||``: the same weight, but not the
    same training from there. A resume puts these raw tensors back, so it trains as if it had not stopped.
    """
    out: dict[str, dict[str, torch.Tensor]] = {}
    for module_name, module in model.named_modules():
        for name in masked_tensor_names(module):
            plist = module.parametrizations[name]  # type: ignore[index]
            if any(is_weight_norm(p) for p in plist):
                out[mask_key(module_name, name)] = {
                    k: getattr(plist, k).detach().clone() for k in ("original0", "original1")
                }
    return out


def restore_weight_norm_originals(model: nn.Module, originals: dict[str, dict[str, torch.Tensor]]) -> None:
    """Copy :func:`weight_norm_originals` back into ``model``'s (masked) weight norms, in place."""
    for key, tensors in originals.items():
        module, name = resolve_mask_key(model, key)
        plist = module.parametrizations[name]  # type: ignore[index]
        with torch.no_grad():
            for k, value in tensors.items():
                getattr(plist, k).copy_(value)


def _fold_weight_norm(g: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g', v')`` with ``g' * v' / ||v'|| == mask * g * v / ||v||``: the mask folded into a weight norm.

    ``||.||`` runs over the dimensions where ``g`` has size 1 (``g`` is ``norm_except_dim(v)``). The masked entries
    of ``v`` become 0 and ``g`` is rescaled by ``||v * mask|| / ||v||``; a norm group the mask empties entirely keeps
    its ``v`` (a zero norm would give NaN) and gets ``g' = 0``.
    """
    gb = g.reshape([1] * (v.dim() - g.dim()) + list(g.shape))
    dims = [d for d in range(v.dim()) if gb.shape[d] == 1]
    vm = v * mask

    def norm(t: torch.Tensor) -> torch.Tensor:
        return t.pow(2).sum(dim=dims, keepdim=True).sqrt() if dims else t.abs()

    nv = norm(v)
    nvm = norm(vm)
    dead = nvm == 0
    g_new = torch.where(dead, torch.zeros_like(gb), gb * nvm / nv.clamp_min(torch.finfo(nv.dtype).tiny))
    return g_new.reshape(g.shape), torch.where(dead, v, vm)


def _remove_mask(module: nn.Module, name: str) -> None:
    """Fold the mask into ``module.<name>`` and drop it, keeping the same ``Parameter`` objects and any weight norm."""
    plist = module.parametrizations[name]  # type: ignore[index]
    index = next(i for i, p in enumerate(plist) if isinstance(p, WeightMask))
    if len(plist) == 1:
        parametrize.remove_parametrizations(module, name, leave_parametrized=True)
        return
    with torch.no_grad():  # stacked on a weight norm (check_maskable allows nothing else): fold into (g, v)
        g, v = _fold_weight_norm(plist.original0, plist.original1, plist[index].mask)
        plist.original0.copy_(g)
        plist.original1.copy_(v)
    del plist[index]  # ModuleList renumbers the parametrizations after it


def make_pruning_permanent(model: nn.Module) -> int:
    """Fold every mask into its weight, keeping the same ``nn.Parameter`` objects; return how many.

    Only the masks are removed: a weight norm under a mask stays (its ``g`` and ``v`` absorb the mask).
    """
    count = 0
    for module in model.modules():
        for name in masked_tensor_names(module):
            if parametrize.is_parametrized(module, name):
                _remove_mask(module, name)
                count += 1
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, torch_prune.BasePruningMethod):
                torch_prune.remove(module, hook._tensor_name)
                count += 1
    return count


def _clean_parametrized(out: dict[str, Any], key: str, dropped: list[str]) -> None:
    """Replace one mask entry of ``out`` (in place) by what the un-masked model holds; note dropped metadata."""
    found = _MASK_KEY.match(key)
    if found is None:
        return
    base = found["base"]
    name = found["name"]
    index = found["index"]
    prefix = f"{base}parametrizations.{name}."
    if prefix + "original" in out:  # the mask is the only parametrization: `weight` = original * mask
        out[base + name] = out.pop(prefix + "original") * out.pop(key)
        dropped.append(prefix[:-1])
        if not any(k.startswith(base + "parametrizations.") for k in out):
            dropped.append(base + "parametrizations")
    elif prefix + "original0" in out and prefix + "original1" in out and prefix + "original2" not in out:
        # stacked on a weight norm: fold the mask into (g, v), the weight norm stays
        g, v = _fold_weight_norm(out[prefix + "original0"], out[prefix + "original1"], out.pop(key))
        out[prefix + "original0"] = g
        out[prefix + "original1"] = v
        dropped.append(prefix + index)


def clean_pruned_state_dict(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Replace masked-weight entries by what the same model without masks holds, so the keys match it.

    Handles parametrized weights of any name (``x.parametrizations.weight.original`` + ``x.parametrizations.weight.0
    .mask`` -> ``x.weight``; ``rnn.parametrizations.weight_hh_l0.original`` -> ``rnn.weight_hh_l0``), masks stacked
    on a weight norm (``original0`` / ``original1`` are kept, the mask is folded into them) and
    ``torch.nn.utils.prune`` pairs (``x.weight_orig`` + ``x.weight_mask``). The state dict's ``_metadata`` (module
    versions that ``_load_from_state_dict`` reads) is kept, without the entries of the removed masks.

    Example::

        >>> layer = nn.Linear(2, 1)
        >>> _ = attach_mask(layer, torch.tensor([[1.0, 0.0]]))
        >>> sorted(clean_pruned_state_dict(layer.state_dict()))
        ['bias', 'weight']
    """
    out = dict(state_dict)
    dropped: list[str] = []
    for key in [k for k in state_dict if k.endswith(".mask")]:
        _clean_parametrized(out, key, dropped)
    for key in [k for k in state_dict if k.endswith("_orig")]:
        base = key[: -len("_orig")]
        if base + "_mask" in out:
            out[base] = out.pop(key) * out.pop(base + "_mask")
    below = tuple(d + "." for d in dropped)
    return keep_metadata(state_dict, out, drop=lambda prefix: prefix in dropped or prefix.startswith(below))


def effective_weight(module: nn.Module, name: str = "weight") -> torch.Tensor:
    """``module.<name>`` as the forward sees it (mask applied), detached."""
    legacy = getattr(module, name + "_orig", None)
    mask = getattr(module, name + "_mask", None)
    if isinstance(legacy, torch.Tensor) and isinstance(mask, torch.Tensor):
        return (legacy * mask).detach()  # the pre-hook refreshes `weight` only at the next forward
    return getattr(module, name).detach()


register_state_dict_cleaner(clean_pruned_state_dict)
