"""Extern kinds for ordering: ``topk`` (also sort and argsort) and ``arg_reduce`` (argmax/argmin).

- ``topk(k, axis, largest)``: the k largest (or smallest) entries along axis, in order, and their int64
  indices; equal values keep index order (lower index first, as ONNX TopK and a stable sort). NaN counts
  as larger than every number. ``topk`` with k = the axis extent is a stable sort.
- ``arg_reduce(fn, axis, keepdims, select_last_index)``: int64 index of the max/min along axis; the
  first one on ties unless ``select_last_index``.
"""

from __future__ import annotations

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType


def _stable_order(v: np.ndarray, largest: bool) -> np.ndarray:
    """Positions that sort the last axis of ``v``; ties keep their order (descending too)."""
    if not largest:
        return np.argsort(v, axis=-1, kind="stable")
    n = v.shape[-1]
    return n - 1 - np.argsort(v[..., ::-1], axis=-1, kind="stable")[..., ::-1]


def _partial_candidates(v: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """For each row of the 2-d ``v``, the positions (ascending) of its k best entries, ties to the lower
    positions: a partition finds the k-th best value, then all better ones and the first equal ones."""
    n = v.shape[-1]
    kth = np.partition(v, n - k if largest else k - 1, axis=-1)[:, n - k if largest else k - 1][:, None]
    better = v > kth if largest else v < kth
    equal = v == kth
    need = k - better.sum(axis=-1, keepdims=True)
    chosen = better | (equal & (np.cumsum(equal, axis=-1) <= need))
    return np.nonzero(chosen)[1].reshape(v.shape[0], k)


def topk_indices(x: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    """int64 indices (k along ``axis``) of the top-k entries of ``x`` in ONNX TopK order."""
    v = np.moveaxis(x, axis, -1)
    n = v.shape[-1]
    lead = v.shape[:-1]
    v2 = v.reshape(-1, n)
    partial = 0 < k and 8 * k <= n and n >= 64 and not (v2.dtype.kind == "f" and np.isnan(v2).any())
    if partial:
        cand = _partial_candidates(v2, k, largest)
        vals = np.take_along_axis(v2, cand, axis=-1)
        order = np.take_along_axis(cand, _stable_order(vals, largest), axis=-1)
    else:
        order = _stable_order(v2, largest)[:, :k]
    return np.moveaxis(order.reshape(lead + (k,)).astype(np.int64, copy=False), -1, axis)


def _topk(xs, a):
    x = xs[0]
    idx = topk_indices(x, a["k"], a["axis"], a["largest"])
    return [np.take_along_axis(x, idx, axis=a["axis"]), idx]


def _topk_type(ts, a):
    x = ts[0]
    axis, k = a["axis"], a["k"]
    if not 0 <= axis < x.rank:
        raise ValueError(f"topk: axis {axis} is out of range for rank {x.rank}")
    if not 0 <= k <= x.shape[axis]:
        raise ValueError(f"topk: k={k} is not in [0, {x.shape[axis]}] (the extent of axis {axis})")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


register("topk", _topk, _topk_type)


def _arg_reduce(xs, a):
    x = xs[0]
    axis = a["axis"]
    pick = np.argmax if a["fn"] == "max" else np.argmin
    if a["select_last_index"]:
        idx = x.shape[axis] - 1 - pick(np.flip(x, axis), axis=axis)
    else:
        idx = pick(x, axis=axis)
    idx = idx.astype(np.int64)
    return [np.expand_dims(idx, axis) if a["keepdims"] else idx]


def _arg_reduce_type(ts, a):
    x = ts[0]
    axis = a["axis"]
    if a["fn"] not in ("max", "min"):
        raise ValueError(f"arg_reduce: fn must be 'max' or 'min', not {a['fn']!r}")
    if not 0 <= axis < x.rank:
        raise ValueError(f"arg{a['fn']}: axis {axis} is out of range for rank {x.rank}")
    if x.shape[axis] == 0:
        raise ValueError(f"arg{a['fn']}: axis {axis} is empty")
    shape = x.shape[:axis] + ((1,) if a["keepdims"] else ()) + x.shape[axis + 1:]
    return [TensorType(shape, "int64")]


register("arg_reduce", _arg_reduce, _arg_reduce_type)
