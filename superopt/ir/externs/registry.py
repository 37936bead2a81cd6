"""The extern registry: kind -> (numpy evaluate, shape/dtype inference).

Each entry maps a kind to ``(evaluate(inputs, attrs) -> outputs, infer(types, attrs) -> types)``.
``evaluate`` keeps the element type of its float inputs (the reference interpreter may feed float64
for float32 tensors) and returns fresh arrays (never an input itself: the executor may hand them out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from superopt.ir.types import TensorType

Evaluate = Callable[[Sequence[np.ndarray], dict[str, Any]], list[np.ndarray]]
Infer = Callable[[Sequence[TensorType], dict[str, Any]], list[TensorType]]

EXTERNS: dict[str, tuple[Evaluate, Infer]] = {}


def register(kind: str, evaluate: Evaluate, infer: Infer) -> None:
    EXTERNS[kind] = (evaluate, infer)


def evaluate_extern(kind: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    if kind not in EXTERNS:
        raise NotImplementedError(f"no extern op {kind!r}; known: {sorted(EXTERNS)}")
    out = EXTERNS[kind][0](inputs, attrs)
    return [np.ascontiguousarray(o).reshape(np.shape(o)) for o in out]  # keep rank 0


def infer_extern(kind: str, types: Sequence[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if kind not in EXTERNS:
        raise NotImplementedError(f"no extern op {kind!r}; known: {sorted(EXTERNS)}")
    return EXTERNS[kind][1](types, attrs)
