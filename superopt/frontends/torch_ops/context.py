"""What every torch handler sees: the tables handlers register in, the import context ``Ctx`` (graph
builder, current node, helpers), graph tensor names ``T`` and dtype conversion.

A handler is ``fn(cx: Ctx, *args, **kwargs)`` called with the FX node's arguments, where graph tensors
are ``T`` names and everything else is the Python value; it returns ``T`` names, tuples of them, or
Python values (folded at import time).
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx
from torch import nn
from torch.fx.node import map_aggregate

from superopt import ops
from superopt.builder import GraphBuilder


class FxImportError(ValueError):
    """A torch.fx graph that the importer cannot translate (unsupported op or argument). ``reason`` is the
    message without the node it names."""

    def __init__(self, msg: str, reason: str | None = None) -> None:
        super().__init__(msg)
        self.reason = reason or msg


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




class Ctx:
    """What a handler sees: the graph builder, the node being imported, and helpers."""

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
        return FxImportError(msg + where, reason=msg)

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

def _concrete(v: Any) -> Any:
    """A shape symbol's example value, read from its hint: ``int(sym)`` would make Dynamo guard on the value
    and recompile the graph for every new size."""
    if isinstance(v, (torch.SymInt, torch.SymFloat)):
        hint = getattr(v.node, "hint", None)
        if hint is None:
            hint = int(v) if isinstance(v, torch.SymInt) else float(v)
        return int(hint) if isinstance(v, torch.SymInt) else float(hint)
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
    name = f"{mod}.{getattr(t, '__qualname__', getattr(t, '__name__', repr(t)))}".lstrip(".")
    for alias, public in (("torch._VariableFunctionsClass.", "torch."), ("torch._C._VariableFunctions.", "torch."),
                          ("torch._C._nn.", "torch.nn.functional."), ("torch._C._special.special_", "torch.special.")):
        if name.startswith(alias):
            return public + name[len(alias):]
    return name


def _no_tensors(args: Any, kwargs: Any) -> bool:
    found = []
    map_aggregate((args, kwargs), lambda a: found.append(a) if isinstance(a, T) else None)
    return not found


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
            inplace = getattr(_aten, packet_name + "_", None)  # add -> add_: the importer rebinds the mutated name
            if inplace is not None and not packet_name.endswith("_"):
                for ov in ([overload] if overload else inplace.overloads()):
                    op = getattr(inplace, ov, None)
                    if op is not None:
                        FUNCTIONS.setdefault(op, h)
        return h
    return deco


def contract_op(module: str, name: str) -> Callable[..., Any] | None:
    """``superopt.ops.<module>.<name>`` if that op exists in this checkout (ops of the shared contract land
    one by one; until one does, its handler refuses and the backend runs the node in eager PyTorch)."""
    import importlib

    try:
        mod = importlib.import_module(f"superopt.ops.{module}")
    except ImportError:
        return None
    return getattr(mod, name, None)


def need_op(cx: Ctx, module: str, name: str) -> Callable[..., Any]:
    op = contract_op(module, name)
    if op is None:
        raise cx.fail(f"superopt.ops.{module}.{name} is not available in this build")
    return op
