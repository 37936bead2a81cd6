"""A float64 reference of a large graph on a sample of its independent axes, so verification stays quick.

The reference interpreter and its magnitude runs (``superopt.interp.magnitude``) cost time and memory in
proportion to every statement's iteration space, three float64 runs of it: an op whose 200 MB intermediate
never leaves the compiled kernel's registers takes the reference a minute and gigabytes. Many of those axes
are independent: an axis every statement maps one to one (the same index in, the same index out, never summed
over, never shifted or combined with another index, never read as a value) splits the graph into separate
problems, one per index. Running the reference on a few of those indices gives exactly the reference's
outputs at those indices. So the compiled program still runs at full size on the full inputs (the program
actually used), and its outputs at the sampled indices are checked against the reference on the sampled
inputs. Each sampled axis keeps its first and last index (where the tile tails of a schedule are) and
seeded random ones between them; a graph whose reference fits the budget is not sampled at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.expr import IndexValue
from superopt.ir.graph import Graph
from superopt.ir.types import TensorType

# iteration points (summed over every statement) the reference runs without sampling: a few seconds of float64
# reference and magnitude runs on one core
REFERENCE_POINTS = 1 << 26
MIN_KEEP = 3  # indices kept on a sampled axis: the first, the last and at least one between

_Key = tuple  # ("g", tensor, axis) | ("t", node, tensor, axis) | ("d", node, statement, dim)


class _Classes:
    """Union-find over axes and statement dims, with the ones that may not be sampled marked."""

    def __init__(self) -> None:
        self.parent: dict[_Key, _Key] = {}
        self.bad: set[_Key] = set()
        self._bad_roots: set[_Key] | None = None  # (the roots of the marked keys, kept until a union or a mark)

    def find(self, k: _Key) -> _Key:
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: _Key, b: _Key) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb
            self._bad_roots = None

    def mark(self, k: _Key) -> None:
        self.bad.add(self.find(k))
        self._bad_roots = None

    def free(self, k: _Key) -> bool:
        if self._bad_roots is None:
            self._bad_roots = {self.find(b) for b in self.bad}
        return self.find(k) not in self._bad_roots


def _classes(graph: Graph) -> _Classes:
    cl = _Classes()
    for name in graph.type_of:
        for ax in range(graph.type_of[name].rank):
            cl.find(("g", name, ax))
    for name, _ in graph.constants:  # read as they are: never sliced
        for ax in range(graph.type_of[name].rank):
            cl.mark(("g", name, ax))
    for node in graph.nodes:
        if node.is_extern:
            for t in node.inputs + node.outputs:
                for ax in range(graph.type_of[t].rank):
                    cl.mark(("g", t, ax))
            continue
        c: Compute = node.op
        for local, outer in zip(c.inputs + c.outputs, node.inputs + node.outputs, strict=True):
            for ax in range(c.type_of[local].rank):
                cl.union(("t", node.name, local, ax), ("g", outer, ax))
        for k, st in enumerate(c.statements):
            ext = st.extent
            for d in st.reduce_dims:
                cl.mark(("d", node.name, k, d))
            for d in st.out_dims:
                cl.find(("d", node.name, k, d))
            for ax, d in enumerate(st.out_dims):
                cl.union(("d", node.name, k, d), ("t", node.name, st.out, ax))
            for e in st.expr.walk():
                if isinstance(e, IndexValue):
                    for d in e.index.dims:
                        cl.mark(("d", node.name, k, d))
            for a in st.expr.accesses():
                shape = c.type_of[a.tensor].shape
                for ax, ix in enumerate(a.index):
                    key = ("t", node.name, a.tensor, ax)
                    if ix.is_plain_dim and ext[ix.dims[0]] == shape[ax]:
                        cl.union(("d", node.name, k, ix.dims[0]), key)
                    else:  # shifted, combined, a constant index or a part of the axis: the indices mix
                        cl.mark(key)
                        for d in ix.dims:
                            cl.mark(("d", node.name, k, d))
    return cl


def _points(graph: Graph, size: Mapping[_Key, int], cl: _Classes) -> int:
    total = 0
    for node in graph.nodes:
        if node.is_extern:
            continue
        for k, st in enumerate(node.op.statements):
            total += math.prod(size.get(cl.find(("d", node.name, k, d)), n) for d, n in st.extents)
    return total


def take_sampled(keep: Mapping[str, tuple[tuple[int, np.ndarray], ...]], name: str, array: np.ndarray) -> np.ndarray:
    """The part of tensor ``name`` at the indices ``keep`` holds for it (an :class:`AxisSample`'s)."""
    out = np.asarray(array)
    for ax, idx in keep.get(name, ()):
        out = np.take(out, idx, axis=ax)
    return out


@dataclass(frozen=True)
class AxisSample:
    """The graph on sampled indices of its independent axes: ``graph`` is the sampled graph, ``keep`` the indices
    kept per axis of each tensor of the original graph (tensor -> ((axis, indices), ...))."""

    graph: Graph
    keep: Mapping[str, tuple[tuple[int, np.ndarray], ...]]

    def take(self, name: str, array: np.ndarray) -> np.ndarray:
        """The sampled part of tensor ``name`` of the original graph."""
        return take_sampled(self.keep, name, array)

    def take_all(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: self.take(n, a) for n, a in arrays.items()}


def sample_axes(graph: Graph, points: int | None = REFERENCE_POINTS, seed: int = 0) -> AxisSample | None:
    """The graph on a sample of its independent axes (module docstring) whose reference runs at most about
    ``points`` iteration points, or None when no sampling is needed (or possible): the reference then runs
    on the whole graph. ``points=None``: never sample."""
    if points is None:
        return None
    cl = _classes(graph)
    sizes: dict[_Key, int] = {}
    full: dict[_Key, int] = {}
    for key in list(cl.parent):
        if key[0] == "g" and cl.free(key):
            full[cl.find(key)] = graph.type_of[key[1]].shape[key[2]]
    if _points(graph, {}, cl) <= points:
        return None
    while True:
        cost = _points(graph, sizes, cl)
        if cost <= points:
            break
        open_ = [r for r, n in full.items() if sizes.get(r, n) > MIN_KEEP]
        if not open_:
            break
        r = max(open_, key=lambda q: sizes.get(q, full[q]))
        now = sizes.get(r, full[r])
        sizes[r] = max(MIN_KEEP, int(now * points / cost))
    if not sizes:
        return None
    rng = np.random.default_rng(seed)
    chosen: dict[_Key, np.ndarray] = {}
    for r in sorted(sizes, key=repr):
        n, k = full[r], sizes[r]
        middle = rng.choice(np.arange(1, n - 1), size=k - 2, replace=False)
        chosen[r] = np.sort(np.concatenate([[0, n - 1], middle])).astype(np.int64)

    def kept(key: _Key) -> np.ndarray | None:
        return chosen.get(cl.find(key))

    def new_type(t: TensorType, keys) -> TensorType:
        shape = tuple(len(idx) if (idx := kept(k)) is not None else s for k, s in zip(keys, t.shape, strict=True))
        return replace(t, shape=shape)

    types = tuple((n, new_type(t, [("g", n, ax) for ax in range(t.rank)])) for n, t in graph.types)
    nodes = []
    for node in graph.nodes:
        if node.is_extern:
            nodes.append(node)
            continue
        c = node.op
        stmts = []
        for k, st in enumerate(c.statements):
            ext = tuple((d, len(idx) if (idx := kept(("d", node.name, k, d))) is not None else n)
                        for d, n in st.extents)
            stmts.append(replace(st, extents=ext))
        ctypes = tuple((n, new_type(t, [("t", node.name, n, ax) for ax in range(t.rank)])) for n, t in c.types)
        nodes.append(replace(node, op=Compute(c.inputs, c.outputs, tuple(stmts), ctypes)))
    keep = {}
    for n, t in graph.types:
        axes = tuple((ax, idx) for ax in range(t.rank) if (idx := kept(("g", n, ax))) is not None)
        if axes:
            keep[n] = axes
    return AxisSample(replace(graph, nodes=tuple(nodes), types=types), keep)


__all__ = ["REFERENCE_POINTS", "AxisSample", "sample_axes"]
