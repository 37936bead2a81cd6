"""torch.fx frontend: a ``GraphModule`` (from ``symbolic_trace`` or Dynamo) becomes a superopt ``Graph``.

Shapes come from running ``ShapeProp`` on the example inputs. Parameters and buffers (``get_attr``
nodes, parameters of leaf modules, and the parameter/buffer placeholders Dynamo lifts out of
``nn.Module``s) become graph constants. Python-level values (``x.size(0)``, ``torch.Size``
arithmetic, tuples) are folded at import time, and so is any node whose tensor inputs are all
constants (``self.weight.t()``, slices of ``in_proj_weight``...), by running it in torch.

Each FX node maps onto the built-in ops of ``superopt.ops`` through the handler tables that the modules of
``superopt.frontends.torch_ops`` fill (one per family: elementwise, reduction, contraction, movement,
indexing, sorting, attention, recurrent, ...); this module is the driver. After every node the result is checked
against the shape ShapeProp recorded (and cast to the recorded dtype), so a mapping mistake fails
at import time, naming the node, instead of silently computing something else.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_aggregate, map_arg

from superopt import ops
from superopt.frontends.torch_ops.context import (
    _PY_FOLDABLE,
    _RANDOM,
    FUNCTIONS,
    METHODS,
    MODULES,
    Ctx,
    FxImportError,
    Handler,
    T,
    _concrete,
    _is_fake,
    _Missing,
    _no_tensors,
    _short,
    _target_name,
    ir_dtype,
    is_param_placeholder,
    to_numpy,
)
from superopt.frontends.torch_ops.user_ops import user_op_handler
from superopt.ir.graph import Graph


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


def import_fx_full(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], name: str | None = None,
                   keep_inputs: Collection[str] = (), constant_inputs: Collection[str] = ()) -> FxImport:
    """``keep_inputs``: placeholder names that stay graph inputs even when they look like Dynamo's lifted
    parameters/buffers (a buffer the model mutates, e.g. a KV cache, must not be baked); ``constant_inputs``:
    placeholder names whose example values are constants of the model (torch.export's parameters/buffers)."""
    imp = _Importer(gm, list(example_inputs), name or type(gm).__name__, frozenset(keep_inputs))
    imp.constant_inputs = frozenset(constant_inputs)
    return imp.run()


class _Importer(Ctx):
    """Imports one GraphModule: runs ShapeProp, then each node through the handler tables."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], name: str,
                 keep_inputs: frozenset[str] = frozenset()) -> None:
        super().__init__(gm, example_inputs, name)
        self.keep_inputs = keep_inputs
        self.constant_inputs: frozenset[str] = frozenset()

    # ---- driver ------------------------------------------------------------------------------
    def run(self) -> FxImport:
        self._propagate_shapes()
        positions, baked = self._bind_placeholders()
        out_node = self._import_nodes()
        return self._build(out_node, positions, baked)

    def _bind_placeholders(self) -> tuple[list[int], list[int]]:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.examples):
            raise FxImportError(f"the graph has {len(placeholders)} placeholders but {len(self.examples)} "
                                "example inputs were given")
        positions, baked = [], []
        for pos, (n, ex) in enumerate(zip(placeholders, self.examples, strict=True)):
            self.node = n
            if isinstance(ex, (bool, int, float, torch.SymInt, torch.SymFloat)) or ex is None:
                self.env[n] = _concrete(ex)  # shape symbols: specialize to the example's value
            elif isinstance(ex, torch.Tensor) and n.name not in self.keep_inputs and (
                    is_param_placeholder(n, ex) or n.name in self.constant_inputs):
                if _is_fake(ex):
                    raise self.fail("parameter placeholder is a FakeTensor; real values are needed")
                self.env[n] = self.param(ex, _short(n.target))
                baked.append(pos)
            elif isinstance(ex, torch.Tensor):
                self.env[n] = T(self.b.input(n.name, tuple(int(s) for s in ex.shape), ir_dtype(ex.dtype)))
                positions.append(pos)
            else:
                raise self.fail(f"unsupported example input of type {type(ex).__name__}")
        return positions, baked

    def _import_nodes(self) -> torch.fx.Node:
        """Imports every node up to the output node, which it returns."""
        for n in self.gm.graph.nodes:
            self.node = n
            if n.op == "placeholder":
                continue
            if n.op == "output":
                return n
            self._step(n)
        raise FxImportError("graph has no output node")

    def _step(self, n: torch.fx.Node) -> None:
        self.env[n] = self._check(self._node(n))
        self._rebind_inplace(n)

    def _build(self, out_node: torch.fx.Node, positions: list[int], baked: list[int]) -> FxImport:
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
            if isinstance(n.target, torch._ops.OpOverload):
                name = n.target._schema.name.split("::")[-1]
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
                    with torch._guards.tracing(None):  # not Dynamo's fake mode: it would guard on shape symbols
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
            h = FUNCTIONS.get(n.target) or user_op_handler(n.target)
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


__all__ = ["FUNCTIONS", "METHODS", "MODULES", "Ctx", "FxImport", "FxImportError", "T", "import_fx", "import_fx_full",
           "ir_dtype", "is_param_placeholder", "to_numpy"]
