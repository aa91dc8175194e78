"""Progressive resizing: train on downscaled images early, at full resolution at the end (fast.ai; Composer).

A convolution's cost grows with the pixel count, so a batch at half the side costs about a quarter of the compute.
Early in training the network learns coarse features that small images carry as well; a final stretch at full
resolution adapts it (and its BatchNorm statistics) to the size it is evaluated at. Composer's schedule is used:

* ``progress < delay_fraction``: scale ``initial_scale``;
* then a linear ramp up to 1 until ``1 - finetune_fraction``;
* the last ``finetune_fraction`` of training: full size.

Sides are rounded to a multiple of ``size_increment`` (fewer distinct shapes: fewer cuDNN autotune runs and
``torch.compile`` recompiles). Floating-point tensors with 4 dimensions ``(N, C, H, W)`` are the images and are
interpolated. Per-pixel targets follow them: any other tensor of at least 3 dimensions whose last two equal an image's
``(H, W)`` (segmentation masks ``(N, H, W)`` or ``(N, 1, H, W)``, integer or not) gets the same new size by nearest
neighbour, so class ids keep their dtype and values, and in ``"crop"`` mode the same window as the image. Labels
(``(N,)``) and every other tensor pass through unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch.nn import functional as F

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range

__all__ = [
    "INTERPOLATIONS",
    "MODES",
    "check_resize_schedule",
    "progressive_scale",
    "resize_batch",
    "resize_images",
    "resize_mask",
    "scaled_side",
]

MODES = ("resize", "crop")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "area")


def check_resize_schedule(initial_scale: float, finetune_fraction: float, delay_fraction: float) -> None:
    """Raise unless ``0 < initial_scale <= 1``, both fractions are in ``[0, 1]`` and they sum to at most 1."""
    check_range("initial_scale", initial_scale, 0.0, 1.0, low_inclusive=False, hint="0.5 halves each side.")
    check_range("finetune_fraction", finetune_fraction, 0.0, 1.0)
    check_range("delay_fraction", delay_fraction, 0.0, 1.0)
    if delay_fraction + finetune_fraction > 1.0:
        raise SpeedupConfigError(
            f"`delay_fraction`={delay_fraction!r} + `finetune_fraction`={finetune_fraction!r} is out of range. "
            "Allowed values: a sum <= 1 (the ramp lies between the two phases)."
        )


def progressive_scale(
    progress: float, initial_scale: float = 0.5, finetune_fraction: float = 0.2, delay_fraction: float = 0.5
) -> float:
    """The image scale at ``progress`` (fraction of training done, in ``[0, 1]``) under Composer's schedule.

    Example::

        >>> [round(progressive_scale(p), 3) for p in (0.0, 0.49, 0.5, 0.65, 0.8, 1.0)]
        [0.5, 0.5, 0.5, 0.75, 1.0, 1.0]
    """
    check_resize_schedule(initial_scale, finetune_fraction, delay_fraction)
    ramp = 1.0 - finetune_fraction - delay_fraction
    if progress < delay_fraction:
        frac = 0.0
    elif ramp <= 0.0:
        frac = 1.0 if progress >= 1.0 - finetune_fraction else 0.0
    else:
        frac = min(1.0, (progress - delay_fraction) / ramp)
    return initial_scale + (1.0 - initial_scale) * frac


def scaled_side(side: int, scale: float, size_increment: int = 4) -> int:
    """``side * scale`` rounded to a multiple of ``size_increment``, at least one increment, at most ``side``.

    Example::

        >>> scaled_side(32, 0.5), scaled_side(32, 0.6), scaled_side(224, 0.5, 16), scaled_side(6, 0.1)
        (16, 20, 112, 4)
    """
    check_int("size_increment", size_increment, 1)
    if scale >= 1.0:
        return side
    rounded = int(round(side * scale / size_increment)) * size_increment
    return min(side, max(size_increment, rounded))


def _crop_offsets(
    full: tuple[int, int], size: tuple[int, int], generator: torch.Generator | None = None
) -> tuple[int, int]:
    top = int(torch.randint(full[0] - size[0] + 1, (1,), generator=generator))
    left = int(torch.randint(full[1] - size[1] + 1, (1,), generator=generator))
    return top, left


def resize_images(
    images: torch.Tensor,
    size: tuple[int, int],
    mode: str = "resize",
    interpolation: str = "bilinear",
    generator: torch.Generator | None = None,
    offsets: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Resize (interpolate) or randomly crop an ``(N, C, H, W)`` batch to ``size``; the same crop for the whole batch.

    Downscaling with ``bilinear``/``bicubic`` uses ``antialias=True`` (a proper low-pass, like PIL), so the small
    image is a blurred version of the large one rather than an aliased sample of its pixels. ``offsets`` (top, left)
    fixes the crop window (``"crop"``); ``None`` draws it from ``generator``.
    """
    h, w = size
    if (h, w) == tuple(images.shape[-2:]):
        return images
    if mode == "crop":
        top, left = offsets if offsets is not None else _crop_offsets(tuple(images.shape[-2:]), size, generator)
        return images[..., top : top + h, left : left + w]
    kwargs: dict[str, Any] = {"size": (h, w), "mode": interpolation}
    if interpolation in ("bilinear", "bicubic"):
        kwargs.update(align_corners=False, antialias=True)
    return F.interpolate(images, **kwargs)


def resize_mask(
    mask: torch.Tensor, size: tuple[int, int], mode: str = "resize", offsets: tuple[int, int] | None = None
) -> torch.Tensor:
    """Resize a per-pixel target ``(..., H, W)`` of any dtype to ``size`` by nearest neighbour (values kept exactly).

    Pixel centres are mapped like ``F.interpolate(mode="nearest-exact")``, by indexing, so integer class masks keep
    their dtype and every value is one of the input's. ``mode="crop"`` takes the window at ``offsets`` (the image's).

    Example::

        >>> resize_mask(torch.arange(16).view(1, 4, 4), (2, 2)).tolist()
        [[[5, 7], [13, 15]]]
    """
    h, w = size
    full_h, full_w = mask.shape[-2:]
    if (h, w) == (full_h, full_w):
        return mask
    if mode == "crop":
        top, left = offsets if offsets is not None else (0, 0)
        return mask[..., top : top + h, left : left + w]

    def centres(n_out: int, n_in: int) -> torch.Tensor:
        idx = ((torch.arange(n_out, device=mask.device) + 0.5) * (n_in / n_out)).floor().long()
        return idx.clamp_(max=n_in - 1)

    return mask.index_select(-2, centres(h, full_h)).index_select(-1, centres(w, full_w))


def resize_batch(
    batch: Any,
    scale: float,
    mode: str = "resize",
    size_increment: int = 4,
    interpolation: str = "bilinear",
    generator: torch.Generator | None = None,
) -> Any:
    """Return ``batch`` with its images scaled by ``scale`` and its per-pixel targets resized to match (any nesting).

    Images are the floating-point ``(N, C, H, W)`` tensors; another tensor of at least 3 dimensions whose last two
    equal an image's ``(H, W)`` is a per-pixel target (a segmentation mask) and gets the same size by nearest
    neighbour (:func:`resize_mask`), and in ``"crop"`` mode the same window. Other tensors (labels) are unchanged.

    Args:
        batch: a tensor, or lists / tuples / dicts / dataclasses of them, e.g. ``(images, labels)``.
        scale: in ``(0, 1]``; 1 returns ``batch`` itself.
        mode: ``"resize"`` (interpolate the whole image) or ``"crop"`` (a random ``scale``-sized window).
        size_increment: round each new side to a multiple of this.
        interpolation: ``F.interpolate`` mode for the images in ``"resize"`` mode.
        generator: random source of the crop offsets (for reproducible crops); one window per image size per batch.

    Raises:
        SpeedupConfigError: a bad ``scale``, ``mode``, ``interpolation`` or ``size_increment``.

    Example::

        >>> x, y = resize_batch((torch.zeros(2, 3, 32, 32), torch.tensor([1, 0])), 0.5)
        >>> tuple(x.shape), y.tolist()
        ((2, 3, 16, 16), [1, 0])
        >>> x, mask = resize_batch((torch.zeros(2, 3, 32, 32), torch.zeros(2, 32, 32, dtype=torch.long)), 0.5)
        >>> tuple(mask.shape), mask.dtype
        ((2, 16, 16), torch.int64)
    """
    check_range("scale", scale, 0.0, 1.0, low_inclusive=False)
    check_choice("mode", mode, MODES)
    check_choice("interpolation", interpolation, INTERPOLATIONS)
    scaled_side(1, 1.0, size_increment)  # validates size_increment
    if scale >= 1.0:
        return batch
    plan: dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int] | None]] = {}  # (H, W) -> new size, window

    def plan_image(t: torch.Tensor) -> torch.Tensor:
        full = (int(t.shape[-2]), int(t.shape[-1])) if t.dim() == 4 else (0, 0)
        if t.dim() == 4 and t.is_floating_point() and full not in plan:
            size = (scaled_side(full[0], scale, size_increment), scaled_side(full[1], scale, size_increment))
            # one window per image size, so every image and mask of that size is cropped alike
            plan[full] = (size, _crop_offsets(full, size, generator) if mode == "crop" and size != full else None)
        return t

    def resize(t: torch.Tensor) -> torch.Tensor:
        full = (int(t.shape[-2]), int(t.shape[-1])) if t.dim() >= 3 else None
        if full is None or full not in plan:
            return t
        size, offsets = plan[full]
        if t.dim() == 4 and t.is_floating_point():
            return resize_images(t, size, mode, interpolation, offsets=offsets)
        return resize_mask(t, size, mode, offsets)

    apply_to_collection(batch, torch.Tensor, plan_image)
    return apply_to_collection(batch, torch.Tensor, resize)
