"""Partition Dynamo's FX graph into regions superopt lowers and nodes left to eager PyTorch.

Three steps, all on the ``GraphModule`` Dynamo hands the backend:

1. :func:`functionalize` rewrites in-place ops (``x.add_(1)``, ``relu_``, ``x[i] = v``, modules built with
   ``inplace=True``) into their out-of-place forms and points later readers at the new value, so that
   splitting the graph cannot reorder a mutation and its readers. A mutated graph input is returned as an
   extra output and written back by the caller. A mutation through an alias (a view of another tensor
   that is read later) is not rewritten: the whole graph then runs in eager PyTorch.
2. :func:`classify` decides per node whether the importer lowers it: it imports the graph node by node
   (the same handler tables and the same argument checks as a real import) and records each refusal
   with its reason; a refused node's results stand in as fresh graph inputs, so its consumers are judged
   on their own.
3. :func:`partition` groups the supported nodes into maximal regions (``CapabilityBasedPartitioner``)
   and fuses each into a submodule ``fused_<i>`` of the returned graph; everything else stays a plain
   node, run by PyTorch.

The tiny-region rule (:func:`worth_compiling`): a region is compiled only if it holds at least one node
that computes on tensor data; a region of views, reshapes, casts, shape arithmetic and ``getitem`` alone
stays in eager PyTorch, where views cost nothing and a compiled kernel would copy.
"""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from superopt.frontends.torch_fx import _Importer
from superopt.frontends.torch_ops.context import FxImportError, T, _Missing, _target_name, ir_dtype
from superopt.frontends.torch_ops.indexing import copy_functional, fill_functional, setitem_functional

logger = logging.getLogger("superopt.torch")


@dataclass(frozen=True)
class Fallback:
    """One FX node that runs in eager PyTorch, and why."""

    node: str
    function: str
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.function}): {self.reason}"


def function_name(n: torch.fx.Node, gm: torch.fx.GraphModule | None = None) -> str:
    """What the node calls, as a user would name it: ``torch.topk``, ``Tensor.cumsum``, ``torch.nn.LSTM``."""
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    if n.op == "call_module" and gm is not None:
        m = gm.get_submodule(n.target)
        return f"{type(m).__module__}.{type(m).__qualname__}"
    return _target_name(n)


# ---- in-place ops --------------------------------------------------------------------------------
_VIEW_METHODS = {"view", "reshape", "view_as", "reshape_as", "transpose", "permute", "t", "expand", "expand_as",
                 "squeeze", "unsqueeze", "flatten", "unflatten", "narrow", "select", "split", "chunk", "unbind",
                 "__getitem__", "as_strided", "diagonal", "movedim", "swapaxes", "swapdims", "contiguous", "detach",
                 "unfold", "view_as_real", "split_with_sizes", "tensor_split", "mT", "T"}
_VIEW_FUNCTIONS = {operator.getitem, torch.reshape, torch.transpose, torch.permute, torch.flatten, torch.squeeze,
                   torch.unsqueeze, torch.narrow, torch.select, torch.split, torch.chunk, torch.unbind, torch.t,
                   torch.movedim, torch.swapaxes, torch.swapdims, torch.detach, torch.diagonal, torch.tensor_split,
                   torch.unflatten}
_IOPS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
         operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.ipow: operator.pow,
         operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
         operator.imatmul: operator.matmul}
_IMETHODS = {"__iadd__": "__add__", "__isub__": "__sub__", "__imul__": "__mul__", "__itruediv__": "__truediv__",
             "__iand__": "__and__", "__ior__": "__or__", "__ixor__": "__xor__"}
_NOT_MUTATING = {"requires_grad_", "share_memory_", "retain_grad"}


def is_view(n: Any) -> bool:
    if not isinstance(n, torch.fx.Node):
        return False
    if n.target is operator.getitem and not _is_tensor_node(n.args[0]):
        return is_view(n.args[0])  # picking a result: a view if the op made views (split, chunk...)
    return (n.op == "call_method" and n.target in _VIEW_METHODS) or (
        n.op == "call_function" and n.target in _VIEW_FUNCTIONS)


def _is_tensor_node(n: Any) -> bool:
    if not isinstance(n, torch.fx.Node):
        return False
    v = n.meta.get("example_value", n.meta.get("val"))
    return isinstance(v, torch.Tensor) or n.meta.get("tensor_meta") is not None or n.op == "placeholder"


def mutated_input(n: torch.fx.Node, gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The tensor node ``n`` mutates in place, if any."""
    if not n.args or not isinstance(n.args[0], torch.fx.Node):
        return None
    first = n.args[0]
    if n.kwargs.get("inplace") is True:
        return first
    if n.op == "call_method":
        t = str(n.target)
        if t in _IMETHODS or (t.endswith("_") and not t.startswith("__") and t not in _NOT_MUTATING):
            return first
    elif n.op == "call_function":
        if n.target is operator.setitem or (n.target in _IOPS and _is_tensor_node(first)):
            return first
        name = getattr(n.target, "__name__", "")
        if name.endswith("_") and not name.startswith("_") and name not in _NOT_MUTATING:
            return first
    elif n.op == "call_module":
        if getattr(gm.get_submodule(str(n.target)), "inplace", False):
            return first
    return None


_FILLS = {"zero_": torch.zeros_like, "fill_": fill_functional, "copy_": copy_functional}


def _functional_form(n: torch.fx.Node, gm: torch.fx.GraphModule) -> tuple[str, Any, tuple, dict] | None:
    """(op, target, args, kwargs) of the out-of-place equivalent of in-place node ``n``, or None."""
    args, kwargs = tuple(n.args), dict(n.kwargs)
    if kwargs.get("inplace") is True and n.op != "call_module":
        kwargs["inplace"] = False
        return n.op, n.target, args, kwargs
    if n.op == "call_method" and n.target in _FILLS:
        return "call_function", _FILLS[str(n.target)], args, kwargs
    if n.op == "call_method":
        t = str(n.target)
        name = _IMETHODS.get(t, t[:-1])
        return ("call_method", name, args, kwargs) if hasattr(torch.Tensor, name) else None
    if n.op == "call_function":
        if n.target is operator.setitem:
            return "call_function", setitem_functional, args, kwargs
        if n.target in _IOPS:
            return "call_function", _IOPS[n.target], args, kwargs
        name = getattr(n.target, "__name__", "")
        for ns in (torch, F, torch.Tensor, torch.special, torch.nn.init):
            if getattr(ns, name, None) is n.target and callable(getattr(ns, name[:-1], None)):
                return "call_function", getattr(ns, name[:-1]), args, kwargs
        return None
    if n.op == "call_module":
        mod = copy.copy(gm.get_submodule(str(n.target)))
        mod.inplace = False
        new_name = f"{str(n.target).replace('.', '_')}_functional"
        gm.add_submodule(new_name, mod)
        return "call_module", new_name, args, kwargs
    return None


@dataclass(frozen=True)
class Functionalized:
    """The result of :func:`functionalize`: ``written_back`` lists the placeholder positions whose new values
    the graph now returns after its own outputs (as a tuple ``(outputs, new_values)``); ``refused`` is set
    when an in-place op could not be rewritten (the graph then runs in eager PyTorch)."""

    written_back: tuple[int, ...]
    refused: Fallback | None


def functionalize(gm: torch.fx.GraphModule) -> Functionalized:
    """Rewrite in-place ops of ``gm`` (in place) into out-of-place ones; see the module docstring."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    latest: dict[torch.fx.Node, torch.fx.Node] = {}  # mutated placeholder -> its newest value
    muts = [(n, m) for n in nodes if (m := mutated_input(n, gm)) is not None]
    if not muts:
        return Functionalized((), None)
    for n, base in muts:
        base = n.args[0]  # earlier rewrites may have re-pointed it
        root = base
        while is_view(root) and isinstance(root.args[0], torch.fx.Node):
            root = root.args[0]
        # refused: mutating a view, or a tensor with a view taken before the mutation and read after it
        if root is not base or any(is_view(u) and order.get(u, -1) < order[n] and any(order.get(w, -1) > order[n]
                                                                                       for w in u.users)
                                   for u in base.users if u is not n):
            return Functionalized((), Fallback(n.name, function_name(n, gm),
                                               "in-place op on a view of another tensor (aliasing): the whole graph "
                                               "runs in eager PyTorch"))
        form = _functional_form(n, gm)
        if form is None:
            return Functionalized((), Fallback(n.name, function_name(n, gm),
                                               "in-place op without an out-of-place form: the whole graph runs in "
                                               "eager PyTorch"))
        op, target, args, kwargs = form
        with gm.graph.inserting_after(n):
            new = gm.graph.create_node(op, target, args, kwargs, name=f"{n.name}_functional")
        new.meta = dict(n.meta)
        if n.target is operator.setitem:
            new.meta["example_value"] = base.meta.get("example_value")
        order[new] = order[n]
        n.replace_all_uses_with(new)
        for u in list(base.users):
            if u is not new and order.get(u, -1) > order[n]:
                u.replace_input_with(base, new)
        if base.op == "placeholder":
            latest[base] = new
        elif base in latest.values():
            latest[next(p for p, v in latest.items() if v is base)] = new
        gm.graph.erase_node(n)
    if latest:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        ps = [p for p in placeholders if p in latest]
        out.args = ((out.args[0], tuple(latest[p] for p in ps)),)
    gm.graph.lint()
    gm.recompile()
    return Functionalized(tuple(placeholders.index(p) for p in latest), None)


PICKS = "picks a result of"


# ---- which nodes the importer lowers --------------------------------------------------------------
class _Trial(_Importer):
    """Imports node by node, recording refusals instead of raising (see :func:`classify`)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], keep_inputs: frozenset[str]) -> None:
        super().__init__(gm, example_inputs, "trial", keep_inputs)
        self.refused: dict[torch.fx.Node, str] = {}

    def _step(self, n: torch.fx.Node) -> None:
        upstream = [a for a in n.all_input_nodes if a in self.refused]
        if n.target is operator.getitem and upstream:
            self._refuse(n, f"{PICKS} {upstream[0].name}, which runs in eager PyTorch")
            return
        try:
            super()._step(n)
        except FxImportError as e:
            self._refuse(n, e.reason)
        except Exception as e:  # noqa: BLE001 - any refusal is a fallback, never a crash
            self._refuse(n, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}")

    def _refuse(self, n: torch.fx.Node, reason: str) -> None:
        self.refused[n] = reason
        self.env[n] = self._stand_in(n)

    def _stand_in(self, n: torch.fx.Node) -> Any:
        """A refused node's tensor result becomes a fresh graph input of its shape, so that consumers are
        judged on their own; any other result cannot be used by lowered nodes."""
        m = n.meta.get("tensor_meta")
        if m is not None and hasattr(m, "shape"):
            try:
                return T(self.b.input(f"{n.name}_standin", tuple(int(s) for s in m.shape), ir_dtype(m.dtype)))
            except FxImportError as e:
                return _Missing(f"the result of {n.name} ({e.reason})")
        return _Missing(f"the result of {n.name}, which runs in eager PyTorch")


def classify(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
             keep_inputs: frozenset[str] = frozenset()) -> dict[torch.fx.Node, str]:
    """The nodes of ``gm`` the importer refuses, each with the reason (empty: everything lowers)."""
    trial = _Trial(gm, list(example_inputs), keep_inputs)
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    try:
        trial._propagate_shapes()
        trial._bind_placeholders()
    except FxImportError as e:
        return dict.fromkeys(calls, e.reason)
    trial._import_nodes()
    return trial.refused


# ---- partitioning ----------------------------------------------------------------------------------
class _Supported(OperatorSupportBase):
    def __init__(self, refused: dict[torch.fx.Node, str]) -> None:
        self.refused = refused

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return node.op in ("call_function", "call_method", "call_module") and node not in self.refused


_NON_COMPUTE_METHODS = _VIEW_METHODS | {"size", "dim", "ndimension", "numel", "nelement", "float", "double", "long",
                                        "int", "bool", "half", "to", "type", "type_as", "clone", "cpu", "cuda",
                                        "new_zeros", "new_ones", "new_full", "new_empty"}


def computes(n: torch.fx.Node) -> bool:
    """Does the node compute on tensor data (more than a view, cast, copy or shape arithmetic)?"""
    if n.op == "call_module":
        return True
    if n.op == "call_method":
        return n.target not in _NON_COMPUTE_METHODS and n.meta.get("tensor_meta") is not None
    if n.op == "call_function":
        return (n.target not in _VIEW_FUNCTIONS and n.target is not getattr
                and n.target not in (torch.zeros_like, torch.ones_like, torch.full_like)
                and n.meta.get("tensor_meta") is not None)
    return False


def worth_compiling(region: torch.fx.GraphModule) -> bool:
    """The tiny-region rule: compile a region only if one of its nodes computes (see :func:`computes`)."""
    return any(computes(n) for n in region.graph.nodes)


def partition(gm: torch.fx.GraphModule, refused: dict[torch.fx.Node, str]) -> torch.fx.GraphModule:
    """``gm`` with each maximal region of supported nodes fused into a submodule ``fused_<i>``."""
    partitioner = CapabilityBasedPartitioner(gm, _Supported(refused), allows_single_node_partition=True)
    parts = partitioner.propose_partitions()
    return partitioner.fuse_partitions(parts)


def fallbacks_of(gm: torch.fx.GraphModule, refused: dict[torch.fx.Node, str]) -> list[Fallback]:
    """The refused nodes, less the ``getitem``s that pick a result of another refused node (they run in eager
    PyTorch too, but only because their producer does)."""
    return [Fallback(n.name, function_name(n, gm), r) for n, r in refused.items() if not r.startswith(PICKS)]


def log_fallbacks(graph_name: str, fallbacks: Sequence[Fallback], regions: int) -> None:
    if not fallbacks:
        logger.info("superopt: %s: every node lowered (%d region(s))", graph_name, regions)
        return
    lines = "\n".join(f"  {f}" for f in fallbacks)
    logger.info("superopt: %s: %d node(s) run in eager PyTorch, %d region(s) compiled:\n%s", graph_name,
                len(fallbacks), regions, lines)
