"""Data-dependent indexing (ONNX GatherElements, GatherND, ScatterElements, ScatterND, OneHot).

Gathers and scatters are extern kinds (the positions they touch are data); ``one_hot`` is index
notation (a comparison of each index with the position along the new axis). Negative indices count
from the end; constant indices are checked when the op is built, run-time ones when it runs.
"""

from __future__ import annotations

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ir.externs.indexing import REDUCTIONS, normalize_indices
from superopt.ops._extern import extern_op
from superopt.ops._util import dims, idx, lit, norm_axis, reshape_alias


def _check_constant_indices(b: GraphBuilder, indices: str, extents: list[int], what: str) -> None:
    """Constant indices out of range fail at build time (``extents``: one per index column or axis)."""
    v = b.const_value(indices)
    if v is None:
        return
    if len(extents) == 1:
        normalize_indices(v, extents[0], what)
    else:
        for j, n in enumerate(extents):
            normalize_indices(v[..., j], n, what)


def _reduction(reduction: str, what: str) -> str:
    reduction = str(reduction)
    if reduction != "none" and reduction not in REDUCTIONS:
        raise ValueError(f"{what}: reduction {reduction!r} is not one of none, {', '.join(REDUCTIONS)}")
    return reduction


def gather_elements(b: GraphBuilder, data: str, indices: str, axis: int = 0) -> str:
    """out[i...] = data[i_0, ..., indices[i...], ..., i_r-1] (the index replaces the one at ``axis``)."""
    a = norm_axis(int(axis), len(b.shape(data)))
    _check_constant_indices(b, indices, [b.shape(data)[a]], "gather_elements")
    return extern_op(b, "gather_elements", [data, indices], "gather_elements", axis=a)[0]


def scatter_elements(b: GraphBuilder, data: str, indices: str, updates: str, axis: int = 0,
                     reduction: str = "none") -> str:
    """A copy of data with data[i_0, ..., indices[i...], ...] = updates[i...] (or combined by ``reduction``)."""
    a = norm_axis(int(axis), len(b.shape(data)))
    _check_constant_indices(b, indices, [b.shape(data)[a]], "scatter_elements")
    return extern_op(b, "scatter_elements", [data, indices, updates], "scatter_elements", axis=a,
                     reduction=_reduction(reduction, "scatter_elements"))[0]


def _nd_extents(b: GraphBuilder, data: str, indices: str, batch_dims: int) -> list[int]:
    m = b.shape(indices)[-1] if b.shape(indices) else 0
    return list(b.shape(data)[batch_dims:batch_dims + m])


def gather_nd(b: GraphBuilder, data: str, indices: str, batch_dims: int = 0) -> str:
    """out[b..., q...] = data[b..., indices[b..., q..., 0], ..., indices[b..., q..., m-1], ...]."""
    out = extern_op(b, "gather_nd", [data, indices], "gather_nd", batch_dims=int(batch_dims))[0]
    _check_constant_indices(b, indices, _nd_extents(b, data, indices, int(batch_dims)), "gather_nd")
    return out


def scatter_nd(b: GraphBuilder, data: str, indices: str, updates: str, reduction: str = "none") -> str:
    """A copy of data with data[indices[q..., :]] = updates[q...] (or combined by ``reduction``)."""
    out = extern_op(b, "scatter_nd", [data, indices, updates], "scatter_nd",
                    reduction=_reduction(reduction, "scatter_nd"))[0]
    _check_constant_indices(b, indices, _nd_extents(b, data, indices, 0), "scatter_nd")
    return out


def one_hot(b: GraphBuilder, indices: str, depth: int, values: str, axis: int = -1) -> str:
    """values[1] where an index equals the position along the new axis ``axis`` (of extent ``depth``),
    values[0] elsewhere; indices in [-depth, 0) count from the end, others match nothing; float
    indices are truncated to integers. The result has the element type of ``values``."""
    it, vt = b.type(indices), b.type(values)
    depth = int(depth)
    if depth < 1:
        raise ValueError(f"one_hot: depth must be positive, got {depth}")
    if vt.shape != (2,):
        raise ValueError(f"one_hot: values must hold [off, on] (shape (2,)), got shape {vt.shape}")
    if it.dtype == "bool":
        raise TypeError("one_hot: indices must be numbers, not bool")
    r = it.rank
    a = norm_axis(int(axis), r + 1)
    iv, vv = b.const_value(indices), b.const_value(values)
    if iv is not None and vv is not None:
        k = np.trunc(iv).astype(np.int64) if iv.dtype.kind == "f" else iv.astype(np.int64)
        k = np.expand_dims(np.where(k < 0, k + depth, k), a)
        pos = np.arange(depth).reshape((depth,) + (1,) * (r - a))
        return b.constant(np.where(k == pos, vv[1], vv[0]).astype(vv.dtype))
    if r == 0:  # index notation needs an axis to index
        return reshape_alias(b, one_hot(b, reshape_alias(b, indices, (1,)), depth, values, 1), (depth,))
    ds = dims(r)
    out_dims = ds[:a] + ["j"] + ds[a:]
    read = f"I[{idx(ds)}]"
    if it.dtype not in ("int64", "int32"):
        read = f"cast_int64({read})"
    src = f"O[{idx(out_dims)}] = where(or({read} == j, {read} + {lit(depth)} == j), V[1], V[0])"
    return b.compute1(src, {"I": indices, "V": values}, "one_hot", extents={"j": depth})


__all__ = ["gather_elements", "gather_nd", "scatter_elements", "scatter_nd", "one_hot"]
