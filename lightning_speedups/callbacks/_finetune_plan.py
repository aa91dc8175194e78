"""What FineTuneFreezing freezes and when: its config, and the plan of layer groups (top group first) it follows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from lightning_speedups._compat import fit_train_dataloader
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int, check_range
from lightning_speedups._heads import Head, find_heads
from lightning_speedups._inputs import example_from_batch, first_batch
from lightning_speedups.functional._layer_groups import _under
from lightning_speedups.functional.finetuning import (
    _is_norm_with_stats,
    backbone_roots,
    find_head,
    head_modules,
    layer_groups,
    resolve_module_names,
)

__all__ = ["BackboneSpec", "FineTuneConfig", "head_inputs", "plan_text", "tie_note"]

BackboneSpec = str | Sequence[str] | Callable[[nn.Module], Any] | None


@dataclass
class FineTuneConfig:
    """What to freeze and when to unfreeze it; see :class:`FineTuneFreezing` for the meaning of each field."""

    backbone: BackboneSpec = None
    unfreeze_at_epoch: int | None = 1
    unfreeze_every: int | None = None
    schedule: dict[int, list[str]] | None = None
    lr_decay: float = 1.0
    train_bn: bool = False

    def __post_init__(self) -> None:
        b = self.backbone
        names_ok = isinstance(b, (list, tuple)) and b and all(isinstance(n, str) and n for n in b)
        if not (b is None or (isinstance(b, str) and b) or names_ok or callable(b)):
            raise SpeedupConfigError(
                f"`backbone`={b!r} is not supported. Allowed values: None (auto: everything but the head), an "
                "attribute name, a non-empty list of module names, or a callable model -> module / names."
            )
        if isinstance(b, (list, tuple)):
            self.backbone = list(b)
        check_int("unfreeze_at_epoch", self.unfreeze_at_epoch, 0, optional=True)
        check_int("unfreeze_every", self.unfreeze_every, 1, optional=True, hint="None unfreezes everything at once.")
        check_range(
            "lr_decay",
            self.lr_decay,
            0.0,
            1.0,
            low_inclusive=False,
            hint="each deeper layer group trains at lr x lr_decay^depth; 1.0 means one lr for all.",
        )
        check_bool("train_bn", self.train_bn)
        if self.schedule is not None:
            self._check_schedule()

    def _check_schedule(self) -> None:
        if not isinstance(self.schedule, Mapping) or not self.schedule:
            raise SpeedupConfigError(
                f"`schedule`={self.schedule!r} is not supported. Allowed values: None or a non-empty dict "
                "{epoch: [module names]}."
            )
        if self.unfreeze_every is not None:
            raise SpeedupConfigError(
                "`schedule` and `unfreeze_every` were both given. Allowed values: one of them. HINT: the schedule "
                "sets every epoch."
            )
        out: dict[int, list[str]] = {}
        prev = -1
        for epoch, names in self.schedule.items():
            check_int(f"schedule key {epoch!r}", epoch, 0)
            if epoch <= prev:
                raise SpeedupConfigError(
                    f"`schedule` epochs are out of order: {list(self.schedule)}. Allowed values: strictly increasing "
                    "epochs, top (next to the head) groups first."
                )
            prev = epoch
            names = [names] if isinstance(names, str) else list(names)
            if not names or not all(isinstance(n, str) and n for n in names):
                raise SpeedupConfigError(
                    f"`schedule[{epoch}]`={names!r} is not supported. Allowed values: a module name or a non-empty "
                    "list of them."
                )
            out[epoch] = names
        first = next(iter(out))
        if self.unfreeze_at_epoch not in (1, first):
            raise SpeedupConfigError(
                f"`unfreeze_at_epoch`={self.unfreeze_at_epoch!r} conflicts with `schedule` (first epoch {first}). "
                f"Allowed values: 1 (the default) or {first}. HINT: leave `unfreeze_at_epoch` at its default when "
                "giving a schedule."
            )
        self.schedule = out


@dataclass
class _Group:
    name: str
    prefixes: list[str]  # module (or loose parameter) names: the lr_multipliers keys
    params: list[str] = field(default_factory=list)
    norms: list[str] = field(default_factory=list)
    depth: int = 1
    epoch: int | None = None
    lr_mult: float = 1.0


def _resolve_backbone(model: nn.Module, spec: BackboneSpec) -> list[str]:
    if callable(spec) and not isinstance(spec, str):
        result = spec(model)
        if isinstance(result, nn.Module):
            names = [n for n, m in model.named_modules() if m is result and n]
            if not names:
                raise SpeedupConfigError(
                    "`backbone` callable returned a module that is not a submodule of the model. Allowed values: a "
                    "callable returning a submodule of the model or module names."
                )
            return names[:1]
        spec = result
        if not (isinstance(spec, str) or (isinstance(spec, Sequence) and spec)):
            raise SpeedupConfigError(
                f"`backbone` callable returned {spec!r}. Allowed values: a callable returning a submodule of the model "
                "or module names."
            )
    names = [spec] if isinstance(spec, str) else list(spec)  # type: ignore[arg-type]
    return resolve_module_names(model, names, "backbone")


def head_inputs(trainer: Any, model: nn.Module, cfg: FineTuneConfig) -> Any:
    """Example inputs for the width rule (``example_input_array``, else two samples of the first training batch), only
    when ``backbone=None`` and no head is found by name or tie: one forward is spent on them."""
    if cfg.backbone is not None or find_heads(model, max_depth=None):
        return None
    if getattr(model, "example_input_array", None) is not None:
        return model.example_input_array
    if trainer is None:
        return None
    try:
        loader = fit_train_dataloader(trainer)
        batch = first_batch(loader) if loader is not None else None
    except Exception:  # noqa: BLE001  (no loader to read outside a fit, an empty one): no width rule
        return None
    return example_from_batch(model, batch) if batch is not None else None


def _head(model: nn.Module, cfg: FineTuneConfig, example_inputs: Any) -> Head | None:
    """The output head (see :func:`~lightning_speedups._heads.find_heads`); without one, ``backbone=None`` raises."""
    heads = find_heads(model, max_depth=None, example_inputs=example_inputs)
    if heads:
        return heads[0]
    if cfg.backbone is None:
        find_head(model, example_inputs=example_inputs)  # raises, listing the names tried
    return None


def _auto_backbone(model: nn.Module, head: Head) -> tuple[list[str], list[str]]:
    """The head and its pooler, and the backbone's roots: everything else."""
    heads = head_modules(model, head.name)  # the head and its pooler (BERT's) always train
    roots = backbone_roots(model, heads)
    if not roots:
        raise SpeedupConfigError(
            f"`backbone`=None: the head `{head.name}` ({_found(head)}) holds every parameter of "
            f"{type(model).__name__}: there is no backbone to freeze. Allowed values: a model with layers before "
            "its head, or an explicit `backbone`. HINT: FineTuneFreezing(backbone=...) names what to freeze."
        )
    return heads, roots


def _found(head: Head) -> str:
    return {
        "name": "found by its name",
        "tied": f"the linear layer tied to the embedding `{head.tied_to}`",
        "width": "the last linear layer with the output's width",
    }[head.found_by]


def _shared_with_head(model: nn.Module, head: Head | None, backbone: list[str]) -> list[str]:
    """Backbone parameter names whose tensor the head holds too (a head tied to the token embedding)."""
    if head is None:
        return []
    own = {id(p) for p in model.get_submodule(head.name).parameters()}
    return [n for n in backbone if id(model.get_parameter(n)) in own]


def _without(groups: list[_Group], names: list[str], params: Mapping[str, Any]) -> None:
    """Take ``names`` out of the groups: a prefix that covers one is replaced by its other parameters' names, so the
    group's lr factor never reaches them."""
    for g in groups:
        g.params = [p for p in g.params if p not in names]
        prefixes: list[str] = []
        for pre in g.prefixes:
            if any(_under(n, pre) for n in names):
                prefixes += [p for p in params if _under(p, pre) and p not in names]
            else:
                prefixes.append(pre)
        g.prefixes = prefixes


def tie_note(head: Head | None, shared: list[str]) -> str | None:
    """What the plan does with a tensor the head shares with the backbone, in one sentence (``None``: none)."""
    if head is None or not shared:
        return None
    owner = f"the embedding `{head.tied_to}`" if head.tied_to else f"`{shared[0].rsplit('.', 1)[0]}`"
    also = f" (so {owner} trains too)" if head.tied_to else ""
    return (
        f"`{head.name}` shares its weight with {owner} ({', '.join(shared)}): one tensor cannot be frozen in the "
        f"backbone and trained in the head, so it trains with the head from the first epoch, at the head's lr{also}."
    )


def _plan(model: nn.Module, cfg: FineTuneConfig, trainer: Any = None) -> tuple[list[_Group], list[str], list[str]]:
    """The backbone's layer groups (top group first), the names of the always-trainable parameters and the plan's
    notes (how the head was found, what happens to a tensor it shares with the backbone). ``trainer``: where the
    width rule reads its example inputs (:func:`head_inputs`)."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    head = _head(model, cfg, head_inputs(trainer, model, cfg))
    heads: list[str] = []
    if cfg.backbone is None:
        assert head is not None
        heads, roots = _auto_backbone(model, head)
        backbone = [n for n in params if not any(_under(n, h) for h in heads)]
    else:
        roots = _resolve_backbone(model, cfg.backbone)
        if head is not None and any(_under(head.name, r) for r in roots):
            raise SpeedupConfigError(
                f"`backbone`={cfg.backbone!r} contains the head {head.name!r}: nothing would be left to train. "
                f"Allowed values: modules outside the head, e.g. {backbone_roots(model, head.name)[:6]}. HINT: name "
                "the feature extractor only."
            )
        backbone = [n for n in params if any(_under(n, r) for r in roots)]
    shared = _shared_with_head(model, head, backbone)
    backbone = [n for n in backbone if n not in shared]
    trainable = [n for n in params if n not in set(backbone)]
    norm_names = [n for n, m in modules.items() if _is_norm_with_stats(m) and any(_under(n, r) for r in roots)]
    if cfg.schedule is not None:
        groups = _scheduled_groups(model, cfg, roots, backbone)
    else:
        groups = _auto_groups(model, cfg, roots, heads, backbone)
    for n in norm_names:
        owner = [g for g in groups if any(_under(n, pre) for pre in g.prefixes)]
        (owner[0] if owner else groups[-1]).norms.append(n)
    _without(groups, shared, params)
    notes = [] if head is None else [f"head: `{head.name}` ({_found(head)})"]
    tie = tie_note(head, shared)
    if tie is not None:
        notes.append(tie)
    return [g for g in groups if g.params or g.norms], trainable, notes


def _scheduled_groups(model: nn.Module, cfg: FineTuneConfig, roots: list[str], backbone: list[str]) -> list[_Group]:
    """One group per ``schedule`` entry, then the backbone parameters it never names (never unfrozen)."""
    assert cfg.schedule is not None
    decay = float(cfg.lr_decay)
    groups: list[_Group] = []
    taken: set[str] = set()
    for depth, (epoch, names) in enumerate(cfg.schedule.items(), 1):
        resolve_module_names(model, names, f"schedule[{epoch}]")
        outside = [n for n in names if not any(_under(n, r) for r in roots)]
        if outside:
            raise SpeedupConfigError(
                f"`schedule[{epoch}]` names {outside}, which are not part of the backbone {roots}. Allowed values: "
                "modules inside the backbone. HINT: the head always trains; the schedule lists backbone modules only."
            )
        mine = [p for p in backbone if p not in taken and any(_under(p, n) for n in names)]
        if not mine:
            raise SpeedupConfigError(
                f"`schedule[{epoch}]`={names} unfreezes no parameter not already scheduled. Allowed values: modules "
                "holding parameters that no earlier entry unfreezes."
            )
        taken.update(mine)
        groups.append(_Group("+".join(names), list(names), mine, depth=depth, epoch=epoch, lr_mult=decay**depth))
    rest = [p for p in backbone if p not in taken]
    if rest:  # never unfrozen: partial fine-tuning of the top layers only
        groups.append(_Group("(never unfrozen)", [], rest, depth=len(groups) + 1, epoch=None, lr_mult=0.0))
    return groups


def _auto_groups(
    model: nn.Module, cfg: FineTuneConfig, roots: list[str], heads: list[str], backbone: list[str]
) -> list[_Group]:
    """The backbone's layer groups, top (next to the head) first, each with its epoch, lr factor and parameters."""
    # auto backbone: layer_groups also places the model's own loose parameters
    found = layer_groups(model, None, heads) if cfg.backbone is None else layer_groups(model, roots)
    decay = float(cfg.lr_decay)
    k = cfg.unfreeze_every
    groups: list[_Group] = []
    for i, names in enumerate(reversed(found)):
        epoch = None if cfg.unfreeze_at_epoch is None else cfg.unfreeze_at_epoch + (i * k if k else 0)
        groups.append(_Group("+".join(names), list(names), depth=i + 1, epoch=epoch, lr_mult=decay ** (i + 1)))
    for p in backbone:
        owner = [g for g in groups if any(_under(p, n) for n in g.prefixes)]
        g = owner[0] if owner else groups[-1]  # loose parameters left over join the deepest group
        if not owner:
            g.prefixes.append(p)
        g.params.append(p)
    return groups


def plan_text(groups: list[_Group], notes: list[str]) -> str:
    """The plan in a few lines: how the head was found, a tensor it shares, and when each group unfreezes."""
    lines = ["FineTuneFreezing plan: " + "; ".join(notes[:1] or ["head: the modules outside `backbone`"])]
    lines += notes[1:]
    for g in groups:
        when = "never unfrozen" if g.epoch is None else f"unfrozen at epoch {g.epoch} (lr x{g.lr_mult:g})"
        lines.append(f"  {g.name}: {len(g.params)} tensors, {when}")
    return "\n".join(lines)
