"""The extern registry: kind -> (numpy evaluate, shape/dtype inference).

Each entry maps a kind to ``(evaluate(inputs, attrs) -> outputs, infer(types, attrs) -> types)``.
``evaluate`` keeps the element type of its float inputs (the reference interpreter may feed float64
for float32 tensors) and returns fresh arrays (never an input itself: the executor may hand them out).

Run-time shapes: a kind registered with ``run_time_shape`` (attrs -> one flag per output) has outputs
whose extents depend on input values (NonZero, Unique, NonMaxSuppression). Their inferred shapes are
upper bounds; the arrays ``evaluate`` returns have the true shapes. Nothing compiled may depend on such a
shape, so such an output may only be a graph output that no node reads (:func:`check_run_time_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from superopt.ir.types import TensorType

if TYPE_CHECKING:
    from superopt.ir.graph import Graph, Node

Evaluate = Callable[[Sequence[np.ndarray], dict[str, Any]], list[np.ndarray]]
Infer = Callable[[Sequence[TensorType], dict[str, Any]], list[TensorType]]
RunTimeShape = Callable[[dict[str, Any]], list[bool]]

EXTERNS: dict[str, tuple[Evaluate, Infer]] = {}
RUN_TIME_SHAPED: dict[str, RunTimeShape] = {}  # kind -> (attrs -> per output: is its shape known only at run time)


def register(kind: str, evaluate: Evaluate, infer: Infer, run_time_shape: RunTimeShape | None = None) -> None:
    EXTERNS[kind] = (evaluate, infer)
    if run_time_shape is not None:
        RUN_TIME_SHAPED[kind] = run_time_shape


def evaluate_extern(kind: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    if kind not in EXTERNS:
        raise NotImplementedError(f"no extern op {kind!r}; known: {sorted(EXTERNS)}")
    out = EXTERNS[kind][0](inputs, attrs)
    return [np.ascontiguousarray(o).reshape(np.shape(o)) for o in out]  # keep rank 0


def infer_extern(kind: str, types: Sequence[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if kind not in EXTERNS:
        raise NotImplementedError(f"no extern op {kind!r}; known: {sorted(EXTERNS)}")
    return EXTERNS[kind][1](types, attrs)


def run_time_shaped(node: Node) -> list[bool]:
    """Per output of ``node``: is its shape known only at run time (all False for compute nodes)."""
    if node.is_extern and node.op.kind in RUN_TIME_SHAPED:
        return RUN_TIME_SHAPED[node.op.kind](node.op.attr)
    return [False] * len(node.outputs)


def check_run_time_shapes(graph: Graph) -> None:
    """One-line ``GraphError`` where an output whose shape is known only at run time is read by a node or
    is not a graph output (it would be compiled or stored for its upper-bound shape)."""
    from superopt.ir.graph import GraphError

    readers = {i: n.name for n in graph.nodes for i in n.inputs}
    outputs = set(graph.outputs)
    for n in graph.nodes:
        for o, dynamic in zip(n.outputs, run_time_shaped(n)):
            if not dynamic:
                continue
            why = f"node {readers[o]!r} reads it" if o in readers else None if o in outputs else "it is not a graph output"
            if why:
                raise GraphError(f"{n.op.kind} node {n.name!r}: output {o!r} has a shape known only at run time "
                                 f"(it depends on input values), so it can only be a graph output, but {why}")
