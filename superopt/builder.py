"""GraphBuilder: how frontends and op builders assemble a Graph, one node at a time."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.externs import infer_extern
from superopt.ir.graph import Constant, Extern, Graph, Node
from superopt.ir.types import TensorType, dtype_name
from superopt.lang.parser import compile_op


def _clean(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if s and not s[0].isdigit() else "t_" + s


class GraphBuilder:
    """Mutable staging area for an immutable Graph.

    Tensor names are graph-level; each compute node has its own local names, mapped positionally.
    Constants are kept as numpy arrays so frontends can fold through them (``const_value``).
    """

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[str] = []
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.constants: dict[str, np.ndarray] = {}
        self._counter = 0
        self._const_by_digest: dict[str, str] = {}
        self._node_names: set[str] = set()

    # ---- naming ----------------------------------------------------------------------------
    def fresh(self, hint: str = "t") -> str:
        base = _clean(hint)
        name = base
        while name in self.types or name in self._node_names:
            self._counter += 1
            name = f"{base}_{self._counter}"
        return name

    # ---- tensors ---------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> str:
        name = _clean(name)
        if name in self.types:
            raise ValueError(f"tensor {name!r} already exists")
        self.types[name] = TensorType(tuple(shape), dtype)
        self.inputs.append(name)
        return name

    def constant(self, value: Any, name: str | None = None, dtype: str | None = None) -> str:
        arr = np.asarray(value)
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)  # (Constant copies what it does not own)
        elif arr.dtype == np.float64 and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)
        dtype_name(arr.dtype)
        c = Constant(arr)
        if c.digest() in self._const_by_digest and name is None:
            return self._const_by_digest[c.digest()]
        name = self.fresh(name or "const")
        self.types[name] = c.type
        self.constants[name] = c.array
        self._const_by_digest.setdefault(c.digest(), name)
        return name

    def type(self, tensor: str) -> TensorType:
        return self.types[tensor]

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.types[tensor].shape

    def const_value(self, tensor: str) -> np.ndarray | None:
        """The value of a constant tensor, or None if it is computed at run time."""
        return self.constants.get(tensor)

    # ---- nodes -----------------------------------------------------------------------------
    def add_compute(self, compute: Compute, inputs: Sequence[str], name: str = "op",
                    out_names: Sequence[str] | None = None) -> list[str]:
        if len(inputs) != len(compute.inputs):
            raise ValueError(f"{name}: compute op takes {len(compute.inputs)} inputs, got {len(inputs)}")
        for g, local in zip(inputs, compute.inputs):
            gt, lt = self.types[g], compute.type_of[local]
            if gt.shape != lt.shape or gt.dtype != lt.dtype:
                raise ValueError(f"{name}: input {g!r} is {gt} but the op expects {lt}")
        outs = []
        for i, local in enumerate(compute.outputs):
            o = self.fresh(out_names[i] if out_names else f"{name}_{local}")
            self.types[o] = compute.type_of[local]
            outs.append(o)
        node_name = self.fresh(name)
        self._node_names.add(node_name)
        self.nodes.append(Node(node_name, compute, tuple(inputs), tuple(outs)))
        return outs

    def compute(self, src: str, inputs: Mapping[str, str], name: str = "op", *, extents: Mapping[str, int] | None = None,
                padding: Mapping[str, float] | None = None, outputs: Sequence[str] | None = None,
                out_names: Sequence[str] | None = None) -> list[str]:
        """Add a node written in index notation; ``inputs`` maps local names to graph tensors."""
        c = compile_op(src, {k: self.types[v] for k, v in inputs.items()}, extents=extents, padding=padding,
                       outputs=outputs)
        return self.add_compute(c, [inputs[k] for k in c.inputs], name, out_names)

    def compute1(self, src: str, inputs: Mapping[str, str], name: str = "op", **kw: Any) -> str:
        (out,) = self.compute(src, inputs, name, **kw)
        return out

    def extern(self, kind: str, inputs: Sequence[str], name: str | None = None, **attrs: Any) -> list[str]:
        op = Extern.of(kind, **attrs)
        out_types = infer_extern(kind, [self.types[i] for i in inputs], op.attr)
        outs = []
        for t in out_types:
            o = self.fresh(f"{name or kind}_out")
            self.types[o] = t
            outs.append(o)
        node_name = self.fresh(name or kind)
        self._node_names.add(node_name)
        self.nodes.append(Node(node_name, op, tuple(inputs), tuple(outs)))
        return outs

    # ---- result ----------------------------------------------------------------------------
    def build(self, outputs: Sequence[str]) -> Graph:
        used = set(outputs) | {i for n in self.nodes for i in n.inputs}
        consts = tuple((n, Constant(a)) for n, a in self.constants.items() if n in used)
        names = set(self.inputs) | {n for n, _ in consts} | {o for n in self.nodes for o in n.outputs}
        types = tuple((n, t) for n, t in self.types.items() if n in names)
        return Graph(tuple(self.inputs), tuple(outputs), tuple(self.nodes), types, consts, self.name)
