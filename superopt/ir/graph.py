"""The graph IR: nodes (compute ops or extern ops) connected by named tensors.

A graph is in SSA form: each tensor is a graph input, a constant, or the output of exactly one
node; nodes are stored in topological order. ``Graph.digest()`` is a stable structural hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.types import TensorType, dtype_name

CONSTANT_ALIGN = 64  # bytes: a cache line, and an AVX-512 vector


def _frozen_aligned_copy(a: np.ndarray) -> np.ndarray:
    """A read-only copy of ``a`` whose data starts on a ``CONSTANT_ALIGN`` boundary, in a read-only buffer
    of its own (numpy alone gives 16 bytes)."""
    raw = np.empty(a.nbytes + CONSTANT_ALIGN, np.uint8)
    off = -raw.ctypes.data % CONSTANT_ALIGN
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    raw.flags.writeable = False
    out.flags.writeable = False
    return out


def _owned(a: np.ndarray) -> bool:
    """Read-only, aligned, and nothing writable behind it (what :func:`_frozen_aligned_copy` returns, and
    views of it)."""
    if a.flags.writeable or a.nbytes and a.ctypes.data % CONSTANT_ALIGN:
        return False
    b = a.base
    while b is not None:
        if not isinstance(b, np.ndarray) or b.flags.writeable:
            return False
        b = b.base
    return True


@dataclass(frozen=True, eq=False)
class Constant:
    """An immutable array; equality and hash by content.

    The array is a private read-only copy on a 64-byte boundary: kernels read constants in place (a
    blocked conv's re-laid-out weights with whole-vector loads), and a vector load from an address
    that is not a multiple of 64 straddles two cache lines. With numpy's 16-byte alignment three
    quarters of ResNet-50's weight bytes would be misaligned, each weight vector costing two loads."""

    array: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        a = np.ascontiguousarray(self.array).reshape(np.shape(self.array))  # keep rank 0
        dtype_name(a.dtype)
        if not _owned(a):
            a = _frozen_aligned_copy(a)
        object.__setattr__(self, "array", a)

    def __reduce__(self):  # unpickled through __init__, so aligned again in the new process
        return Constant, (self.array,)

    @cached_property
    def _digest(self) -> str:
        h = hashlib.sha256(f"{self.array.dtype.name}{self.array.shape}".encode())
        h.update(self.array.tobytes())
        return h.hexdigest()

    def digest(self) -> str:
        return self._digest

    @cached_property
    def type(self) -> TensorType:  # cached: Graph.validate reads it for every constant of every rewritten graph
        return TensorType(self.array.shape, dtype_name(self.array.dtype))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and self.digest() == other.digest()

    def __hash__(self) -> int:
        return hash(self.digest())

    def __repr__(self) -> str:
        return f"Constant({self.type})"


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return Constant(v)
    return v


@dataclass(frozen=True)
class Extern:
    """An op index notation cannot express (data-dependent indexing, reshapes kept as aliases).

    ``kind`` names an entry in :mod:`superopt.ir.externs`; attrs are sorted (key, value) pairs.
    """

    kind: str
    attrs: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(kind: str, **attrs: Any) -> Extern:
        return Extern(kind, tuple(sorted((k, _freeze(v)) for k, v in attrs.items())))

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def text(self) -> str:
        a = ", ".join(f"{k}={v}" for k, v in self.attrs)
        return f"extern {self.kind}({a})"


@dataclass(frozen=True)
class Node:
    name: str
    op: Compute | Extern
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def is_extern(self) -> bool:
        return isinstance(self.op, Extern)


class GraphError(ValueError):
    """A graph that breaks an IR invariant."""


@dataclass(frozen=True)
class Graph:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    types: tuple[tuple[str, TensorType], ...]
    constants: tuple[tuple[str, Constant], ...] = ()
    name: str = "graph"

    def __post_init__(self) -> None:
        self.validate()

    @cached_property
    def type_of(self) -> dict[str, TensorType]:
        return dict(self.types)

    @cached_property
    def constant(self) -> dict[str, Constant]:
        return dict(self.constants)

    @cached_property
    def producer(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    @cached_property
    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def validate(self) -> None:
        # (run on every graph a rewrite builds: a graph search over a large model builds thousands, so the
        # loops take the identical-object shortcut before comparing types field by field)
        types = self.type_of
        defined: set[str] = set()
        for name in self.inputs:
            if name not in types:
                raise GraphError(f"graph input {name!r} has no type")
            defined.add(name)
        for name, c in self.constants:
            if name in defined:
                raise GraphError(f"tensor {name!r} is both an input and a constant")
            t = types.get(name)
            if t is not c.type and t != c.type:
                raise GraphError(f"constant {name!r} is {c.type} but typed {t}")
            defined.add(name)
        node_names: set[str] = set()
        for node in self.nodes:
            if node.name in node_names:
                raise GraphError(f"two nodes are named {node.name!r}")
            node_names.add(node.name)
            for i in node.inputs:
                if i not in defined:
                    raise GraphError(f"node {node.name!r} reads {i!r}, which is not defined before it")
            for o in node.outputs:
                if o in defined:
                    raise GraphError(f"tensor {o!r} is defined twice (again by node {node.name!r})")
                if o not in types:
                    raise GraphError(f"node {node.name!r} output {o!r} has no type")
                defined.add(o)
            c = node.op
            if isinstance(c, Compute):
                if len(c.inputs) != len(node.inputs) or len(c.outputs) != len(node.outputs):
                    raise GraphError(f"node {node.name!r}: arity differs from its compute op")
                local_types = c.type_of
                for g, local in zip(node.inputs + node.outputs, c.inputs + c.outputs):
                    gt, lt = types[g], local_types[local]
                    if gt is not lt and (gt.shape != lt.shape or gt.dtype != lt.dtype):
                        raise GraphError(f"node {node.name!r}: tensor {g!r} is {gt} but the op expects {lt}")
        for o in self.outputs:
            if o not in defined:
                raise GraphError(f"graph output {o!r} is never defined")

    # ---- views -------------------------------------------------------------------------
    def text(self) -> str:
        """Readable and canonical: the digest hashes exactly this (plus constant digests)."""
        t = self.type_of
        lines = [f"graph {self.name}"]
        lines += [f"  input {n}: {t[n]}" for n in self.inputs]
        lines += [f"  const {n}: {c.type} #{c.digest()[:12]}" for n, c in self.constants]
        for node in self.nodes:
            outs = ", ".join(f"{o}: {t[o]}" for o in node.outputs)
            head = f"  {outs} = {node.name}({', '.join(node.inputs)})"
            if isinstance(node.op, Compute):
                lines.append(head + " compute")
                lines += ["      " + line for line in node.op.text().splitlines()]
            else:
                lines.append(head + " " + node.op.text())
        lines.append(f"  return {', '.join(self.outputs)}")
        return "\n".join(lines)

    @cached_property
    def _digest(self) -> str:
        h = hashlib.sha256(self.text().encode())
        for _, c in self.constants:
            h.update(c.digest().encode())
        return h.hexdigest()

    def digest(self) -> str:
        return self._digest

    def __str__(self) -> str:
        return self.text()

    def to_networkx(self):
        """A DiGraph with one vertex per node (attr ``node``) and an edge per tensor use (attr ``tensor``)."""
        import networkx as nx

        g = nx.MultiDiGraph()
        for n in self.nodes:
            g.add_node(n.name, node=n)
        for n in self.nodes:
            for i in n.inputs:
                p = self.producer.get(i)
                if p is not None:
                    g.add_edge(p.name, n.name, tensor=i)
        return g

    def replace(self, **changes: Any) -> Graph:
        from dataclasses import replace

        return replace(self, **changes)
