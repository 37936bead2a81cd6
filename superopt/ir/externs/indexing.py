"""Extern kinds for data-dependent indexing (ONNX semantics; negative indices count from the end).

- ``gather_elements(axis)``: ``out[i...] = data[i..., idx[i...] (at axis), i...]``; out has the shape of idx.
- ``gather_nd(batch_dims)``: ``out[b..., q...] = data[b..., idx[b..., q..., :], ...]``.
- ``scatter_elements(axis, reduction)`` / ``scatter_nd(reduction)``: a copy of data with updates written
  (reduction ``none``) or combined (``add``, ``mul``, ``max``, ``min``) at the indexed places.
An index out of range raises IndexError at run time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType

REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
INDEX_DTYPES = ("int64", "int32")


def normalize_indices(idx: np.ndarray, extent: int, what: str) -> np.ndarray:
    """Indices in [-extent, extent) as int64 in [0, extent); anything else raises IndexError."""
    idx = np.asarray(idx).astype(np.int64, copy=False)
    out = np.where(idx < 0, idx + extent, idx)
    if out.size and (out.min() < 0 or out.max() >= extent):
        bad = idx.reshape(-1)[np.flatnonzero((out < 0) | (out >= extent))[0]]
        raise IndexError(f"{what}: index {int(bad)} is out of range for an axis of extent {extent}")
    return out


def _check_index_type(t: TensorType, what: str) -> None:
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{what}: indices must be int64 or int32, not {t.dtype}")


def _element_key(data_shape: Sequence[int], idx: np.ndarray, axis: int, what: str) -> tuple[np.ndarray, ...]:
    """Advanced-index key for data: the position of every index element, with idx at ``axis``."""
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = normalize_indices(idx, data_shape[axis], what)
    return tuple(grid)


def _check_elements(data: TensorType, idx: TensorType, axis: int, what: str) -> None:
    _check_index_type(idx, what)
    if idx.rank != data.rank:
        raise ValueError(f"{what}: indices have rank {idx.rank} but data has rank {data.rank}")
    if not 0 <= axis < max(data.rank, 1):
        raise ValueError(f"{what}: axis {axis} is out of range for rank {data.rank}")
    for k, (i, d) in enumerate(zip(idx.shape, data.shape)):
        if k != axis and i > d:
            raise ValueError(f"{what}: indices shape {idx.shape} exceeds data shape {data.shape} on axis {k}")


# ---- gather_elements --------------------------------------------------------------------------
def _gather_elements(xs, a):
    data, idx = xs
    return [data[_element_key(data.shape, idx, a["axis"], "gather_elements")]]


def _gather_elements_type(ts, a):
    data, idx = ts
    _check_elements(data, idx, a["axis"], "gather_elements")
    return [TensorType(idx.shape, data.dtype)]


register("gather_elements", _gather_elements, _gather_elements_type)


# ---- scatter_elements -------------------------------------------------------------------------
def _scatter(out: np.ndarray, key: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "none":
        out[key] = updates
    else:
        REDUCTIONS[reduction].at(out, key, updates)
    return out


def _scatter_elements(xs, a):
    data, idx, updates = xs
    key = _element_key(data.shape, idx, a["axis"], "scatter_elements")
    return [_scatter(data.copy(), key, updates.astype(data.dtype, copy=False), a["reduction"])]


def _check_updates(data: TensorType, updates: TensorType, what: str) -> None:
    if updates.dtype != data.dtype:
        raise TypeError(f"{what}: updates are {updates.dtype} but data is {data.dtype}")


def _check_reduction(reduction: str, what: str) -> None:
    if reduction != "none" and reduction not in REDUCTIONS:
        raise ValueError(f"{what}: reduction {reduction!r} is not one of none, {', '.join(REDUCTIONS)}")


def _scatter_elements_type(ts, a):
    data, idx, updates = ts
    _check_elements(data, idx, a["axis"], "scatter_elements")
    _check_reduction(a["reduction"], "scatter_elements")
    _check_updates(data, updates, "scatter_elements")
    if updates.shape != idx.shape:
        raise ValueError(f"scatter_elements: updates shape {updates.shape} differs from indices shape {idx.shape}")
    return [TensorType(data.shape, data.dtype)]


register("scatter_elements", _scatter_elements, _scatter_elements_type)


# ---- gather_nd --------------------------------------------------------------------------------
def _gather_nd(xs, a):
    data, idx = xs
    b = a["batch_dims"]
    m = idx.shape[-1]
    batch = math.prod(data.shape[:b])
    queries = math.prod(idx.shape[b:-1])
    d2 = data.reshape((batch,) + data.shape[b:])
    i2 = idx.reshape(batch, queries, m)
    cols = [normalize_indices(i2[..., j], data.shape[b + j], "gather_nd") for j in range(m)]
    got = d2[(np.arange(batch)[:, None], *cols)]
    if m == 0:
        got = np.broadcast_to(got, (batch, queries) + data.shape[b:])
    return [np.array(got.reshape(idx.shape[:-1] + data.shape[b + m:]))]


def _check_nd(data: TensorType, idx: TensorType, b: int, what: str) -> int:
    _check_index_type(idx, what)
    if idx.rank < 1 or data.rank < 1:
        raise ValueError(f"{what}: data and indices need rank >= 1, got {data.rank} and {idx.rank}")
    if not 0 <= b < min(data.rank, idx.rank):
        raise ValueError(f"{what}: batch_dims {b} must be in [0, {min(data.rank, idx.rank)})")
    if idx.shape[:b] != data.shape[:b]:
        raise ValueError(f"{what}: batch dims of indices {idx.shape[:b]} differ from data's {data.shape[:b]}")
    m = idx.shape[-1]
    if m > data.rank - b:
        raise ValueError(f"{what}: index tuples of length {m} exceed the {data.rank - b} indexable axes of data")
    return m


def _gather_nd_type(ts, a):
    data, idx = ts
    b = a["batch_dims"]
    m = _check_nd(data, idx, b, "gather_nd")
    return [TensorType(idx.shape[:-1] + data.shape[b + m:], data.dtype)]


register("gather_nd", _gather_nd, _gather_nd_type)


# ---- scatter_nd -------------------------------------------------------------------------------
def _scatter_nd(xs, a):
    data, idx, updates = xs
    key = tuple(normalize_indices(idx[..., j], data.shape[j], "scatter_nd") for j in range(idx.shape[-1]))
    return [_scatter(data.copy(), key, updates.astype(data.dtype, copy=False), a["reduction"])]


def _scatter_nd_type(ts, a):
    data, idx, updates = ts
    m = _check_nd(data, idx, 0, "scatter_nd")
    _check_reduction(a["reduction"], "scatter_nd")
    _check_updates(data, updates, "scatter_nd")
    want = idx.shape[:-1] + data.shape[m:]
    if updates.shape != want:
        raise ValueError(f"scatter_nd: updates shape {updates.shape} should be {want}")
    return [TensorType(data.shape, data.dtype)]


register("scatter_nd", _scatter_nd, _scatter_nd_type)
