"""Resampling: Resize (opsets 10 to 19, antialias included) and the older Upsample, onto superopt.ops.resize."""

from __future__ import annotations

import numpy as np

from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops.resize import resize


def _mode(c: _Ctx) -> str:
    mode = str(c.attr("mode", "nearest")).lower()
    return "linear" if mode in ("bilinear", "trilinear") else mode


def _full(values, axes: list[int], rank: int, fill) -> list:
    out = [fill(k) for k in range(rank)]
    for i, a in enumerate(axes):
        out[a] = values[i]
    return out


@_conv("Resize")
def _resize(c: _Ctx, x):
    shape = list(c.b.shape(x[0]))
    rank = len(shape)
    mode = _mode(c)
    if c.opset < 11:  # Resize-10: (X, scales); the asymmetric transform, nearest rounds down
        scales = [float(s) for s in c.const(x[1], "Resize scales").reshape(-1)]
        sizes = [int(np.floor(s * n)) for s, n in zip(scales, shape, strict=True)]
        return resize(c.b, x[0], sizes, scales, mode, "asymmetric", "floor")
    axes = c.attr("axes")
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    roi_v, scales_v, sizes_v = (c.const(x[k] if len(x) > k else None, f"Resize {what}")
                                for k, what in ((1, "roi"), (2, "scales"), (3, "sizes")))
    roi = None
    if roi_v is not None and roi_v.size:
        r = [float(v) for v in roi_v.reshape(-1)]
        n = len(axes)
        roi = _full(r[:n], axes, rank, lambda k: 0.0) + _full(r[n:], axes, rank, lambda k: 1.0)
    if sizes_v is not None and sizes_v.size:
        want = _full([int(v) for v in sizes_v.reshape(-1)], axes, rank, lambda k: shape[k])
        policy = str(c.attr("keep_aspect_ratio_policy", "stretch"))
        scales = None
        if policy != "stretch":  # one scale for every resized axis, the output rounded half up
            ratios = [want[a] / shape[a] for a in axes]
            s = min(ratios) if policy == "not_larger" else max(ratios)
            scales = [s if k in axes else 1.0 for k in range(rank)]
            want = [int(s * shape[k] + 0.5) if k in axes else shape[k] for k in range(rank)]
        sizes = want
    elif scales_v is not None and scales_v.size:
        scales = _full([float(v) for v in scales_v.reshape(-1)], axes, rank, lambda k: 1.0)
        sizes = [int(s * n) for s, n in zip(scales, shape, strict=True)]
    else:
        raise OnnxImportError("Resize needs scales or sizes")
    return resize(
        c.b,
        x[0],
        sizes,
        scales,
        mode,
        str(c.attr("coordinate_transformation_mode", "half_pixel")),
        str(c.attr("nearest_mode", "round_prefer_floor")),
        float(c.attr("cubic_coeff_a", -0.75)),
        bool(c.attr("exclude_outside", 0)),
        float(c.attr("extrapolation_value", 0.0)),
        roi,
        bool(c.attr("antialias", 0)),  # linear/cubic: the kernel widened by 1/scale when down-sampling
    )


@_conv("Upsample")
def _upsample(c: _Ctx, x):
    """Upsample-9 (scales input; Upsample-1/7 come here through onnx_ops.old_versions): Resize-10's asymmetric
    transform."""
    shape = c.b.shape(x[0])
    scales = [float(s) for s in c.const(x[1], "Upsample scales").reshape(-1)]
    sizes = [int(np.floor(s * n)) for s, n in zip(scales, shape, strict=True)]
    return resize(c.b, x[0], sizes, list(scales), _mode(c), "asymmetric", "floor")
