"""torch.fx frontend: a ``GraphModule`` (from ``symbolic_trace`` or Dynamo) becomes a superopt ``Graph``.

Shapes come from running ``ShapeProp`` on the example inputs. Parameters and buffers (``get_attr``
nodes, parameters of leaf modules, and the parameter/buffer placeholders Dynamo lifts out of
``nn.Module``s) become graph constants. Python-level values (``x.size(0)``, ``torch.Size``
arithmetic, tuples) are folded at import time, and so is any node whose tensor inputs are all
constants (``self.weight.t()``, slices of ``in_proj_weight``...), by running it in torch.

Each FX node maps onto the built-in ops of ``superopt.ops``. After every node the result is checked
against the shape ShapeProp recorded (and cast to the recorded dtype), so a mapping mistake fails
at import time, naming the node, instead of silently computing something else.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.fx.node import map_aggregate, map_arg

from superopt import ops
from superopt.builder import GraphBuilder
from superopt.ir.graph import Graph


class FxImportError(ValueError):
    """A torch.fx graph that the importer cannot translate (unsupported op or argument)."""


class T(str):
    """A graph tensor name, as distinct from a Python string argument (``approximate="tanh"``)."""


# ---- dtypes ------------------------------------------------------------------------------------
_IR_DTYPE = {
    torch.float32: "float32", torch.float16: "float32", torch.bfloat16: "float32",
    torch.float64: "float64", torch.int64: "int64", torch.int32: "int32", torch.int16: "int32",
    torch.int8: "int32", torch.uint8: "int32", torch.bool: "bool",
}


def ir_dtype(dt: torch.dtype) -> str:
    if dt not in _IR_DTYPE:
        raise FxImportError(f"unsupported tensor dtype {dt}")
    return _IR_DTYPE[dt]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return t.to(getattr(torch, ir_dtype(t.dtype))).numpy().copy()


def _is_fake(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and type(t).__name__ == "FakeTensor"


def is_param_placeholder(node: torch.fx.Node, example: Any) -> bool:
    """Dynamo lifts module parameters and buffers into placeholders such as
    ``L_self_modules_fc_parameters_weight_``; those are constants of the model, not inputs."""
    if isinstance(example, nn.Parameter):
        return True
    name = str(node.target)
    return isinstance(example, torch.Tensor) and ("_parameters_" in name or "_buffers_" in name)


# ---- the result of an import ---------------------------------------------------------------------
@dataclass(frozen=True)
class FxImport:
    graph: Graph
    input_positions: tuple[int, ...]  # placeholder positions (in example_inputs order) of graph.inputs
    output_spec: Any  # the FX output structure; leaves are ("tensor", name, torch dtype) or ("value", v)
    baked: tuple[int, ...]  # placeholder positions folded into constants (Dynamo parameters)


def import_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], name: str | None = None) -> Graph:
    """Import ``gm`` as a superopt Graph; inputs are the non-parameter placeholders, in order."""
    return import_fx_full(gm, example_inputs, name).graph


def import_fx_full(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   name: str | None = None) -> FxImport:
    return _Importer(gm, list(example_inputs), name or type(gm).__name__).run()


# ---- handler tables -------------------------------------------------------------------------------
Handler = Callable[..., Any]
FUNCTIONS: dict[Any, Handler] = {}
METHODS: dict[str, Handler] = {}
MODULES: dict[type, Handler] = {}


def _targets(*ts: Any) -> list[Any]:
    return [t for t in ts if t is not None]


def function(*targets: Any) -> Callable[[Handler], Handler]:
    def deco(h: Handler) -> Handler:
        for t in _targets(*targets):
            FUNCTIONS[t] = h
        return h
    return deco


def method(*names: str) -> Callable[[Handler], Handler]:
    def deco(h: Handler) -> Handler:
        for n in names:
            METHODS[n] = h
        return h
    return deco


def module(*types: type) -> Callable[[Handler], Handler]:
    def deco(h: Handler) -> Handler:
        for t in types:
            MODULES[t] = h
        return h
    return deco


_RANDOM = ("rand", "normal", "bernoulli", "uniform", "multinomial", "dropout", "empty", "poisson")

# Pure Python functions folded when none of their arguments is a run-time tensor.
_PY_FOLDABLE = {builtins.getattr, builtins.len, builtins.int, builtins.float, builtins.max, builtins.min,
                builtins.abs, builtins.tuple, builtins.list, builtins.round, builtins.sum}
_PY_FOLDABLE |= {getattr(operator, n) for n in dir(operator) if not n.startswith("_")}
_PY_FOLDABLE |= {getattr(math, n) for n in dir(math) if callable(getattr(math, n))}


class _Importer:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], name: str) -> None:
        self.gm = gm
        self.examples = example_inputs
        self.b = GraphBuilder(name)
        self.env: dict[torch.fx.Node, Any] = {}
        self.node: torch.fx.Node | None = None
        self._param_cache: dict[int, T] = {}

    # ---- helpers used by handlers --------------------------------------------------------------
    def fail(self, msg: str) -> FxImportError:
        n = self.node
        where = f" (node {n.name!r}, {n.op} {_target_name(n)})" if n is not None else ""
        return FxImportError(msg + where)

    def shape(self, t: str) -> tuple[int, ...]:
        return self.b.shape(t)

    def rank(self, t: str) -> int:
        return len(self.b.shape(t))

    def dtype(self, t: str) -> str:
        return self.b.type(t).dtype

    def const(self, value: Any, hint: str = "const") -> T:
        if isinstance(value, torch.Tensor):
            value = to_numpy(value)
        arr = np.asarray(value)
        if arr.dtype == np.float64 and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)
        if arr.dtype.kind in "iu" and arr.dtype != np.int32:
            arr = arr.astype(np.int64)
        return T(self.b.constant(arr))

    def param(self, t: torch.Tensor | None, hint: str) -> T | None:
        """A module parameter or buffer as a (cached) graph constant."""
        if t is None:
            return None
        key = id(t)
        if key not in self._param_cache:
            self._param_cache[key] = T(self.b.constant(to_numpy(t), name=hint))
        return self._param_cache[key]

    def tensor(self, v: Any, like: str | None = None) -> T:
        """A tensor operand: graph tensors pass through, Python numbers become 0-d constants
        (of ``like``'s dtype when that is float or the number is integral)."""
        if isinstance(v, T):
            return v
        if isinstance(v, (bool, int, float, np.number)):
            if like is not None:
                ld = self.dtype(like)
                if ld in ("float32", "float64") or (ld in ("int64", "int32") and not isinstance(v, float)):
                    return self.const(np.asarray(v, dtype=ld))
            return self.const(v)
        if isinstance(v, torch.Tensor):
            return self.const(v)
        raise self.fail(f"expected a tensor operand, got {type(v).__name__} {v!r}")

    def axis(self, d: int, rank: int) -> int:
        if not -max(rank, 1) <= d < max(rank, 1):
            raise self.fail(f"dim {d} out of range for rank {rank}")
        return d % rank if rank else 0

    def out_shape(self) -> tuple[int, ...] | None:
        """The shape ShapeProp recorded for the current node's (single tensor) result."""
        m = self.node.meta.get("tensor_meta") if self.node is not None else None
        if m is not None and hasattr(m, "shape"):
            return tuple(int(s) for s in m.shape)
        v = self.node.meta.get("example_value") if self.node is not None else None
        if isinstance(v, torch.Tensor):
            return tuple(int(s) for s in v.shape)
        return None

    def reshape(self, x: str, shape: Sequence[int]) -> T:
        shape = [int(s) for s in shape]
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            total = math.prod(self.shape(x))
            shape[shape.index(-1)] = total // known if known else 0
        if math.prod(shape) != math.prod(self.shape(x)):
            raise self.fail(f"cannot reshape {self.shape(x)} to {tuple(shape)}")
        if tuple(shape) == self.shape(x):
            return T(x)
        return T(ops.reshape(self.b, x, shape))

    def transpose(self, x: str, perm: Sequence[int]) -> T:
        perm = [self.axis(p, self.rank(x)) for p in perm]
        if perm == list(range(len(perm))):
            return T(x)
        return T(ops.transpose(self.b, x, perm))

    def swap(self, x: str, d0: int, d1: int) -> T:
        r = self.rank(x)
        perm = list(range(r))
        d0, d1 = self.axis(d0, r), self.axis(d1, r)
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.transpose(x, perm)

    def slice_axis(self, x: str, axis: int, start: int, end: int, step: int = 1) -> T:
        n = self.shape(x)[axis]
        start, end, step = slice(start, end, step).indices(n)
        if (start, end, step) == (0, n, 1):
            return T(x)
        v = self.b.const_value(x)
        if v is not None:
            sl = [slice(None)] * v.ndim
            sl[axis] = slice(start, end, step)
            return self.const(np.ascontiguousarray(v[tuple(sl)]))
        return T(ops.slice_(self.b, x, [start], [end], axes=[axis], steps=[step]))

    # ---- driver ------------------------------------------------------------------------------
    def run(self) -> FxImport:
        gm = self.gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.examples):
            raise FxImportError(f"the graph has {len(placeholders)} placeholders but {len(self.examples)} "
                                "example inputs were given")
        self._propagate_shapes()
        positions, baked = [], []
        for pos, (n, ex) in enumerate(zip(placeholders, self.examples, strict=True)):
            self.node = n
            if isinstance(ex, (bool, int, float, torch.SymInt, torch.SymFloat)) or ex is None:
                self.env[n] = _concrete(ex)  # shape symbols: specialize to the example's value
            elif isinstance(ex, torch.Tensor) and is_param_placeholder(n, ex):
                if _is_fake(ex):
                    raise self.fail("parameter placeholder is a FakeTensor; real values are needed")
                self.env[n] = self.param(ex, _short(n.target))
                baked.append(pos)
            elif isinstance(ex, torch.Tensor):
                self.env[n] = T(self.b.input(n.name, tuple(int(s) for s in ex.shape), ir_dtype(ex.dtype)))
                positions.append(pos)
            else:
                raise self.fail(f"unsupported example input of type {type(ex).__name__}")
        out_node = None
        for n in gm.graph.nodes:
            self.node = n
            if n.op == "placeholder":
                continue
            if n.op == "output":
                out_node = n
                break
            self.env[n] = self._check(self._node(n))
            self._rebind_inplace(n)
        if out_node is None:
            raise FxImportError("graph has no output node")
        self.node = out_node
        outputs: list[str] = []
        meta_vals = _flatten_meta(out_node)

        def spec(v: Any) -> Any:
            if isinstance(v, T):
                if v not in outputs:
                    outputs.append(v)
                dt = meta_vals.pop(0) if meta_vals else None
                return ("tensor", str(v), dt)
            if isinstance(v, (tuple, list)):
                return type(v)(spec(e) for e in v)
            if isinstance(v, dict):
                return {k: spec(e) for k, e in v.items()}
            if isinstance(v, _Missing):
                raise self.fail(f"the graph returns {v.what}, which the import does not compute "
                                "(aot_autograd forward graphs are supported for inference only)")
            return ("value", v)

        out_spec = spec(map_arg(out_node.args[0], lambda a: self.env[a]))
        if not outputs:
            raise FxImportError("the graph returns no tensors")
        graph = self.b.build([str(o) for o in outputs])
        return FxImport(graph, tuple(positions), out_spec, tuple(baked))

    def _rebind_inplace(self, n: torch.fx.Node) -> None:
        """``y = x.add_(1)``: later readers of ``x`` must see the new value too (SSA rebinding).
        A mutated graph input is not written back to the caller's tensor."""
        inplace = n.kwargs.get("inplace") is True
        if n.op == "call_method":
            inplace = inplace or (n.target.endswith("_") and not n.target.startswith("__"))
        elif n.op == "call_function":
            name = getattr(n.target, "__name__", "")
            inplace = inplace or (name.endswith("_") and not name.startswith("_")) or n.target in (
                operator.iadd, operator.isub, operator.imul, operator.itruediv)
        elif n.op == "call_module":
            inplace = bool(getattr(self.gm.get_submodule(n.target), "inplace", False))
        if inplace and n.args and isinstance(n.args[0], torch.fx.Node) and isinstance(self.env[n], T):
            old = self.env[n.args[0]]
            if isinstance(old, T) and self.shape(old) == self.shape(self.env[n]):
                self.env[n.args[0]] = self.env[n]

    def _propagate_shapes(self) -> None:
        from torch.fx.passes.shape_prop import ShapeProp

        fake = next((e for e in self.examples if _is_fake(e)), None)
        try:
            with torch.no_grad():
                if fake is not None:
                    ShapeProp(self.gm, fake_mode=fake.fake_mode).propagate(*self.examples)
                else:
                    ShapeProp(self.gm).propagate(*self.examples)
        except Exception as e:  # noqa: BLE001 - report what torch said, in one line
            first = (str(e).splitlines() or [""])[0]
            raise FxImportError(f"shape propagation failed: {type(e).__name__}: {first}") from e

    def _check(self, v: Any) -> Any:
        """Cast/verify a node's tensor result against the recorded shape and dtype."""
        m = self.node.meta.get("tensor_meta")
        if isinstance(v, T) and m is not None and hasattr(m, "shape"):
            want = tuple(int(s) for s in m.shape)
            if self.shape(v) != want:
                raise self.fail(f"internal: the import produced shape {self.shape(v)} but torch gives {want}")
            dt = ir_dtype(m.dtype)
            if self.dtype(v) != dt:
                v = T(ops.cast(self.b, v, dt))
        return v

    def _node(self, n: torch.fx.Node) -> Any:
        args = map_arg(n.args, lambda a: self.env[a])
        kwargs = map_arg(n.kwargs, lambda a: self.env[a])
        missing: list[Any] = []
        map_aggregate((args, kwargs), lambda a: missing.append(a) if isinstance(a, _Missing) else None)
        if missing and n.target is not operator.getitem:  # picking the other results out is fine
            raise self.fail(f"uses {missing[0].what}, which the import does not compute")
        if n.op == "get_attr":
            return self._get_attr(n.target)
        if n.op == "call_function":
            if _no_tensors(args, kwargs) and n.target in _PY_FOLDABLE:
                return n.target(*args, **kwargs)
            if n.target is operator.getitem and not isinstance(args[0], T):
                return args[0][args[1]]
            folded = self._fold(n, args, kwargs)
            if folded is not _NOT_FOLDED:
                return folded
            h = FUNCTIONS.get(n.target)
            if h is None:
                raise self.fail(f"unsupported function {_target_name(n)}")
            return self._call(h, args, kwargs)
        if n.op == "call_method":
            folded = self._fold(n, args, kwargs)
            if folded is not _NOT_FOLDED:
                return folded
            h = METHODS.get(n.target)
            if h is None:
                raise self.fail(f"unsupported method Tensor.{n.target}")
            return self._call(h, args, kwargs)
        if n.op == "call_module":
            mod = self.gm.get_submodule(n.target)
            h = MODULES.get(type(mod))
            if h is None:
                raise self.fail(f"unsupported module {type(mod).__module__}.{type(mod).__name__}")
            return self._call(h, (mod, *args), kwargs)
        raise self.fail(f"unsupported FX op {n.op!r}")

    def _call(self, h: Handler, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        try:
            return h(self, *args, **kwargs)
        except FxImportError:
            raise
        except TypeError as e:
            raise self.fail(f"unsupported arguments: {e}") from e
        except (ValueError, NotImplementedError) as e:
            raise self.fail(f"{type(e).__name__}: {e}") from e

    def _get_attr(self, target: str) -> Any:
        obj: Any = self.gm
        for part in target.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, torch.Tensor):
            return self.param(obj, _short(target))
        return obj

    def _fold(self, n: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        """Run a node whose tensor inputs are all constants in torch, making its result a constant."""
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if any(r in name.lower() for r in _RANDOM) or (name.endswith("_") and not name.startswith("_")):
            return _NOT_FOLDED
        tensors: list[T] = []
        map_aggregate((args, kwargs), lambda a: tensors.append(a) if isinstance(a, T) else None)
        if not tensors and not (isinstance(n.target, torch._ops.OpOverload) or n.target in _FACTORIES):
            return _NOT_FOLDED
        if any(self.b.const_value(t) is None for t in tensors):
            return _NOT_FOLDED

        def to_torch(a: Any) -> Any:
            return torch.from_numpy(self.b.const_value(a).copy()) if isinstance(a, T) else a

        targs = map_aggregate(args, to_torch)
        tkwargs = map_aggregate(kwargs, to_torch)
        with torch.no_grad():
            if n.op == "call_method":
                res = getattr(targs[0], n.target)(*targs[1:], **tkwargs)
            else:
                res = n.target(*targs, **tkwargs)
        return map_aggregate(res, lambda r: self.const(r) if isinstance(r, torch.Tensor) else r)


_NOT_FOLDED = object()
_FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.full, torch.tensor, torch.eye, torch.linspace,
              torch.scalar_tensor, torch.as_tensor}


def _concrete(v: Any) -> Any:
    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, torch.SymFloat):
        return float(v)
    return v


def _short(target: Any) -> str:
    s = str(target)
    for pre in ("L_self_", "L_fn_", "L_", "l_self_", "l_"):
        if s.startswith(pre):
            s = s[len(pre):]
            break
    return s.replace("modules_", "").replace("parameters_", "").replace("buffers_", "").strip("_.") or "param"


def _target_name(n: torch.fx.Node) -> str:
    t = n.target
    if isinstance(t, str):
        return t
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(t)
    mod = getattr(t, "__module__", None) or ""
    return f"{mod}.{getattr(t, '__qualname__', getattr(t, '__name__', repr(t)))}".lstrip(".")


def _no_tensors(args: Any, kwargs: Any) -> bool:
    found = []
    map_aggregate((args, kwargs), lambda a: found.append(a) if isinstance(a, T) else None)
    return not found


def _flatten_meta(out_node: torch.fx.Node) -> list[torch.dtype | None]:
    """Torch dtypes of the output node's tensor leaves, in order."""
    res: list[torch.dtype | None] = []

    def visit(a: Any) -> None:
        if isinstance(a, torch.fx.Node):
            m = a.meta.get("tensor_meta")
            if m is not None and hasattr(m, "dtype"):
                res.append(m.dtype)
            elif isinstance(a.meta.get("example_value"), torch.Tensor):
                res.append(a.meta["example_value"].dtype)
            else:
                res.append(None)
        elif isinstance(a, (tuple, list)):
            for e in a:
                visit(e)
        elif isinstance(a, dict):
            for e in a.values():
                visit(e)

    visit(out_node.args[0])
    return res


def _ints(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(e) for e in v)
    return v * n if len(v) == 1 else v


def _dims(args: Sequence[Any]) -> list[int]:
    """``x.view(2, 3)`` and ``x.view((2, 3))`` alike."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return [int(a) for a in args[0]]
    return [int(a) for a in args]


# =================================================================================================
# Elementwise
# =================================================================================================
@function(torch.relu, F.relu, torch.relu_, F.relu_)
@method("relu", "relu_")
def _relu(cx: _Importer, x: T, inplace: bool = False) -> T:
    return T(ops.relu(cx.b, x))


@function(F.gelu)
@method("gelu")
def _gelu(cx: _Importer, x: T, approximate: str = "none") -> T:
    return T(ops.gelu(cx.b, x, approximate=approximate))


@function(F.silu)
def _silu(cx: _Importer, x: T, inplace: bool = False) -> T:
    return T(ops.silu(cx.b, x))


@function(torch.sigmoid, F.sigmoid)
@method("sigmoid")
def _sigmoid(cx: _Importer, x: T) -> T:
    return T(ops.sigmoid(cx.b, x))


@function(torch.tanh, F.tanh)
@method("tanh")
def _tanh(cx: _Importer, x: T) -> T:
    return T(ops.tanh(cx.b, x))


def _unary_fn(fn: str) -> Handler:
    def h(cx: _Importer, x: T) -> T:
        return T(ops.unary(cx.b, fn, x))
    return h


for _fn in ("exp", "log", "sqrt", "rsqrt", "erf", "abs", "neg", "floor", "ceil", "reciprocal", "sin", "cos"):
    function(getattr(torch, _fn, None), getattr(torch.special, _fn, None))(_unary_fn(_fn))
    method(_fn)(_unary_fn(_fn))
function(operator.neg, torch.negative)(_unary_fn("neg"))


def _binary(cx: _Importer, fn: Callable[..., str], pyop: Callable[[Any, Any], Any], x: Any, y: Any) -> Any:
    if not isinstance(x, T) and not isinstance(y, T):
        return pyop(x, y)
    like = x if isinstance(x, T) else y
    return T(fn(cx.b, cx.tensor(x, like), cx.tensor(y, like)))


@function(operator.add, torch.add, operator.iadd)
@method("add", "add_", "__add__", "__iadd__")
def _add(cx: _Importer, x: Any, y: Any, *, alpha: float = 1, out: Any = None) -> Any:
    if alpha != 1:
        y = _mul(cx, y, alpha)
    return _binary(cx, ops.add, operator.add, x, y)


@function(operator.sub, torch.sub, torch.subtract, operator.isub)
@method("sub", "sub_", "__sub__")
def _sub(cx: _Importer, x: Any, y: Any, *, alpha: float = 1, out: Any = None) -> Any:
    if alpha != 1:
        y = _mul(cx, y, alpha)
    return _binary(cx, ops.sub, operator.sub, x, y)


@method("__rsub__", "rsub")
def _rsub(cx: _Importer, x: Any, y: Any, *, alpha: float = 1) -> Any:
    return _sub(cx, y, x, alpha=alpha)


@function(operator.mul, torch.mul, torch.multiply, operator.imul)
@method("mul", "mul_", "__mul__")
def _mul(cx: _Importer, x: Any, y: Any, *, out: Any = None) -> Any:
    return _binary(cx, ops.mul, operator.mul, x, y)


@function(operator.truediv, torch.div, torch.divide, torch.true_divide, operator.itruediv)
@method("div", "div_", "__truediv__", "true_divide")
def _div(cx: _Importer, x: Any, y: Any, *, rounding_mode: str | None = None, out: Any = None) -> Any:
    if rounding_mode is None:
        if isinstance(x, T) or isinstance(y, T):
            # true division of integer tensors gives float
            x = cx.tensor(x, y if isinstance(y, T) else None)
            y = cx.tensor(y, x)
            if cx.dtype(x) not in ("float32", "float64"):
                x = T(ops.cast(cx.b, x, "float32"))
            if cx.dtype(y) != cx.dtype(x):
                y = T(ops.cast(cx.b, y, cx.dtype(x)))
        return _binary(cx, ops.div, operator.truediv, x, y)
    if rounding_mode == "floor":
        return _floordiv(cx, x, y)
    raise cx.fail(f"div rounding_mode={rounding_mode!r} is not supported")


@function(operator.floordiv, torch.floor_divide)
@method("floor_divide", "__floordiv__")
def _floordiv(cx: _Importer, x: Any, y: Any) -> Any:
    if not isinstance(x, T) and not isinstance(y, T):
        return x // y
    like = x if isinstance(x, T) else y
    x, y = cx.tensor(x, like), cx.tensor(y, like)
    if cx.dtype(x) in ("float32", "float64"):
        return T(ops.unary(cx.b, "floor", ops.div(cx.b, x, y)))
    raise cx.fail("integer floor division of tensors is not supported")


@function(operator.pow, torch.pow)
@method("pow", "__pow__")
def _pow(cx: _Importer, x: Any, y: Any) -> Any:
    if isinstance(x, T) and not isinstance(y, T) and y == 2:
        return T(ops.mul(cx.b, x, x))
    if isinstance(x, T) and not isinstance(y, T) and y == 0.5:
        return T(ops.unary(cx.b, "sqrt", x))
    return _binary(cx, ops.pow_, operator.pow, x, y)


@function(torch.maximum, torch.max)
@method("maximum")
def _maximum(cx: _Importer, x: T, y: Any = None, *a: Any, **kw: Any) -> Any:
    if not isinstance(y, T) or a or kw:
        return _max_min(cx, "max", x, y, *a, **kw)
    return _binary(cx, ops.maximum, builtins.max, x, y)


@function(torch.minimum, torch.min)
@method("minimum")
def _minimum(cx: _Importer, x: T, y: Any = None, *a: Any, **kw: Any) -> Any:
    if not isinstance(y, T) or a or kw:
        return _max_min(cx, "min", x, y, *a, **kw)
    return _binary(cx, ops.minimum, builtins.min, x, y)


def _max_min(cx: _Importer, kind: str, x: T, dim: Any = None, keepdim: bool = False, **kw: Any) -> Any:
    if dim is None and not kw:
        return T(ops.reduce(cx.b, x, kind, list(range(cx.rank(x))), keepdims=False))
    raise cx.fail(f"torch.{kind} along a dim returns indices too; use amax/amin")


_CMP = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=", operator.eq: "==",
        operator.ne: "!=", torch.lt: "<", torch.le: "<=", torch.gt: ">", torch.ge: ">=", torch.eq: "==",
        torch.ne: "!="}


def _compare_fn(op: str, pyop: Callable[[Any, Any], Any]) -> Handler:
    def h(cx: _Importer, x: Any, y: Any) -> Any:
        if not isinstance(x, T) and not isinstance(y, T):
            return pyop(x, y)
        like = x if isinstance(x, T) else y
        return T(ops.compare(cx.b, op, cx.tensor(x, like), cx.tensor(y, like)))
    return h


for _t, _op in _CMP.items():
    _py = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
           "!=": operator.ne}[_op]
    function(_t)(_compare_fn(_op, _py))
for _m, _op in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items():
    method(_m, f"__{_m}__")(_compare_fn(_op, getattr(operator, _m)))


@function(torch.where)
@method("where")
def _where(cx: _Importer, c: Any, x: Any = None, y: Any = None) -> T:
    if x is None:
        raise cx.fail("torch.where(cond) (nonzero) is not supported")
    if not isinstance(c, T):
        return x if c else y
    like = x if isinstance(x, T) else (y if isinstance(y, T) else None)
    xt = cx.tensor(x, like)
    yt = cx.tensor(y, like or xt)
    return T(ops.where(cx.b, c, xt, yt))


@method("masked_fill", "masked_fill_")
def _masked_fill(cx: _Importer, x: T, mask: T, value: Any) -> T:
    return T(ops.where(cx.b, mask, cx.tensor(value, x), x))


@function(torch.clamp, torch.clip)
@method("clamp", "clip", "clamp_")
def _clamp(cx: _Importer, x: T, min: Any = None, max: Any = None) -> T:  # noqa: A002 - torch's names
    if isinstance(min, T) or isinstance(max, T):
        if min is not None:
            x = T(ops.maximum(cx.b, x, cx.tensor(min, x)))
        if max is not None:
            x = T(ops.minimum(cx.b, x, cx.tensor(max, x)))
        return x
    return T(ops.clip(cx.b, x, lo=min, hi=max))


@function(F.hardtanh, F.relu6)
def _hardtanh(cx: _Importer, x: T, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> T:
    if cx.node.target is F.relu6:
        min_val, max_val = 0.0, 6.0
    return T(ops.clip(cx.b, x, lo=min_val, hi=max_val))


@function(F.leaky_relu)
def _leaky_relu(cx: _Importer, x: T, negative_slope: float = 0.01, inplace: bool = False) -> T:
    neg = ops.scale(cx.b, x, negative_slope)
    return T(ops.maximum(cx.b, x, neg)) if negative_slope <= 1 else T(ops.minimum(cx.b, x, neg))


# dtype conversion ---------------------------------------------------------------------------------
_DTYPE_METHODS = {"float": torch.float32, "double": torch.float64, "long": torch.int64, "int": torch.int32,
                  "bool": torch.bool, "half": torch.float16, "bfloat16": torch.bfloat16}


def _dtype_method(dt: torch.dtype) -> Handler:
    def h(cx: _Importer, x: T, *a: Any, **kw: Any) -> T:
        return T(ops.cast(cx.b, x, ir_dtype(dt)))
    return h


for _m, _dt in _DTYPE_METHODS.items():
    method(_m)(_dtype_method(_dt))


@method("to", "type")
def _to(cx: _Importer, x: T, *args: Any, dtype: torch.dtype | None = None, **kw: Any) -> T:
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, T):
            dtype = getattr(torch, cx.dtype(a))
    return T(ops.cast(cx.b, x, ir_dtype(dtype))) if dtype is not None else x


@method("type_as")
def _type_as(cx: _Importer, x: T, other: T) -> T:
    return T(ops.cast(cx.b, x, cx.dtype(other)))


@method("contiguous", "clone", "detach", "cpu", "cuda", "requires_grad_")
@function(torch.clone, torch.Tensor.contiguous)
def _identity(cx: _Importer, x: T, *a: Any, **kw: Any) -> T:
    return x


@function(F.dropout, torch.dropout, F.dropout1d, F.dropout2d, F.alpha_dropout)
def _dropout(cx: _Importer, x: T, p: float = 0.5, training: bool = True, inplace: bool = False) -> T:
    if training and p > 0:
        raise cx.fail("dropout in training mode is not supported (call model.eval())")
    return x


# =================================================================================================
# Reductions, softmax, normalization
# =================================================================================================
def _reduce_axes(cx: _Importer, x: T, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(cx.rank(x)))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({cx.axis(d, cx.rank(x)) for d in dim})


def _reducer(kind: str) -> Handler:
    def h(cx: _Importer, x: T, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> T:
        if dtype is not None:
            x = T(ops.cast(cx.b, x, ir_dtype(dtype)))
        if cx.rank(x) == 0:
            return x
        return T(ops.reduce(cx.b, x, kind, _reduce_axes(cx, x, dim), keepdims=keepdim))
    return h


for _kind, _names in {"mean": ("mean",), "sum": ("sum",), "max": ("amax",), "min": ("amin",),
                      "prod": ("prod",)}.items():
    for _n in _names:
        function(getattr(torch, _n))(_reducer(_kind))
        method(_n)(_reducer(_kind))


@method("max", "min")
def _max_method(cx: _Importer, x: T, dim: Any = None, keepdim: bool = False) -> Any:
    kind = cx.node.target
    if isinstance(dim, T):
        return _binary(cx, ops.maximum if kind == "max" else ops.minimum, builtins.max, x, dim)
    return _max_min(cx, kind, x, dim, keepdim)


def _softmax_dim(cx: _Importer, x: T, dim: int | None) -> int:
    if dim is None:  # torch's legacy implicit dim
        dim = 0 if cx.rank(x) in (0, 1, 3) else 1
    return dim


@function(F.softmax, torch.softmax, torch.special.softmax)
@method("softmax")
def _softmax(cx: _Importer, x: T, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> T:
    if dtype is not None:
        x = T(ops.cast(cx.b, x, ir_dtype(dtype)))
    return T(ops.softmax(cx.b, x, axis=_softmax_dim(cx, x, dim)))


@function(F.log_softmax, torch.log_softmax, torch.special.log_softmax)
@method("log_softmax")
def _log_softmax(cx: _Importer, x: T, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> T:
    if dtype is not None:
        x = T(ops.cast(cx.b, x, ir_dtype(dtype)))
    return T(ops.log_softmax(cx.b, x, axis=_softmax_dim(cx, x, dim)))


@function(F.layer_norm, torch.layer_norm)
def _layer_norm(cx: _Importer, x: T, normalized_shape: Sequence[int], weight: T | None = None,
                bias: T | None = None, eps: float = 1e-5, cudnn_enable: bool = True) -> T:
    n = len(_ints(normalized_shape, 1))
    return T(ops.layer_norm(cx.b, x, weight, bias, axis=cx.rank(x) - n, eps=eps))


@function(getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None))
def _rms_norm(cx: _Importer, x: T, normalized_shape: Sequence[int], weight: T | None = None,
              eps: float | None = None) -> T:
    n = len(_ints(normalized_shape, 1))
    if eps is None:
        eps = float(torch.finfo(getattr(torch, cx.dtype(x))).eps)
    return T(ops.rms_norm(cx.b, x, weight, axis=cx.rank(x) - n, eps=eps))


def _bn(cx: _Importer, x: T, mean: T, var: T, weight: T | None, bias: T | None, training: bool,
        eps: float) -> T:
    if training:
        raise cx.fail("batch_norm in training mode is not supported (call model.eval())")
    if mean is None or var is None:
        raise cx.fail("batch_norm without running statistics is not supported")
    c = cx.shape(x)[1]
    if weight is None:
        weight = cx.const(np.ones(c, np.float32))
    if bias is None:
        bias = cx.const(np.zeros(c, np.float32))
    return T(ops.batch_norm(cx.b, x, weight, bias, mean, var, eps=eps))


@function(F.batch_norm)
def _f_batch_norm(cx: _Importer, x: T, running_mean: T | None, running_var: T | None,
                  weight: T | None = None, bias: T | None = None, training: bool = False,
                  momentum: float = 0.1, eps: float = 1e-5) -> T:
    return _bn(cx, x, running_mean, running_var, weight, bias, training, eps)


@function(torch.batch_norm)
def _torch_batch_norm(cx: _Importer, x: T, weight: T | None, bias: T | None, running_mean: T | None,
                      running_var: T | None, training: bool, momentum: float, eps: float,
                      cudnn_enabled: bool = True) -> T:
    return _bn(cx, x, running_mean, running_var, weight, bias, training, eps)


# =================================================================================================
# Contractions
# =================================================================================================
@function(torch.matmul, operator.matmul, torch.bmm, torch.mm)
@method("matmul", "bmm", "mm", "__matmul__")
def _matmul(cx: _Importer, x: T, y: T) -> T:
    return T(ops.matmul(cx.b, x, y))


@function(F.linear)
def _linear(cx: _Importer, x: T, weight: T, bias: T | None = None) -> T:
    return T(ops.linear(cx.b, x, weight, bias))


@function(torch.addmm)
def _addmm(cx: _Importer, bias: T, x: T, y: T, *, beta: float = 1, alpha: float = 1) -> T:
    out = T(ops.matmul(cx.b, x, y))
    if alpha != 1:
        out = T(ops.scale(cx.b, out, alpha))
    if beta != 1:
        bias = T(ops.scale(cx.b, bias, beta))
    return T(ops.add(cx.b, out, bias))


def _conv_pads(cx: _Importer, padding: Any, weight: T, dilation: tuple[int, int],
               stride: tuple[int, int]) -> tuple[int, int, int, int]:
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise cx.fail("padding='same' needs stride 1")
            kh, kw = cx.shape(weight)[2:]
            th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
            return (th // 2, tw // 2, th - th // 2, tw - tw // 2)
        raise cx.fail(f"unknown padding {padding!r}")
    ph, pw = _ints(padding, 2)
    return (ph, pw, ph, pw)


@function(F.conv2d)
def _conv2d(cx: _Importer, x: T, weight: T, bias: T | None = None, stride: Any = 1, padding: Any = 0,
            dilation: Any = 1, groups: int = 1) -> T:
    stride, dilation = _ints(stride, 2), _ints(dilation, 2)
    unbatched = cx.rank(x) == 3
    if unbatched:
        x = T(ops.unsqueeze(cx.b, x, [0]))
    pads = _conv_pads(cx, padding, weight, dilation, stride)
    out = T(ops.conv2d(cx.b, x, weight, bias, strides=stride, pads=pads, dilations=dilation, groups=groups))
    return cx.reshape(out, cx.shape(out)[1:]) if unbatched else out


# =================================================================================================
# Pooling
# =================================================================================================
def _pool_args(kernel: Any, stride: Any, padding: Any, dilation: Any = 1):
    k = _ints(kernel, 2)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else _ints(stride, 2)
    ph, pw = _ints(padding, 2)
    return k, s, (ph, pw, ph, pw), _ints(dilation, 2)


@function(F.max_pool2d, torch.max_pool2d, getattr(F, "max_pool2d_with_indices", None))
def _max_pool2d(cx: _Importer, x: T, kernel_size: Any, stride: Any = None, padding: Any = 0,
                dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> T:
    if return_indices:
        raise cx.fail("max_pool2d with return_indices=True is not supported")
    k, s, p, d = _pool_args(kernel_size, stride, padding, dilation)
    return T(ops.max_pool2d(cx.b, x, k, s, pads=p, dilations=d, ceil_mode=ceil_mode))


@function(F.avg_pool2d, torch._C._nn.avg_pool2d)
def _avg_pool2d(cx: _Importer, x: T, kernel_size: Any, stride: Any = None, padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> T:
    if divisor_override is not None:
        raise cx.fail("avg_pool2d divisor_override is not supported")
    k, s, p, _ = _pool_args(kernel_size, stride, padding)
    return T(ops.avg_pool2d(cx.b, x, k, s, pads=p, ceil_mode=ceil_mode, count_include_pad=count_include_pad))


@function(F.adaptive_avg_pool2d, torch._C._nn.adaptive_avg_pool2d)
def _adaptive_avg_pool2d(cx: _Importer, x: T, output_size: Any) -> T:
    h, w = cx.shape(x)[-2:]
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    oh = h if output_size[0] is None else output_size[0]
    ow = w if output_size[1] is None else output_size[1]
    if (oh, ow) == (1, 1):
        return T(ops.reduce(cx.b, x, "mean", [cx.rank(x) - 2, cx.rank(x) - 1], keepdims=True))
    return T(ops.adaptive_avg_pool2d(cx.b, x, (int(oh), int(ow))))


# =================================================================================================
# Movement
# =================================================================================================
@method("view", "reshape")
def _view(cx: _Importer, x: T, *shape: Any) -> T:
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise cx.fail("view(dtype) is not supported")
    return cx.reshape(x, _dims(shape))


@function(torch.reshape)
def _reshape(cx: _Importer, x: T, shape: Sequence[int]) -> T:
    return cx.reshape(x, _dims([shape]))


@method("view_as", "reshape_as")
def _view_as(cx: _Importer, x: T, other: T) -> T:
    return cx.reshape(x, cx.shape(other))


@function(torch.flatten)
@method("flatten")
def _flatten(cx: _Importer, x: T, start_dim: int = 0, end_dim: int = -1) -> T:
    s = cx.shape(x)
    if not s:
        return cx.reshape(x, (1,))
    a, e = cx.axis(start_dim, len(s)), cx.axis(end_dim, len(s))
    return cx.reshape(x, s[:a] + (math.prod(s[a:e + 1]),) + s[e + 1:])


@function(torch.unflatten)
@method("unflatten")
def _unflatten(cx: _Importer, x: T, dim: int, sizes: Sequence[int]) -> T:
    s = cx.shape(x)
    d = cx.axis(dim, len(s))
    return cx.reshape(x, s[:d] + tuple(sizes) + s[d + 1:])


@function(torch.squeeze)
@method("squeeze")
def _squeeze(cx: _Importer, x: T, dim: Any = None) -> T:
    s = cx.shape(x)
    if dim is None:
        axes = [i for i, e in enumerate(s) if e == 1]
    else:
        axes = [cx.axis(d, len(s)) for d in ([dim] if isinstance(dim, int) else dim)]
        axes = [a for a in axes if s[a] == 1]  # torch ignores non-1 dims
    return cx.reshape(x, [e for i, e in enumerate(s) if i not in axes])


@function(torch.unsqueeze)
@method("unsqueeze")
def _unsqueeze(cx: _Importer, x: T, dim: int) -> T:
    s = list(cx.shape(x))
    d = cx.axis(dim, len(s) + 1)
    return cx.reshape(x, s[:d] + [1] + s[d:])


@function(torch.transpose, torch.swapaxes, torch.swapdims)
@method("transpose", "swapaxes", "swapdims")
def _transpose(cx: _Importer, x: T, dim0: int, dim1: int) -> T:
    return cx.swap(x, dim0, dim1)


@function(torch.t)
@method("t")
def _t(cx: _Importer, x: T) -> T:
    return cx.swap(x, 0, 1) if cx.rank(x) == 2 else x


@function(torch.permute)
@method("permute")
def _permute(cx: _Importer, x: T, *dims: Any) -> T:
    return cx.transpose(x, _dims(dims))


@method("expand")
def _expand(cx: _Importer, x: T, *sizes: Any) -> T:
    sizes = _dims(sizes)
    s = cx.shape(x)
    lead = len(sizes) - len(s)
    shape = [s[i - lead] if (e == -1 and i >= lead) else e for i, e in enumerate(sizes)]
    if tuple(shape) == s:
        return x
    return T(ops.expand(cx.b, x, shape))


@method("expand_as")
def _expand_as(cx: _Importer, x: T, other: T) -> T:
    return _expand(cx, x, cx.shape(other))


@function(torch.cat, torch.concat, torch.concatenate)
def _cat(cx: _Importer, tensors: Sequence[Any], dim: int = 0, *, axis: int | None = None) -> T:
    if axis is not None:
        dim = axis
    ts = [cx.tensor(t) for t in tensors]
    ts = [t for t in ts if math.prod(cx.shape(t)) > 0 or cx.rank(t) > 1]  # torch skips empty 1-D tensors
    if len(ts) == 1:
        return ts[0]
    return T(ops.concat(cx.b, ts, cx.axis(dim, cx.rank(ts[0]))))


@function(torch.stack)
def _stack(cx: _Importer, tensors: Sequence[Any], dim: int = 0) -> T:
    ts = [cx.tensor(t) for t in tensors]
    d = cx.axis(dim, cx.rank(ts[0]) + 1)
    ts = [_unsqueeze(cx, t, d) for t in ts]
    return ts[0] if len(ts) == 1 else T(ops.concat(cx.b, ts, d))


def _split_sizes(cx: _Importer, x: T, split: Any, dim: int) -> tuple[int, list[int]]:
    d = cx.axis(dim, cx.rank(x))
    n = cx.shape(x)[d]
    if isinstance(split, int):
        sizes = [split] * (n // split) + ([n % split] if n % split else [])
    else:
        sizes = [int(s) for s in split]
    return d, sizes


def _split_parts(cx: _Importer, x: T, d: int, sizes: list[int]) -> tuple[T, ...]:
    if len(sizes) == 1:
        return (x,)
    parts, start = [], 0
    for s in sizes:
        parts.append(cx.slice_axis(x, d, start, start + s))
        start += s
    return tuple(parts)


@function(torch.split)
@method("split")
def _split(cx: _Importer, x: T, split_size_or_sections: Any, dim: int = 0) -> tuple[T, ...]:
    d, sizes = _split_sizes(cx, x, split_size_or_sections, dim)
    return _split_parts(cx, x, d, sizes)


@function(torch.chunk)
@method("chunk")
def _chunk(cx: _Importer, x: T, chunks: int, dim: int = 0) -> tuple[T, ...]:
    d = cx.axis(dim, cx.rank(x))
    n = cx.shape(x)[d]
    size = -(-n // chunks)
    return _split(cx, x, size, d)


@function(torch.unbind)
@method("unbind")
def _unbind(cx: _Importer, x: T, dim: int = 0) -> tuple[T, ...]:
    d = cx.axis(dim, cx.rank(x))
    s = cx.shape(x)
    return tuple(cx.reshape(cx.slice_axis(x, d, i, i + 1), s[:d] + s[d + 1:]) for i in range(s[d]))


@function(torch.narrow)
@method("narrow")
def _narrow(cx: _Importer, x: T, dim: int, start: int, length: int) -> T:
    d = cx.axis(dim, cx.rank(x))
    return cx.slice_axis(x, d, start, start + length)


@function(operator.getitem)
def _getitem(cx: _Importer, x: T, index: Any) -> T:
    idx = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, T) for i in idx):
        if len(idx) == 1 and cx.dtype(idx[0]) in ("int64", "int32"):
            return T(ops.gather(cx.b, x, idx[0], axis=0))
        raise cx.fail("advanced (tensor) indexing is only supported as x[int_tensor]")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if sum(1 for i in idx if i is Ellipsis) > 1:
        raise cx.fail("more than one Ellipsis in an index")
    if Ellipsis in idx:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (cx.rank(x) - n_real) + idx[k + 1:]
    shape: list[int] = []
    axis = 0
    out = x
    for i in idx:
        if i is None:
            shape.append(1)
            continue
        if axis >= cx.rank(x):
            raise cx.fail("too many indices")
        n = cx.shape(x)[axis]
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step <= 0:
                raise cx.fail("slices with a non-positive step are not supported")
            out = cx.slice_axis(out, axis, start, stop, step)
            shape.append(cx.shape(out)[axis])
        elif isinstance(i, int):
            if not -n <= i < n:
                raise cx.fail(f"index {i} out of range for size {n}")
            i %= n
            out = cx.slice_axis(out, axis, i, i + 1)
        else:
            raise cx.fail(f"unsupported index {i!r}")
        axis += 1
    shape += list(cx.shape(out)[axis:])
    return cx.reshape(out, shape)


@function(builtins.getattr)
def _getattr(cx: _Importer, x: T, attr: str) -> Any:
    if attr == "shape":
        return torch.Size(cx.shape(x))
    if attr == "ndim":
        return cx.rank(x)
    if attr == "dtype":
        return getattr(torch, cx.dtype(x))
    if attr == "T":
        return cx.transpose(x, list(range(cx.rank(x)))[::-1])
    if attr == "mT":
        return cx.swap(x, -2, -1)
    raise cx.fail(f"unsupported tensor attribute .{attr}")


@method("size")
def _size(cx: _Importer, x: T, dim: int | None = None) -> Any:
    s = cx.shape(x)
    return torch.Size(s) if dim is None else s[cx.axis(dim, len(s))]


@method("dim", "ndimension")
def _dim(cx: _Importer, x: T) -> int:
    return cx.rank(x)


@method("numel", "nelement")
def _numel(cx: _Importer, x: T) -> int:
    return math.prod(cx.shape(x))


@function(F.pad)
def _pad(cx: _Importer, x: T, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> T:
    if mode != "constant":
        raise cx.fail(f"F.pad mode={mode!r} is not supported")
    r = cx.rank(x)
    begins, ends = [0] * r, [0] * r
    for k in range(len(pad) // 2):  # torch lists (left, right) pairs from the last dim backwards
        begins[r - 1 - k], ends[r - 1 - k] = int(pad[2 * k]), int(pad[2 * k + 1])
    if any(p < 0 for p in begins + ends):
        raise cx.fail("negative padding is not supported")
    return T(ops.pad(cx.b, x, begins + ends, value=0.0 if value is None else value))


# =================================================================================================
# Attention
# =================================================================================================
def _bool_mask_to_additive(cx: _Importer, mask: T, like: T, true_means_masked: bool) -> T:
    neg = cx.tensor(float("-inf"), like)
    zero = cx.tensor(0.0, like)
    return T(ops.where(cx.b, mask, neg, zero) if true_means_masked else ops.where(cx.b, mask, zero, neg))


@function(F.scaled_dot_product_attention)
def _sdpa(cx: _Importer, q: T, k: T, v: T, attn_mask: T | None = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> T:
    if dropout_p > 0:
        raise cx.fail("scaled_dot_product_attention with dropout_p > 0 is not supported")
    if enable_gqa and cx.shape(q)[-3] != cx.shape(k)[-3]:
        raise cx.fail("grouped-query attention (enable_gqa) is not supported")
    return T(ops.scaled_dot_product_attention(cx.b, q, k, v, mask=attn_mask, is_causal=is_causal,
                                              scale=scale))


def _mha_core(cx: _Importer, query: T, key: T, value: T, num_heads: int, wq: T, wk: T, wv: T,
              bq: T | None, bk: T | None, bv: T | None, out_w: T, out_b: T | None,
              key_padding_mask: T | None, need_weights: bool, attn_mask: T | None,
              average_attn_weights: bool, is_causal: bool) -> tuple[T, T | None]:
    """Multi-head attention on seq-first (L, N, E) inputs; returns ((L, N, E), weights or None)."""
    b = cx.b
    L, N, E = cx.shape(query)
    S = cx.shape(key)[0]
    H = num_heads
    hd = E // H

    def heads(x: T, w: T, bias: T | None, n: int) -> T:  # (n, N, E) -> (N, H, n, hd)
        y = T(ops.linear(b, x, w, bias))
        y = cx.reshape(y, (n, N, H, hd))
        return cx.transpose(y, (1, 2, 0, 3))

    q, k, v = heads(query, wq, bq, L), heads(key, wk, bk, S), heads(value, wv, bv, S)
    mask = None
    if attn_mask is not None:  # (L, S) or (N*H, L, S); bool: True = masked
        m = attn_mask
        if cx.dtype(m) == "bool":
            m = _bool_mask_to_additive(cx, m, q, true_means_masked=True)
        if cx.rank(m) == 3:
            m = cx.reshape(m, (N, H, L, S))
        mask = m
    elif is_causal:
        causal = np.triu(np.full((L, S), -np.inf, np.float32), 1)
        mask = cx.const(causal.astype(cx.dtype(q)))
    if key_padding_mask is not None:  # (N, S)
        kp = key_padding_mask
        if cx.dtype(kp) == "bool":
            kp = _bool_mask_to_additive(cx, kp, q, true_means_masked=True)
        kp = cx.reshape(kp, (N, 1, 1, S))
        mask = kp if mask is None else T(ops.add(b, mask, kp))
    weights = None
    if need_weights:
        scores = T(ops.matmul(b, q, cx.transpose(k, (0, 1, 3, 2))))
        scores = T(ops.scale(b, scores, 1.0 / math.sqrt(hd)))
        if mask is not None:
            scores = T(ops.add(b, scores, mask))
        p = T(ops.softmax(b, scores, axis=-1))
        o = T(ops.matmul(b, p, v))
        weights = T(ops.reduce(b, p, "mean", [1], keepdims=False)) if average_attn_weights else p
    else:
        o = T(ops.scaled_dot_product_attention(b, q, k, v, mask=mask, is_causal=False, scale=None))
    o = cx.reshape(cx.transpose(o, (2, 0, 1, 3)), (L, N, E))
    return T(ops.linear(b, o, out_w, out_b)), weights


@function(F.multi_head_attention_forward)
def _f_mha(cx: _Importer, query: T, key: T, value: T, embed_dim_to_check: int, num_heads: int,
           in_proj_weight: T | None, in_proj_bias: T | None, bias_k: T | None, bias_v: T | None,
           add_zero_attn: bool, dropout_p: float, out_proj_weight: T, out_proj_bias: T | None,
           training: bool = True, key_padding_mask: T | None = None, need_weights: bool = True,
           attn_mask: T | None = None, use_separate_proj_weight: bool = False, q_proj_weight: T | None = None,
           k_proj_weight: T | None = None, v_proj_weight: T | None = None, static_k: T | None = None,
           static_v: T | None = None, average_attn_weights: bool = True, is_causal: bool = False) -> Any:
    if add_zero_attn or any(t is not None for t in (bias_k, bias_v, static_k, static_v)):
        raise cx.fail("multi-head attention with bias_k/bias_v/add_zero_attn/static_k/static_v "
                      "is not supported")
    if training and dropout_p > 0:
        raise cx.fail("multi-head attention dropout in training mode is not supported (call model.eval())")
    E = embed_dim_to_check
    if use_separate_proj_weight:
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    else:
        wq, wk, wv = (cx.slice_axis(in_proj_weight, 0, i * E, (i + 1) * E) for i in range(3))
    bq = bk = bv = None
    if in_proj_bias is not None:
        bq, bk, bv = (cx.slice_axis(in_proj_bias, 0, i * E, (i + 1) * E) for i in range(3))
    unbatched = cx.rank(query) == 2
    if unbatched:
        query, key, value = (cx.reshape(t, (cx.shape(t)[0], 1, cx.shape(t)[1])) for t in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = cx.reshape(key_padding_mask, (1, *cx.shape(key_padding_mask)))
    out, w = _mha_core(cx, query, key, value, num_heads, wq, wk, wv, bq, bk, bv, out_proj_weight,
                       out_proj_bias, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                       is_causal)
    if unbatched:
        out = cx.reshape(out, (cx.shape(out)[0], cx.shape(out)[2]))
        if w is not None:
            w = cx.reshape(w, cx.shape(w)[1:])
    return (out, w)


# =================================================================================================
# Modules (leaves of symbolic_trace)
# =================================================================================================
@module(nn.Linear)
def _m_linear(cx: _Importer, m: nn.Linear, x: T) -> T:
    return _linear(cx, x, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"))


@module(nn.Conv2d)
def _m_conv2d(cx: _Importer, m: nn.Conv2d, x: T) -> T:
    if m.padding_mode != "zeros":
        raise cx.fail(f"Conv2d padding_mode={m.padding_mode!r} is not supported")
    return _conv2d(cx, x, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), m.stride, m.padding,
                   m.dilation, m.groups)


@module(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
def _m_batch_norm(cx: _Importer, m: nn.modules.batchnorm._BatchNorm, x: T) -> T:
    training = m.training or not m.track_running_stats or m.running_mean is None
    return _bn(cx, x, cx.param(m.running_mean, "running_mean"), cx.param(m.running_var, "running_var"),
               cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), training, m.eps)


@module(nn.LayerNorm)
def _m_layer_norm(cx: _Importer, m: nn.LayerNorm, x: T) -> T:
    return _layer_norm(cx, x, m.normalized_shape, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"),
                       m.eps)


if hasattr(nn, "RMSNorm"):
    @module(nn.RMSNorm)
    def _m_rms_norm(cx: _Importer, m: nn.Module, x: T) -> T:
        return _rms_norm(cx, x, m.normalized_shape, cx.param(m.weight, "weight"), m.eps)


@module(nn.ReLU)
def _m_relu(cx: _Importer, m: nn.Module, x: T) -> T:
    return T(ops.relu(cx.b, x))


@module(nn.GELU)
def _m_gelu(cx: _Importer, m: nn.GELU, x: T) -> T:
    return T(ops.gelu(cx.b, x, approximate=m.approximate))


@module(nn.SiLU)
def _m_silu(cx: _Importer, m: nn.Module, x: T) -> T:
    return T(ops.silu(cx.b, x))


@module(nn.Sigmoid)
def _m_sigmoid(cx: _Importer, m: nn.Module, x: T) -> T:
    return T(ops.sigmoid(cx.b, x))


@module(nn.Tanh)
def _m_tanh(cx: _Importer, m: nn.Module, x: T) -> T:
    return T(ops.tanh(cx.b, x))


@module(nn.ReLU6, nn.Hardtanh)
def _m_hardtanh(cx: _Importer, m: nn.Hardtanh, x: T) -> T:
    return T(ops.clip(cx.b, x, lo=m.min_val, hi=m.max_val))


@module(nn.LeakyReLU)
def _m_leaky_relu(cx: _Importer, m: nn.LeakyReLU, x: T) -> T:
    return _leaky_relu(cx, x, m.negative_slope)


@module(nn.Softmax)
def _m_softmax(cx: _Importer, m: nn.Softmax, x: T) -> T:
    return _softmax(cx, x, m.dim)


@module(nn.LogSoftmax)
def _m_log_softmax(cx: _Importer, m: nn.LogSoftmax, x: T) -> T:
    return _log_softmax(cx, x, m.dim)


@module(nn.MaxPool2d)
def _m_max_pool2d(cx: _Importer, m: nn.MaxPool2d, x: T) -> T:
    return _max_pool2d(cx, x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, m.return_indices)


@module(nn.AvgPool2d)
def _m_avg_pool2d(cx: _Importer, m: nn.AvgPool2d, x: T) -> T:
    return _avg_pool2d(cx, x, m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad,
                       m.divisor_override)


@module(nn.AdaptiveAvgPool2d)
def _m_adaptive_avg_pool2d(cx: _Importer, m: nn.AdaptiveAvgPool2d, x: T) -> T:
    return _adaptive_avg_pool2d(cx, x, m.output_size)


@module(nn.Flatten)
def _m_flatten(cx: _Importer, m: nn.Flatten, x: T) -> T:
    return _flatten(cx, x, m.start_dim, m.end_dim)


@module(nn.Unflatten)
def _m_unflatten(cx: _Importer, m: nn.Unflatten, x: T) -> T:
    return _unflatten(cx, x, m.dim, m.unflattened_size)


@module(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)
def _m_dropout(cx: _Importer, m: nn.modules.dropout._DropoutNd, x: T) -> T:
    return _dropout(cx, x, m.p, m.training)


@module(nn.Identity)
def _m_identity(cx: _Importer, m: nn.Module, x: T, *a: Any, **kw: Any) -> T:
    return x


@module(nn.MultiheadAttention)
def _m_mha(cx: _Importer, m: nn.MultiheadAttention, query: T, key: T, value: T,
           key_padding_mask: T | None = None, need_weights: bool = True, attn_mask: T | None = None,
           average_attn_weights: bool = True, is_causal: bool = False) -> Any:
    batched = cx.rank(query) == 3
    if m.batch_first and batched:
        query, key, value = (cx.swap(t, 0, 1) for t in (query, key, value))
    p = cx.param
    out, w = _f_mha(cx, query, key, value, m.embed_dim, m.num_heads, p(m.in_proj_weight, "in_proj_weight"),
                    p(m.in_proj_bias, "in_proj_bias"), p(m.bias_k, "bias_k"), p(m.bias_v, "bias_v"),
                    m.add_zero_attn, m.dropout, p(m.out_proj.weight, "out_proj_weight"),
                    p(m.out_proj.bias, "out_proj_bias"), m.training, key_padding_mask, need_weights,
                    attn_mask, not m._qkv_same_embed_dim, p(m.q_proj_weight, "q_proj_weight"),
                    p(m.k_proj_weight, "k_proj_weight"), p(m.v_proj_weight, "v_proj_weight"),
                    None, None, average_attn_weights, is_causal)
    if m.batch_first and batched:
        out = cx.swap(out, 0, 1)
    return (out, w)


@function(getattr(torch, "_transformer_encoder_layer_fwd", None))
def _transformer_encoder_layer_fwd(cx: _Importer, src: T, embed_dim: int, num_heads: int, qkv_weight: T,
                                   qkv_bias: T | None, proj_weight: T, proj_bias: T | None, use_gelu: bool,
                                   norm_first: bool, eps: float, norm_weight_1: T, norm_bias_1: T,
                                   norm_weight_2: T, norm_bias_2: T, ffn_weight_1: T, ffn_bias_1: T | None,
                                   ffn_weight_2: T, ffn_bias_2: T | None, mask: T | None = None,
                                   mask_type: int | None = None) -> T:
    """nn.TransformerEncoderLayer's inference fast path (batch-first src), which Dynamo sees under no_grad."""
    b = cx.b
    if cx.rank(src) != 3:
        raise cx.fail("the encoder-layer fast path needs a batched (N, L, E) input")
    n, length, _ = cx.shape(src)
    attn_mask = kpm = None
    if mask is not None:
        if mask_type == 1 or (mask_type == 2 and cx.rank(mask) == 2 and cx.shape(mask)[0] == n != length):
            kpm = mask
        elif cx.rank(mask) in (2, 4):  # (L, S), or merged (N, H, L, S)
            attn_mask = mask
        else:
            raise cx.fail(f"encoder-layer mask of shape {cx.shape(mask)} (mask_type {mask_type}) "
                          "is not supported")
    E = embed_dim
    wq, wk, wv = (cx.slice_axis(qkv_weight, 0, i * E, (i + 1) * E) for i in range(3))
    bq = bk = bv = None
    if qkv_bias is not None:
        bq, bk, bv = (cx.slice_axis(qkv_bias, 0, i * E, (i + 1) * E) for i in range(3))

    def attn(x: T) -> T:
        xs = cx.swap(x, 0, 1)
        out, _ = _mha_core(cx, xs, xs, xs, num_heads, wq, wk, wv, bq, bk, bv, proj_weight, proj_bias, kpm,
                           False, attn_mask, True, False)
        return cx.swap(out, 0, 1)

    def ffn(x: T) -> T:
        h = T(ops.linear(b, x, ffn_weight_1, ffn_bias_1))
        h = T(ops.gelu(b, h)) if use_gelu else T(ops.relu(b, h))
        return T(ops.linear(b, h, ffn_weight_2, ffn_bias_2))

    def ln(x: T, w: T, bias: T) -> T:
        return T(ops.layer_norm(b, x, w, bias, axis=-1, eps=eps))

    x = src
    if norm_first:
        x = T(ops.add(b, x, attn(ln(x, norm_weight_1, norm_bias_1))))
        return T(ops.add(b, x, ffn(ln(x, norm_weight_2, norm_bias_2))))
    x = ln(T(ops.add(b, x, attn(x))), norm_weight_1, norm_bias_1)
    return ln(T(ops.add(b, x, ffn(x))), norm_weight_2, norm_bias_2)


# =================================================================================================
# Tensor creation (shape-driven constants)
# =================================================================================================
def _filled(cx: _Importer, shape: Sequence[int], value: Any, dtype: Any) -> T:
    if dtype is None:
        dtype = torch.get_default_dtype() if isinstance(value, float) else (
            torch.bool if isinstance(value, bool) else torch.int64)
    return cx.const(np.full(tuple(int(s) for s in shape), value, dtype=ir_dtype(dtype)))


def _like(value: Any) -> Handler:
    def h(cx: _Importer, x: T, *, dtype: Any = None, **kw: Any) -> T:
        dt = dtype if dtype is not None else getattr(torch, cx.dtype(x))
        return _filled(cx, cx.shape(x), value, dt)
    return h


function(torch.zeros_like)(_like(0))
function(torch.ones_like)(_like(1))


@function(torch.full_like)
def _full_like(cx: _Importer, x: T, fill_value: Any, *, dtype: Any = None, **kw: Any) -> T:
    return _like(fill_value)(cx, x, dtype=dtype)


@method("new_zeros", "new_ones")
def _new_filled(cx: _Importer, x: T, *size: Any, dtype: Any = None, **kw: Any) -> T:
    dt = dtype if dtype is not None else getattr(torch, cx.dtype(x))
    return _filled(cx, _dims(size), 0 if cx.node.target == "new_zeros" else 1, dt)


@method("new_full")
def _new_full(cx: _Importer, x: T, size: Any, fill_value: Any, *, dtype: Any = None, **kw: Any) -> T:
    dt = dtype if dtype is not None else getattr(torch, cx.dtype(x))
    return _filled(cx, _dims([size]), fill_value, dt)


# =================================================================================================
# ATen-level graphs (what aot_autograd hands a forward compiler)
# =================================================================================================
class _Missing:
    """A secondary output of an ATen op that the import does not compute (batch-norm/layer-norm
    saved statistics, max-pool indices, attention logsumexp). Using one is an FxImportError."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<not computed: {self.what}>"


_aten = torch.ops.aten


def aten(*names: str) -> Callable[[Handler], Handler]:
    """Register a handler for ``aten.<name>`` overloads, e.g. ``"add.Tensor"`` or ``"relu"`` (all)."""
    def deco(h: Handler) -> Handler:
        for name in names:
            packet_name, _, overload = name.partition(".")
            packet = getattr(_aten, packet_name, None)
            if packet is None:
                continue
            FUNCTIONS[packet] = h
            for ov in ([overload] if overload else packet.overloads()):
                op = getattr(packet, ov, None)
                if op is not None:
                    FUNCTIONS[op] = h
        return h
    return deco


aten("add")(_add)
aten("sub")(_sub)
aten("rsub")(_rsub)
aten("mul")(_mul)
aten("div")(_div)
aten("pow")(_pow)
aten("maximum")(_maximum)
aten("minimum")(_minimum)
aten("relu")(_relu)
aten("gelu")(_gelu)
aten("silu")(_silu)
aten("sigmoid")(_sigmoid)
aten("tanh")(_tanh)
aten("clamp", "clamp_min", "clamp_max")(_clamp)
aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")(_where)
aten("masked_fill")(_masked_fill)
for _fn in ("exp", "log", "sqrt", "rsqrt", "erf", "abs", "neg", "floor", "ceil", "reciprocal", "sin", "cos"):
    aten(_fn)(_unary_fn(_fn))
for _m, _op in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items():
    aten(_m)(_compare_fn(_op, getattr(operator, _m)))
aten("mm", "bmm", "matmul")(_matmul)
aten("addmm")(_addmm)
aten("linear")(_linear)
aten("t", "numpy_T")(_t)
aten("transpose.int")(_transpose)
aten("permute")(_permute)
aten("view.default", "_unsafe_view", "reshape")(_reshape)
aten("unsqueeze")(_unsqueeze)
aten("squeeze")(_squeeze)
aten("expand")(lambda cx, x, size, implicit=False: _expand(cx, x, size))
aten("cat")(_cat)
aten("stack")(_stack)
aten("split.Tensor", "split_with_sizes")(_split)
aten("unbind")(_unbind)
aten("clone", "alias", "detach", "contiguous", "lift_fresh_copy")(_identity)
aten("dropout")(lambda cx, x, p, train: _dropout(cx, x, p, train))
aten("softmax.int")(_softmax)
aten("_softmax")(lambda cx, x, dim, half_to_float: _softmax(cx, x, dim))
aten("_log_softmax")(lambda cx, x, dim, half_to_float: _log_softmax(cx, x, dim))
aten("log_softmax.int")(_log_softmax)
aten("mean.dim", "mean.default")(_reducer("mean"))
aten("sum.dim_IntList", "sum.default")(_reducer("sum"))
aten("amax")(_reducer("max"))
aten("amin")(_reducer("min"))
aten("prod.dim_int", "prod.default")(_reducer("prod"))
aten("layer_norm")(_layer_norm)
aten("scaled_dot_product_attention")(_sdpa)
aten("adaptive_avg_pool2d", "_adaptive_avg_pool2d")(_adaptive_avg_pool2d)
aten("avg_pool2d")(_avg_pool2d)
aten("max_pool2d")(_max_pool2d)
aten("_transformer_encoder_layer_fwd")(_transformer_encoder_layer_fwd)
aten("constant_pad_nd")(lambda cx, x, pad, value=0: _pad(cx, x, pad, "constant", value))


@aten("_to_copy", "to.dtype", "_to_dtype")
def _aten_to(cx: _Importer, x: T, dtype: Any = None, *a: Any, **kw: Any) -> T:
    dtype = kw.get("dtype", dtype) if isinstance(dtype, torch.dtype) or dtype is None else dtype
    return T(ops.cast(cx.b, x, ir_dtype(dtype))) if isinstance(dtype, torch.dtype) else x


@aten("slice.Tensor")
def _aten_slice(cx: _Importer, x: T, dim: int = 0, start: int | None = None, end: int | None = None,
                step: int = 1) -> T:
    d = cx.axis(dim, cx.rank(x))
    n = cx.shape(x)[d]
    start = 0 if start is None else max(min(start, n), -n)
    end = n if end is None else max(min(end, n), -n - 1)
    return cx.slice_axis(x, d, start, end, step)


@aten("select.int")
def _aten_select(cx: _Importer, x: T, dim: int, index: int) -> T:
    d = cx.axis(dim, cx.rank(x))
    s = cx.shape(x)
    return cx.reshape(cx.slice_axis(x, d, index % s[d], index % s[d] + 1), s[:d] + s[d + 1:])


@aten("convolution")
def _aten_convolution(cx: _Importer, x: T, weight: T, bias: T | None, stride: Any, padding: Any,
                      dilation: Any, transposed: bool, output_padding: Any, groups: int) -> T:
    if transposed:
        raise cx.fail("transposed convolution is not supported")
    if cx.rank(weight) != 4:
        raise cx.fail(f"only 2-D convolution is supported (weight rank {cx.rank(weight)})")
    return _conv2d(cx, x, weight, bias, stride, padding, dilation, groups)


@aten("_native_batch_norm_legit_no_training")
def _aten_bn_no_training(cx: _Importer, x: T, weight: T | None, bias: T | None, running_mean: T,
                         running_var: T, momentum: float, eps: float) -> tuple[Any, ...]:
    return (_bn(cx, x, running_mean, running_var, weight, bias, False, eps), _Missing("batch_norm save_mean"),
            _Missing("batch_norm save_invstd"))


@aten("native_layer_norm")
def _aten_native_layer_norm(cx: _Importer, x: T, normalized_shape: Any, weight: T | None, bias: T | None,
                            eps: float) -> tuple[Any, ...]:
    return (_layer_norm(cx, x, normalized_shape, weight, bias, eps), _Missing("layer_norm mean"),
            _Missing("layer_norm rstd"))


@aten("max_pool2d_with_indices")
def _aten_max_pool2d_with_indices(cx: _Importer, x: T, kernel_size: Any, stride: Any = (), padding: Any = 0,
                                  dilation: Any = 1, ceil_mode: bool = False) -> tuple[Any, ...]:
    out = _max_pool2d(cx, x, kernel_size, stride, padding, dilation, ceil_mode)
    return (out, _Missing("max_pool2d indices"))


@aten("_scaled_dot_product_flash_attention_for_cpu")
def _aten_sdpa_cpu(cx: _Importer, q: T, k: T, v: T, dropout_p: float = 0.0, is_causal: bool = False, *,
                   attn_mask: T | None = None, scale: float | None = None) -> tuple[Any, ...]:
    return (_sdpa(cx, q, k, v, attn_mask, dropout_p, is_causal, scale), _Missing("attention logsumexp"))
