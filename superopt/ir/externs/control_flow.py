"""Extern kinds for control flow: ``if``, ``loop`` and ``scan``, whose branches and bodies are Graphs.

The extern runs the control logic (pick a branch, count trips, carry values, slice and stack scan
values) and calls each branch or body as a compiled superopt Graph (:mod:`superopt.runtime.subgraph`:
compiled once per body and cached). A body's inputs are fixed by the frontend: its formal inputs first,
then the values it reads from the enclosing graph (``outer`` extern inputs, passed unchanged on every
call).

- ``if(then_body, else_body)``: inputs ``[cond, *outer]``; both branches take ``outer`` and give outputs
  of equal types.
- ``loop(body, n_carried, trips)``: inputs ``[max_trips, cond, *carried, *outer]`` (ONNX Loop; the frontend
  supplies int64 max and True for absent ones); the body takes ``[iteration, cond, *carried, *outer]`` and
  gives ``[cond, *carried, *scan]``. Scan outputs stack each iteration's value on a new leading axis of
  length ``trips`` (the trip count known when compiling; -1 when the loop has no scan outputs). A loop
  that stops after another number of iterations while it has scan outputs is a run-time error.
- ``scan(body, n_state, in_axes, in_reverse, out_axes, out_reverse)``: inputs ``[*state, *scanned, *outer]``
  (ONNX Scan, opset 9+); the body takes ``[*state, *slices, *outer]`` and gives ``[*state, *scan]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.graph import Graph
from superopt.ir.types import TensorType


@dataclass(frozen=True, eq=False)
class Body:
    """A branch or loop body: a Graph held by an extern attribute (equal and hashed by its digest,
    printed short so that the enclosing graph's text and digest stay readable)."""

    graph: Graph = field(repr=False)

    @cached_property
    def digest(self) -> str:
        return self.graph.digest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Body) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"Body(#{self.digest[:12]}, {len(self.graph.nodes)} nodes)"

    @property
    def input_types(self) -> list[TensorType]:
        return [self.graph.type_of[i] for i in self.graph.inputs]

    @property
    def output_types(self) -> list[TensorType]:
        return [self.graph.type_of[o] for o in self.graph.outputs]

    def __call__(self, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        run = _BODY_RUNNER_HERE.get()
        if run is not None:
            return run(self.graph, xs)
        if not _BODY_RUNNER:
            raise RuntimeError(f"control-flow body {self.graph.name!r}: no body runner installed (importing "
                               "superopt.runtime installs the compiled one)")
        return _BODY_RUNNER[0](self.graph, xs)


BodyRunner = Callable[[Graph, Sequence[np.ndarray]], list[np.ndarray]]
_BODY_RUNNER: list[BodyRunner] = []  # installed by the runtime, which compiles bodies (the IR sits below it)


# the runner of this thread's current context, over the installed one: the reference interpreter runs bodies
# itself, so that a compiled body is checked against the spec and not against its own code
_BODY_RUNNER_HERE: ContextVar[BodyRunner | None] = ContextVar("body_runner", default=None)


def install_body_runner(run: BodyRunner) -> None:
    """How every control-flow body runs from now on: ``run(graph, inputs) -> outputs``."""
    _BODY_RUNNER[:] = [run]


@contextmanager
def bodies_run_by(run: BodyRunner) -> Iterator[None]:
    """Within the block, in this thread only, control-flow bodies run by ``run`` instead of the installed runner."""
    token = _BODY_RUNNER_HERE.set(run)
    try:
        yield
    finally:
        _BODY_RUNNER_HERE.reset(token)


def _check_inputs(kind: str, body: Body, types: Sequence[TensorType], what: str) -> None:
    want = body.input_types
    if len(want) != len(types) or any(w.shape != t.shape or w.dtype != t.dtype for w, t in zip(want, types)):
        raise TypeError(f"{kind}: {what} takes {[str(t) for t in want]}, not {[str(t) for t in types]}")


# ---- if ----------------------------------------------------------------------------------------------
def _if(xs, a):
    branch = a["then_body"] if bool(np.asarray(xs[0]).reshape(-1)[0]) else a["else_body"]
    return [np.array(v, copy=True) for v in branch(list(xs[1:]))]


def _if_type(ts, a):
    then, other = a["then_body"], a["else_body"]
    if ts[0].shape not in ((), (1,)):
        raise ValueError(f"if: the condition must hold one element, not shape {ts[0].shape}")
    _check_inputs("if", then, ts[1:], "the then branch")
    _check_inputs("if", other, ts[1:], "the else branch")
    if then.output_types != other.output_types:
        raise TypeError(f"if: the branches give different types: {[str(t) for t in then.output_types]} and "
                        f"{[str(t) for t in other.output_types]}")
    return list(then.output_types)


register("if", _if, _if_type)


# ---- loop --------------------------------------------------------------------------------------------
def _loop(xs, a):
    body, nc, trips = a["body"], a["n_carried"], a["trips"]
    limit = int(np.asarray(xs[0]).reshape(-1)[0])
    go = bool(np.asarray(xs[1]).reshape(-1)[0])
    carried = [np.reshape(x, t.shape) for x, t in zip(xs[2:2 + nc], body.input_types[2:])]  # rank 0 may come as 1
    outer = list(xs[2 + nc:])
    scans: list[list[np.ndarray]] = [[] for _ in body.output_types[1 + nc:]]
    i = 0
    while i < limit and go:
        outs = body([np.array(i, np.int64), np.array(go), *carried, *outer])
        go = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = [np.array(v, copy=True) for v in outs[1:1 + nc]]
        for s, v in zip(scans, outs[1 + nc:]):
            s.append(np.array(v, copy=True))
        i += 1
    if scans and i != trips:
        raise RuntimeError(f"loop: ran {i} iterations but its scan outputs were compiled for {trips} "
                           "(the trip count depends on run-time values)")
    elems = body.output_types[1 + nc:]
    stacked = [np.stack(s) if s else np.zeros((0, *t.shape), t.np_dtype) for s, t in zip(scans, elems)]
    return [*carried, *stacked]


def _loop_type(ts, a):
    body, nc, trips = a["body"], a["n_carried"], a["trips"]
    outs = body.output_types
    _check_inputs("loop", body, [TensorType((), "int64"), TensorType((), "bool"), *ts[2:]], "the body")
    if len(outs) < 1 + nc:
        raise ValueError(f"loop: the body gives {len(outs)} outputs, fewer than 1 + {nc} carried values")
    for k, (t_in, t_out) in enumerate(zip(ts[2:2 + nc], outs[1:1 + nc])):
        if t_in != t_out:
            raise TypeError(f"loop: carried value {k} enters as {t_in} but the body gives {t_out}")
    if len(outs) > 1 + nc and trips < 0:
        raise ValueError("loop: scan outputs need a trip count known when compiling")
    return [*ts[2:2 + nc], *(TensorType((trips, *t.shape), t.dtype) for t in outs[1 + nc:])]


register("loop", _loop, _loop_type)


# ---- scan --------------------------------------------------------------------------------------------
def _scan(xs, a):
    body, ns = a["body"], a["n_state"]
    in_axes, in_rev, out_axes, out_rev = a["in_axes"], a["in_reverse"], a["out_axes"], a["out_reverse"]
    n_in = len(in_axes)
    state = [np.reshape(x, t.shape) for x, t in zip(xs[:ns], body.input_types)]  # rank 0 may come as rank 1
    scanned = list(xs[ns:ns + n_in])
    outer = list(xs[ns + n_in:])
    steps = scanned[0].shape[in_axes[0]] if scanned else 0
    collected: list[list[np.ndarray]] = [[] for _ in out_axes]
    for t in range(steps):
        slices = [np.take(x, steps - 1 - t if r else t, axis=ax) for x, ax, r in zip(scanned, in_axes, in_rev)]
        outs = body([*state, *slices, *outer])
        state = [np.array(v, copy=True) for v in outs[:ns]]
        for c, v in zip(collected, outs[ns:]):
            c.append(np.array(v, copy=True))
    res = []
    for c, ax, r, t in zip(collected, out_axes, out_rev, body.output_types[ns:]):
        if not c:
            res.append(np.zeros(_stacked_shape(t.shape, 0, ax), t.np_dtype))
            continue
        res.append(np.stack(c[::-1] if r else c, axis=ax))
    return [*state, *res]


def _stacked_shape(shape: tuple[int, ...], n: int, axis: int) -> tuple[int, ...]:
    return shape[:axis] + (n,) + shape[axis:]


def _scan_type(ts, a):
    body, ns = a["body"], a["n_state"]
    in_axes, out_axes = a["in_axes"], a["out_axes"]
    n_in = len(in_axes)
    if len(a["in_reverse"]) != n_in or len(a["out_reverse"]) != len(out_axes):
        raise ValueError("scan: one direction per scanned input and per scan output")
    scanned = ts[ns:ns + n_in]
    for x, ax in zip(scanned, in_axes):
        if not 0 <= ax < x.rank:
            raise ValueError(f"scan: axis {ax} is out of range for a scanned input of rank {x.rank}")
    lengths = {x.shape[ax] for x, ax in zip(scanned, in_axes)}
    if len(lengths) > 1:
        raise ValueError(f"scan: the scanned inputs have different lengths {sorted(lengths)}")
    steps = lengths.pop() if lengths else 0
    slices = [TensorType(x.shape[:ax] + x.shape[ax + 1:], x.dtype) for x, ax in zip(scanned, in_axes)]
    _check_inputs("scan", body, [*ts[:ns], *slices, *ts[ns + n_in:]], "the body")
    outs = body.output_types
    if len(outs) != ns + len(out_axes):
        raise ValueError(f"scan: the body gives {len(outs)} outputs, not {ns} states + {len(out_axes)} scan outputs")
    for k, (t_in, t_out) in enumerate(zip(ts[:ns], outs[:ns])):
        if t_in != t_out:
            raise TypeError(f"scan: state {k} enters as {t_in} but the body gives {t_out}")
    res = list(ts[:ns])
    for t, ax in zip(outs[ns:], out_axes):
        if not 0 <= ax <= t.rank:
            raise ValueError(f"scan: output axis {ax} is out of range for a stacked value of rank {t.rank + 1}")
        res.append(TensorType(_stacked_shape(t.shape, steps, ax), t.dtype))
    return res


register("scan", _scan, _scan_type)


__all__ = ["Body"]
