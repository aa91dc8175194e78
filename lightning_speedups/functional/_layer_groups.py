"""Find a network's classifier head and split the rest (the backbone) into layer groups that follow its blocks.

The layer groups drive gradual unfreezing and layer-wise lr decay (``FineTuneFreezing(lr_decay=...)``), so they
must be the blocks a practitioner would name: a ResNet's stages, a ViT's encoder layers, BERT's ``encoder.layer[i]``,
a Swin's ``features[i]``. One structural rule finds them in all of these without a per-model list (see
:func:`layer_groups`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from lightning_speedups._errors import SpeedupConfigError, check_module_names
from lightning_speedups._heads import HEAD_NAMES, find_heads

__all__ = [
    "HEAD_NAMES",
    "POOLER_NAMES",
    "find_head",
    "head_modules",
    "backbone_roots",
    "layer_groups",
    "resolve_module_names",
]

#: layers that exist to feed the classifier and train with it (Hugging Face ``BertModel.pooler``: dense + tanh on the
#: [CLS] token); they belong to the head, not to the last layer group.
POOLER_NAMES: tuple[str, ...] = ("pooler",)
# leaf norm layers that join the group before them (a ResNet stem's bn1, a ViT's final LayerNorm)
_NORM_TYPES: tuple[type[nn.Module], ...] = (
    _NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


def _has_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _under(name: str, prefix: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _shallowest(model: nn.Module, names: Sequence[str], skip: Sequence[str] = ()) -> dict[str, str]:
    """``{attribute name: dotted module name}`` of the shallowest submodules with parameters named one of ``names``."""
    level: list[tuple[str, nn.Module]] = [("", model)]
    while level:
        found: dict[str, str] = {}
        nxt: list[tuple[str, nn.Module]] = []
        for prefix, mod in level:
            for child_name, child in mod.named_children():
                full = f"{prefix}.{child_name}" if prefix else child_name
                if any(_under(full, s) for s in skip):
                    continue
                if child_name in names and child_name not in found and _has_params(child):
                    found[child_name] = full
                nxt.append((full, child))
        if found:
            return found
        level = nxt
    return {}


def find_head(model: nn.Module, names: Sequence[str] = HEAD_NAMES, example_inputs: Any = None) -> str:
    """Dotted name of the output head: the shallowest submodule named like a head (``lm_head``, ``fc``, ...), else the
    linear layer tied to the token embedding, else (with ``example_inputs``) the last linear layer with the output's
    width (:func:`lightning_speedups._heads.find_heads`, at any depth).

    Args:
        model: the network (a torchvision model, a GPT, a LightningModule holding one, ...).
        names: attribute names to look for, in priority order (default :data:`HEAD_NAMES`).
        example_inputs: inputs of one forward, for the width rule (a tensor, a tuple of arguments or a dict).

    Returns:
        The head's module name, e.g. ``"fc"`` for a torchvision ResNet, ``"model.fc"`` when it sits one level down,
        ``"lm_head"`` for a GPT.

    Raises:
        SpeedupConfigError: no rule finds a head; the message lists the names tried.

    Example::

        >>> find_head(nn.Sequential())  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        SpeedupConfigError: ...
        >>> from torchvision.models import resnet18
        >>> find_head(resnet18())
        'fc'
    """
    heads = find_heads(model, names, max_depth=None, example_inputs=example_inputs)
    if heads:
        return heads[0].name
    width = "" if example_inputs is None else ", nor a linear layer that gives the output's width"
    raise SpeedupConfigError(
        f"`backbone`=None: could not find the output head of {type(model).__name__}: no submodule with parameters is "
        f"named one of {', '.join(map(repr, names))}, no linear layer shares its weight with an embedding{width}. "
        "Allowed values: a model with such a head, or an explicit `backbone`. HINT: say what to freeze with "
        "FineTuneFreezing(backbone=...): an attribute name ('encoder'), a list of module names, or a callable "
        "model -> module; everything outside it trains."
    )


def head_modules(model: nn.Module, head: str | None = None, example_inputs: Any = None) -> list[str]:
    """The head (:func:`find_head`) and the pooler layers that feed it (:data:`POOLER_NAMES`): what always trains.

    Example::

        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        ...                  intermediate_size=64)
        >>> head_modules(BertForSequenceClassification(cfg))
        ['classifier', 'bert.pooler']
    """
    head = find_head(model, example_inputs=example_inputs) if head is None else head
    return [head, *_shallowest(model, POOLER_NAMES, skip=[head]).values()]


def resolve_module_names(model: nn.Module, names: Iterable[str], arg: str = "module names") -> list[str]:
    """Check that every name is a submodule of ``model``; unknown names raise and list close matches."""
    return check_module_names(arg, list(names), model)


def backbone_roots(model: nn.Module, head: str | Sequence[str] | None = None) -> list[str]:
    """The largest submodules that hold no head parameter, in registration order: the default backbone.

    Args:
        model: the network.
        head: the head's module name(s); ``None`` uses :func:`head_modules` (the head and its pooler).

    Returns:
        Module names; for a torchvision ResNet ``['conv1', 'bn1', 'layer1', 'layer2', 'layer3', 'layer4']``.
    """
    heads = head_modules(model) if head is None else ([head] if isinstance(head, str) else list(head))
    resolve_module_names(model, heads, "head")
    roots: list[str] = []

    def walk(prefix: str, mod: nn.Module) -> None:
        for child_name, child in mod.named_children():
            full = f"{prefix}.{child_name}" if prefix else child_name
            if any(_under(full, h) for h in heads) or not _has_params(child):
                continue
            if any(_under(h, full) for h in heads):
                walk(full, child)
            else:
                roots.append(full)

    walk("", model)
    return roots


def _is_leaf(module: nn.Module) -> bool:
    """No child holds a parameter (a Conv2d, a LayerNorm, timm's BatchNormAct2d with its parameter-free act)."""
    return not any(_has_params(c) for c in module.children())


def _pick(modules: dict[str, nn.Module], roots: list[str], blocks: set[str]) -> str | None:
    """The root to replace by its children, or ``None`` when the roots are the groups."""
    if not roots:
        return None
    if len(roots) == 1:  # one module is no split: look inside
        return None if _is_leaf(modules[roots[0]]) else roots[0]
    count = {r: sum(1 for _ in modules[r].parameters()) for r in roots}  # tensors, not elements: embeddings are big
    big = max(roots, key=lambda r: count[r])
    same_type = [r for r in roots if type(modules[r]) is type(modules[big])]
    if 2 * count[big] <= sum(count.values()) or len(same_type) > 1 or big in blocks or _is_leaf(modules[big]):
        return None  # no dominant body, or it is one of several stages / a block itself: these are the groups
    return big


def layer_groups(
    model: nn.Module, backbone: Sequence[str] | None = None, head: Sequence[str] | None = None
) -> list[list[str]]:
    """Split the backbone into layer groups for gradual unfreezing, ordered from the input to the head.

    Rules, from the backbone's modules (:func:`backbone_roots` by default):

    1. **Find the blocks.** A single module is replaced by its children. A module that holds most of the backbone's
       parameter tensors is replaced by its children too, unless another module has its type (then they are stages:
       a ResNet's ``layer1..4``) or it is a block (a child of an ``nn.Sequential`` / ``nn.ModuleList``). So a ViT's
       ``encoder`` opens to ``encoder.layers`` and then to its encoder layers; BERT's ``bert`` to ``embeddings`` +
       ``encoder.layer[i]``; timm's ``blocks`` to ``blocks[i]``; a Swin's ``features`` to its stages.
    2. **Group.** Each module is a group, except a parameterised norm leaf, which joins the group before it (a stem's
       ``bn1``, a transformer's final ``norm``).
    3. **Loose parameters** (a ViT's ``class_token`` / ``pos_embedding``, timm's ``cls_token`` / ``pos_embed``) sit on
       a container rather than in a block: they join the first group, with the patch or token embedding.

    Args:
        model: the network.
        backbone: the backbone's module names; ``None`` = everything but the head and its pooler.
        head: with ``backbone=None``, the head's module names; ``None`` finds them (:func:`head_modules`).

    Returns:
        A list of groups, each a list of module (or loose parameter) names; ``groups[-1]`` is the one next to the head.

    Example::

        >>> from torchvision.models import resnet18
        >>> layer_groups(resnet18())
        [['conv1', 'bn1'], ['layer1'], ['layer2'], ['layer3'], ['layer4']]
        >>> from torchvision.models.vision_transformer import VisionTransformer
        >>> layer_groups(VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32))
        ... # doctest: +NORMALIZE_WHITESPACE
        [['conv_proj', 'class_token', 'encoder.pos_embedding'], ['encoder.layers.encoder_layer_0'],
         ['encoder.layers.encoder_layer_1', 'encoder.ln']]
    """
    modules = dict(model.named_modules())
    if backbone is None:
        heads = head_modules(model) if head is None else list(head)
        roots = backbone_roots(model, heads)
        owned = [n for n, _ in model.named_parameters() if not any(_under(n, h) for h in heads)]
    else:
        roots = resolve_module_names(model, backbone, "backbone")
        owned = [n for n, _ in model.named_parameters() if any(_under(n, r) for r in roots)]
    roots = [r for r in roots if _has_params(modules[r])]
    blocks: set[str] = set()
    while (pick := _pick(modules, roots, blocks)) is not None:
        mod = modules[pick]
        children = [f"{pick}.{n}" for n, c in mod.named_children() if _has_params(c)]
        if isinstance(mod, (nn.Sequential, nn.ModuleList)):
            blocks.update(children)
        i = roots.index(pick)
        roots[i : i + 1] = children
    groups: list[list[str]] = []
    for name in roots:
        mod = modules[name]
        if groups and isinstance(mod, _NORM_TYPES) and _is_leaf(mod):
            groups[-1].append(name)  # a norm layer belongs with the layer or block it normalises
        else:
            groups.append([name])
    loose = [n for n in owned if not any(_under(n, m) for g in groups for m in g)]
    if groups:
        groups[0].extend(loose)
    return groups
