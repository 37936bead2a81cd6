"""Extern op kinds: what index notation cannot express, with numpy semantics and shape rules.

Each entry maps a kind to ``(evaluate(inputs, attrs) -> outputs, infer(types, attrs) -> types)``.
Code generators handle ``reshape`` as an alias and call back into numpy for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from superopt.ir.types import TensorType, dtype_name

Evaluate = Callable[[Sequence[np.ndarray], dict[str, Any]], list[np.ndarray]]
Infer = Callable[[Sequence[TensorType], dict[str, Any]], list[TensorType]]

EXTERNS: dict[str, tuple[Evaluate, Infer]] = {}


def register(kind: str, evaluate: Evaluate, infer: Infer) -> None:
    EXTERNS[kind] = (evaluate, infer)


# reshape(shape): same elements in row-major order, new shape (an alias: no data moves).
register(
    "reshape",
    lambda xs, a: [np.reshape(xs[0], a["shape"])],
    lambda ts, a: [TensorType(tuple(a["shape"]), ts[0].dtype)],
)


def _gather(xs, a):
    data, idx = xs
    idx = np.where(idx < 0, idx + data.shape[a["axis"]], idx)
    return [np.take(data, idx, axis=a["axis"])]


def _gather_type(ts, a):
    d, i = ts
    ax = a["axis"]
    return [TensorType(d.shape[:ax] + i.shape + d.shape[ax + 1:], d.dtype)]


# gather(axis): out[..., i..., ...] = data[..., idx[i...], ...] with run-time indices.
register("gather", _gather, _gather_type)


def _nonzero(xs, a):
    return [np.array(np.nonzero(xs[0]), dtype=np.int64)]


def evaluate_extern(kind: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    if kind not in EXTERNS:
        raise NotImplementedError(f"no extern op {kind!r}; known: {sorted(EXTERNS)}")
    out = EXTERNS[kind][0](inputs, attrs)
    return [np.ascontiguousarray(o).reshape(np.shape(o)) for o in out]  # keep rank 0


def infer_extern(kind: str, types: Sequence[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if kind not in EXTERNS:
        raise NotImplementedError(f"no extern op {kind!r}; known: {sorted(EXTERNS)}")
    return EXTERNS[kind][1](types, attrs)


__all__ = ["EXTERNS", "register", "evaluate_extern", "infer_extern", "dtype_name"]
