"""Layout choice rules: NCHW activations as blocked NCHWc tensors, conversions that cancel.

A blocked tensor is just another tensor: ``X_c[n, cb, y, x, c]`` holds ``X[n, B*cb + c, y, x]`` (B, the
block, is 8 or 16: one or two float32 vectors). Conversions are compute ops (``to_blocked``:
``O[n,cb,y,x,c] = X[n,B*cb+c,y,x]``; ``from_blocked``: the transpose ``O[n,cb,c,y,x] = X_c[n,cb,y,x,c]``
followed by a reshape alias to ``[n, C, y, x]``). A compute node is *blocked* by splitting every dim that
indexes the channel axis of an activation (``c = B*c_b + c_l``) and rewriting its statements over the
blocked tensors; constant weights indexed by split dims are re-laid out ahead of time (a conv's
``W[co,ci,kh,kw]`` becomes ``W_c[cob,cib,kh,kw,ci_l,co_l]``, the output channel lane innermost, the
natural fit for a vector FMA). Elementwise ops, residual adds, pooling and concat take the blocked
layout the same way, so after ``cancel_conversions`` nothing is converted between blocked nodes.

``block_node`` grows the graph (it inserts conversions) and ``block_node`` then ``cancel_conversions``
moves conversions around: these rules are for the layout pass and the graph search, never for the
greedy driver (family ``layout_choice``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import chain
from operator import attrgetter

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, IndexValue, map_expr
from superopt.ir.graph import DeferredConstant, Extern, Graph, Node
from superopt.ir.prune import prune_graph
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType

FAMILY = "layout_choice"
BLOCKS = (8, 16)


# ---- conversions ------------------------------------------------------------------------------------

def blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    """``(N, C, *spatial)`` -> ``(N, C/B, *spatial, B)``."""
    return (shape[0], shape[1] // block, *shape[2:], block)


def _spatial(rank: int) -> tuple[str, ...]:
    return tuple(f"s{i}" for i in range(rank - 2))


@lru_cache(maxsize=512)
def to_blocked_compute(shape: tuple[int, ...], block: int, dtype: str = "float32") -> Compute:
    """``O[n,cb,s..,c] = X[n, B*cb + c, s..]``."""
    sp = _spatial(len(shape))
    idx = (Affine.dim("n"), Affine.of({"cb": block, "c": 1}), *(Affine.dim(d) for d in sp))
    st = Statement("O", ("n", "cb", *sp, "c"), "=", Access("X", idx),
                   (("n", shape[0]), ("cb", shape[1] // block), *zip(sp, shape[2:]), ("c", block)))
    return Compute(("X",), ("O",), (st,), (("X", TensorType(tuple(shape), dtype)),
                                           ("O", TensorType(blocked_shape(tuple(shape), block), dtype))))


@lru_cache(maxsize=512)
def from_blocked_compute(shape: tuple[int, ...], block: int, dtype: str = "float32") -> Compute:
    """``O[n,cb,c,s..] = X_c[n,cb,s..,c]`` (then a reshape alias merges cb and c into the channel axis)."""
    sp = _spatial(len(shape))
    bshape = blocked_shape(tuple(shape), block)
    st = Statement("O", ("n", "cb", "c", *sp), "=", Access("X", tuple(Affine.dim(d) for d in ("n", "cb", *sp, "c"))),
                   (("n", shape[0]), ("cb", shape[1] // block), ("c", block), *zip(sp, shape[2:])))
    split = (shape[0], shape[1] // block, block, *shape[2:])
    return Compute(("X",), ("O",), (st,), (("X", TensorType(bshape, dtype)), ("O", TensorType(split, dtype))))


def conversion_kind(graph: Graph, node: Node) -> tuple[str, int] | None:
    """``("to", B)`` for a to_blocked node, ``("from", B)`` for a from_blocked transpose, else None
    (structurally: any names, canonical ones included)."""
    if node.is_extern or len(node.inputs) != 1 or len(node.outputs) != 1 or len(node.op.statements) != 1:
        return None
    st = node.op.statements[0]
    if st.reduce != "=" or st.padding or not isinstance(st.expr, Access) or st.expr.tensor != node.op.inputs[0]:
        return None
    src, dst = graph.type_of[node.inputs[0]], graph.type_of[node.outputs[0]]
    hit = _KINDS.get(id(node))
    if hit is not None and hit[0] is node and hit[1] is src and hit[2] is dst:
        return hit[3]
    kind = _conversion_kind(st, src, dst)
    if len(_KINDS) >= 20_000:
        _KINDS.clear()
    _KINDS[id(node)] = (node, src, dst, kind)
    return kind


# id(node) -> (node, its input's and output's types, its conversion kind): the layout pass asks again for every
# node after each node it blocks, and the graphs it builds share their nodes and types by object
_KINDS: dict[int, tuple] = {}


def _conversion_kind(st: Statement, src: TensorType, dst: TensorType) -> tuple[str, int] | None:
    d, ix, ext = st.out_dims, st.expr.index, st.extent
    if dst.rank == src.rank + 1 >= 4:  # O[n,cb,s..,c] = X[n, B*cb + c, s..]
        block = ext[d[-1]]
        chan = Affine.of({d[1]: block, d[-1]: 1})
        want = (Affine.dim(d[0]), chan, *(Affine.dim(x) for x in d[2:-1]))
        if ix == want and block in BLOCKS and dst.shape == blocked_shape(src.shape, block):
            return "to", block
    if dst.rank == src.rank >= 4:  # O[n,cb,c,s..] = X_c[n,cb,s..,c]
        block = ext[d[2]]
        want = (Affine.dim(d[0]), Affine.dim(d[1]), *(Affine.dim(x) for x in d[3:]), Affine.dim(d[2]))
        if ix == want and block in BLOCKS and src.shape[-1] == block:
            return "from", block
    return None


def conversions(graph: Graph) -> list[Node]:
    """The layout conversion nodes of ``graph``."""
    return [n for n in graph.nodes if conversion_kind(graph, n) is not None]


# ---- blocking one compute op ------------------------------------------------------------------------

@dataclass(frozen=True)
class WeightLayout:
    """A constant re-laid out: axes ``split`` (each split into outer x lane), lanes moved last in ``lanes`` order."""

    split: tuple[int, ...]
    lanes: tuple[int, ...]  # original axis of each trailing lane axis, in order
    block: int

    def apply(self, a: np.ndarray) -> np.ndarray:
        shape: list[int] = []
        for i, n in enumerate(a.shape):
            shape += [n // self.block, self.block] if i in self.split else [n]
        pos, outer, lane_at = 0, [], {}
        for i in range(a.ndim):
            outer.append(pos)
            if i in self.split:
                lane_at[i] = pos + 1
                pos += 2
            else:
                pos += 1
        return np.ascontiguousarray(a.reshape(shape).transpose(outer + [lane_at[i] for i in self.lanes]))

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(n // self.block if i in self.split else n for i, n in enumerate(shape)) + (self.block,) * len(self.lanes)


class NotBlockable(ValueError):
    """The compute op cannot take the blocked layout (a channel axis read through a window, a reshape...)."""


def _channel_dim(ix: Affine, block: int) -> tuple[str, int]:
    """``d + k*B`` -> (d, k); NotBlockable for any other channel index."""
    if len(ix.terms) == 1 and ix.terms[0][1] == 1 and isinstance(ix.terms[0][0], str) and ix.const % block == 0:
        return ix.terms[0][0], ix.const // block
    raise NotBlockable(f"channel index {ix} is not a dim plus a multiple of {block}")


def _block_statement(st: Statement, blocked: set[str], weights: set[str], types: dict[str, TensorType], block: int
                     ) -> tuple[Statement, dict[str, WeightLayout]]:
    split: list[str] = []

    def add(d: str) -> None:
        if d not in split:
            split.append(d)

    if st.out in blocked:
        add(st.out_dims[1])
    for a in st.expr.accesses():
        if a.tensor in blocked:
            add(_channel_dim(a.index[1], block)[0])
    ext = st.extent
    for d in split:
        if ext[d] % block:
            raise NotBlockable(f"dim {d} of {st.out} has extent {ext[d]}, not a multiple of {block}")
    if st.out not in blocked and any(d in split for d in st.out_dims):
        raise NotBlockable(f"{st.out} is not blocked but its channel dim is split")
    names = {d for d, _ in st.extents}
    outer, lane = {}, {}
    for d in split:
        outer[d] = fresh_name(f"{d}_b", names)
        lane[d] = fresh_name(f"{d}_l", names)
    sub = {d: Affine.of({outer[d]: block, lane[d]: 1}) for d in split}
    layouts: dict[str, WeightLayout] = {}
    weight_reads = {a.tensor: a for a in st.expr.accesses() if a.tensor in weights}
    for w, acc in weight_reads.items():
        plain = all(ix.is_plain_dim for ix in acc.index)
        axes = [i for i, ix in enumerate(acc.index) if ix.is_plain_dim and ix.dims[0] in split]
        uses = {a.index for a in st.expr.accesses() if a.tensor == w}
        if plain and axes and len(uses) == 1:
            dims = [acc.index[i].dims[0] for i in axes]
            # lanes of reduction dims first, the output's lanes innermost (in output order)
            order = sorted(axes, key=lambda i: (dims[axes.index(i)] in st.out_dims,
                                               st.out_dims.index(dims[axes.index(i)]) if dims[axes.index(i)] in st.out_dims
                                               else 0))
            layouts[w] = WeightLayout(tuple(axes), tuple(order), block)

    def rewrite(e):
        if isinstance(e, IndexValue):  # a channel index used as a value (concat's select)
            return IndexValue(e.index.substitute(sub))
        if not isinstance(e, Access):
            return e
        if e.tensor in blocked:
            for k, ix in enumerate(e.index):
                if k != 1 and any(d in split for d in ix.dims):
                    raise NotBlockable(f"{e} reads a split channel dim on a non-channel axis")
            d, shift = _channel_dim(e.index[1], block)
            return Access(e.tensor, (e.index[0], Affine.of({outer[d]: 1}, shift), *e.index[2:], Affine.dim(lane[d])))
        if e.tensor in layouts:
            lay = layouts[e.tensor]
            idx = [Affine.dim(outer[ix.dims[0]]) if i in lay.split else ix for i, ix in enumerate(e.index)]
            return Access(e.tensor, (*idx, *(Affine.dim(lane[e.index[i].dims[0]]) for i in lay.lanes)))
        return Access(e.tensor, tuple(ix.substitute(sub) for ix in e.index))

    expr = map_expr(st.expr, rewrite)
    if st.out in blocked:
        c = st.out_dims[1]
        out_dims = (st.out_dims[0], outer[c], *st.out_dims[2:], lane[c])
    else:
        out_dims = st.out_dims
    new_ext = {**{outer[d]: ext[d] // block for d in split}, **{lane[d]: block for d in split}, **ext}
    extents = [(d, new_ext[d]) for d in out_dims]
    red = [d for d in st.reduce_dims]
    extents += [(outer.get(d, d), new_ext[outer.get(d, d)]) for d in red]
    extents += [(lane[d], block) for d in red if d in split]
    return Statement(st.out, out_dims, st.reduce, expr, tuple(extents), st.padding), layouts


def block_compute(c: Compute, activations: set[str], weights: set[str], block: int
                  ) -> tuple[Compute, set[str], dict[str, WeightLayout]]:
    """``c`` over blocked tensors: every local in ``activations`` (rank >= 3, channels a multiple of the block)
    becomes ``[n, C/B, s.., B]``; constants in ``weights`` indexed by split dims are re-laid out.
    Returns the new op, the locals blocked and the weight layouts (NotBlockable when it cannot)."""
    types = c.type_of
    blocked = {t for t in activations if types[t].rank >= 3 and types[t].shape[1] % block == 0}
    if not blocked:
        raise NotBlockable("no activation with channels a multiple of the block")
    statements, layouts = [], {}
    for st in c.statements:
        try:
            new, lay = _block_statement(st, blocked, weights, types, block)
        except NotBlockable:
            raise
        except ValueError as e:  # the rewritten statement or op is not well formed
            raise NotBlockable(str(e)) from None
        for w, wl in lay.items():
            if layouts.setdefault(w, wl) != wl:
                raise NotBlockable(f"weight {w} is read in two layouts")
        statements.append(new)
    new_types = []
    for name, t in c.types:
        if name in blocked:
            t = TensorType(blocked_shape(t.shape, block), t.dtype)
        elif name in layouts:
            t = TensorType(layouts[name].shape(t.shape), t.dtype)
        new_types.append((name, t))
    try:
        return Compute(c.inputs, c.outputs, tuple(statements), tuple(new_types)), blocked, layouts
    except ValueError as e:
        raise NotBlockable(str(e)) from None


def activation_locals(graph: Graph, node: Node) -> tuple[set[str], set[str]]:
    """(locals that are activations: non-constant float NCHW tensors; locals bound to graph constants)."""
    c = node.op
    consts = {local for local, g in zip(c.inputs, node.inputs) if g in graph.constant}
    # rank 4 only (NCHW): a blocked tensor has rank 5, so a blocked node is never blocked again
    acts = {n for n, t in c.types if t.rank == 4 and n not in consts and t.dtype.startswith("float")}
    return acts, consts


@lru_cache(maxsize=4096)
def _blockable_op(op: Compute, acts: frozenset[str], consts: frozenset[str], block: int) -> bool:
    try:
        _, blocked, _ = block_compute(op, set(acts), set(consts), block)
    except NotBlockable:
        return False
    return bool(blocked & (set(op.inputs) | set(op.outputs)))


def blockable(graph: Graph, node: Node, block: int) -> bool:
    """The node can take the blocked layout on at least one of its inputs or outputs."""
    if node.is_extern or conversion_kind(graph, node) is not None:
        return False
    acts, consts = activation_locals(graph, node)
    return _blockable_op(node.op, frozenset(acts), frozenset(consts), block)


# ---- graph surgery ----------------------------------------------------------------------------------

def _insert(nodes: list[Node], before: Node, new: list[Node]) -> list[Node]:
    k = nodes.index(before)
    return nodes[:k] + new + nodes[k:]


def block_node_in(graph: Graph, name: str, block: int, *, check: bool = True) -> Graph:
    """The graph with node ``name`` computing on blocked tensors, conversions inserted around it
    (an existing to_blocked conversion of an input is reused). ``check=False``: the graph is not validated
    (:meth:`Graph.unchecked`; for a pass that validates what it returns)."""
    node = node_named(graph, name)
    if node.is_extern or conversion_kind(graph, node) is not None:
        raise RuleNotApplicable(f"node {name!r} is not a blockable compute op")
    acts, consts = activation_locals(graph, node)
    try:
        op, blocked, layouts = block_compute(node.op, acts, consts, block)
    except NotBlockable as e:
        raise RuleNotApplicable(f"node {name!r}: {e}") from None
    if not blocked & (set(node.op.inputs) | set(node.op.outputs)):
        raise RuleNotApplicable(f"node {name!r} has no blocked input or output")
    types = dict(graph.types)
    used_t = set(types) | {n.name for n in graph.nodes}
    used_n = {n.name for n in graph.nodes}
    constants = dict(graph.constants)
    nodes = list(graph.nodes)
    ins = set(node.inputs)  # (the conversions of the node's inputs: those are the ones it can reuse)
    conversions = {n.inputs[0]: n for n in graph.nodes
                   if len(n.inputs) == 1 and n.inputs[0] in ins and conversion_kind(graph, n) == ("to", block)}
    existing_to = {g: n.outputs[0] for g, n in conversions.items()}
    before: list[Node] = []
    new_inputs = []
    for local, g in zip(node.op.inputs, node.inputs):
        if local in blocked:
            if g not in existing_to:
                t = types[g]
                out = fresh_name(f"{g}_nchw{block}c", used_t)
                types[out] = TensorType(blocked_shape(t.shape, block), t.dtype)
                before.append(Node(fresh_name(f"to_nchw{block}c", used_n), to_blocked_compute(t.shape, block, t.dtype),
                                   (g,), (out,)))
                existing_to[g] = out
            new_inputs.append(existing_to[g])
        elif local in layouts:
            key = f"{g}_nchw{block}c_{''.join(map(str, layouts[local].split))}_{''.join(map(str, layouts[local].lanes))}"
            if key not in constants:
                src, layout = graph.constant[g], layouts[local]
                constants[key] = DeferredConstant(TensorType(layout.shape(src.type.shape), src.type.dtype),
                                                  repr(layout), (src,), layout.apply)
                types[key] = constants[key].type
                used_t.add(key)
            new_inputs.append(key)
        else:
            new_inputs.append(g)
    after: list[Node] = []
    new_outputs = []
    for local, g in zip(node.op.outputs, node.outputs):
        if local not in blocked:
            new_outputs.append(g)
            continue
        t = types[g]
        bout = fresh_name(f"{g}_nchw{block}c", used_t)
        types[bout] = TensorType(blocked_shape(t.shape, block), t.dtype)
        split = fresh_name(f"{g}_split", used_t)
        types[split] = TensorType((t.shape[0], t.shape[1] // block, block, *t.shape[2:]), t.dtype)
        after.append(Node(fresh_name(f"from_nchw{block}c", used_n), from_blocked_compute(t.shape, block, t.dtype),
                          (bout,), (split,)))
        after.append(Node(fresh_name("reshape", used_n), Extern.of("reshape", shape=tuple(t.shape)), (split,), (g,)))
        new_outputs.append(bout)
    # a reused conversion that a later reader's blocking placed after this node moves up to just before it
    # (it reads only the input, which this node reads too, so it is defined earlier)
    position = {id(n): i for i, n in enumerate(nodes)}  # (by identity: equal nodes compare field by field)
    k = position[id(node)]
    late = [c for g, c in conversions.items() if existing_to.get(g) in new_inputs and position[id(c)] > k]
    if late:
        moved = {id(c) for c in late}
        nodes = [n for n in nodes if id(n) not in moved]
        k = next(i for i, n in enumerate(nodes) if n is node)
    before = late + before
    nodes = nodes[:k] + before + [replace(node, op=op, inputs=tuple(new_inputs), outputs=tuple(new_outputs))] \
        + after + nodes[k + 1:]
    return (replace if check else Graph.unchecked)(
        graph, nodes=tuple(nodes), types=tuple(types.items()), constants=tuple(constants.items()))


def cancel_sites(graph: Graph, reading: set[str] | None = None) -> Iterator[Site]:
    """to_blocked nodes whose input is a from_blocked conversion (through its reshape) of the same block
    (``reading``: only those that read one of these tensors)."""
    for n in graph.nodes:
        if reading is not None and (len(n.inputs) != 1 or n.inputs[0] not in reading):
            continue
        kind = conversion_kind(graph, n)
        if kind is None or kind[0] != "to":
            continue
        r = graph.producer.get(n.inputs[0])
        if r is None or not r.is_extern or r.op.kind != "reshape":
            continue
        f = graph.producer.get(r.inputs[0])
        if f is not None and conversion_kind(graph, f) == ("from", kind[1]):
            yield (n.name,)


def _cancel(graph: Graph, nodes: list[Node], check: bool = True) -> Graph:
    """Readers of each to_blocked node in ``nodes`` read the blocked tensor its from_blocked input came from.

    ``check=False``: for a graph with no dead code, which the cancellation leaves so: only the cancelled
    conversions, and the from_blocked conversions (with their reshapes) that nothing reads any more, are
    dropped (no pass over the whole graph) and the graph is not validated (:meth:`Graph.unchecked`)."""
    rename = {n.outputs[0]: graph.producer[graph.producer[n.inputs[0]].inputs[0]].inputs[0] for n in nodes}
    drop = {n.name for n in nodes}

    def ren(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(rename.get(x, x) for x in names)

    kept = tuple(n if rename.keys().isdisjoint(n.inputs) else replace(n, inputs=ren(n.inputs))
                 for n in graph.nodes if n.name not in drop)
    outputs = ren(graph.outputs)
    if check:
        return prune_graph(replace(graph, nodes=kept, outputs=outputs))
    readers = Counter(chain.from_iterable(map(attrgetter("inputs"), kept)))
    readers.update(outputs)
    gone = {o for n in nodes for o in n.outputs}
    # the reshapes the cancelled conversions read, then the from_blocked conversions only those read
    reshapes = {r.name: r for r in (graph.producer[n.inputs[0]] for n in nodes) if r.outputs[0] not in readers}
    froms = Counter()
    for r in reshapes.values():
        froms[r.inputs[0]] += 1
    dead = [*reshapes.values(), *(graph.producer[t] for t, k in froms.items() if readers[t] == k)]
    gone.update(o for n in dead for o in n.outputs)
    dead_names = {n.name for n in dead}
    types = dict(graph.types)
    for t in gone:
        del types[t]
    return graph.unchecked(nodes=tuple(n for n in kept if n.name not in dead_names), outputs=outputs,
                           types=tuple(types.items()))


def cancel_at(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    if (site[0],) not in set(cancel_sites(graph)):
        raise RuleNotApplicable(f"{site[0]!r} does not convert back a from_blocked conversion")
    return _cancel(graph, [node])


def cancel_all(graph: Graph, *, check: bool = True, reading: set[str] | None = None) -> Graph:
    """Every conversion pair cancelled (rounds until none is left: a cancelled pair may expose another).
    ``check=False``: for a graph with no dead code; the result is not validated (see :func:`_cancel`).
    ``reading``: the graph had no pair left but at conversions that read these tensors (a step that
    blocked a node: the tensors it reads and writes).

    A round can expose a pair only at a conversion whose input it renamed (it adds no node, and the nodes it
    drops are read by none that stays), so each round after the first looks only at the readers of the
    tensors the last one renamed to."""
    while True:
        names = {s[0] for s in cancel_sites(graph, reading)}
        if not names:
            return graph
        nodes = [n for n in graph.nodes if n.name in names]
        reading = {graph.producer[graph.producer[n.inputs[0]].inputs[0]].inputs[0] for n in nodes}
        graph = _cancel(graph, nodes, check)


# ---- a conversion read by a copy: the copy converts ----------------------------------------------------

def _copy_reads(node: Node, local: str) -> bool:
    """Every access of ``local`` in ``node`` is a whole pure-copy statement (``T[..] = local[..]``, padded
    or not): the pad stage of a conv, say."""
    reads = False
    for st in node.op.statements:
        accs = [a for a in st.expr.accesses() if a.tensor == local]
        if not accs:
            continue
        if st.reduce != "=" or not isinstance(st.expr, Access):
            return False
        reads = True
    return reads


def absorb_sites(graph: Graph) -> Iterator[Site]:
    """(to_blocked conversion, the one node that reads it, in pure copies only)."""
    for n in graph.nodes:
        kind = conversion_kind(graph, n)
        if kind is None or kind[0] != "to":
            continue
        (out,) = n.outputs
        readers = graph.consumers.get(out, [])
        if out in graph.outputs or len(readers) != 1 or readers[0].is_extern or readers[0].inputs.count(out) != 1:
            continue
        r = readers[0]
        if _copy_reads(r, r.op.inputs[r.inputs.index(out)]):
            yield (n.name, r.name)


def _converted_index(conv: Node, index: tuple[Affine, ...], extents: dict[str, int], shape: tuple[int, ...]
                     ) -> tuple[Affine, ...] | None:
    """``index`` into the conversion's output, as an index into its input. None when a padded read could
    change meaning: an axis that feeds a channel index with another axis must be read whole, by a plain dim
    (the spatial axes map one to one, so their offsets and bounds carry over)."""
    st = conv.op.statements[0]
    sub = dict(zip(st.out_dims, index, strict=True))
    for k, d in enumerate(st.out_dims):
        mixed = any(d in ix.vars() and not ix.is_plain_dim for ix in st.expr.index)
        if mixed and not (index[k].is_plain_dim and extents.get(index[k].dims[0]) == shape[k]):
            return None
    return tuple(ix.substitute(sub) for ix in st.expr.index)


def absorb_conversion(graph: Graph, site: Site) -> Graph:
    """The consumer's copies read the NCHW tensor with the blocked index (``T[..,cb,y,x,c] = X[..,B*cb+c,y,x]``),
    and the conversion is gone: a conv's pad stage, which copies its input anyway, converts it on the way."""
    conv, reader = node_named(graph, site[0]), node_named(graph, site[1])
    (out,) = conv.outputs
    if reader.inputs.count(out) != 1:
        raise RuleNotApplicable(f"{reader.name!r} does not read {conv.name!r} once")
    local = reader.op.inputs[reader.inputs.index(out)]
    if not _copy_reads(reader, local):
        raise RuleNotApplicable(f"{reader.name!r} reads {conv.name!r} other than by a copy")
    src = conv.inputs[0]
    shape = graph.type_of[out].shape
    statements = []
    for st in reader.op.statements:
        if isinstance(st.expr, Access) and st.expr.tensor == local:
            index = _converted_index(conv, st.expr.index, st.extent, shape)
            if index is None:
                raise RuleNotApplicable(f"{reader.name!r} reads part of a blocked channel axis of {out!r}")
            st = replace(st, expr=Access(local, index))
        statements.append(st)
    c = reader.op
    types = tuple((n, graph.type_of[src] if n == local else t) for n, t in c.types)
    op = Compute(c.inputs, c.outputs, tuple(statements), types)
    node = Node(reader.name, op, tuple(src if g == out else g for g in reader.inputs), reader.outputs)
    nodes = tuple(node if n.name == reader.name else n for n in graph.nodes if n.name != conv.name)
    return replace(graph, nodes=nodes, types=tuple((n, t) for n, t in graph.types if n != out))


def absorb_all(graph: Graph) -> Graph:
    """Every conversion that only a copy reads absorbed into it (a site the rule refuses is passed over, not
    the end of the pass)."""
    refused: set[Site] = set()
    while True:
        site = next((s for s in absorb_sites(graph) if s not in refused), None)
        if site is None:
            return graph
        try:
            graph = absorb_conversion(graph, site)
        except RuleNotApplicable:
            refused.add(site)


# ---- rules ------------------------------------------------------------------------------------------

def _block_sites(block: int):
    def sites(graph: Graph) -> Iterator[Site]:
        for n in graph.nodes:
            if blockable(graph, n, block):
                yield (n.name,)
    return sites


def _block_apply(block: int):
    def apply(graph: Graph, site: Site) -> Graph:
        return block_node_in(graph, site[0], block)
    return apply


def _sink_sites(block: int):
    """Blockable non-contraction nodes whose every activation input comes out of a from_blocked conversion."""
    def sites(graph: Graph) -> Iterator[Site]:
        for n in graph.nodes:
            if n.is_extern or any(st.reduce == "+=" and st.reduce_dims for st in n.op.statements):
                continue
            acts, _ = activation_locals(graph, n)
            ins = [g for local, g in zip(n.op.inputs, n.inputs) if local in acts]
            if ins and all((r := graph.producer.get(g)) is not None and r.is_extern and r.op.kind == "reshape"
                   and (f := graph.producer.get(r.inputs[0])) is not None
                   and conversion_kind(graph, f) == ("from", block) for g in ins) and blockable(graph, n, block):
                yield (n.name,)
    return sites


def _sink_apply(block: int):
    def apply(graph: Graph, site: Site) -> Graph:
        if site not in set(_sink_sites(block)(graph)):
            raise RuleNotApplicable(f"{site[0]!r} does not read only from_blocked conversions")
        return cancel_all(block_node_in(graph, site[0], block))
    return apply


def _conv_graph(name: str, cin: int, cout: int, hw: int, k: int, seed: int) -> tuple[GraphBuilder, str]:
    rng = np.random.default_rng(seed)
    b = GraphBuilder(name)
    x = b.input("x", (1, cin, hw, hw))
    w = b.constant(rng.standard_normal((cout, cin, k, k)).astype(np.float32), "w")
    bias = b.constant(rng.standard_normal(cout).astype(np.float32), "bias")
    pad = (k - 1) // 2
    y = b.compute1(f"P[n,co,y,x] += X[n,ci,y+kh-{pad},x+kw-{pad}] * W[co,ci,kh,kw]\nO[n,co,y,x] = relu(P[n,co,y,x] + Bi[co])",
                   {"X": x, "W": w, "Bi": bias}, "conv", extents={"y": hw, "x": hw},
                   padding={"X": 0.0} if pad else None, outputs=["O"])
    return b, y


def _block_examples(block: int):
    def examples() -> list[Graph]:
        out = []
        for cin, cout, hw, k in ((block, 2 * block, 5, 3), (2 * block, block, 4, 1), (3, block, 6, 3)):
            b, y = _conv_graph(f"conv{cin}_{cout}_{k}", cin, cout, hw, k, cin + cout)
            out.append(b.build([y]))
        b = GraphBuilder("max_pool")
        x = b.input("x", (1, block, 7, 7))
        out.append(b.build([b.compute1("O[n,c,y,x] max= X[n,c,2*y+k0-1,2*x+k1-1]", {"X": x}, "pool",
                                       extents={"k0": 3, "k1": 3, "y": 4, "x": 4}, padding={"X": float("-inf")})]))
        return out
    return examples


def _chain_examples() -> list[Graph]:
    """conv -> conv (+ residual add), each node already blocked: conversions between them."""
    out = []
    for block, hw, seed in ((8, 5, 1), (16, 4, 2)):
        b, y = _conv_graph("conv_chain", block, block, hw, 3, seed)
        rng = np.random.default_rng(seed)
        w2 = b.constant(rng.standard_normal((block, block, 1, 1)).astype(np.float32), "w2")
        z = b.compute1("P[n,co,y,x] += X[n,ci,y+kh,x+kw] * W[co,ci,kh,kw]\nO[n,co,y,x] = P[n,co,y,x] + R[n,co,y,x]",
                       {"X": y, "W": w2, "R": y}, "conv2", outputs=["O"])
        g = b.build([z])
        for n in [n.name for n in g.nodes]:
            g = block_node_in(g, n, block)
        out.append(g)
    return out


def _sink_examples(block: int):
    def examples() -> list[Graph]:
        out = []
        for hw in (6, 5):
            b, y = _conv_graph("conv_pool", block, block, hw, 3, hw)
            z = b.compute1("O[n,c,y,x] max= X[n,c,2*y+k0,2*x+k1]", {"X": y}, "pool",
                           extents={"k0": 2, "k1": 2, "y": hw // 2, "x": hw // 2})
            w = b.compute1("O[n,c,y,x] = X[n,c,y,x] * 0.5", {"X": z}, "half")
            g = b.build([w])
            out.append(block_node_in(g, "conv", block))
        return out
    return examples


def _absorb_examples() -> list[Graph]:
    """A padded conv whose pad stage copies the input (as the ONNX frontend writes a padded Conv), blocked:
    the input's conversion feeds the copy."""
    out = []
    for block, hw, seed in ((8, 5, 3), (16, 4, 4)):
        rng = np.random.default_rng(seed)
        b = GraphBuilder("conv_in")
        x = b.input("x", (1, block, hw, hw))
        w = b.constant(rng.standard_normal((2 * block, block, 3, 3)).astype(np.float32), "w")
        bias = b.constant(rng.standard_normal(2 * block).astype(np.float32), "bias")
        y = b.compute1("T[n,c,p,q] = X[n,c,p-1,q-1]\nP[n,co,y,x] += T[n,ci,y+kh,x+kw] * W[co,ci,kh,kw]\n"
                       "O[n,co,y,x] = relu(P[n,co,y,x] + Bi[co])", {"X": x, "W": w, "Bi": bias}, "conv",
                       extents={"p": hw + 2, "q": hw + 2, "y": hw, "x": hw}, padding={"X": 0.0}, outputs=["O"])
        out.append(block_node_in(b.build([y]), "conv", block))
    return out


CANCEL_CONVERSIONS = Rule("cancel_conversions", FAMILY, "to_nchwBc(from_nchwBc(X_c)) = X_c", cancel_sites, cancel_at,
                          _chain_examples)
ABSORB_CONVERSION = Rule("absorb_conversion", FAMILY, "T = copy(to_nchwBc(X)) = copy'(X), copy' reading X[n,B*cb+c,y,x]",
                         absorb_sites, absorb_conversion, _absorb_examples)
RULES: list[Rule] = [CANCEL_CONVERSIONS, ABSORB_CONVERSION]
for _b in BLOCKS:
    RULES += [
        Rule(f"block_node_nchw{_b}c", FAMILY,
             f"f(X) = from_nchw{_b}c(f_c(to_nchw{_b}c(X))), f_c reading X_c[n,cb,y,x,c] = X[n,{_b}cb+c,y,x]",
             _block_sites(_b), _block_apply(_b), _block_examples(_b)),
        Rule(f"sink_conversion_nchw{_b}c", FAMILY,
             f"f(from_nchw{_b}c(X_c)) = from_nchw{_b}c(f_c(X_c)) for f elementwise or pooling",
             _sink_sites(_b), _sink_apply(_b), _sink_examples(_b)),
    ]
