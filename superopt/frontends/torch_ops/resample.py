"""Resampling: ``F.interpolate`` / ``nn.Upsample`` onto the resize op (torch's coordinate conventions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import nn

from superopt.frontends.torch_ops.context import Ctx, T, aten, function, module, need_op

# torch mode -> (resize mode, coordinate transformation without align_corners, nearest rounding)
_MODES = {"nearest": ("nearest", "asymmetric", "floor"), "nearest-exact": ("nearest", "half_pixel", "round_prefer_ceil"),
          "linear": ("linear", "half_pixel", None), "bilinear": ("linear", "half_pixel", None),
          "trilinear": ("linear", "half_pixel", None), "bicubic": ("cubic", "half_pixel", None)}


@function(F.interpolate, F.upsample)
def _interpolate(cx: Ctx, x: T, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                 antialias: bool = False) -> T:
    if mode not in _MODES or antialias:
        raise cx.fail(f"interpolate mode={mode!r}{' with antialias' if antialias else ''} is not supported")
    xs = cx.shape(x)
    nsp = len(xs) - 2
    out = cx.out_shape()
    if out is None:
        raise cx.fail("interpolate needs the output shape (shape propagation)")
    scales = None
    if scale_factor is not None and not recompute_scale_factor:
        sf = [float(s) for s in (scale_factor if isinstance(scale_factor, Sequence) else [scale_factor] * nsp)]
        scales = [1.0, 1.0, *sf]
    rmode, coord, nearest = _MODES[mode]
    if align_corners and rmode != "nearest":
        coord, scales = "align_corners", None
    kw = {"nearest_mode": nearest} if nearest else {}
    return T(need_op(cx, "resize", "resize")(cx.b, x, list(out), scales=scales, mode=rmode,
                                             coordinate_transformation_mode=coord, cubic_coeff_a=-0.75, **kw))


@module(nn.Upsample)
def _m_upsample(cx: Ctx, m: nn.Upsample, x: T) -> T:
    return _interpolate(cx, x, m.size, m.scale_factor, m.mode, m.align_corners, m.recompute_scale_factor)


def _aten_upsample(mode: str) -> Any:
    def h(cx: Ctx, x: T, output_size: Any, *rest: Any) -> T:
        align = next((r for r in rest if isinstance(r, bool)), None)
        factors = next((r for r in rest if isinstance(r, (list, tuple))), None)
        return _interpolate(cx, x, output_size, None if output_size is not None else factors, mode, align)
    return h


for _name, _mode in {"upsample_nearest1d": "nearest", "upsample_nearest2d": "nearest", "upsample_nearest3d": "nearest",
                     "_upsample_nearest_exact2d": "nearest-exact", "upsample_linear1d": "linear",
                     "upsample_bilinear2d": "bilinear", "upsample_trilinear3d": "trilinear",
                     "upsample_bicubic2d": "bicubic"}.items():
    aten(_name)(_aten_upsample(_mode))
