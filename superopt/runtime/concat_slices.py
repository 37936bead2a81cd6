"""Concatenation without copies: the producers of a concatenation's inputs write into its slices.

A compute node whose output, flattened, is its inputs flattened one after the other (``O = [A | B]``
in memory: a concat along the outermost non-unit axis, NCHW with one image, or NCHWc along the channel
blocks) moves no data that its producers could not have written in place. The memory plan then gives
each input the slice of the output's buffer at its offset, the producers' kernels write there, and
the node is never run.

Which nodes are such copies is decided by running them, not by reading their statements: the
reference interpreter evaluates the node on inputs whose every element holds a distinct number (its
position in the concatenation of the flattened inputs), and the output must be exactly ``0, 1, 2,
...``. Any layout, padding or select form of the copy is recognized, and nothing else is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from superopt.interp.reference import evaluate_compute
from superopt.ir.compute import Compute
from superopt.ir.graph import Graph, Node
from superopt.ir.types import is_float

MAX_PROBE_ELEMENTS = 1 << 24  # ids stay exact in float64; larger copies are left to their kernels


@dataclass(frozen=True)
class ConcatSlices:
    """``node`` is elided: each of ``inputs`` lives in ``output``'s buffer at its byte offset."""

    node: str
    output: str
    inputs: tuple[tuple[str, int], ...]  # (graph tensor, byte offset in the output)


def is_contiguous_concat(graph: Graph, n: Node) -> bool:
    """Whether compute node ``n`` copies its inputs, each whole and in order, into one contiguous output."""
    if n.is_extern or len(n.inputs) < 2 or len(set(n.inputs)) != len(n.inputs) or len(n.outputs) != 1:
        return False
    return _copies_in_order(n.op)


@lru_cache(maxsize=4096)
def _copies_in_order(c: Compute) -> bool:
    """The probe (cached by the op's structural hash: a graph search asks about the same ops again)."""
    if len(c.statements) != 1 or c.statements[0].reduce != "=" or len(c.outputs) != 1:
        return False
    types = [c.type_of[t] for t in (*c.inputs, c.outputs[0])]
    if len({t.dtype for t in types}) != 1 or not is_float(types[0].dtype):
        return False
    sizes = [t.size for t in types[:-1]]
    if sum(sizes) != types[-1].size or types[-1].size > MAX_PROBE_ELEMENTS:
        return False
    starts = np.cumsum([0, *sizes])
    ids = [np.arange(a, a + s, dtype=np.float64).reshape(t.shape) for a, s, t in zip(starts, sizes, types)]
    try:
        (out,) = evaluate_compute(c, ids, np.float64)
    except (ValueError, IndexError):  # (a probe that the interpreter refuses is no copy we know)
        return False
    return bool(np.array_equal(out.ravel(), np.arange(types[-1].size, dtype=np.float64)))


def _written_by(graph: Graph, t: str) -> list[str] | None:
    """The tensors a producer writes when it writes ``t``: ``[t]`` for a compute node's output, ``[t, s]`` for
    the reshape of a compute node's output ``s`` that nothing else reads (a view of the same bytes, as the
    Winograd output transform's blocks merged back into a tile); None otherwise."""
    producer = graph.producer
    p = producer.get(t)
    if p is None:
        return None
    if not p.is_extern:
        return [t]
    if p.op.kind != "reshape":
        return None
    s = p.inputs[0]
    q = producer.get(s)
    if q is None or q.is_extern or s in graph.outputs or len(graph.consumers.get(s, [])) != 1:
        return None
    return [t, s]


def writable_in_place(graph: Graph, n: Node) -> bool:
    """Whether node ``n`` is a contiguous concatenation whose inputs' producers can write its slices:
    compute nodes produce them (or a reshape of a compute node's output read by nothing else), and neither
    they nor its output is a graph output (those are fresh arrays each call) or aliased by a reshape."""
    if n.is_extern or len(n.inputs) < 2 or len(n.outputs) != 1:  # (first: the graph cost asks of every node)
        return False
    if n.outputs[0] in graph.outputs or any(t in graph.outputs for t in n.inputs):
        return False
    if any(_written_by(graph, t) is None for t in n.inputs):
        return False
    if any(r.is_extern and r.op.kind == "reshape" for t in n.inputs for r in graph.consumers.get(t, [])):
        return False
    return is_contiguous_concat(graph, n)


def concat_slices(graph: Graph) -> list[ConcatSlices]:
    """The concatenations of ``graph`` whose inputs can be written in place, with their offsets.

    Each node is :func:`writable_in_place`, and no tensor is a slice of two. A concatenation of a
    concatenation nests: the inner one's output is a slice of the outer one (DenseNet's chain of growing
    concatenations lives in one buffer, each a prefix of the next), so ``inputs`` may name a tensor that is
    itself the output of an earlier entry; its slices' offsets are relative to it."""
    taken: set[str] = set()
    found: list[ConcatSlices] = []
    for n in graph.nodes:
        if n.outputs[0] in taken or any(t in taken for t in n.inputs) or not writable_in_place(graph, n):
            continue
        offsets = np.cumsum([0, *(graph.type_of[t].nbytes for t in n.inputs)])
        inputs = [(w, int(o)) for t, o in zip(n.inputs, offsets) for w in _written_by(graph, t)]
        found.append(ConcatSlices(n.name, n.outputs[0], tuple(inputs)))
        taken.update(w for w, _ in inputs)
    return found


def resolve_slices(root: dict[str, str], slices: list[ConcatSlices]) -> tuple[dict[str, str], dict[str, int]]:
    """``root`` (tensor -> the tensor owning its memory, reshapes already aliased) with every slice moved into
    its outermost concatenation, and each slice's byte offset there (a nested slice's offsets add up)."""
    parent = {t: (cs.output, off) for cs in slices for t, off in cs.inputs}
    root = dict(root)
    offset_of: dict[str, int] = {}
    for t in list(root):
        r, off, seen = root[t], 0, 0
        if t in parent:
            r, off = parent[t]
        while r in parent and seen < len(parent):  # the owner is itself a slice of an outer concatenation
            r, step = parent[r]
            off += step
            seen += 1
        if r != root[t] or t in parent:
            root[t] = r
            offset_of[t] = off
    return root, offset_of
