"""The graph IR: nodes (compute ops or extern ops) connected by named tensors.

A graph is in SSA form: each tensor is a graph input, a constant, or the output of exactly one
node; nodes are stored in topological order. ``Graph.digest()`` is a stable structural hash.
"""

from __future__ import annotations

import hashlib
import mmap
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.types import TensorType, dtype_name

CONSTANT_ALIGN = 64  # bytes: a cache line, and an AVX-512 vector


# a constant this large gets pages of its own (_ConstantPages), smaller ones a heap block
OWN_PAGES_BYTES = 256 * 1024


class _ConstantPages(mmap.mmap):
    """Anonymous pages holding one constant, returned to the system when the constant is freed. From the heap,
    a model's weights freed while others are computed (the imported weights as the build computes the
    rewritten ones) leave holes that the allocator keeps: the resident set then holds both sets at once.
    Written once, by :func:`_frozen_aligned_copy`, and read-only from then on (the arrays on it are)."""


def _frozen_aligned_copy(a: np.ndarray) -> np.ndarray:
    """A read-only copy of ``a`` whose data starts on a ``CONSTANT_ALIGN`` boundary, in a read-only buffer
    of its own (numpy alone gives 16 bytes)."""
    if a.nbytes >= OWN_PAGES_BYTES:
        raw = np.frombuffer(_ConstantPages(-1, a.nbytes), np.uint8)  # (page-aligned)
    else:
        raw = np.empty(a.nbytes + CONSTANT_ALIGN, np.uint8)
    off = -raw.ctypes.data % CONSTANT_ALIGN
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    raw.flags.writeable = False
    out.flags.writeable = False
    return out


def _immutable_buffer(b: Any) -> bool:
    """A buffer nothing can write through: bytes, or a read-only memory map (or a read-only view of either)."""
    if isinstance(b, memoryview):
        if isinstance(b.obj, _ConstantPages):
            return True  # (private to the read-only arrays on it)
        return b.readonly and _immutable_buffer(b.obj)
    if isinstance(b, mmap.mmap):
        return memoryview(b).readonly  # (mmap.ACCESS_READ; a copy-on-write map is writable)
    return isinstance(b, bytes)


def _owned(a: np.ndarray) -> bool:
    """Read-only, aligned, and nothing writable behind it (what :func:`_frozen_aligned_copy` returns, views of
    it, and views of a read-only memory map: a saved program's weights, superopt.runtime.array_file)."""
    if a.flags.writeable or a.nbytes and a.ctypes.data % CONSTANT_ALIGN:
        return False
    b = a.base
    while b is not None:
        if not isinstance(b, np.ndarray):
            return _immutable_buffer(b)
        if b.flags.writeable:
            return False
        b = b.base
    return True


def _content_digest(a: np.ndarray) -> str:
    h = hashlib.sha256(f"{a.dtype.name}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8) if a.size else b"")  # (its bytes, not a copy)
    return h.hexdigest()


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
        return _content_digest(self.array)

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


class DeferredConstant(Constant):
    """A constant computed from other constants where it is read, and held only once ``array`` is read: a
    rewrite's re-laid-out, folded, sliced or transformed weight.

    The graph search builds hundreds of candidate graphs, each with its own transformed weights, and keeps
    one; held from the moment each candidate was built, the dropped candidates' copies were most of a
    model's peak memory during the search (on ResNet-50, 270 MB of weights beside the model's own 98 MB).
    Its type is declared, so validating a graph computes nothing. Equality and hash stay by content, as for
    every constant (the search knows a graph reached by two orders of rules, fold then re-lay out or the
    other way round, for one by its constants' digests): the digest computes the value, hashes it and lets
    it go. The first read of ``array`` computes it again, keeps it, and lets go of the inputs. ``recipe``
    names the computation in errors."""

    def __init__(self, type_: TensorType, recipe: str, inputs: Sequence[Constant],
                 compute: Callable[..., np.ndarray]) -> None:
        object.__setattr__(self, "_declared", type_)
        object.__setattr__(self, "_recipe", recipe)
        object.__setattr__(self, "_pending", (tuple(inputs), compute))
        object.__setattr__(self, "_lock", threading.Lock())

    def _compute(self, keep_inputs: bool = True) -> np.ndarray:
        """The value; ``keep_inputs=False``: deferred inputs not yet computed are computed and let go too."""
        inputs, compute = self._pending
        a = np.asarray(compute(*(c.array if keep_inputs or not isinstance(c, DeferredConstant) or c.computed
                                 else c._compute(False) for c in inputs)))
        got = TensorType(a.shape, dtype_name(a.dtype))
        if got != self._declared:
            raise GraphError(f"deferred constant ({self._recipe}) computed {got}, declared {self._declared}")
        return a

    @property
    def array(self) -> np.ndarray:  # type: ignore[override]
        value = self.__dict__.get("_value")
        if value is not None:
            return value
        with self._lock:  # (read from the build's and the reference's threads alike)
            if "_value" not in self.__dict__:
                a = np.ascontiguousarray(self._compute())
                self.__dict__["_value"] = a if _owned(a) else _frozen_aligned_copy(a)
                object.__setattr__(self, "_pending", None)
        return self.__dict__["_value"]

    @cached_property
    def _digest(self) -> str:
        with self._lock:
            value = self.__dict__.get("_value")
            return _content_digest(value if value is not None else self._compute(keep_inputs=False))

    @property
    def computed(self) -> bool:
        """Whether ``array`` has been read (and so is held)."""
        return "_value" in self.__dict__

    @property
    def type(self) -> TensorType:  # type: ignore[override]
        return self._declared

    def __repr__(self) -> str:
        return f"DeferredConstant({self._declared})"


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


# the graph validated last (a weak reference: it must not keep weights alive): the next one is usually a small
# step from it (``Graph._valid_from``)
_LAST_VALID: list[weakref.ref | None] = [None]

# node id -> (node, the graph types of its inputs and outputs) it was found to agree with: the graphs of a
# rewrite search share most nodes (by object), so a node's op is checked against its tensors' types once
_NODE_TYPES: dict[int, tuple[Node, tuple[TensorType, ...]]] = {}
_NODE_TYPES_LIMIT = 20_000
_OUTPUTS = attrgetter("outputs")
_NAME = itemgetter(0)
_RETYPED: list = [None]  # (base, graph, the names the graph retypes): computed once per validation

# the last few graphs proven valid as a small step from a base graph: id(graph) -> (the graph, the base, id(node)
# -> index of the nodes it kept, indices of its new nodes, the base's nodes it dropped), all but the kept
# indices by weak or bounded reference. A search asks each step's graph who reads what
# (:attr:`Graph.consumers`), a whole pass over a graph of thousands of nodes; from the base's answer it is a
# patch where the step changed something
_STEPS: dict[int, tuple[weakref.ref, weakref.ref, dict[int, int], tuple[int, ...], tuple[Node, ...]]] = {}
_STEPS_LIMIT = 8


def _readers_after(old: dict[str, list[Node]], nodes: tuple[Node, ...], kept: dict[int, int], fresh: tuple[int, ...],
                   dropped: tuple[Node, ...]) -> dict[str, list[Node]]:
    """:attr:`Graph.consumers` of a graph of ``nodes`` from its base's (``old``): the lists of the tensors the
    dropped and the new nodes read are rebuilt in graph order (a node as often as it reads the tensor), every
    other one is the base's (the same readers, in the same order: kept nodes keep their relative order)."""
    gone = {id(n) for n in dropped}
    added: dict[str, list[tuple[int, Node]]] = {}
    for k in fresh:
        n = nodes[k]
        for i in n.inputs:
            added.setdefault(i, []).append((k, n))
    out = dict(old)
    for t in {i for n in dropped for i in n.inputs} | added.keys():
        readers = [(kept[id(n)], n) for n in old.get(t, ()) if id(n) not in gone]
        more = added.get(t)
        if more:
            readers = sorted(readers + more, key=itemgetter(0)) if readers else more
        if readers:
            out[t] = [n for _, n in readers]
        else:
            out.pop(t, None)
    return out


def _op_agrees(node: Node, types: tuple[TensorType, ...]) -> bool:
    """Whether a compute node's op has the node's arity and expects ``types`` (its inputs', then outputs')."""
    c = node.op
    if len(c.inputs) != len(node.inputs) or len(c.outputs) != len(node.outputs):
        return False
    local_types = c.type_of
    for gt, local in zip(types, c.inputs + c.outputs):
        lt = local_types[local]
        if gt is not lt and (gt.shape != lt.shape or gt.dtype != lt.dtype):
            return False
    return True


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

    def unchecked(self, **changes) -> Graph:
        """``dataclasses.replace(self, **changes)`` without :meth:`validate`: for a pass that builds a chain of
        graphs, each a step from the last, and validates the graph it returns (the layout pass blocks a
        thousand nodes of DenseNet-121 one by one; checking every step cost more than the steps)."""
        g = object.__new__(Graph)
        for f in fields(Graph):
            object.__setattr__(g, f.name, changes.pop(f.name) if f.name in changes else getattr(self, f.name))
        if changes:
            raise TypeError(f"Graph has no field {next(iter(changes))!r}")
        return g

    @cached_property
    def type_of(self) -> dict[str, TensorType]:
        return dict(self.types)

    @cached_property
    def constant(self) -> dict[str, Constant]:
        return dict(self.constants)

    @cached_property
    def producer(self) -> dict[str, Node]:
        step = self._step_base("producer")
        if step is not None:  # (from the base's: the dropped nodes' outputs out, the new nodes' in)
            out = dict(step[0])
            for m in step[3]:
                for o in m.outputs:
                    if out.get(o) is m:
                        del out[o]
            nodes = self.nodes
            for k in step[2]:
                for o in nodes[k].outputs:
                    out[o] = nodes[k]
            return out
        return {o: n for n in self.nodes for o in n.outputs}

    @cached_property
    def node_of(self) -> dict[str, Node]:
        """Node name -> node."""
        step = self._step_base("node_of")
        if step is not None:  # (from the base's: the dropped nodes out, the new ones in)
            out = dict(step[0])
            for m in step[3]:
                if out.get(m.name) is m:
                    del out[m.name]
            nodes = self.nodes
            for k in step[2]:
                out[nodes[k].name] = nodes[k]
            return out
        return {n.name: n for n in self.nodes}

    def _step_base(self, what: str) -> tuple | None:
        """(the base's ``what``, id(node) -> index of the kept nodes, indices of the new nodes, the dropped
        nodes) when this graph was proven valid as a small step from a base that has computed ``what``."""
        step = _STEPS.get(id(self))
        if step is None or step[0]() is not self:
            return None
        base = step[1]()
        old = base.__dict__.get(what) if base is not None else None
        return None if old is None else (old, *step[2:])

    @cached_property
    def consumers(self) -> dict[str, list[Node]]:
        step = self._step_base("consumers")
        if step is not None:
            return _readers_after(step[0], self.nodes, *step[1:])
        out: dict[str, list[Node]] = {}
        get = out.get
        for n in self.nodes:
            for i in n.inputs:
                readers = get(i)
                if readers is None:
                    out[i] = [n]
                else:
                    readers.append(n)
        return out

    def validate(self) -> None:
        """Raises a :class:`GraphError` naming the first IR invariant broken (SSA, topological order, typed
        tensors, node ops that agree with the graph's types).

        Run on every graph a rewrite builds (a graph search over a large model builds thousands, each a few
        nodes away from the last), so a graph is first checked as a difference from the graph validated last
        (:meth:`_valid_from`: only the nodes it adds or rewires, and those reading a tensor defined or typed
        differently), else by whole-set checks and one pass per node (:meth:`_valid_fast`); both only prove
        validity, and any doubt falls back to :meth:`_validate_full`, which names the cause."""
        last = _LAST_VALID[0]
        base = last() if last is not None else None
        try:
            static = self._static(base)
            if static is None or (base is None or not self._valid_from(base, static)) and not self._valid_fast(static):
                self._validate_full()
        finally:
            _RETYPED[0] = None  # (holds both graphs)
        _LAST_VALID[0] = weakref.ref(self)

    def _static(self, base: Graph | None = None) -> set[str] | None:
        """The graph inputs and constants (distinct, typed, constants typed as their arrays); None: doubt.
        ``base``: a valid graph; a constant it has (the same object), typed by the same object, is not
        checked again."""
        types, inputs, constants = self.type_of, self.inputs, self.constants
        static = {*inputs, *map(_NAME, constants)}
        if len(static) != len(inputs) + len(constants) or not static <= types.keys():
            return None
        pairs = constants
        if base is not None:
            todo = base._retyped(self) & static
            if constants != base.constants:
                same = base.constant
                todo.update(name for name, c in constants if same.get(name) is not c)
            mine = self.constant
            pairs = [(name, mine[name]) for name in todo if name in mine]
        for name, c in pairs:
            t, ct = types[name], c.type
            if t is not ct and t != ct:
                return None
        return static

    @cached_property
    def _static_names(self) -> frozenset[str]:
        return frozenset((*self.inputs, *map(_NAME, self.constants)))

    def _retyped(self, other: Graph) -> set[str]:
        """The tensor names ``other`` types by another object than this graph does (or this one lacks)."""
        if other.types is self.types:
            return set()
        hit = _RETYPED[0]
        if hit is not None and hit[0] is self and hit[1] is other:
            return hit[2]
        mine = self.type_of
        out = {name for name, t in other.types if mine.get(name) is not t}
        _RETYPED[0] = (self, other, out)
        return out

    @cached_property
    def _position(self) -> dict[str, int]:
        """Tensor -> index of the node defining it (the last one, where a graph defines one twice)."""
        return {o: k for k, n in enumerate(self.nodes) for o in n.outputs}

    @cached_property
    def _index(self) -> dict[int, int]:
        """id(node) -> its index (the nodes stay alive with the graph, so ids are not reused meanwhile)."""
        return {id(n): k for k, n in enumerate(self.nodes)}

    def _outputs_sound(self, static: set[str]) -> bool:
        """Node outputs defined once, typed and not inputs or constants; distinct node names; graph outputs
        defined."""
        position, nodes = self._position, self.nodes
        keys = position.keys()
        return (len(position) == sum(map(len, map(_OUTPUTS, nodes))) and keys <= self.type_of.keys()
                and keys.isdisjoint(static) and len({n.name for n in nodes}) == len(nodes)
                and all(o in position or o in static for o in self.outputs))

    def _node_sound(self, k: int, n: Node, static: set[str]) -> bool:
        """Node ``k`` reads only tensors defined before it, and its op agrees with the graph's types."""
        position = self._position
        for i in n.inputs:
            if position.get(i, -1) >= k or (i not in position and i not in static):
                return False
        if isinstance(n.op, Compute):
            seen = tuple(map(self.type_of.__getitem__, n.inputs + n.outputs))
            hit = _NODE_TYPES.get(id(n))
            if hit is None or hit[0] is not n or hit[1] != seen:
                if not _op_agrees(n, seen):
                    return False
                if len(_NODE_TYPES) >= _NODE_TYPES_LIMIT:
                    _NODE_TYPES.clear()
                _NODE_TYPES[id(n)] = (n, seen)
        return True

    def _valid_fast(self, static: set[str]) -> bool:
        """True only when every invariant holds (False: unknown, ask :meth:`_validate_full`)."""
        if not self._outputs_sound(static):
            return False
        return all(self._node_sound(k, n, static) for k, n in enumerate(self.nodes))

    def _valid_from(self, base: Graph, static: set[str]) -> bool:
        """True only when every invariant holds, knowing that ``base`` (a valid graph) does: a node of
        ``base`` (the same object) kept in the same relative order still reads tensors defined before it
        and agrees with its types, unless one of its tensors is now defined by another node (or none) or
        typed by another object; only the other nodes are checked one by one."""
        if not self._outputs_sound(static):
            return False
        nodes, bnodes, bindex = self.nodes, base.nodes, base._index
        prev, kept, fresh = -1, {}, []
        for k, n in enumerate(nodes):
            b = bindex.get(id(n))
            if b is None or bnodes[b] is not n:
                fresh.append(k)
            elif b < prev:
                return False  # reordered: leave it to the pass over every node
            else:
                prev = b
                kept[id(n)] = k
        if len(fresh) * 4 > len(nodes) + 4:
            return False  # not a small step from ``base``
        # tensors whose definition changed: new nodes' outputs, removed nodes' outputs, static ones that came
        # or went; and tensors typed by another object
        moved = {o for k in fresh for o in nodes[k].outputs}
        dropped = tuple(m for m in bnodes if id(m) not in kept) if len(kept) != len(bnodes) else ()
        moved.update(o for m in dropped for o in m.outputs)
        moved |= static ^ base._static_names
        moved |= base._retyped(self)
        check = set(fresh)
        if moved:
            check.update(k for k in kept.values() if not moved.isdisjoint(nodes[k].inputs)
                         or not moved.isdisjoint(nodes[k].outputs))
        if not all(self._node_sound(k, nodes[k], static) for k in check):
            return False
        if len(_STEPS) >= _STEPS_LIMIT:  # (the oldest out; list() copies the keys at once, whatever other threads do)
            for old in list(_STEPS)[: len(_STEPS) - _STEPS_LIMIT + 1]:
                _STEPS.pop(old, None)
        _STEPS[id(self)] = (weakref.ref(self), weakref.ref(base), kept, tuple(fresh), dropped)
        return True

    def _validate_full(self) -> None:
        """Every invariant checked in turn: raises a GraphError naming the first one broken."""
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
