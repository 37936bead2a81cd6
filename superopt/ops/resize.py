"""Resize (ONNX Resize, opset 19 without antialias): nearest, N-linear and N-cubic resampling.

Nearest resampling whose every axis copies an affine run of input positions (strided down-sampling,
a constant position) or repeats each position f times (integer up-sampling) is index notation plus a
reshape alias, so the optimizer sees and fuses it; everything else is the ``resize`` extern kind.
Both use the same sampling tables (:mod:`superopt.ir.externs.resize`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ir.externs.resize import (
    axis_roi,
    axis_scale,
    check_resize_attrs,
    is_identity_axis,
    nearest_indices,
    source_coordinates,
)
from superopt.ops._extern import extern_op
from superopt.ops._util import idx, reshape_alias


def _nearest_axis_form(attrs: dict[str, Any], axis: int, in_len: int, rank: int) -> tuple[str, int, int] | None:
    """How one axis of a nearest resize reads its input: ("affine", step, start) for
    in = step*out + start, ("repeat", f, 0) for in = out // f, or None (any other table)."""
    out_len = attrs["sizes"][axis]
    if is_identity_axis(attrs, axis, in_len, rank):
        return "affine", 1, 0
    x, outside = source_coordinates(in_len, out_len, axis_scale(attrs, axis, in_len),
                                    attrs["coordinate_transformation_mode"], axis_roi(attrs, axis, rank))
    if outside is not None and outside.any():
        return None
    table = nearest_indices(x, in_len, attrs["nearest_mode"])
    pos = np.arange(out_len)
    step = int(table[1] - table[0]) if out_len > 1 else 0
    if step >= 0 and np.array_equal(table, table[0] + step * pos):
        return "affine", step, int(table[0])
    if out_len % in_len == 0 and np.array_equal(table, pos // (out_len // in_len)):
        return "repeat", out_len // in_len, 0
    return None


def _nearest_index_notation(b: GraphBuilder, x: str, attrs: dict[str, Any]) -> str | None:
    shape = b.shape(x)
    rank = len(shape)
    forms = [_nearest_axis_form(attrs, k, n, rank) for k, n in enumerate(shape)]
    if any(f is None for f in forms):
        return None
    out_dims: list[str] = []
    reads: list[str] = []
    extents: dict[str, int] = {}
    padded = False
    for k, (kind, step, start) in enumerate(forms):
        d = f"i{k}"
        if kind == "repeat":
            out_dims += [d, f"r{k}"]
            extents[d], extents[f"r{k}"] = shape[k], step
            reads.append(d)
            continue
        out_dims.append(d)
        extents[d] = attrs["sizes"][k]
        term = str(start) if step == 0 else (d if step == 1 else f"{step}*{d}") + (f"+{start}" if start else "")
        padded |= term == d and extents[d] != shape[k]  # a plain dim that does not span the input axis
        reads.append(term)
    out = b.compute1(f"O[{idx(out_dims)}] = X[{idx(reads)}]", {"X": x}, "resize", extents=extents,
                     padding={"X": 0.0} if padded else None)
    return reshape_alias(b, out, attrs["sizes"])


def resize(b: GraphBuilder, x: str, sizes: Sequence[int], scales: Sequence[float] | None = None, mode: str = "nearest",
           coordinate_transformation_mode: str = "half_pixel", nearest_mode: str = "round_prefer_floor",
           cubic_coeff_a: float = -0.75, exclude_outside: bool = False, extrapolation_value: float = 0.0,
           roi: Sequence[float] | None = None, antialias: bool = False) -> str:
    """Resample ``x`` to the full output shape ``sizes``.

    ``scales`` (one per axis) are the caller's scale factors when it was given scales (ONNX maps
    coordinates with them, not with sizes/shape). ``roi`` (begins then ends, one pair per axis, in
    normalized coordinates) is read only by tf_crop_and_resize (default: the whole input), whose
    samples outside the input take ``extrapolation_value``. ``antialias`` (linear and cubic; nearest
    ignores it) widens the kernel by 1/scale when down-sampling, as ONNX Resize-18.
    """
    attrs: dict[str, Any] = {
        "sizes": tuple(int(s) for s in sizes),
        "scales": None if scales is None else tuple(float(s) for s in scales),
        "mode": str(mode),
        "coordinate_transformation_mode": str(coordinate_transformation_mode),
        "nearest_mode": str(nearest_mode),
        "cubic_coeff_a": float(cubic_coeff_a),
        "exclude_outside": bool(exclude_outside),
        "extrapolation_value": float(extrapolation_value),
        "roi": None if roi is None else tuple(float(r) for r in roi),
        "antialias": bool(antialias),
    }
    t = b.type(x)
    check_resize_attrs(t, attrs)
    if all(is_identity_axis(attrs, k, n, t.rank) for k, n in enumerate(t.shape)):
        return x
    if attrs["mode"] == "nearest" and b.const_value(x) is None:
        out = _nearest_index_notation(b, x, attrs)
        if out is not None:
            return out
    return extern_op(b, "resize", [x], "resize", **attrs)[0]


__all__ = ["resize"]
