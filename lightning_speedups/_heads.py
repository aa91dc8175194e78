"""Find a network's output heads: by name, else by structure (a tied LM head, the layer that gives the output width).

A head is what turns the network's features into its outputs: a torchvision ``fc`` / ``classifier``, a ViT's
``heads``, a timm ``head``, a Hugging Face ``lm_head`` / ``score`` / ``qa_outputs``, a minimal GPT's ``lm_head``.
Techniques treat it apart (fine-tuning trains it while the backbone is frozen; Muon leaves it to AdamW; pruning
keeps its width), so they all find it here, with the same rules:

1. **By name** (:data:`HEAD_NAMES`): the shallowest submodules with parameters named one of them, never inside a
   repeated block (BERT's ``encoder.layer[i].output`` is no head);
2. **tied**: failing that, the linear layer whose weight is also an ``nn.Embedding``'s (an LM head tied to the
   token embedding, e.g. Whisper's ``proj_out``);
3. **width**: failing that, with example inputs, the last linear layer one forward runs whose output size is the
   model's output width.

Hugging Face's ``Conv1D`` (GPT-2's linear layer, weight stored ``(in, out)``) counts as a linear layer; it is matched
by class name, so ``transformers`` stays optional.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_speedups._inputs import call_model, eval_mode

__all__ = [
    "CONV_LINEAR",
    "HEAD_NAMES",
    "Head",
    "embedding_ties",
    "find_heads",
    "is_conv_or_linear",
    "is_linear_like",
    "shared_parameters",
]

#: the conv and linear layers that pruning removes channels of, masks and quantizes (HF ``Conv1D``: see
#: :func:`is_conv_or_linear`)
CONV_LINEAR: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)

#: attribute names of output heads, in priority order: minimal GPT code and Hugging Face ``*ForCausalLM`` /
#: ``*LMHeadModel`` (``lm_head``), torchvision (resnet ``fc``; vgg/mobilenet/efficientnet/convnext ``classifier``;
#: vit ``heads``; swin ``head``), timm (``head``), Hugging Face ``*ForSequenceClassification`` of decoders (``score``)
#: and ``*ForQuestionAnswering`` (``qa_outputs``), Meta's llama code and torchtune (``output``).
HEAD_NAMES: tuple[str, ...] = (
    "lm_head",
    "fc",
    "classifier",
    "heads",
    "head",
    "score",
    "qa_outputs",
    "output",
    "out_proj_head",
)
_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)


@dataclass(frozen=True)
class Head:
    """One output head of a model.

    Attributes:
        name: its dotted module name (``"lm_head"``, ``"model.fc"``).
        found_by: ``"name"`` (:data:`HEAD_NAMES`), ``"tied"`` (shares its weight with an embedding) or ``"width"``
            (the last linear layer with the output's width).
        tied_to: the module name of the ``nn.Embedding`` whose weight the head's weight is (``"transformer.wte"``), or
            ``None`` when it has its own.
    """

    name: str
    found_by: str
    tied_to: str | None = None


def is_linear_like(module: nn.Module) -> bool:
    """``nn.Linear``, or Hugging Face's ``Conv1D`` (a linear layer with its weight stored ``(in, out)``), also once
    ``torch.nn.utils.parametrize`` has swapped its class for a ``ParametrizedConv1D`` subclass (a pruning mask).

    Example::

        >>> is_linear_like(nn.Linear(2, 2)), is_linear_like(nn.Conv1d(2, 2, 1))
        (True, False)
    """
    return isinstance(module, nn.Linear) or any(c.__name__ == "Conv1D" for c in type(module).__mro__)


def is_conv_or_linear(module: nn.Module) -> bool:
    """A layer of :data:`CONV_LINEAR`, or Hugging Face's ``Conv1D`` (see :func:`is_linear_like`).

    Example::

        >>> is_conv_or_linear(nn.Conv2d(2, 2, 1)), is_conv_or_linear(nn.BatchNorm2d(2))
        (True, False)
    """
    return isinstance(module, CONV_LINEAR) or is_linear_like(module)


def shared_parameters(module: nn.Module) -> list[list[tuple[str, nn.Module]]]:
    """Every parameter held by two or more distinct modules: for each, ``[(module name, module), ...]`` of its holders.

    Example::

        >>> emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
        >>> head.weight = emb.weight
        >>> [[name for name, _ in holders] for holders in shared_parameters(nn.ModuleDict({"wte": emb, "out": head}))]
        [['wte', 'out']]
    """
    holders: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, mod in module.named_modules(remove_duplicate=False):
        for p in mod.parameters(recurse=False):
            seen = holders.setdefault(id(p), [])
            if all(m is not mod for _, m in seen):
                seen.append((name, mod))
    return [h for h in holders.values() if len(h) > 1]


def embedding_ties(module: nn.Module) -> dict[str, str]:
    """``{module name: embedding name}`` for every module (not itself an embedding) that holds a parameter an
    ``nn.Embedding`` / ``nn.EmbeddingBag`` also holds: a head tied to the token embedding, in registration order.

    Example::

        >>> emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
        >>> head.weight = emb.weight
        >>> embedding_ties(nn.ModuleDict({"wte": emb, "lm_head": head}))
        {'lm_head': 'wte'}
    """
    ties: dict[str, str] = {}
    for holders in shared_parameters(module):
        embedding = next((n for n, m in holders if isinstance(m, _EMBEDDINGS)), None)
        if embedding is None:
            continue
        for name, mod in holders:
            if not isinstance(mod, _EMBEDDINGS):
                ties.setdefault(name, embedding)
    order = {name: i for i, (name, _) in enumerate(module.named_modules(remove_duplicate=False))}
    return dict(sorted(ties.items(), key=lambda kv: order.get(kv[0], len(order))))


def _has_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _repeated(parent: nn.Module, child: nn.Module) -> bool:
    """Whether ``child`` is one of a stack of blocks (an ``nn.ModuleList`` item, or one of several same-typed
    ``nn.Sequential`` items): a head is never inside one."""
    if isinstance(parent, nn.ModuleList):
        return True
    if isinstance(parent, nn.Sequential):
        return sum(type(c) is type(child) for c in parent.children()) > 1
    return False


def _levels(module: nn.Module, max_depth: int | None) -> Iterator[list[tuple[str, nn.Module]]]:
    """The submodules depth by depth (0: the children), leaving out every block of a stack and what is inside it."""
    level: list[tuple[str, nn.Module]] = [("", module)]
    depth = 0
    while level and (max_depth is None or depth <= max_depth):
        nxt = []
        for prefix, mod in level:
            for child_name, child in mod.named_children():
                if not _repeated(mod, child):
                    nxt.append((f"{prefix}.{child_name}" if prefix else child_name, child))
        yield nxt
        level = nxt
        depth += 1


def _by_name(module: nn.Module, names: Sequence[str], max_depth: int | None) -> list[str]:
    """The shallowest submodules with parameters named one of ``names``, in the priority order of ``names``."""
    for level in _levels(module, max_depth):
        found = [(names.index(n.rsplit(".", 1)[-1]), n) for n, m in level if n.rsplit(".", 1)[-1] in names]
        found = [(rank, n) for rank, n in found if _has_params(module.get_submodule(n))]
        if found:
            return [n for _, n in sorted(found, key=lambda rn: rn[0])]
    return []


def _first_output(out: Any) -> torch.Tensor | None:
    """The first floating tensor of at least 2 dimensions in ``out`` (logits before a scalar loss)."""
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() and out.dim() >= 2 else None
    values = out.values() if isinstance(out, Mapping) else out if isinstance(out, (tuple, list)) else []
    return next((t for v in values if (t := _first_output(v)) is not None), None)


def _by_width(module: nn.Module, example_inputs: Any) -> str | None:
    """The last linear layer one eval-mode, no-grad forward runs whose output has the model output's width."""
    names = {m: n for n, m in module.named_modules()}
    ran: list[tuple[str, int]] = []

    def hook(mod: nn.Module, _inp: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.dim() >= 1:
            ran.append((names[mod], int(out.shape[-1])))

    handles = [m.register_forward_hook(hook) for m in module.modules() if is_linear_like(m)]
    try:  # eval mode: BatchNorm statistics must not see the example
        with torch.no_grad(), torch.random.fork_rng(devices=[]), eval_mode(module):
            logits = _first_output(call_model(module, example_inputs))
    except Exception:  # noqa: BLE001  (a forward these inputs do not fit: no width to read)
        return None
    finally:
        for h in handles:
            h.remove()
    if logits is None:
        return None
    width = int(logits.shape[-1])
    return next((n for n, w in reversed(ran) if w == width), None)


def find_heads(
    module: nn.Module,
    names: Sequence[str] = HEAD_NAMES,
    *,
    max_depth: int | None = 1,
    example_inputs: Any = None,
) -> list[Head]:
    """The output heads of ``module``, by name, else by structure (see the module docstring for the rules).

    Args:
        module: the model (a bare network, a LightningModule or any wrapper holding one).
        names: the attribute names to look for, in priority order (:data:`HEAD_NAMES` by default: the names tried).
        max_depth: how deep a named head may sit: 0 = top-level only, 1 = also one level down (``model.lm_head`` in
            a wrapper), ``None`` = any depth (the shallowest wins). The structural rules look at any depth.
        example_inputs: inputs of one forward (a tensor, a tuple of positional arguments or a dict of keyword
            arguments); only with them is the width rule tried, as the last one.

    Returns:
        The heads found by the first rule that finds any (several by name when several names match at the same
        depth), each with its name, the rule and the embedding its weight is tied to; ``[]`` when no rule finds one.

    Example::

        >>> class GPT(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.wte = nn.Embedding(50, 8)
        ...         self.lm_head = nn.Linear(8, 50, bias=False)
        ...         self.wte.weight = self.lm_head.weight
        >>> find_heads(GPT())
        [Head(name='lm_head', found_by='name', tied_to='wte')]
        >>> find_heads(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), example_inputs=torch.zeros(1, 4))
        [Head(name='2', found_by='width', tied_to=None)]
    """
    ties = embedding_ties(module)

    def tie_of(name: str) -> str | None:
        return next((emb for holder, emb in ties.items() if holder == name or holder.startswith(name + ".")), None)

    named = _by_name(module, names, max_depth)
    if named:
        return [Head(n, "name", tie_of(n)) for n in named]
    tied = [n for n in ties if is_linear_like(module.get_submodule(n))]
    if tied:
        return [Head(tied[-1], "tied", ties[tied[-1]])]
    if example_inputs is not None:
        widest = _by_width(module, example_inputs)
        if widest is not None:
            return [Head(widest, "width", tie_of(widest))]
    return []
