"""What kind of model autotune tunes, and where each time-to-accuracy method has shown that it helps.

A method that needs fewer epochs (the EMA of the weights, a schedule for time to target) cannot be timed by a few
trial steps, so its place in autotune's *default* plan rests on the bench (:data:`EVIDENCE`; how it was measured:
docs/evidence.md, sections "autotune" and "Workloads"). It is added by default for a model kind where it reached the
target sooner on some task and made no task of that kind slower (do no harm: one task where it hurt takes it out of
the kind's default plan). Other kinds do not get it by default: one note says why, and a user who names a method in
``methods`` still gets it, with a note that quotes what the bench found for this kind.

:func:`model_kind` reads the model's modules:

- ``"transformer"``: ``nn.MultiheadAttention`` or ``nn.Transformer*`` layers, a Hugging Face ``PreTrainedModel``, a
  module whose class or attribute name says attention (``attn``, ``Attention``), or a module of the user's own code
  whose ``forward`` calls ``scaled_dot_product_attention``. Where the source of such a ``forward`` cannot be read (a
  class built by ``exec``, a script piped to ``python -``, a frozen module) and a ``batch`` is given, one eval-mode,
  no-grad forward on two of its samples decides instead: a ``TorchFunctionMode`` records whether it calls
  ``scaled_dot_product_attention`` or ``multi_head_attention_forward``, or a matmul, then a softmax over a tensor of
  at least 3 dimensions, then a matmul again (attention written by hand);
- ``"recurrent"``: a GRU, LSTM or RNN (layer or cell);
- ``"conv"``: a convolution of any dimension (``nn.Conv1d``, ``nn.Conv2d``, ``nn.Conv3d`` or a transposed one: a 1-D
  CNN over signals or audio, an image CNN, a video or volume CNN), with no attention and no recurrence;
- ``"mlp"``: anything else.

A CNN with "attention" blocks (squeeze-and-excitation named so, say) reads as a transformer: the conservative side,
since the only cost is a method left out of the default plan.

The conv rows of :data:`EVIDENCE` are all image (2-D) CNN tasks, and a 1-D or 3-D CNN shares them. Today that decides
nothing by default (a conv task slowed each method, so no kind has it), and a user who names a method sees the image
tasks by name. A new row where a method helps conv models would add it to the default plan of 1-D CNNs too: check it
first on the workload suite's 1-D CNN (``signal_cnn1d``).

Example::

    >>> from torch import nn
    >>> model_kind(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())), model_kind(nn.GRU(4, 4))
    ('conv', 'recurrent')
    >>> model_kind(nn.Sequential(nn.Conv1d(3, 8, 7), nn.ReLU())), model_kind(nn.Conv3d(1, 4, 3))
    ('conv', 'conv')
    >>> proven_kinds("ema"), proven_kinds("schedule")
    ((), ())
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from lightning_speedups._inputs import candidate_inputs, forward_error, head_samples

__all__ = ["EVIDENCE", "KINDS", "Evidence", "default_for", "evidence_text", "hurt_tasks", "model_kind", "proven_kinds"]

KINDS = ("conv", "transformer", "recurrent", "mlp")


@dataclass(frozen=True)
class Evidence:
    """One bench result of a method on a task: the method, the model kind, the task and the counts to the target
    without and with it; ``split`` is the task's (``"dev"``: the rule was tuned on it, ``"held_out"``: it only judged
    the rule) and ``helps`` whether the method reached the target sooner there."""

    method: str
    kind: str
    task: str
    measure: str
    without: str
    with_method: str
    split: str = "dev"
    helps: bool = True


def _load_evidence() -> tuple[Evidence, ...]:
    """The rows of ``evidence.json``, shipped with the package and written from the committed results in
    ``docs/_data`` by ``python -m benchmarks.autotune_evidence`` (in a clone): the plain run against autotune's first
    run on the workload suite, and transcribed runs the evidence notes state."""
    rows = json.loads(resources.files(__package__).joinpath("evidence.json").read_text())
    return tuple(Evidence(**{key: value for key, value in row.items() if key != "source"}) for row in rows)


# The bench's end-to-end results (benchmarks/autotune_methods.py, `lightning-speedups bench --only recipes` and the
# workload suite), the data the plan's notes quote as the bench's; docs/evidence.md, sections "autotune" and
# "Workloads", tell how each was run. A row where the method helps a new kind adds that kind to the method's default
# plan; a row where it hurts takes the kind out.
EVIDENCE: tuple[Evidence, ...] = _load_evidence()

_ATTENTION_LAYERS = (
    nn.MultiheadAttention,
    nn.Transformer,
    nn.TransformerEncoder,
    nn.TransformerDecoder,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
)
# every dimension, transposed too (the Lazy* layers subclass these): a 1-D CNN over signals is as much a conv model
_CONV_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_ATTENTION_NAME = re.compile(r"attn|attention", re.IGNORECASE)


def proven_kinds(method: str) -> tuple[str, ...]:
    """The model kinds where ``method`` reached the target sooner on some task and slowed no task of that kind (in
    :data:`EVIDENCE` order, no repeats): the kinds whose default plan has it."""
    rows = [e for e in EVIDENCE if e.method == method]
    hurt = {e.kind for e in rows if not e.helps}
    return tuple(dict.fromkeys(e.kind for e in rows if e.helps and e.kind not in hurt))


def hurt_tasks(method: str, kind: str) -> list[str]:
    """The tasks of a ``kind`` model where ``method`` made the run slower to its target."""
    return [e.task for e in EVIDENCE if e.method == method and e.kind == kind and not e.helps]


def evidence_text(method: str, kind: str) -> str:
    """What the plan says of ``method``'s evidence for a ``kind`` model: the bench numbers when they are this kind's
    (where it helped and where it hurt), else that there are none for it (never another kind's numbers)."""
    rows = [e for e in EVIDENCE if e.method == method and e.kind == kind]
    if rows:
        return f"its evidence for {kind} models: " + "; ".join(
            f"{e.task}{'' if e.helps else ' (slower with it)'}, {e.measure}: {e.without} without it, "
            f"{e.with_method} with it"
            for e in rows
        )
    return f"no bench evidence for {kind} models (the default plan has it for {default_for(method)})"


def default_for(method: str) -> str:
    """Which model kinds' default plan has ``method``, in words: ``"conv models only"``, ``"no model kind"``."""
    kinds = proven_kinds(method)
    return f"{', '.join(kinds)} models only" if kinds else "no model kind"


def _user_classes(model: nn.Module) -> set[type]:
    """The module classes of ``model`` that are not torch's own."""
    return {type(m) for m in model.modules() if not type(m).__module__.startswith("torch.")}


def _source(cls: type) -> str | None:
    """The source of ``cls.forward``, or ``None`` when it cannot be read (built in, ``exec``, ``python -``)."""
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None


class _AttentionCalls(TorchFunctionMode):
    """Records whether the torch functions called look like attention (see the module docstring)."""

    _ATTENTION = ("scaled_dot_product_attention", "multi_head_attention_forward", "_native_multi_head_attention")
    _MATMUL = ("matmul", "__matmul__", "bmm", "baddbmm", "einsum")

    def __init__(self) -> None:
        super().__init__()
        self.found = False
        self.stage = 0  # 1: a matmul ran; 2: then a softmax over scores; a matmul after that is attention

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if name in self._ATTENTION:
            self.found = True
        elif name in self._MATMUL:
            self.found = self.found or self.stage == 2
            self.stage = max(self.stage, 1)
        elif name == "softmax" and self.stage >= 1 and isinstance(first, torch.Tensor) and first.dim() >= 3:
            self.stage = 2
        return func(*args, **(kwargs or {}))


def _traced_attention(model: nn.Module, batch: Any) -> bool:
    """Whether one forward on two samples of ``batch`` (the first form ``forward`` accepts) calls attention."""
    for inputs in candidate_inputs(head_samples(batch)):
        mode = _AttentionCalls()
        with mode, torch.random.fork_rng(devices=[]):
            failed = forward_error(model, inputs)  # eval mode, no grad: no weight or statistic changes
        if failed is None:
            return mode.found
    return False


def _has_attention(model: nn.Module, batch: Any = None) -> bool:
    if any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__):  # Hugging Face, without importing it
        return True
    for name, module in model.named_modules():
        if isinstance(module, _ATTENTION_LAYERS) or _ATTENTION_NAME.search(type(module).__name__):
            return True
        if name and _ATTENTION_NAME.search(name.rsplit(".", 1)[-1]):
            return True
    sources = [_source(cls) for cls in _user_classes(model)]  # user code only, not torch's
    if any(src is not None and "scaled_dot_product_attention" in src for src in sources):
        return True
    unreadable = None in sources  # the source rule could not look everywhere: what one forward calls decides
    return unreadable and batch is not None and _traced_attention(model, batch)


def model_kind(model: nn.Module, batch: Any = None) -> str:
    """``"transformer"``, ``"recurrent"``, ``"conv"`` or ``"mlp"``: see the module docstring for the rules.

    Args:
        model: the model (its modules are read; a forward runs only when a ``forward``'s source cannot be read).
        batch: a training batch (or example inputs) for that forward; ``None``: no forward runs.

    Example::

        >>> model_kind(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.zeros(8, 4))
        'mlp'
    """
    if _has_attention(model, batch):
        return "transformer"
    modules = list(model.modules())
    if any(isinstance(m, (nn.RNNBase, nn.RNNCellBase)) for m in modules):
        return "recurrent"
    if any(isinstance(m, _CONV_LAYERS) for m in modules):
        return "conv"
    return "mlp"
