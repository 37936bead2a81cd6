"""The magnitude of what an output is computed from: the scale a rounding error of that output is measured by.

A float sum's rounding error grows with the terms summed, not with the sum: ``sum R`` over random normal
``R`` nearly cancels, and a correct float32 kernel then differs from float64 by far more than a tiny
fraction of the result, and so does everything computed from that sum (``sum R*V / sum R``). The magnitude
``M`` of an output element is in units of float32's unit roundoff ``u``: a correct kernel's error is a
modest multiple of ``u * M`` (``superopt.interp.tolerance`` decides how large). It has two parts:

- the element's own rounding: its statement's expression evaluated on absolute values (``sum |terms|`` for
  a sum of products), with first-order rules through quotients (``(|a| + |a/b| |b|) / |b|``) and smooth
  functions (``|f'(a)| |a| + |f(a)|``); the tensors it reads count as exact here;
- the rounding it inherits: the float64 reference is run again with every statement's result (and every
  extern op's) moved by ``u`` times its own rounding magnitude, in random directions, and the largest
  change of the output over those runs, divided by ``u``, is added. This follows the real sensitivity,
  cancellations included: a variance around a weighted mean barely moves when the mean does (its
  derivative there is zero), while a quotient by a cancelling sum moves a lot; a bound propagated term by
  term would call both ill-conditioned and then catch no wrong kernel. A branch on a computed value that
  a perturbation flips is thereby also given the room a kernel that flips it needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from superopt.interp.reference import (
    _LETTERS,
    BINARY,
    COMPARE,
    UNARY,
    _as_input,
    _product_factors,
    _Space,
    _StatementEval,
    access_view,
    body_interpreter,
    evaluate_statement,
)
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Binary, Cast, Compare, Const, Expr, IndexValue, Unary, Where
from superopt.ir.externs.control_flow import bodies_run_by
from superopt.ir.graph import Graph
from superopt.ir.statement import Statement
from superopt.ir.types import is_float

# |f'(x)| as a function of (x, f(x)), for the smooth unary functions
_SLOPE = {
    "exp": lambda x, y: np.abs(y),
    "log": lambda x, y: 1.0 / np.abs(x),
    "sqrt": lambda x, y: 0.5 / np.abs(y),
    "rsqrt": lambda x, y: 0.5 * np.abs(y) / np.abs(x),
    "tanh": lambda x, y: 1.0 - y * y,
    "erf": lambda x, y: 2.0 / np.sqrt(np.pi) * np.exp(-x * x),
    "sigmoid": lambda x, y: y * (1.0 - y),
    "reciprocal": lambda x, y: y * y,
    "sin": lambda x, y: np.abs(np.cos(x)),
    "cos": lambda x, y: np.abs(np.sin(x)),
    "tan": lambda x, y: 1.0 + y * y,
    "atan": lambda x, y: 1.0 / (1.0 + x * x),
    "sinh": lambda x, y: np.cosh(x),
    "cosh": lambda x, y: np.abs(np.sinh(x)),
    "asinh": lambda x, y: 1.0 / np.sqrt(1.0 + x * x),
    "asin": lambda x, y: 1.0 / np.sqrt(np.abs(1.0 - x * x)),
    "acos": lambda x, y: 1.0 / np.sqrt(np.abs(1.0 - x * x)),
    "acosh": lambda x, y: 1.0 / np.sqrt(np.abs(x * x - 1.0)),
    "atanh": lambda x, y: 1.0 / np.abs(1.0 - x * x),
}
_LIPSCHITZ = ("abs", "neg", "relu")  # |f(a) - f(b)| <= |a - b| and |f(a)| <= |a|


class _NoBound(Exception):
    """The expression is not continuous in computed data: no magnitude bounds its rounding error."""


class _MagnitudeEval:
    """One statement evaluated as (value, magnitude) pairs in float64."""

    def __init__(self, st: Statement, values: Mapping[str, np.ndarray], mags: Mapping[str, np.ndarray | None],
                 exact: frozenset[str]) -> None:
        self.st, self.values, self.mags, self.exact = st, values, mags, exact
        self.space = _Space(st)

    def run(self) -> np.ndarray:
        st = self.st
        if len(self.space.order) > len(_LETTERS):
            raise _NoBound
        factors = _product_factors(st.expr) if st.reduce == "+=" else None
        accesses = [f for f in factors or () if isinstance(f, Access)]
        if accesses and all(p >= 0 for p in st.pad_value.values()):
            # a sum of products, without the full iteration space: the reference on absolute values, once per
            # rounded product (the tensors read count as exact)
            # (the magnitudes of what a statement reads are their absolute values: taken a slice at a time)
            pos = [replace(f, value=abs(f.value)) if isinstance(f, Const) else f for f in factors]
            m = len(accesses) * _StatementEval(st, self.values, np.dtype(np.float64))._einsum(pos, absolute=True)
            return np.ascontiguousarray(m, dtype=np.float64).reshape(st.out_shape)
        _, m = self.eval(st.expr)
        full = tuple(self.space.ext[d] for d in self.space.order)
        m = np.broadcast_to(np.asarray(m, np.float64), full)
        red_axes = tuple(range(len(st.out_dims), len(full)))
        if st.reduce == "+=":
            m = m.sum(axis=red_axes) if red_axes else m
        elif st.reduce in ("max=", "min="):
            # an infinite term (a max pool's -inf padding) never wins where the result is finite, and where it
            # does the result is that exact infinity: its scale bounds no error
            m = np.where(np.isfinite(m), m, 0.0)
            m = m.max(axis=red_axes, initial=0.0) if red_axes else m
        elif st.reduce != "=":
            raise _NoBound
        return np.ascontiguousarray(m, dtype=np.float64).reshape(st.out_shape)

    def _view(self, arrays: Mapping[str, np.ndarray], a: Access, pad: float | None) -> np.ndarray:
        arr = np.asarray(arrays[a.tensor])
        if arr.dtype.kind == "f" and arr.dtype != np.float64:  # (a float32 weight, read in float64)
            arr = arr.astype(np.float64)
        return access_view(arr, a, self.space, pad, self.space.order)

    def _exact(self, e: Expr) -> bool:
        """Whether ``e`` reads only exact data (inputs, index values): a branch on it never flips."""
        return all(a.tensor in self.exact for a in e.accesses())

    def eval(self, e: Expr):
        if isinstance(e, Access):
            if self.mags.get(e.tensor) is None:
                raise _NoBound
            pad = self.st.pad_value.get(e.tensor)
            v = self._view(self.values, e, pad)
            m = self._view(self.mags, e, None if pad is None else abs(float(pad)))
            return v, m
        if isinstance(e, Const):
            return e.value, abs(float(e.value))
        if isinstance(e, IndexValue):
            v = _index_value(self.space, e)
            return v, np.abs(v).astype(np.float64)
        if isinstance(e, Cast):
            v, m = self.eval(e.x)
            if not is_float(e.dtype) and np.issubdtype(np.asarray(v).dtype, np.floating):
                raise _NoBound
            return v, m
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if isinstance(e, Unary):
                return self._unary(e)
            if isinstance(e, Binary):
                return self._binary(e)
            if isinstance(e, Where):
                if not self._exact(e.cond):
                    raise _NoBound
                c = self._cond(e.cond)
                (va, ma), (vb, mb) = self.eval(e.a), self.eval(e.b)
                return np.where(c, va, vb), np.where(c, ma, mb)
        raise _NoBound

    def _cond(self, e: Expr):
        if isinstance(e, Compare):
            return COMPARE[e.op](self.eval(e.a)[0], self.eval(e.b)[0])
        return self.eval(e)[0]

    def _unary(self, e: Unary):
        x, mx = self.eval(e.x)
        x = np.asarray(x, np.float64)
        y = UNARY[e.fn](x)
        if e.fn in _LIPSCHITZ:
            return y, mx
        slope = _SLOPE.get(e.fn)
        if slope is None:
            if self._exact(e.x):  # floor, round, ... of exact data (index arithmetic): still exact
                return y, np.abs(y)
            raise _NoBound
        return y, slope(x, y) * mx + np.abs(y)

    def _binary(self, e: Binary):
        (a, ma), (b, mb) = self.eval(e.a), self.eval(e.b)
        v = BINARY[e.op](a, b)
        if e.op in ("+", "-"):
            return v, ma + mb
        if e.op == "*":
            return v, ma * np.abs(b) + np.abs(a) * mb
        if e.op == "/":
            q = np.abs(v)
            return v, (ma + q * mb) / np.abs(b)
        if e.op in ("max", "min"):
            return v, np.maximum(ma, mb)
        if e.op == "pow" and isinstance(e.b, Const):
            p = float(e.b.value)
            return v, np.abs(p * np.power(np.abs(a), p - 1.0)) * ma + np.abs(v)
        if self._exact(e):
            return v, np.abs(np.asarray(v, np.float64))
        raise _NoBound


def _index_value(space: _Space, e: IndexValue) -> np.ndarray:
    n = len(space.order)
    val = np.array(e.index.const, dtype=np.int64).reshape((1,) * n)
    for d, c in e.index.terms:
        shape = [1] * n
        shape[space.axis[d]] = space.ext[d]
        val = val + c * np.arange(space.ext[d], dtype=np.int64).reshape(shape)
    return val


U32 = 2.0**-24  # float32's unit roundoff
SAMPLES = 2  # perturbed reference runs


class _Absolute(Mapping):
    """``|env[n]|`` in float64 for each of ``names``, computed when first read (a sum of products reads none:
    it takes the absolute values of its operands a slice at a time)."""

    def __init__(self, env: Mapping[str, np.ndarray], names: set[str]) -> None:
        self.env, self.names, self.done = env, names, {}

    def __getitem__(self, n: str) -> np.ndarray:
        if n not in self.names:
            raise KeyError(n)
        if n not in self.done:
            self.done[n] = np.abs(np.asarray(self.env[n], np.float64))
        return self.done[n]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _local_magnitude(st: Statement, env: Mapping[str, np.ndarray], value: np.ndarray) -> np.ndarray:
    """The statement's own rounding magnitude, the tensors it reads taken as exact."""
    names = {a.tensor for a in st.expr.accesses()}
    mags = _Absolute(env, names)
    try:
        return _MagnitudeEval(st, env, mags, frozenset(names)).run()
    except Exception:  # noqa: BLE001 - *=, too many dims, ...: the rounding of the result itself
        return np.abs(np.asarray(value, np.float64))


def _perturb(value: np.ndarray, magnitude: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    if rng is None or value.dtype.kind != "f":
        return value
    # (in place, and one pass over the sum where all is finite: this is most of a whole model's reference time)
    with np.errstate(invalid="ignore", over="ignore"):  # (a non-finite sum is redone below)
        noise = rng.standard_normal(value.shape)
        noise *= magnitude
        noise *= U32
        moved = value + noise
    if np.isfinite(moved).all():
        return moved
    # an infinity (a max pool's -inf padding) is exact: perturbing it would give inf - inf = NaN downstream
    return np.where(np.isfinite(value), value + np.where(np.isfinite(noise), noise, 0.0), value)


def _input64(x, t, what: str) -> np.ndarray:
    """An input of a float64 evaluation: a float array of another float type (a float32 weight) as it is (each
    statement converts what it reads, a slice at a time where it is large), anything else in float64."""
    if isinstance(x, np.ndarray) and x.dtype.kind == "f" and is_float(t.dtype) and tuple(x.shape) == t.shape \
            and x.flags.c_contiguous:
        return x
    return _as_input(x, t, np.dtype(np.float64), what)


def _run_compute(c: Compute, args: Mapping[str, np.ndarray], rng: np.random.Generator | None,
                 local: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``c`` in float64. Without ``rng``: each float statement's own rounding magnitude is
    stored in ``local`` (float32, by statement name); with it, each statement's result is moved by ``u`` times
    that magnitude in a random direction before later statements read it."""
    env = {n: _input64(args[n], c.type_of[n], f"input {n!r}") for n in c.inputs}
    for st in c.statements:
        v = evaluate_statement(st, env, c.type_of[st.out], np.float64)
        if v.dtype.kind == "f":
            if rng is None:
                local[st.out] = _local_magnitude(st, env, v).astype(np.float32)
            else:
                v = _perturb(v, local[st.out], rng)
        env[st.out] = v
    return [env[o] for o in c.outputs]


def _combine(value: np.ndarray, local: np.ndarray | None, runs: Sequence[np.ndarray]) -> np.ndarray | None:
    """The own rounding magnitude plus the largest change over the perturbed runs, over ``u``."""
    if local is None or np.asarray(value).dtype.kind != "f":
        return None
    spread = np.zeros(np.shape(value))
    with np.errstate(invalid="ignore"):
        for r in runs:
            spread = np.fmax(spread, np.abs(np.asarray(r, np.float64) - value))
    return np.asarray(local, np.float64) + spread / U32


def compute_magnitudes(c: Compute, args: Sequence[np.ndarray] | Mapping[str, np.ndarray],
                       samples: int = SAMPLES, seed: int = 0) -> list[np.ndarray | None]:
    """Per output of ``c``, the magnitude of each element in units of ``u`` (see the module docstring), or
    None for a non-float output."""
    if not isinstance(args, Mapping):
        args = dict(zip(c.inputs, args, strict=True))
    local: dict[str, np.ndarray] = {}
    values = _run_compute(c, args, None, local)
    rng = np.random.default_rng(seed)
    runs = [_run_compute(c, args, rng, local) for _ in range(samples)]
    return [_combine(v, local.get(o), [r[k] for r in runs])
            for k, (o, v) in enumerate(zip(c.outputs, values, strict=True))]


def reference_with_magnitudes(graph: Graph, inputs: Mapping[str, np.ndarray], samples: int = SAMPLES, seed: int = 0
                              ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray | None]]:
    """(the float64 reference outputs, :func:`graph_magnitudes`) from one set of runs: the reference and its
    ``samples`` perturbed copies go through the graph node by node, in lockstep, as :func:`_run_compute` runs
    each node (an extern op's result counts one rounding of its own). A tensor lives until its last reader and a
    statement's own rounding magnitude until its node's copies have run, so a whole model's float64 tensors are
    never held once per run."""
    with bodies_run_by(body_interpreter(np.float64)):  # a control-flow body is interpreted too
        return _reference_with_magnitudes(graph, inputs, samples, seed)


def _reference_with_magnitudes(graph: Graph, inputs: Mapping[str, np.ndarray], samples: int, seed: int
                               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray | None]]:
    from superopt.ir.externs import evaluate_extern

    rng = np.random.default_rng(seed)
    envs: list[dict[str, np.ndarray]] = [{} for _ in range(samples + 1)]  # [0]: the reference
    for n in graph.inputs:
        x = _as_input(inputs[n], graph.type_of[n], np.dtype(np.float64), f"graph input {n!r}")
        for env in envs:
            env[n] = x
    constants = dict(graph.constants)
    keep = set(graph.outputs)
    last = {name: k for k, node in enumerate(graph.nodes) for name in node.inputs}
    own: dict[str, np.ndarray | None] = {}  # the own rounding magnitude of each graph output a node computes
    for k, node in enumerate(graph.nodes):
        # read, not kept; a compute node converts its float32 weights to float64 a slice at a time
        shared = {i: constants[i].array if not node.is_extern else _constant64(constants[i])
                  for i in node.inputs if i in constants}
        for r, env in enumerate(envs):
            ins = [shared[i] if i in shared else env[i] for i in node.inputs]
            if node.is_extern:
                outs = [np.asarray(o) for o in evaluate_extern(node.op.kind, ins, node.op.attr)]
                if r:
                    outs = [_perturb(o, np.abs(o), rng) for o in outs]
            else:
                if r == 0:
                    mine: dict[str, np.ndarray] = {}
                outs = _run_compute(node.op, dict(zip(node.op.inputs, ins, strict=True)), rng if r else None, mine)
                if r == 0:
                    own.update({name: mine.get(node.op.outputs[j]) for j, name in enumerate(node.outputs)
                                if name in keep})
            env.update(zip(node.outputs, outs, strict=True))
        for i in set(node.inputs):
            if last[i] == k and i not in keep:
                for env in envs:
                    env.pop(i, None)
    ref = {o: envs[0][o] if o in envs[0] else _constant64(constants[o]) for o in graph.outputs}
    mags = {}
    for o in graph.outputs:
        value = ref[o]
        local = None if np.asarray(value).dtype.kind != "f" else own[o] if o in own else np.abs(np.asarray(value, np.float64))
        mags[o] = _combine(value, local, [env.get(o, value) for env in envs[1:]])
    return ref, mags


def _constant64(cst) -> np.ndarray:
    return cst.array.astype(np.float64) if is_float(cst.type.dtype) else cst.array


def graph_magnitudes(graph: Graph, inputs: Mapping[str, np.ndarray], samples: int = SAMPLES, seed: int = 0
                     ) -> dict[str, np.ndarray | None]:
    """``compute_magnitudes`` through a graph, per graph output (the outputs of extern ops count one rounding
    of their own, and inherit as every result does)."""
    return reference_with_magnitudes(graph, inputs, samples, seed)[1]


__all__ = ["U32", "compute_magnitudes", "graph_magnitudes", "reference_with_magnitudes"]
