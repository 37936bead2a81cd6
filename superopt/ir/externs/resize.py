"""Extern kind ``resize``: ONNX Resize (opset 19) over all axes, one axis at a time.

Attrs: ``sizes`` (the output shape), ``scales`` (one per axis, or None: size ratios), ``mode``
(nearest/linear/cubic), ``coordinate_transformation_mode``, ``nearest_mode``, ``cubic_coeff_a``,
``exclude_outside``, ``extrapolation_value``, ``antialias`` (read by linear and cubic only) and ``roi``
(begins then ends, per axis; only read by tf_crop_and_resize). Nearest, N-linear and N-cubic
interpolation are separable, so an axis at a time gives the ONNX result. The sampling tables depend
only on the attrs and shapes; they are computed in float64 and the data is interpolated in float64,
then cast back to its element type (rounded and saturated for integers, as ONNX's reference does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def axis_scale(attrs: dict[str, Any], axis: int, in_len: int) -> float:
    scales = attrs.get("scales")
    return float(scales[axis]) if scales is not None else attrs["sizes"][axis] / in_len


def axis_roi(attrs: dict[str, Any], axis: int, rank: int) -> tuple[float, float]:
    roi = attrs.get("roi")
    return (0.0, 1.0) if roi is None else (float(roi[axis]), float(roi[rank + axis]))


def is_identity_axis(attrs: dict[str, Any], axis: int, in_len: int, rank: int) -> bool:
    out_len = attrs["sizes"][axis]
    if out_len != in_len or axis_scale(attrs, axis, in_len) != 1.0:
        return False
    return attrs["coordinate_transformation_mode"] != "tf_crop_and_resize" or axis_roi(attrs, axis, rank) == (0.0, 1.0)


def source_coordinates(in_len: int, out_len: int, scale: float, mode: str,
                       roi: tuple[float, float] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray | None]:
    """x_original (float64, one per output position) and, for tf_crop_and_resize, the positions that
    fall outside the input (they take the extrapolation value); ONNX's formulas. align_corners divides by
    the unrounded resized length ``in_len * scale`` (as the ONNX reference does: scale 0.6 of 4 is 2.4)."""
    y = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        offset = in_len / 2 * (1 - adjustment)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":
        return ((y + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)), None
    if mode == "align_corners":
        resized = in_len * scale
        if np.isclose(resized, out_len, rtol=1e-12, atol=0.0):  # scale given as a size ratio: exactly out_len
            resized = float(out_len)
        return (y * (in_len - 1) / (resized - 1) if resized != 1 else np.zeros(out_len)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            x = start * (in_len - 1) + y * (end - start) * (in_len - 1) / (out_len - 1)
        else:
            x = np.full(out_len, 0.5 * (start + end) * (in_len - 1))
        return x, (x < 0) | (x > in_len - 1)
    raise ValueError(f"resize: unknown coordinate_transformation_mode {mode!r}; known: {', '.join(COORDINATE_MODES)}")


def nearest_indices(x: np.ndarray, in_len: int, nearest_mode: str) -> np.ndarray:
    """The input position each output position copies (int64, clamped into the input)."""
    f = np.floor(x)
    frac = x - f
    if nearest_mode == "round_prefer_floor":
        idx = f + (frac > 0.5)
    elif nearest_mode == "round_prefer_ceil":
        idx = f + (frac >= 0.5)
    elif nearest_mode == "floor":
        idx = f
    elif nearest_mode == "ceil":
        idx = np.ceil(x)
    else:
        raise ValueError(f"resize: unknown nearest_mode {nearest_mode!r}; known: {', '.join(NEAREST_MODES)}")
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def _kernel(t: np.ndarray, mode: str, a: float) -> np.ndarray:
    """The interpolation kernel at offsets ``t``: the triangle (linear) or Keys' cubic with parameter a."""
    t = np.abs(t)
    if mode == "linear":
        return np.clip(1 - t, 0.0, 1.0)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def interpolation_taps(x: np.ndarray, in_len: int, mode: str, cubic_coeff_a: float = -0.75,
                       exclude_outside: bool = False, scale: float = 1.0,
                       antialias: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(positions, weights), each (out_len, taps): positions clamped into the input (edge padding).

    The taps sit around x, the kernel's support (1 for linear, 2 for cubic) each side; ``antialias``
    stretches the kernel by 1/scale when down-sampling (more taps, weights normalized to sum 1). An
    integer x takes its taps as if its fraction were 1 (ONNX's choice): that only matters for which
    taps ``exclude_outside`` drops (it zeroes the weights of taps outside the input and renormalizes).
    """
    if mode not in ("linear", "cubic"):
        raise ValueError(f"resize: no interpolation taps for mode {mode!r}")
    support = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if antialias else 1.0
    first = int(np.floor(-support / stretch)) + 1 if antialias else 1 - support  # offset of the first tap
    offsets = first + np.arange(2 - 2 * first)
    f = np.floor(x)
    whole = x == f
    r = np.where(whole, 1.0, x - f)
    left = f.astype(np.int64) - whole.astype(np.int64)  # the tap left of x
    taps = left[:, None] + offsets
    weights = _kernel((offsets - r[:, None]) * stretch, mode, cubic_coeff_a)
    if antialias:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    if exclude_outside:
        weights = np.where((taps < 0) | (taps >= in_len), 0.0, weights)
        total = weights.sum(axis=-1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(taps, 0, in_len - 1), weights


def _resize_axis(data: np.ndarray, axis: int, attrs: dict[str, Any]) -> np.ndarray:
    in_len, rank = data.shape[axis], data.ndim
    out_len = attrs["sizes"][axis]
    scale = axis_scale(attrs, axis, in_len)
    x, outside = source_coordinates(in_len, out_len, scale, attrs["coordinate_transformation_mode"],
                                    axis_roi(attrs, axis, rank))
    if attrs["mode"] == "nearest":
        res = np.take(data, nearest_indices(x, in_len, attrs["nearest_mode"]), axis=axis)
    else:
        taps, weights = interpolation_taps(x, in_len, attrs["mode"], attrs["cubic_coeff_a"], attrs["exclude_outside"],
                                           scale, attrs.get("antialias", False))
        gathered = np.take(data, taps, axis=axis)  # (..., out, taps, ...)
        res = np.einsum("...ot,ot->...o", np.moveaxis(gathered, (axis, axis + 1), (-2, -1)), weights)
        res = np.moveaxis(res, -1, axis)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (out_len,) + (1,) * (rank - axis - 1))
        res = np.where(mask, np.asarray(attrs["extrapolation_value"]).astype(res.dtype), res)
    return res


def _cast_back(res: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if res.dtype == dtype:
        return res
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(res), info.min, info.max).astype(dtype)
    return res.astype(dtype)


def _resize(xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    data = xs[0]
    res = data if attrs["mode"] == "nearest" or data.dtype == np.float64 else data.astype(np.float64)
    for axis in range(data.ndim):
        if not is_identity_axis(attrs, axis, data.shape[axis], data.ndim):
            res = _resize_axis(res, axis, attrs)
    return [_cast_back(res, data.dtype) if res is not data else data.copy()]


def check_resize_attrs(x: TensorType, attrs: dict[str, Any]) -> None:
    sizes, scales, roi = attrs["sizes"], attrs.get("scales"), attrs.get("roi")
    if len(sizes) != x.rank:
        raise ValueError(f"resize: sizes {tuple(sizes)} should have one entry per axis of {x.shape}")
    if any(s < 0 for s in sizes) or any(s == 0 for s in x.shape):
        raise ValueError(f"resize: cannot resize {x.shape} to {tuple(sizes)}")
    if scales is not None and (len(scales) != x.rank or any(not s > 0 for s in scales)):
        raise ValueError(f"resize: scales {tuple(scales)} should be one positive number per axis of {x.shape}")
    if roi is not None and len(roi) != 2 * x.rank:
        raise ValueError(f"resize: roi should have {2 * x.rank} entries (begins, then ends), got {len(roi)}")
    for key, known in (("mode", MODES), ("coordinate_transformation_mode", COORDINATE_MODES),
                       ("nearest_mode", NEAREST_MODES)):
        if attrs[key] not in known:
            raise ValueError(f"resize: unknown {key} {attrs[key]!r}; known: {', '.join(known)}")
    if attrs["mode"] != "nearest" and x.dtype == "bool":
        raise TypeError(f"resize: {attrs['mode']} interpolation of a bool tensor is not supported")


def _resize_type(ts, attrs):
    check_resize_attrs(ts[0], attrs)
    return [TensorType(tuple(attrs["sizes"]), ts[0].dtype)]


register("resize", _resize, _resize_type)
