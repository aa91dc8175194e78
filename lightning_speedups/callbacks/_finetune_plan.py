"""What FineTuneFreezing freezes and when: its config, and the plan of layer groups (top group first) it follows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int, check_range
from lightning_speedups.functional._layer_groups import _under
from lightning_speedups.functional.finetuning import (
    _is_norm_with_stats,
    backbone_roots,
    find_head,
    head_modules,
    layer_groups,
    resolve_module_names,
)

__all__ = ["BackboneSpec", "FineTuneConfig"]

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


def _plan(model: nn.Module, cfg: FineTuneConfig) -> tuple[list[_Group], list[str]]:
    """The backbone's layer groups (top group first) and the names of the always-trainable parameters."""
    # long: one walk over the layer groups that builds the whole plan in order
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    if cfg.backbone is None:
        heads = head_modules(model)  # the classifier and its pooler (BERT's) always train
        roots = backbone_roots(model, heads)
        backbone = [n for n in params if not any(_under(n, h) for h in heads)]
    else:
        roots = _resolve_backbone(model, cfg.backbone)
        try:
            head = find_head(model)
        except SpeedupConfigError:
            head = None
        inside = [r for r in roots if head is not None and _under(head, r)]
        if inside:
            raise SpeedupConfigError(
                f"`backbone`={cfg.backbone!r} contains the head {head!r}: nothing would be left to train. Allowed "
                f"values: modules outside the head, e.g. {backbone_roots(model, head)[:6]}. HINT: name the feature "
                "extractor only."
            )
        backbone = [n for n in params if any(_under(n, r) for r in roots)]
    trainable = [n for n in params if n not in set(backbone)]
    norm_names = [n for n, m in modules.items() if _is_norm_with_stats(m) and any(_under(n, r) for r in roots)]
    decay = float(cfg.lr_decay)
    groups: list[_Group] = []
    if cfg.schedule is not None:
        taken: set[str] = set()
        for depth, (epoch, names) in enumerate(cfg.schedule.items(), 1):
            resolve_module_names(model, names, f"schedule[{epoch}]")
            outside = [n for n in names if not any(_under(n, r) for r in roots)]
            if outside:
                raise SpeedupConfigError(
                    f"`schedule[{epoch}]` names {outside}, which are not part of the backbone {roots}. Allowed values: "
                    "modules inside the backbone. HINT: the head always trains; the schedule lists backbone modules "
                    "only."
                )
            mine = [p for p in backbone if p not in taken and any(_under(p, n) for n in names)]
            if not mine:
                raise SpeedupConfigError(
                    f"`schedule[{epoch}]`={names} unfreezes no parameter not already scheduled. Allowed values: "
                    "modules holding parameters that no earlier entry unfreezes."
                )
            taken.update(mine)
            groups.append(_Group("+".join(names), list(names), mine, depth=depth, epoch=epoch, lr_mult=decay**depth))
        rest = [p for p in backbone if p not in taken]
        if rest:  # never unfrozen: partial fine-tuning of the top layers only
            groups.append(_Group("(never unfrozen)", [], rest, depth=len(groups) + 1, epoch=None, lr_mult=0.0))
    else:
        # top (next to the head) first; auto backbone: layer_groups also places the model's own loose parameters
        lg = list(reversed(layer_groups(model, None if cfg.backbone is None else roots)))
        k = cfg.unfreeze_every
        for i, names in enumerate(lg):
            epoch = None if cfg.unfreeze_at_epoch is None else cfg.unfreeze_at_epoch + (i * k if k else 0)
            groups.append(_Group("+".join(names), list(names), depth=i + 1, epoch=epoch, lr_mult=decay ** (i + 1)))
        for p in backbone:
            owner = [g for g in groups if any(_under(p, n) for n in g.prefixes)]
            g = owner[0] if owner else groups[-1]  # loose parameters left over join the deepest group
            if not owner:
                g.prefixes.append(p)
            g.params.append(p)
    for n in norm_names:
        owner = [g for g in groups if any(_under(n, pre) for pre in g.prefixes)]
        (owner[0] if owner else groups[-1]).norms.append(n)
    return [g for g in groups if g.params or g.norms], trainable
