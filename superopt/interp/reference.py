"""Evaluate statements, compute ops and graphs with numpy.

Each tensor access becomes a strided *view* over the statement's iteration space (no copies,
no Python loops): ``P[n,2*y+kh,...]`` is ``as_strided`` with stride ``2*s1`` for y and ``s1`` for kh.
Pure sum-of-products statements go to ``np.einsum``; everything else is evaluated by broadcasting
and reduced along the reduction axes. ``dtype=np.float64`` evaluates floats in double precision
(for verification).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Binary, Cast, Compare, Const, Expr, IndexValue, Unary, Where
from superopt.ir.externs import evaluate_extern, run_time_shaped
from superopt.ir.externs.control_flow import bodies_run_by
from superopt.ir.graph import Graph
from superopt.ir.statement import REDUCE_IDENTITY, Statement
from superopt.ir.types import DTYPES, TensorType, is_float


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x).astype(x.dtype, copy=False)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh,
    "erf": _erf, "sigmoid": _sigmoid, "abs": np.abs, "neg": np.negative, "relu": lambda x: np.maximum(x, 0),
    "floor": np.floor, "ceil": np.ceil, "reciprocal": lambda x: 1.0 / x, "sin": np.sin, "cos": np.cos,
    "round": np.round, "not": np.logical_not, "sign": np.sign,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "isnan": np.isnan, "isinf": np.isinf,
    "bitnot": np.invert,
}


def _divide(a, b):
    a_int = np.issubdtype(np.asarray(a).dtype, np.integer)
    b_int = np.issubdtype(np.asarray(b).dtype, np.integer)
    if a_int and b_int:  # C / ONNX semantics: truncate toward zero
        q = np.abs(a) // np.abs(b)
        return np.where((np.asarray(a) < 0) ^ (np.asarray(b) < 0), -q, q)
    return np.divide(a, b)


BINARY = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": _divide, "max": np.maximum, "min": np.minimum,
    "pow": np.power, "and": np.logical_and, "or": np.logical_or, "mod": np.mod, "fmod": np.fmod,
    "bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor, "shl": np.left_shift,
    "shr": np.right_shift,
}
COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
           "!=": np.not_equal}
REDUCE = {"+=": np.add, "*=": np.multiply, "max=": np.maximum, "min=": np.minimum}


class _Space:
    """The iteration space of one statement: ordered dims and their extents."""

    def __init__(self, st: Statement) -> None:
        self.order = [d for d, _ in st.extents]
        self.ext = st.extent
        self.axis = {d: i for i, d in enumerate(self.order)}


def access_view(arr: np.ndarray, a: Access, space: _Space, pad: float | None, dims: Sequence[str]) -> np.ndarray:
    """A strided view of ``arr`` as indexed by ``a``, with one axis per dim in ``dims``."""
    arr = np.asarray(arr)
    lows: list[int] = []
    need_pad = False
    widths = []
    for axis, (ix, size) in enumerate(zip(a.index, arr.shape)):
        lo, hi = ix.bounds(space.ext)
        before, after = max(0, -lo), max(0, hi - size + 1)
        if before or after:
            if pad is None:
                raise IndexError(f"out-of-range access {a}: axis {axis} spans [{lo},{hi}] of extent {size}")
            need_pad = True
        widths.append((before, after))
        lows.append(before)
    if need_pad:
        arr = np.pad(arr, widths, constant_values=pad)
    arr = np.ascontiguousarray(arr)
    shape = tuple(space.ext[d] if any(ix.coeff(d) for ix in a.index) else 1 for d in dims)
    if arr.size == 0 or 0 in shape:
        return np.zeros(shape, arr.dtype)
    elem = arr.strides
    offset = sum((ix.const + low) * s for ix, low, s in zip(a.index, lows, elem))
    strides = tuple(sum(ix.coeff(d) * s for ix, s in zip(a.index, elem)) for d in dims)
    flat = arr.reshape(-1)
    return as_strided(flat[offset // arr.itemsize:], shape=shape, strides=strides, writeable=False)


def _product_factors(e: Expr) -> list[Expr] | None:
    if isinstance(e, (Access, Const)):
        return [e]
    if isinstance(e, Binary) and e.op == "*":
        a, b = _product_factors(e.a), _product_factors(e.b)
        if a is not None and b is not None:
            return a + b
    return None


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


# an einsum operand that would be copied whole (a float32 weight of a float64 reference, converted; a convolution's
# window view, laid out) is taken in slices of at most this many bytes: a large model's weights are never held
# twice more, nor a convolution's input nine times
CAST_CHUNK_BYTES = 32 << 20


class _StatementEval:
    """One statement evaluated in ``float_dtype``. The tensors in ``env`` may be of another float type (a float32
    weight): each is converted when read, and an einsum operand slice by slice."""

    def __init__(self, st: Statement, env: Mapping[str, np.ndarray], float_dtype: np.dtype) -> None:
        self.st = st
        self.env = env
        self.space = _Space(st)
        self.pad = st.pad_value
        self.float_dtype = float_dtype
        self._converted: dict[str, np.ndarray] = {}

    def _array(self, name: str) -> np.ndarray:
        """``env[name]`` in the evaluation's float type (converted once per statement)."""
        arr = np.asarray(self.env[name])
        if arr.dtype.kind != "f" or arr.dtype == self.float_dtype:
            return arr
        if name not in self._converted:
            self._converted[name] = arr.astype(self.float_dtype)
        return self._converted[name]

    def run(self, out_type: TensorType) -> np.ndarray:
        st = self.st
        out_dtype = self.float_dtype if is_float(out_type.dtype) else np.dtype(DTYPES[out_type.dtype][0])
        if len(self.space.order) > len(_LETTERS):
            raise ValueError("statement has too many dimensions")
        factors = _product_factors(st.expr) if st.reduce == "+=" else None
        if factors is not None and any(isinstance(f, Access) for f in factors):
            return self._einsum(factors).astype(out_dtype, copy=False).reshape(st.out_shape)
        val = np.asarray(self.eval(st.expr))
        full = tuple(self.space.ext[d] for d in self.space.order)
        val = np.broadcast_to(val, full)
        if st.reduce != "=":
            red_axes = tuple(range(len(st.out_dims), len(full)))
            init = REDUCE_IDENTITY[st.reduce]
            if st.reduce in ("max=", "min=") and np.issubdtype(val.dtype, np.integer):  # no int infinity
                info = np.iinfo(val.dtype)
                init = info.min if st.reduce == "max=" else info.max
            val = REDUCE[st.reduce].reduce(val, axis=red_axes, initial=init) if red_axes else val
        return np.ascontiguousarray(val, dtype=out_dtype).reshape(st.out_shape)

    def _einsum(self, factors: list[Expr], absolute: bool = False) -> np.ndarray:
        """The sum of products; ``absolute``: of the operands' absolute values."""
        letter = {d: _LETTERS[i] for i, d in enumerate(self.space.order)}
        operands, subs = [], []
        scale = 1.0
        for f in factors:
            if isinstance(f, Const):
                scale *= f.value
                continue
            dims = [d for d in self.space.order if any(ix.coeff(d) for ix in f.index)]
            operands.append(access_view(np.asarray(self.env[f.tensor]), f, self.space, self.pad.get(f.tensor), dims))
            subs.append("".join(letter[d] for d in dims))
        # reduction dims referenced by no operand multiply the sum by their extent
        for d in self.st.reduce_dims:
            if not any(letter[d] in s for s in subs):
                scale *= self.space.ext[d]
        out_sub = "".join(letter[d] for d in self.st.out_dims if any(letter[d] in s for s in subs))
        # optimize: the contractions go through BLAS (with einsum's own loops, the float64 reference of a
        # convolutional model takes longer than compiling it); integer operands keep those loops
        fast = len(operands) > 2 or all(o.dtype.kind in "fc" for o in operands)
        res = _chunked_einsum(",".join(subs) + "->" + out_sub, operands, subs, out_sub, self.float_dtype, fast,
                              absolute)
        if scale != 1.0:
            res = res * scale
        # output dims referenced by no operand broadcast
        shape = [self.space.ext[d] if letter[d] in out_sub else 1 for d in self.st.out_dims]
        return np.broadcast_to(res.reshape(shape), self.st.out_shape)

    def _view(self, a: Access, dims: Sequence[str]) -> np.ndarray:
        return access_view(self._array(a.tensor), a, self.space, self.pad.get(a.tensor), dims)

    def eval(self, e: Expr):
        if isinstance(e, Access):
            return self._view(e, self.space.order)
        if isinstance(e, Const):
            if e.dtype == "bool" or isinstance(e.value, bool):
                return bool(e.value)
            return e.value  # Python scalar: weakly typed, does not promote arrays
        if isinstance(e, IndexValue):
            return self._index_value(e.index)
        if isinstance(e, Unary):
            x = self.eval(e.x)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return UNARY[e.fn](np.asarray(x) if not np.isscalar(x) else np.asarray(x, self._scalar_dtype(x)))
        if isinstance(e, Binary):
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return BINARY[e.op](self.eval(e.a), self.eval(e.b))
        if isinstance(e, Compare):
            return COMPARE[e.op](self.eval(e.a), self.eval(e.b))
        if isinstance(e, Where):
            return np.where(self.eval(e.cond), self.eval(e.a), self.eval(e.b))
        if isinstance(e, Cast):
            x = np.asarray(self.eval(e.x))
            target = self.float_dtype if is_float(e.dtype) else np.dtype(DTYPES[e.dtype][0])
            if np.issubdtype(target, np.integer) and np.issubdtype(x.dtype, np.floating):
                x = np.trunc(x)
            return x.astype(target)
        raise TypeError(f"cannot evaluate {e!r}")

    def _scalar_dtype(self, x) -> np.dtype:
        return self.float_dtype if isinstance(x, float) else np.asarray(x).dtype

    def _index_value(self, ix: Affine) -> np.ndarray:
        n = len(self.space.order)
        val = np.array(ix.const, dtype=np.int64).reshape((1,) * n)
        for d, c in ix.terms:
            shape = [1] * n
            shape[self.space.axis[d]] = self.space.ext[d]
            val = val + c * np.arange(self.space.ext[d], dtype=np.int64).reshape(shape)
        return val


def _chunked_einsum(expr: str, operands: list[np.ndarray], subs: list[str], out_sub: str, float_dtype: np.dtype,
                    fast: bool, absolute: bool) -> np.ndarray:
    """``np.einsum(expr, *operands)`` with the float operands in ``float_dtype`` (``absolute``: their absolute
    values). The largest operand, when it would be copied whole (converted, made absolute, or a strided view such
    as a convolution's window view, which the BLAS path lays out contiguously: nine times its input for a 3x3
    kernel) and that copy exceeds ``CAST_CHUNK_BYTES``, is taken a slice at a time: along its largest output axis
    (the parts concatenated: each output element sums the same terms), else its largest axis (the parts summed)."""
    def prepare(o: np.ndarray) -> np.ndarray:
        if o.dtype.kind == "f" and o.dtype != float_dtype:
            o = o.astype(float_dtype)
        return np.abs(o) if absolute else o

    def nbytes(o: np.ndarray) -> int:
        return o.size * (float_dtype.itemsize if o.dtype.kind == "f" else o.dtype.itemsize)

    big = max(range(len(operands)), key=lambda i: nbytes(operands[i]), default=None)
    copied = big is not None and (absolute or not operands[big].flags.c_contiguous
                                  or operands[big].dtype.kind == "f" and operands[big].dtype != float_dtype)
    need = nbytes(operands[big]) if copied else 0
    if need <= CAST_CHUNK_BYTES or not subs[big]:
        return np.einsum(expr, *[prepare(o) for o in operands], optimize=fast)
    sub, shape = subs[big], operands[big].shape
    split = max([c for c in sub if c in out_sub] or sub, key=lambda c: shape[sub.index(c)])
    extent = shape[sub.index(split)]
    step = max(1, extent * CAST_CHUNK_BYTES // need)
    parts, total = [], None
    for lo in range(0, extent, step):
        ops = []
        for o, s in zip(operands, subs, strict=True):
            if split in s:
                o = o[(slice(None),) * s.index(split) + (slice(lo, lo + step),)]
            ops.append(prepare(o))
        part = np.einsum(expr, *ops, optimize=fast)
        if split in out_sub:
            parts.append(part)
        else:
            total = part if total is None else total + part
    return np.concatenate(parts, axis=out_sub.index(split)) if split in out_sub else total


def evaluate_statement(st: Statement, env: Mapping[str, np.ndarray], out_type: TensorType,
                       dtype=np.float32) -> np.ndarray:
    return _StatementEval(st, env, np.dtype(dtype)).run(out_type)


def _as_input(x, t: TensorType, float_dtype: np.dtype, what: str) -> np.ndarray:
    x = np.asarray(x)
    if tuple(x.shape) != t.shape:
        raise ValueError(f"{what} has shape {tuple(x.shape)} but {t.shape} is expected")
    target = float_dtype if is_float(t.dtype) else np.dtype(DTYPES[t.dtype][0])
    return np.ascontiguousarray(x, dtype=target).reshape(t.shape)  # (ascontiguousarray makes rank 0 rank 1)


def evaluate_compute(c: Compute, args: Sequence[np.ndarray] | Mapping[str, np.ndarray], dtype=np.float32,
                     keep_temporaries: bool = False) -> list[np.ndarray] | dict[str, np.ndarray]:
    """Run a compute op; ``args`` positional (in ``c.inputs`` order) or by local name."""
    float_dtype = np.dtype(dtype)
    if not isinstance(args, Mapping):
        if len(args) != len(c.inputs):
            raise ValueError(f"compute op takes {len(c.inputs)} inputs, got {len(args)}")
        args = dict(zip(c.inputs, args))
    env = {n: _as_input(args[n], c.type_of[n], float_dtype, f"input {n!r}") for n in c.inputs}
    for st in c.statements:
        env[st.out] = evaluate_statement(st, env, c.type_of[st.out], float_dtype)
    if keep_temporaries:
        return env
    return [env[o] for o in c.outputs]


def _constant(c, float_dtype: np.dtype) -> np.ndarray:
    return c.array.astype(float_dtype) if is_float(c.type.dtype) else c.array


def body_interpreter(dtype) -> Callable[[Graph, Sequence[np.ndarray]], list[np.ndarray]]:
    """A control-flow body runner (:func:`superopt.ir.externs.control_flow.bodies_run_by`) that interprets the
    body in ``dtype``, as the enclosing graph is."""

    def run(body: Graph, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = evaluate(body, list(xs), dtype)
        return [out[o] for o in body.outputs]
    return run


def evaluate(graph: Graph, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], dtype=np.float32,
             keep_intermediates: bool = False) -> dict[str, np.ndarray]:
    """Run a graph; returns its outputs by name (or every tensor, with ``keep_intermediates``). Control-flow
    bodies are interpreted too, in the same precision."""
    with bodies_run_by(body_interpreter(dtype)):
        return _evaluate(graph, inputs, dtype, keep_intermediates)


def _evaluate(graph: Graph, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], dtype,
              keep_intermediates: bool) -> dict[str, np.ndarray]:
    float_dtype = np.dtype(dtype)
    if not isinstance(inputs, Mapping):
        inputs = dict(zip(graph.inputs, inputs))
    missing = [n for n in graph.inputs if n not in inputs]
    if missing:
        raise ValueError(f"missing graph input(s) {missing}")
    env: dict[str, np.ndarray] = {}
    for n in graph.inputs:
        env[n] = _as_input(inputs[n], graph.type_of[n], float_dtype, f"graph input {n!r}")
    # a constant is converted when first read and every tensor dropped after its last reader (unless kept):
    # at most the live tensors are held, not the whole model's weights in float64 besides its float32 ones
    constants = dict(graph.constants)
    last_use = {t: i for i, node in enumerate(graph.nodes) for t in node.inputs}
    keep = set(graph.outputs) | set(graph.inputs)
    if keep_intermediates:
        keep |= set(constants)
    for n in (set(constants) & set(graph.outputs)) | (set(constants) if keep_intermediates else set()):
        env[n] = _constant(constants[n], float_dtype)
    for i, node in enumerate(graph.nodes):
        for t in node.inputs:
            if t not in env and t in constants:
                env[t] = _constant(constants[t], float_dtype)
        ins = [env[t] for t in node.inputs]
        if node.is_extern:
            outs = evaluate_extern(node.op.kind, ins, node.op.attr)
        else:
            outs = evaluate_compute(node.op, ins, float_dtype)
        for name, val, dynamic in zip(node.outputs, outs, run_time_shaped(node)):
            t = graph.type_of[name]
            if tuple(val.shape) != t.shape and not dynamic:  # (a run-time shape: its type is an upper bound)
                raise ValueError(f"node {node.name!r} produced {name!r} with shape {val.shape}, expected {t.shape}")
            env[name] = val
        if not keep_intermediates:
            for t in node.inputs:
                if last_use.get(t) == i and t not in keep:
                    env.pop(t, None)
        del ins
    if keep_intermediates:
        return env
    return {o: env[o] for o in graph.outputs}
