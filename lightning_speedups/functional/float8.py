"""float8 training without Lightning: torchao ``Float8Linear`` for large ``nn.Linear`` layers (CUDA sm >= 8.9)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_choice, require

__all__ = ["FLOAT8_RECIPES", "Float8Summary", "convert_to_float8", "float8_filter", "float8_supported"]

FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


@dataclass
class Float8Summary:
    """Which ``nn.Linear`` layers :func:`convert_to_float8` converted and why the others were skipped."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _cuda_capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def float8_supported() -> tuple[bool, str]:
    """``(True, "")`` on CUDA compute capability >= 8.9 (Ada, Hopper, Blackwell), else ``(False, reason)``."""
    cap = _cuda_capability()
    if cap is None:
        return False, "float8 training needs a CUDA GPU with compute capability >= 8.9, but no CUDA GPU is available"
    if tuple(cap) < (8, 9):
        return False, (
            f"float8 training needs CUDA compute capability >= 8.9 (Ada/Hopper); this GPU has {cap[0]}.{cap[1]}"
        )
    return True, ""


def float8_filter(
    module: nn.Module,
    fqn: str,
    *,
    min_features: int = 1024,
    exclude: Sequence[str] = (),
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> str | None:
    """``None`` when ``module`` should run in float8, else the reason it stays in high precision.

    Eligible: an ``nn.Linear`` whose in/out features are divisible by 16 (float8 GEMM requirement) and both at least
    ``min_features`` (small GEMMs get slower from the casts), not named in ``exclude``, and accepted by ``filter_fn``.
    """
    if type(module) is not nn.Linear:
        return "not an nn.Linear"
    if any(fqn == p or fqn.startswith(p + ".") for p in exclude):
        return "excluded"
    n, k = module.weight.shape
    if n % 16 or k % 16:
        return f"dims {k}x{n} not divisible by 16"
    if min(n, k) < min_features:
        return f"dims {k}x{n} below min_features={min_features}"
    if filter_fn is not None and not filter_fn(module, fqn):
        return "rejected by filter_fn"
    return None


def convert_to_float8(
    model: nn.Module,
    *,
    recipe: str = "tensorwise",
    min_features: int = 1024,
    exclude: Sequence[str] = (),
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    check_hardware: bool = True,
) -> Float8Summary:
    """Swap eligible ``nn.Linear`` layers for torchao ``Float8Linear`` in place (see :func:`float8_filter`).

    Raises:
        SpeedupConfigError: unknown recipe, hardware without float8 (when ``check_hardware``), no eligible layer.
    """
    check_choice("recipe", recipe, FLOAT8_RECIPES)
    if check_hardware:
        ok, reason = float8_supported()
        if not ok:
            raise SpeedupConfigError(
                f"float8 is unavailable: {reason}. Allowed values: a CUDA GPU with compute capability >= 8.9, or "
                "`check_hardware`=False. HINT: Float8Training(skip_if_unsupported=True) skips instead."
            )
    summary = Float8Summary()
    for name, module in model.named_modules():
        why = float8_filter(module, name, min_features=min_features, exclude=exclude, filter_fn=filter_fn)
        if why is None:
            summary.converted.append(name)
        elif isinstance(module, nn.Linear):
            summary.skipped[name] = why
    if not summary.converted:
        raise SpeedupConfigError(
            f"`model` has no nn.Linear eligible for float8 (`min_features`={min_features}). Skipped: "
            f"{summary.skipped or 'no nn.Linear layers'}. Allowed values: a model with an nn.Linear that passes "
            "`min_features`, `exclude` and `filter_fn`. HINT: float8 pays off for Linear layers >= 1024 wide."
        )
    f8 = require("torchao.float8", "quantization", "Float8 training")
    chosen = set(summary.converted)
    f8.convert_to_float8_training(
        model,
        module_filter_fn=lambda _m, fqn: fqn in chosen,
        config=f8.Float8LinearConfig.from_recipe_name(recipe),
    )
    return summary
