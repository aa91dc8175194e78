"""Fine-tuning helpers on plain ``nn.Module``s: freeze / unfreeze, find the head, split the backbone into layer groups,
swap the classifier head and load torchvision weights offline (way 5).

A frozen parameter (``requires_grad=False``) gets no gradient, so autograd skips the backward pass through every layer
below the lowest trainable one and the optimizer skips its update: training only the head of a pretrained network costs
little more than a forward pass. Frozen BatchNorm layers are also put in eval mode, so their running statistics keep the
pretrained values.

Raw PyTorch equivalent::

    for p in model.parameters():
        p.requires_grad_(False)
    model.fc = torch.nn.Linear(model.fc.in_features, 5)   # new head, trainable
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()                                        # keep the pretrained statistics
"""

from __future__ import annotations

import difflib
import os
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError, check_int
from lightning_speedups.functional._layer_groups import (
    HEAD_NAMES,
    POOLER_NAMES,
    backbone_roots,
    find_head,
    head_modules,
    layer_groups,
    resolve_module_names,
)

__all__ = [
    "HEAD_NAMES",
    "POOLER_NAMES",
    "freeze",
    "unfreeze",
    "find_head",
    "head_modules",
    "backbone_roots",
    "layer_groups",
    "replace_head",
    "load_pretrained",
    "resolve_module_names",
]


def _is_norm_with_stats(module: nn.Module) -> bool:
    # BatchNorm (and InstanceNorm with running stats): the layers whose statistics a frozen backbone must keep
    return isinstance(module, _NormBase)


def _has_initial_stats(module: nn.Module) -> bool:
    """A norm layer whose running statistics are still those of a freshly built one (mean 0, variance 1).

    Such a layer has no statistics to keep: held in eval mode it does not normalise at all, and a backbone that relies
    on it (Inception v3's large truncated-normal init) overflows.
    """
    mean = getattr(module, "running_mean", None)
    var = getattr(module, "running_var", None)
    if not _is_norm_with_stats(module) or not isinstance(mean, torch.Tensor) or not isinstance(var, torch.Tensor):
        return False
    if mean.is_meta or var.is_meta:
        return False
    return bool((mean == 0).all() and (var == 1).all())


def freeze(module: nn.Module, train_bn: bool = False) -> dict[str, int]:
    """Stop training ``module``: ``requires_grad=False`` on its parameters and, unless ``train_bn``, BatchNorm in eval.

    Args:
        module: the module to freeze, in place.
        train_bn: keep BatchNorm layers trainable (parameters and running statistics), as in Lightning's
            ``BaseFinetuning.freeze(train_bn=True)``. With ``False`` (default) BatchNorm layers are frozen too and put
            in eval mode so their running statistics stay untouched.

    Returns:
        ``{"params": tensors frozen, "numel": elements frozen, "norm_eval": norm layers put in eval mode}``.

    Example::

        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        >>> freeze(net)
        {'params': 4, 'numel': 120, 'norm_eval': 1}
        >>> net[1].training, any(p.requires_grad for p in net.parameters())
        (False, False)
    """
    params = numel = norm_eval = 0
    for sub in module.modules():
        is_norm = _is_norm_with_stats(sub)
        if is_norm and train_bn:
            continue
        for p in sub.parameters(recurse=False):
            if p.requires_grad:
                params += 1
                numel += p.numel()
            p.requires_grad_(False)
        if is_norm:
            sub.eval()
            norm_eval += 1
    return {"params": params, "numel": numel, "norm_eval": norm_eval}


def unfreeze(module: nn.Module, train: bool | None = None) -> dict[str, int]:
    """Make every parameter of ``module`` trainable again and give its norm layers back their training mode.

    Args:
        module: the module to unfreeze, in place.
        train: mode for the norm layers that :func:`freeze` put in eval; ``None`` uses ``module.training`` (``True``
            when ``module`` is itself a norm layer).

    Returns:
        ``{"params": tensors unfrozen, "numel": elements unfrozen}``.

    Example::

        >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        >>> _ = freeze(net)
        >>> unfreeze(net)
        {'params': 4, 'numel': 10}
        >>> net[1].training
        True
    """
    if train is None:
        train = True if _is_norm_with_stats(module) else module.training
    params = numel = 0
    for p in module.parameters():
        if not p.requires_grad:
            params += 1
            numel += p.numel()
        p.requires_grad_(True)
    for sub in module.modules():
        if _is_norm_with_stats(sub):
            sub.train(train)
    return {"params": params, "numel": numel}


def _head_layer(model: nn.Module, head: str | None = None) -> tuple[str, nn.Module]:
    """Name and module of the last Linear / 1x1 Conv2d inside the head."""
    head_name = find_head(model) if head is None else resolve_module_names(model, [head], "head")[0]
    head_mod = model.get_submodule(head_name)
    target = None
    for name, mod in head_mod.named_modules():
        if isinstance(mod, nn.Linear) or (isinstance(mod, nn.Conv2d) and mod.kernel_size == (1, 1)):
            target = (f"{head_name}.{name}" if name else head_name, mod)
    if target is None:
        raise SpeedupConfigError(
            f"`head`={head_name!r} ({type(head_mod).__name__}) holds no Linear or 1x1 Conv2d layer to replace. "
            "Allowed values: a module holding an nn.Linear or a 1x1 nn.Conv2d."
        )
    return target


def replace_head(model: nn.Module, num_classes: int, head: str | None = None) -> dict[str, Any]:
    """Swap the last ``Linear`` (or 1x1 ``Conv2d``) of the classifier head for a fresh one with ``num_classes`` outputs.

    Args:
        model: the network, changed in place; the new layer matches the old one's device and dtype.
        num_classes: outputs of the new layer.
        head: the head's module name; ``None`` finds it with :func:`find_head`.

    Returns:
        ``{"layer": replaced module name, "in_features": ..., "old_classes": ..., "num_classes": ...}``.

    Raises:
        SpeedupConfigError: ``num_classes`` is not a positive integer, or the head holds no Linear/Conv2d.

    Example::

        >>> from torchvision.models import resnet18
        >>> replace_head(resnet18(), 5)
        {'layer': 'fc', 'in_features': 512, 'old_classes': 1000, 'num_classes': 5}
    """
    check_int("num_classes", num_classes, 1)
    full, old = _head_layer(model, head)
    p = old.weight
    new: nn.Module
    if isinstance(old, nn.Linear):
        new = nn.Linear(old.in_features, num_classes, bias=old.bias is not None, device=p.device, dtype=p.dtype)
        fan_in = old.in_features
        old_out = old.out_features
    else:
        assert isinstance(old, nn.Conv2d)
        new = nn.Conv2d(old.in_channels, num_classes, 1, bias=old.bias is not None, device=p.device, dtype=p.dtype)
        fan_in = old.in_channels
        old_out = old.out_channels
    parent_name, _, attr = full.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    new.train(old.training)
    setattr(parent, attr, new)
    return {"layer": full, "in_features": fan_in, "old_classes": old_out, "num_classes": num_classes}


def _unwrap_state_dict(obj: Any) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        return obj.state_dict()
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model_state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping):
                return _unwrap_state_dict(obj[key])
        return dict(obj)
    raise SpeedupConfigError(
        f"The file holds a {type(obj).__name__}, not a state dict. Allowed values: a state dict, a module, or a "
        "checkpoint dict with one under 'state_dict', 'model_state_dict' or 'model'."
    )


def _head_out(state: Mapping[str, torch.Tensor], layer: str) -> int | None:
    w = state.get(f"{layer}.weight")
    return int(w.shape[0]) if isinstance(w, torch.Tensor) else None


def _reachable(url: str, timeout: float) -> str | None:
    """``None`` if a TCP connection to the URL's host opens within ``timeout`` s, else the reason."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return None
    except OSError as err:
        return f"{type(err).__name__}: {err}"


def load_pretrained(
    arch: str,
    weights: Any = None,
    path: str | os.PathLike[str] | None = None,
    num_classes: int | None = None,
    *,
    download: bool = True,
    timeout: float = 10.0,
) -> nn.Module:
    """Build a torchvision model with the ``weights=`` API, from a local file or the torch hub cache when offline.

    Args:
        arch: a torchvision model name (``torchvision.models.list_models()``), e.g. ``"resnet18"``.
        weights: ``None`` (random init), a weights enum member, its name (``"IMAGENET1K_V1"``), ``"DEFAULT"`` or a full
            name (``"ResNet18_Weights.DEFAULT"``). Loaded from the torch hub cache
            (``torch.hub.get_dir()/checkpoints``) if present, else downloaded.
        path: a local state-dict file (raw, or a dict with ``"state_dict"``/``"model"``); wins over ``weights``.
        num_classes: replace the head with a fresh one with this many outputs (see :func:`replace_head`).
        download: allow downloading weights missing from the cache.
        timeout: seconds to wait for the download server before giving up (no hang when offline).

    Returns:
        The model in train mode.

    Raises:
        SpeedupConfigError: unknown ``arch``/``weights``, a missing or unreadable ``path``, or weights that are neither
            cached nor downloadable.
        SpeedupRuntimeError: the download started but failed (network error).

    Example::

        >>> model = load_pretrained("resnet18", num_classes=5)  # random init; pass weights="DEFAULT" for ImageNet
        >>> model.fc.out_features
        5
    """
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if arch not in available:
        close = difflib.get_close_matches(str(arch), available, n=5)
        raise SpeedupConfigError(
            f"`arch`={arch!r} is not a torchvision classification model. Allowed values: a name from "
            f"torchvision.models.list_models(). Close matches: {', '.join(map(repr, close)) or 'none'}."
        )
    state: dict[str, torch.Tensor] | None = None
    if path is not None:
        if not os.path.isfile(path):
            raise SpeedupConfigError(
                f"`path`={os.fspath(path)!r} does not exist or is not a file. Allowed values: a state-dict file."
            )
        try:
            state = _unwrap_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        except SpeedupConfigError:
            raise
        except Exception as err:  # a corrupt or non-torch file: say which file, keep the cause
            raise SpeedupConfigError(
                f"`path`={os.fspath(path)!r} could not be loaded as a state dict: {err}. Allowed values: a file "
                "saved with torch.save(model.state_dict())."
            ) from err
    elif weights is not None:
        state = _weights_state_dict(arch, weights, download=download, timeout=timeout)
    model = torchvision.models.get_model(arch, weights=None)
    if state is not None:
        layer, old = _head_layer(model)
        out = _head_out(state, layer)
        if out is not None and out != old.weight.shape[0]:
            replace_head(model, out)  # a file from a fine-tuned model: size the head like the file first
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise SpeedupConfigError(
                f"The weights do not fit `arch`={arch!r}: missing keys {missing[:5]}, unexpected keys "
                f"{unexpected[:5]}. Allowed values: weights of a {arch!r} model."
            )
    if num_classes is not None:
        replace_head(model, num_classes)
    return model


def _weights_state_dict(arch: str, weights: Any, *, download: bool, timeout: float) -> dict[str, torch.Tensor]:
    import torchvision

    enum = torchvision.models.get_model_weights(arch)
    if isinstance(weights, enum):
        member = weights
    else:
        name = str(weights).split(".")[-1]
        try:
            member = enum.DEFAULT if name == "DEFAULT" else enum[name]
        except KeyError:
            raise SpeedupConfigError(
                f"`weights`={weights!r} is not available for `arch`={arch!r}. Allowed values: 'DEFAULT', "
                f"{', '.join(repr(m.name) for m in enum)}."
            ) from None
    cached = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(member.url).path))
    if not os.path.isfile(cached):
        reason = "downloading is disabled (`download=False`)" if not download else _reachable(member.url, timeout)
        if reason is not None:
            raise SpeedupConfigError(
                f"`weights`={member} for `arch`={arch!r} are not in the torch hub cache ({cached}) and cannot be "
                f"downloaded from {member.url} ({reason}). Allowed values: weights in that cache, or `path=` a local "
                "state-dict file. HINT: on an offline machine, copy the file to that path."
            )
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)  # urllib has no timeout of its own: a stalled download must not hang
    try:
        return member.get_state_dict(progress=False, check_hash=False)
    except OSError as err:
        raise SpeedupRuntimeError(
            f"`weights`={member} could not be downloaded from {member.url}: {err}. HINT: retry, or pass `path=` to a "
            "local state-dict file."
        ) from err
    finally:
        socket.setdefaulttimeout(old)
