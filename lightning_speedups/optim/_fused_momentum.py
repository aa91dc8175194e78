"""Let torch's fused SGD step a param group in which only some parameters have a momentum buffer.

torch's fused SGD (``torch.optim.SGD(fused=True)``, what ``implementation="auto"`` picks on CPU and CUDA) handles a
group's momentum buffers all-or-nothing: on the group's very first step it creates every buffer, afterwards it hands
the kernel each parameter's ``momentum_buffer`` and fails with ``TypeError: expected Tensor as element 0 in argument
2, but got NoneType`` when one is missing. A group mixes both kinds as soon as a parameter gets its first gradient
after the others stepped: a backbone unfrozen by fine-tuning (in an uninterrupted run and after a resume alike), a
branch that was unused for some steps. The for-loop and foreach kernels give such a parameter ``buf = grad`` (its
first step); :func:`guard_fused_momentum` creates the missing buffers just before the kernel runs, valued so that the
fused update gives exactly that.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["guard_fused_momentum", "fill_missing_momentum_buffers"]

_MARK = "_speedups_fused_momentum_guard"  # set on a guarded optimizer: guard once


def _needs_guard(group: dict[str, Any]) -> bool:
    return bool(group.get("fused")) and bool(group.get("momentum"))


@torch.no_grad()
def fill_missing_momentum_buffers(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Create the momentum buffers a fused SGD step lacks; returns the parameters that got one.

    Only groups with ``fused=True`` and ``momentum != 0`` in which some parameters with a gradient have a buffer and
    others have none are touched. The fused kernel updates ``buf = momentum * buf + (1 - dampening) * g`` where
    ``g`` is the unscaled gradient after ``maximize`` and weight decay; torch's first step is ``buf = g``, so the new
    buffer is ``g * dampening / momentum`` (zeros with the default ``dampening=0``: no gradient is read at all).
    """
    filled: list[torch.Tensor] = []
    scale = getattr(optimizer, "grad_scale", None)  # set by GradScaler for kernels that unscale internally
    for group in optimizer.param_groups:
        if not _needs_guard(group):
            continue
        stepping = [p for p in group["params"] if p.grad is not None]
        missing = [p for p in stepping if optimizer.state.get(p, {}).get("momentum_buffer") is None]
        if not missing or len(missing) == len(stepping):
            continue  # none missing, or all missing: torch's own first step creates them
        momentum = float(group["momentum"])
        dampening = float(group.get("dampening", 0.0))
        for p in missing:
            grad = p.grad
            assert grad is not None  # for mypy: `stepping` holds parameters with a gradient only
            if dampening == 0.0:
                buf = torch.zeros_like(grad, memory_format=torch.preserve_format)
            else:
                g = -grad if group.get("maximize") else grad
                g = g / scale.to(g.device) if scale is not None else g.clone()
                if group.get("weight_decay"):
                    g = g.add(p, alpha=float(group["weight_decay"]))
                buf = g.mul_(dampening / momentum)
            optimizer.state[p]["momentum_buffer"] = buf
            filled.append(p)
    return filled


def guard_fused_momentum(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make a fused SGD ``optimizer`` step groups with missing momentum buffers like the for-loop kernel does.

    Registers a step pre-hook (hooks are not part of ``state_dict``, so checkpoints are unchanged). When ``step`` gets a
    closure (Lightning's automatic optimization computes the gradients inside it) the hook wraps the closure and fills
    the buffers after it has run; otherwise it fills them at once. Idempotent; optimizers without a fused momentum
    group pay one loop over their groups per step.

    Args:
        optimizer: any optimizer; returned as is.

    Returns:
        ``optimizer``.

    Example::

        >>> a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
        >>> opt = guard_fused_momentum(torch.optim.SGD([a, b], lr=0.1, momentum=0.9, fused=True))
        >>> a.grad = torch.ones(2); opt.step()          # b is frozen: no gradient, no buffer
        >>> b.grad = torch.ones(2); opt.step()          # b unfrozen: unguarded, this raises TypeError
        >>> [round(v, 4) for v in b.tolist()]          # its first step: buf = grad, as the for-loop kernel does
        [0.9, 0.9]
    """
    if getattr(optimizer, _MARK, False):
        return optimizer

    def pre_step(opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not any(_needs_guard(g) for g in opt.param_groups):
            return None
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0] is the optimizer itself
        if closure is None:
            fill_missing_momentum_buffers(opt)
            return None

        def closure_then_fill() -> Any:
            loss = closure()
            fill_missing_momentum_buffers(opt)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_fill}
        return (args[0], closure_then_fill, *args[2:]), kwargs

    optimizer.register_step_pre_hook(pre_step)
    setattr(optimizer, _MARK, True)
    return optimizer
