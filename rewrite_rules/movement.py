"""Data-movement rules: transposes, slices and reshapes disappear into the index maps of their readers.

The frontends emit a transpose or a slice as a compute op with one copy statement (``O[i,k,j] =
X[i,j,k]``) and a reshape as the extern ``reshape`` (an alias). A copy read only by compute ops is
substituted into their accesses (a transpose read by a contraction becomes part of its index map;
transpose of transpose composes, and an identity copy vanishes). Reshape of reshape is one reshape;
an identity reshape is none. A reshape that splits axes is an affine re-indexing of its reader; a
reshape that merges axes is undone by splitting the reader's loop over the merged axis.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from rewrite_rules.graph_edit import constant_locals, drop_unread_inputs, rebuild
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, IndexValue, map_expr
from superopt.ir.graph import DeferredConstant, Extern, Graph, Node
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType


def _is_reshape(node: Node | None) -> bool:
    return node is not None and node.is_extern and node.op.kind == "reshape"


def _readers_all_compute(graph: Graph, t: str) -> bool:
    readers = graph.consumers.get(t, [])
    return bool(readers) and t not in graph.outputs and all(not n.is_extern for n in readers)


def _padded(op: Compute, local: str) -> bool:
    return any(local in st.pad_value for st in op.statements)


def _reread(consumer: Node, tensor: str, new_input: str, new_type: TensorType, index_of) -> Node:
    """``consumer`` reading graph tensor ``new_input`` where it read ``tensor``: every access ``t[ix]`` of
    its local for ``tensor`` becomes ``x[index_of(ix, extents of the statement)]``."""
    op = consumer.op
    old_locals = {local for local, g in zip(op.inputs, consumer.inputs) if g == tensor}
    existing = [local for local, g in zip(op.inputs, consumer.inputs) if g == new_input]
    inputs, graph_inputs, types = list(op.inputs), list(consumer.inputs), list(op.types)
    if existing and op.type_of[existing[0]] == new_type:
        x = existing[0]
    else:
        x = fresh_name("X", set(op.type_of))
        inputs.append(x)
        graph_inputs.append(new_input)
        types.append((x, new_type))

    def sub(e, ext):
        if isinstance(e, Access) and e.tensor in old_locals:
            return Access(x, index_of(e.index, ext))
        return e

    def padding(st: Statement) -> tuple[tuple[str, float], ...]:  # a padded read of the old tensor pads the new one
        pads = dict((x if t in old_locals else t, v) for t, v in st.padding)
        return tuple(pads.items())

    statements = tuple(replace(st, expr=map_expr(st.expr, lambda e, st=st: sub(e, st.extent)), padding=padding(st))
                       for st in op.statements)
    new = Node(consumer.name, Compute(tuple(inputs), op.outputs, statements, tuple(types)), tuple(graph_inputs),
               consumer.outputs)
    return drop_unread_inputs(new)


def _rewire(graph: Graph, gone: Node, new_readers: dict[str, Node]) -> Graph:
    nodes = [new_readers.get(n.name, n) for n in graph.nodes if n.name != gone.name]
    still_read = any(o in n.inputs or o in graph.outputs for n in nodes for o in gone.outputs)
    if still_read:
        nodes = [new_readers.get(n.name, n) for n in graph.nodes]
    return rebuild(graph, nodes)


# ---- a copy (transpose, slice, broadcast) substituted into its compute readers ---------------------
def _copy_of(node: Node) -> tuple[str, Access, tuple[str, ...]] | None:
    """(input local, the access, the output dims) when the node is one copy statement ``O[d] = X[f(d)]``."""
    if node.is_extern or len(node.op.statements) != 1 or len(node.outputs) != 1:
        return None
    (st,) = node.op.statements
    if st.reduce != "=" or st.padding or not isinstance(st.expr, Access) or st.expr.tensor not in node.op.inputs:
        return None
    return st.expr.tensor, st.expr, st.out_dims


def copy_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        copy = _copy_of(node)
        if copy is None or not _readers_all_compute(graph, node.outputs[0]):
            continue
        t = node.outputs[0]
        source = graph.type_of[node.inputs[node.op.inputs.index(copy[0])]]
        if all(_pad_safe(copy, source.shape, r.op, local) for r in graph.consumers[t]
               for local, g in zip(r.op.inputs, r.inputs) if g == t):
            yield (node.name,)


def _pad_safe(copy, source_shape: tuple[int, ...], op: Compute, local: str) -> bool:
    """A reader padding the copy's output may read the source instead when the copy is a slice (axis m of the
    output is axis m of the source, shifted) and every padded read is out of range for both or for neither:
    on each axis the slice is the whole source axis, or the reader's index stays inside the slice."""
    if not _padded(op, local):
        return True
    _, access, dims = copy
    shape = op.type_of[local].shape
    if len(access.index) != len(dims) or any(ix.dims not in ((d,),) or ix.coeff(d) != 1 for ix, d in zip(access.index, dims)):
        return False
    for st in op.statements:
        for a in st.expr.accesses():
            if a.tensor != local:
                continue
            for m, ix in enumerate(a.index):
                whole = access.index[m].const == 0 and shape[m] == source_shape[m]
                lo, hi = ix.bounds(st.extent)
                if not whole and not (lo >= 0 and hi < shape[m]):
                    return False
    return True


def inline_copy(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    copy = _copy_of(node)
    if copy is None or (site not in set(copy_sites(graph))):
        raise RuleNotApplicable(f"node {site[0]!r} is not a copy read only by compute ops")
    local, access, dims = copy
    source = node.inputs[node.op.inputs.index(local)]
    t = node.outputs[0]

    def index_of(ix: tuple[Affine, ...], ext) -> tuple[Affine, ...]:
        return tuple(a.substitute(dict(zip(dims, ix))) for a in access.index)

    readers = {r.name: _reread(r, t, source, graph.type_of[source], index_of) for r in graph.consumers[t]}
    return _rewire(graph, node, readers)


# ---- a copy of a producer's output written by the producer itself ------------------------------------
def _radix_axes(copy_index: tuple[Affine, ...], extent: dict[str, int], shape: tuple[int, ...],
                dims: tuple[str, ...]) -> list[list[str]] | None:
    """Per axis of the copied tensor, the copy's dims (outer first) whose mixed-radix number it is
    (``X[.., 4*a + b, ..]`` with b < 4: [a, b]), every dim of the copy used exactly once; None otherwise."""
    groups, seen = [], []
    for ix, n in zip(copy_index, shape):
        if ix.const != 0 or not ix.terms or any(not isinstance(d, str) for d in ix.dims):
            return None
        terms = sorted(ix.terms, key=lambda t: -t[1])
        stride = 1
        for d, c in reversed(terms):
            if c != stride:
                return None
            stride *= extent[d]
        if stride != n:
            return None
        groups.append([d for d, _ in terms])
        seen += groups[-1]
    return groups if sorted(seen) == sorted(dims) else None


def _write_back_plan(graph: Graph, node: Node):
    """(producer, its output local, the copy's dim groups per axis) when ``node`` is a copy ``O[d] = X[f(d)]``
    (a transpose, a split, or both) of a compute node's output that nothing else reads."""
    copy = _copy_of(node)
    if copy is None:
        return None
    local, access, dims = copy
    x = node.inputs[node.op.inputs.index(local)]
    prod = graph.producer.get(x)
    if prod is None or prod.is_extern or x in graph.outputs or len(graph.consumers.get(x, [])) != 1:
        return None
    if prod.outputs.count(x) != 1 or graph.type_of[x].dtype != graph.type_of[node.outputs[0]].dtype:
        return None
    (st,) = node.op.statements
    groups = _radix_axes(access.index, st.extent, graph.type_of[x].shape, dims)
    if groups is None:
        return None
    xo = prod.op.outputs[prod.outputs.index(x)]
    for pst in prod.op.statements:  # the producer reads its output only where it writes it (an accumulation)
        for a in pst.expr.accesses():
            if a.tensor == xo and (pst.out != xo or a.index != tuple(Affine.dim(d) for d in pst.out_dims)):
                return None
    return prod, xo, groups


def _through_reshapes(graph: Graph, node: Node) -> Graph | None:
    """``graph`` with the reshapes between the copy ``node`` and a compute producer merged and read through by the
    copy (an exported model reshapes a conv's output before it transposes it); None where one does not read
    through. Alone each of these moves gains nothing, so the write-back takes them as part of its own move."""
    for _ in range(8):
        n = node_named(graph, node.name)
        if _copy_of(n) is None or len(n.inputs) != 1:
            return None
        p = graph.producer.get(n.inputs[0])
        if p is None or not p.is_extern:
            return graph
        if not _is_reshape(p) or len(graph.consumers.get(p.outputs[0], [])) != 1 or p.outputs[0] in graph.outputs:
            return None
        if _is_reshape(graph.producer.get(p.inputs[0])):
            graph = merge_reshapes(graph, (p.name,))
        elif (p.name, n.name) in set(split_reshape_sites(graph)):
            graph = read_through_reshape(graph, (p.name, n.name))
        else:
            return None
    return None


def write_back_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if _copy_of(node) is None:
            continue
        through = _through_reshapes(graph, node)
        if through is not None and _write_back_plan(through, node_named(through, node.name)) is not None:
            yield (node.name,)


def write_back_copy(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    through = _through_reshapes(graph, node) if _copy_of(node) is not None else None
    if through is None:
        raise RuleNotApplicable(f"node {site[0]!r} does not read a compute node's output through reshapes")
    graph, node = through, node_named(through, site[0])
    plan = _write_back_plan(graph, node)
    if plan is None:
        raise RuleNotApplicable(f"node {site[0]!r} is no copy of a compute node's output")
    prod, xo, groups = plan
    (cst,) = node.op.statements
    cext = cst.extent
    statements = []
    for st in prod.op.statements:
        if st.out != xo:
            statements.append(st)
            continue
        used = {d for d, _ in st.extents}
        names: dict[str, str] = {}  # the copy's dim -> the producer's new loop
        values: dict[str, Affine] = {}
        for e, group in zip(st.out_dims, groups):
            fresh = [e] if len(group) == 1 else [fresh_name(f"{e}_{j}", used) for j in range(len(group))]
            names.update(zip(group, fresh))
            values[e] = _mixed_radix(fresh, tuple(cext[d] for d in group))
        out_dims = tuple(names[d] for d in cst.out_dims)
        # the output's dims first, in its order (as every statement lists them), then the reduction's
        extents = [(names[d], cext[d]) for d in cst.out_dims] + [(d, n) for d, n in st.extents if d not in st.out_dims]

        def sub(e, values=values, out_dims=out_dims, st=st):
            if isinstance(e, Access) and e.tensor == xo:  # the accumulation's read of its own output
                return Access(xo, tuple(Affine.dim(d) for d in out_dims))
            if isinstance(e, Access):
                return Access(e.tensor, tuple(ix.substitute(values) for ix in e.index))
            if isinstance(e, IndexValue):
                return IndexValue(e.index.substitute(values))
            return e

        statements.append(Statement(xo, out_dims, st.reduce, map_expr(st.expr, sub), tuple(extents), st.padding))
    t = node.outputs[0]
    types = tuple((n, graph.type_of[t] if n == xo else ty) for n, ty in prod.op.types)
    new_prod = Node(prod.name, Compute(prod.op.inputs, prod.op.outputs, tuple(statements), types), prod.inputs,
                    tuple(t if o == prod.outputs[prod.op.outputs.index(xo)] else o for o in prod.outputs))
    nodes = [new_prod if n.name == prod.name else n for n in graph.nodes if n.name != node.name]
    return rebuild(graph, nodes)


# ---- identity copies and reshapes, reshape of reshape ----------------------------------------------
def _identity_source(graph: Graph, node: Node) -> str:
    return node.inputs[0] if _is_reshape(node) else node.inputs[node.op.inputs.index(_copy_of(node)[0])]


def _renamable(graph: Graph, node: Node) -> bool:
    """A graph output made by an identity of a tensor that only it reads: the producer can write the output."""
    src = _identity_source(graph, node)
    return (src in graph.producer and src not in graph.outputs and len(graph.consumers.get(src, [])) == 1
            and graph.producer[src].outputs.count(src) == 1)


def _identity(graph: Graph, node: Node) -> bool:
    if not (_is_reshape(node) or _copy_of(node) is not None) or len(node.outputs) != 1:
        return False
    if node.outputs[0] in graph.outputs and not _renamable(graph, node):
        return False
    if _is_reshape(node):
        return graph.type_of[node.inputs[0]] == graph.type_of[node.outputs[0]]
    copy = _copy_of(node)
    return copy is not None and copy[1].index == tuple(Affine.dim(d) for d in copy[2]) and \
        node.op.type_of[copy[0]] == node.op.type_of[node.op.outputs[0]]


def identity_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if _identity(graph, node):
            yield (node.name,)


def remove_identity(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    if not _identity(graph, node):
        raise RuleNotApplicable(f"node {site[0]!r} is no identity copy or reshape")
    source = _identity_source(graph, node)
    t = node.outputs[0]
    if t in graph.outputs:  # the producer writes the graph output itself
        nodes = [replace(n, outputs=tuple(t if o == source else o for o in n.outputs)) for n in graph.nodes if n is not node]
        return rebuild(graph, nodes)
    nodes = [replace(n, inputs=tuple(source if i == t else i for i in n.inputs)) for n in graph.nodes if n is not node]
    return rebuild(graph, nodes)


def reshape_chain_sites(graph: Graph) -> Iterator[Site]:
    producer = graph.producer
    for node in graph.nodes:
        if _is_reshape(node) and _is_reshape(producer.get(node.inputs[0])):
            yield (node.name,)


def merge_reshapes(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    inner = graph.producer.get(node.inputs[0]) if _is_reshape(node) else None
    if not _is_reshape(inner):
        raise RuleNotApplicable(f"node {site[0]!r} is not a reshape of a reshape")
    nodes = [replace(n, inputs=(inner.inputs[0],)) if n is node else n for n in graph.nodes]
    if not any(inner.outputs[0] in n.inputs for n in nodes) and inner.outputs[0] not in graph.outputs:
        nodes = [n for n in nodes if n is not inner]
    return rebuild(graph, nodes)


# ---- reshapes read by compute ops ------------------------------------------------------------------
def reshape_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Consecutive axis groups (axes of a, axes of b) with equal products, in row-major order; None when the
    sizes differ."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        ga, gb, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                ga.append(i)
                pa, i = pa * a[i], i + 1
            elif pb < pa and j < len(b):
                gb.append(j)
                pb, j = pb * b[j], j + 1
            else:
                return None
        groups.append((ga, gb))
    if any(a[k] != 1 for k in range(i, len(a))) or any(b[k] != 1 for k in range(j, len(b))):
        return None
    if not groups:
        groups.append(([], []))
    groups[-1][0].extend(range(i, len(a)))
    groups[-1][1].extend(range(j, len(b)))
    return groups


def _split_merged(ix: Affine, sizes: list[int], ext) -> list[Affine] | None:
    """``ix`` into a merged axis of the given sizes, as one index per size when it composes (``16*b + i`` with
    ``b < 2, i < 16`` into sizes (2, 16) is ``[b, i]``); None otherwise."""
    strides = [int(np.prod(sizes[k + 1:])) for k in range(len(sizes))]
    parts: dict[int, Affine] = {}
    if ix.const:
        return None
    for d, c in ix.terms:
        axes = [k for k, st in enumerate(strides) if st == c and sizes[k] > 1]
        if not isinstance(d, str) or len(axes) != 1 or axes[0] in parts or ext.get(d, 0) > sizes[axes[0]]:
            return None
        parts[axes[0]] = Affine.dim(d)
    return [parts.get(k, Affine.of({}, 0)) for k in range(len(sizes))]


def _affine_reader(a: tuple[int, ...], b: tuple[int, ...]):
    """(index into b, the statement's extents) -> index into a, or None where it is not affine."""
    groups = reshape_groups(a, b)
    if groups is None:
        return None

    def index_of(ix: tuple[Affine, ...], ext) -> tuple[Affine, ...] | None:
        out: list[Affine] = []
        for ga, gb in groups:
            flat = Affine.of({}, 0)
            for jb in gb:
                flat = flat.scale(b[jb]) + ix[jb]
            big = [i for i in ga if a[i] > 1]
            if len(big) <= 1:
                out += [flat if i == (big or ga[-1:])[0] else Affine.of({}, 0) for i in ga]
                continue
            parts = _split_merged(flat, [a[i] for i in ga], ext)
            if parts is None:
                return None
            out += parts
        return tuple(out)

    return index_of


def _reads_through(reader: Node, t: str, index_of) -> bool:
    """Every access of ``t`` in ``reader`` maps to an affine index of the reshape's input."""
    locals_ = {local for local, g in zip(reader.op.inputs, reader.inputs) if g == t}
    return all(index_of(a.index, st.extent) is not None for st in reader.op.statements for a in st.expr.accesses()
               if a.tensor in locals_)


def _reshape_read_by(graph: Graph, reshape: Node, reader: Node) -> bool:
    t = reshape.outputs[0]
    return (_is_reshape(reshape) and not reader.is_extern and t in reader.inputs
            and not any(_padded(reader.op, local) for local, g in zip(reader.op.inputs, reader.inputs) if g == t))


def split_reshape_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if not _is_reshape(node):
            continue
        a, b = graph.type_of[node.inputs[0]].shape, graph.type_of[node.outputs[0]].shape
        index_of = _affine_reader(a, b) if a != b else None
        if index_of is not None:
            for reader in dict.fromkeys(graph.consumers.get(node.outputs[0], [])):
                if _reshape_read_by(graph, node, reader) and _reads_through(reader, node.outputs[0], index_of):
                    yield (node.name, reader.name)


def read_through_reshape(graph: Graph, site: Site) -> Graph:
    node, reader = node_named(graph, site[0]), node_named(graph, site[1])
    if not _reshape_read_by(graph, node, reader):
        raise RuleNotApplicable(f"{site[1]!r} reads no reshape {site[0]!r}")
    src = node.inputs[0]
    index_of = _affine_reader(graph.type_of[src].shape, graph.type_of[node.outputs[0]].shape)
    if index_of is None or not _reads_through(reader, node.outputs[0], index_of):
        raise RuleNotApplicable(f"{site[1]!r} does not read reshape {site[0]!r} affinely")
    return _rewire(graph, node, {reader.name: _reread(reader, node.outputs[0], src, graph.type_of[src], index_of)})


# ---- a merging reshape undone by splitting the reader's loops -----------------------------------------
def _digits(c: int, factors: tuple[int, ...]) -> list[int]:
    out = []
    for f in reversed(factors):
        out.append(c % f)
        c //= f
    return out[::-1]


def _split_plan(op: Compute, seeds: dict[tuple[str, int], tuple[int, ...]], splittable: set[str]):
    """Propagate axis splits through the op: {(tensor, axis): factors}, {(statement, dim): factors}; None if stuck."""
    axes, dims = dict(seeds), {}
    changed = True
    while changed:
        changed = False
        for k, st in enumerate(op.statements):
            ext = st.extent
            for p, d in enumerate(st.out_dims):  # a split output axis splits its loop, and back
                if (st.out, p) in axes and dims.get((k, d)) != axes[(st.out, p)]:
                    if (k, d) in dims:
                        return None
                    dims[(k, d)], changed = axes[(st.out, p)], True
                if (k, d) in dims and (st.out, p) not in axes:
                    axes[(st.out, p)], changed = dims[(k, d)], True
            for acc in st.expr.walk():
                if isinstance(acc, IndexValue) and any((k, d) in dims for d in acc.index.vars()):
                    return None
                if not isinstance(acc, Access):
                    continue
                for m, ix in enumerate(acc.index):
                    f = axes.get((acc.tensor, m))
                    if f is not None and ix.is_plain_dim:
                        d = ix.terms[0][0]
                        if ext[d] != int(np.prod(f)) or dims.get((k, d), f) != f:
                            return None
                        if op.type_of[acc.tensor].shape[m] != int(np.prod(f)):
                            return None
                        if (k, d) not in dims:
                            dims[(k, d)], changed = f, True
                    elif f is not None and ix.terms:
                        if _radix_dims(ix, f, ext) is None:
                            return None
                        continue  # already read as its digits (4*a + b): the split axis is read as [a, b]
                    split_dims = [d for d in ix.vars() if (k, d) in dims]
                    if split_dims and acc.tensor not in splittable and all(d in st.reduce_dims for d in split_dims):
                        # a tensor whose layout stays (a run-time input, as a conv's weight) read along a split
                        # reduction: re-indexed by _split_op
                        continue
                    if split_dims:
                        if not ix.is_plain_dim:
                            return None
                        f = dims[(k, split_dims[0])]
                        if axes.get((acc.tensor, m), f) != f or op.type_of[acc.tensor].shape[m] != int(np.prod(f)):
                            return None
                        if (acc.tensor, m) not in axes:
                            axes[(acc.tensor, m)], changed = f, True
    if any(t not in splittable for t, _ in axes):
        return None
    return axes, dims


def _radix_dims(ix: Affine, factors: tuple[int, ...], extent: dict[str, int]) -> list[str] | None:
    """The dims, outer first, of an index that is already the mixed-radix number of ``factors``
    (``4*a + b`` with a < n1, b < 4 for factors (n1, 4)); None otherwise."""
    if ix.const != 0 or len(ix.terms) != len(factors) or any(not isinstance(d, str) for d in ix.dims):
        return None
    terms = sorted(ix.terms, key=lambda t: -t[1])
    stride = 1
    for (d, c), f in zip(reversed(terms), reversed(factors)):
        if c != stride or extent.get(d) != f:
            return None
        stride *= f
    return [d for d, _ in terms]


def _split_shape(shape: tuple[int, ...], tensor: str, axes) -> tuple[int, ...]:
    out: list[int] = []
    for m, n in enumerate(shape):
        out += list(axes.get((tensor, m), (n,)))
    return tuple(out)


def _mixed_radix(names: list[str], factors: tuple[int, ...]) -> Affine:
    """``d = f2*f3*d0 + f3*d1 + d2``: a loop split in ``factors`` (outer first) as the value of the old loop."""
    terms, stride = {}, 1
    for n, f in zip(reversed(names), reversed(factors)):
        terms[n], stride = stride, stride * f
    return Affine.of(terms)


def _split_op(op: Compute, axes, dims) -> Compute:
    statements = []
    for k, st in enumerate(op.statements):
        used = {d for d, _ in st.extents}
        names = {d: [fresh_name(f"{d}_{j}", used) for j in range(len(f))] for (kk, d), f in dims.items() if kk == k}
        values = {d: _mixed_radix(names[d], f) for (kk, d), f in dims.items() if kk == k}

        def split_index(tensor: str, index: tuple[Affine, ...], names=names, values=values, ext=st.extent
                        ) -> tuple[Affine, ...]:
            out: list[Affine] = []
            for m, ix in enumerate(index):
                f = axes.get((tensor, m))
                if f is None:  # an axis that keeps its extent: the split loops recombined into the old index
                    out.append(ix.substitute(values))
                elif ix.is_plain_dim:
                    out += [Affine.dim(n) for n in names[ix.terms[0][0]]]
                elif ix.terms:  # read as its digits already (checked by _split_plan)
                    out += [Affine.dim(d) for d in _radix_dims(ix, f, ext)]
                else:
                    out += [Affine.of({}, c) for c in _digits(ix.const, f)]
            return tuple(out)

        def sub(e, split_index=split_index):
            return Access(e.tensor, split_index(e.tensor, e.index)) if isinstance(e, Access) else e

        extents, out_dims = [], []
        for d, n in st.extents:
            extents += list(zip(names[d], dims[(k, d)])) if d in names else [(d, n)]
        for d in st.out_dims:
            out_dims += names.get(d, [d])
        statements.append(Statement(st.out, tuple(out_dims), st.reduce, map_expr(st.expr, sub), tuple(extents),
                                    st.padding))
    types = tuple((n, TensorType(_split_shape(t.shape, n, axes), t.dtype)) for n, t in op.types)
    return Compute(op.inputs, op.outputs, tuple(statements), types)


def _merge_plan(graph: Graph, reshape: Node, reader: Node):
    if not _reshape_read_by(graph, reshape, reader):
        return None
    a, b = graph.type_of[reshape.inputs[0]].shape, graph.type_of[reshape.outputs[0]].shape
    groups = reshape_groups(a, b)
    if groups is None or any(len(ga) > 1 and len(gb) > 1 for ga, gb in groups):
        return None
    if all(len(ga) == 1 for ga, _ in groups):  # no merge: read_through_reshape's case
        return None
    op = reader.op
    t = reshape.outputs[0]
    y = [local for local, g in zip(op.inputs, reader.inputs) if g == t]
    if len(y) != 1:
        return None
    seeds = {}
    for ga, gb in groups:
        if len(ga) > 1:
            (m,) = gb
            seeds[(y[0], m)] = tuple(a[i] for i in ga)
        elif len(gb) > 1:
            return None
    consts = constant_locals(graph, reader)
    splittable = {y[0]} | set(consts) | set(op.temporaries) | set(op.outputs)
    plan = _split_plan(op, seeds, splittable)
    return None if plan is None else (y[0], plan)


def merge_reshape_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if _is_reshape(node):
            for reader in dict.fromkeys(graph.consumers.get(node.outputs[0], [])):
                if _merge_plan(graph, node, reader) is not None:
                    yield (node.name, reader.name)


def split_loops_through_reshape(graph: Graph, site: Site) -> Graph:
    reshape, reader = node_named(graph, site[0]), node_named(graph, site[1])
    got = _merge_plan(graph, reshape, reader)
    if got is None:
        raise RuleNotApplicable(f"{site[1]!r} cannot read through the merging reshape {site[0]!r}")
    y, (axes, dims) = got
    op = reader.op
    new_op = _split_op(op, axes, dims)
    used = set(graph.type_of)
    consts = constant_locals(graph, reader)
    inputs, new_consts, new_types, after = list(reader.inputs), {}, {}, []
    for k, (local, g) in enumerate(zip(op.inputs, reader.inputs)):
        if local == y:
            inputs[k] = reshape.inputs[0]
        elif local in consts and any(tensor == local for tensor, _ in axes):
            inputs[k] = fresh_name(f"{g}_split", used)
            shape = new_op.type_of[local].shape
            new_consts[inputs[k]] = DeferredConstant(new_op.type_of[local], f"reshape {shape}", (consts[local],),
                                                     lambda a, shape=shape: a.reshape(shape))
    outputs = list(reader.outputs)
    for k, (local, g) in enumerate(zip(op.outputs, reader.outputs)):
        if any(tensor == local for tensor, _ in axes):
            outputs[k] = fresh_name(f"{g}_split", used)
            new_types[outputs[k]] = new_op.type_of[local]
            after.append(Node(fresh_name(f"{reader.name}_unsplit", {n.name for n in graph.nodes}),
                              Extern.of("reshape", shape=graph.type_of[g].shape), (outputs[k],), (g,)))
    new_reader = Node(reader.name, new_op, tuple(inputs), tuple(outputs))
    nodes = []
    for n in graph.nodes:
        nodes += [new_reader, *after] if n is reader else [n]
    if not any(reshape.outputs[0] in n.inputs for n in nodes if n is not reshape) and reshape.outputs[0] not in graph.outputs:
        nodes = [n for n in nodes if n is not reshape]
    split = rebuild(graph, nodes, new_types=new_types, new_constants=new_consts)
    split = _read_through_unsplit(split, {n.name for n in after})
    # a transpose of a graph input feeding the reshape (an exported model's reshape-transpose chain at its
    # entry) is read through in the same move: alone, the split loops read the transposed copy in an order no
    # schedule likes, a cost the copy's removal then repays. (A copy of a node's output is left to the other
    # moves: its producer may write it, or fuse with its reader)
    copy = split.producer.get(reshape.inputs[0])
    if copy is not None and all(g not in split.producer for g in copy.inputs) and \
            (copy.name,) in set(copy_sites(split)):
        split = inline_copy(split, (copy.name,))
    return split


def _read_through_unsplit(graph: Graph, unsplit: set[str]) -> Graph:
    """The reshapes back to the old shape read through where their readers allow (a reshape of them merged,
    an identity removed, a compute reader re-indexed): the split and its clean-up are one move."""
    for _ in range(8 * len(unsplit) + 8):
        touched = unsplit | {r.name for n in graph.nodes if n.name in unsplit for r in graph.consumers.get(n.outputs[0], [])
                             if _is_reshape(r)}
        for rule in (MERGE_RESHAPES, REMOVE_IDENTITY, READ_THROUGH_RESHAPE):
            site = next((s for s in rule.matches(graph) if s[0] in touched), None)
            if site is not None:
                graph = rule.apply(graph, site)
                break
        else:
            return graph
    return graph


# ---- examples -------------------------------------------------------------------------------------
def _transpose_examples() -> list[Graph]:
    out = []
    for b_, m, n in ((2, 3, 4), (1, 5, 2)):  # transpose of transpose: the identity
        b = GraphBuilder(f"transpose_transpose_{m}")
        x = b.input("x", (b_, m, n))
        t = b.compute1("O[a,j,i] = X[a,i,j]", {"X": x}, "transpose")
        t2 = b.compute1("O[a,j,i] = X[a,i,j]", {"X": t}, "transpose2")
        out.append(b.build([b.compute1("O[a,i,j] = X[a,i,j] * X[a,i,j]", {"X": t2}, "square")]))
    for m, k, n in ((3, 4, 5), (2, 6, 3)):  # a transposed operand of a matmul, read by two ops
        b = GraphBuilder(f"matmul_transposed_{k}")
        x, y = b.input("x", (m, k)), b.input("y", (n, k))
        yt = b.compute1("O[k,j] = Y[j,k]", {"Y": y}, "transpose")
        mm = b.compute1("O[i,j] += X[i,k] * Y[k,j]", {"X": x, "Y": yt}, "matmul")
        out.append(b.build([mm, b.compute1("O[k,j] = Y[k,j] * 3.0", {"Y": yt}, "scale")]))
    return out


def _identity_examples() -> list[Graph]:
    out = []
    for shape in ((3, 4), (2, 3, 5)):
        b = GraphBuilder(f"identity_reshape_{len(shape)}")
        x = b.input("x", shape)
        (r,) = b.extern("reshape", [x], shape=shape)
        dims = ",".join(f"i{k}" for k in range(len(shape)))
        c = b.compute1(f"O[{dims}] = X[{dims}]", {"X": r}, "copy")
        out.append(b.build([b.compute1(f"O[{dims}] = X[{dims}] * X[{dims}]", {"X": c}, "square")]))
    return out


def _reshape_chain_examples() -> list[Graph]:
    out = []
    for shape, mid, last in (((2, 3, 4), (6, 4), (3, 8)), ((4, 6), (24,), (2, 2, 6))):
        b = GraphBuilder(f"reshape_reshape_{len(last)}")
        x = b.input("x", shape)
        (r,) = b.extern("reshape", [x], shape=mid)
        (r2,) = b.extern("reshape", [r], shape=last)
        dims = ",".join(f"i{k}" for k in range(len(last)))
        out.append(b.build([b.compute1(f"O[{dims}] = X[{dims}] * X[{dims}]", {"X": r2}, "square")]))
    return out


def _split_reshape_examples() -> list[Graph]:
    out = []
    for bsz, t, h, d in ((2, 3, 2, 4), (1, 4, 3, 2)):  # (b, t, h*d) -> (b, t, h, d) -> transpose: heads
        b = GraphBuilder(f"split_heads_{h}")
        x = b.input("x", (bsz, t, h * d))
        (r,) = b.extern("reshape", [x], shape=(bsz, t, h, d))
        out.append(b.build([b.compute1("O[a,j,i,k] = X[a,i,j,k]", {"X": r}, "transpose")]))
    for bsz, t, d in ((2, 3, 4), (3, 5, 2)):  # (b, t, d) -> (b*t, d) read as Y[t*a + i, k]: back to X[a, i, k]
        b = GraphBuilder(f"merged_rows_{t}")
        x = b.input("x", (bsz, t, d))
        (r,) = b.extern("reshape", [x], shape=(bsz * t, d))
        out.append(b.build([b.compute1(f"O[a,i,k] = X[{t}*a+i,k] * 2.0", {"X": r}, "scale", extents={"a": bsz, "i": t})]))
    return out


def _merge_reshape_examples() -> list[Graph]:
    rng = np.random.default_rng(0)
    out = []
    for bsz, t, d in ((2, 3, 4), (3, 2, 5)):  # (b, t, d) -> (b*t, d) -> layer norm over rows -> (b, t, d)
        b = GraphBuilder(f"flatten_layer_norm_{d}")
        x = b.input("x", (bsz, t, d))
        g = b.constant(rng.standard_normal(d).astype(np.float32), "g")
        (r,) = b.extern("reshape", [x], shape=(bsz * t, d))
        ln = b.compute1(f"S[i,u] += X[i,r]\nD[i,j] = X[i,j] - S[i,0] / {d}.0\nQ[i,u] += D[i,r] * D[i,r]\n"
                        f"O[i,j] = D[i,j] * rsqrt(Q[i,0] / {d}.0 + 0.00001) * G[j]", {"X": r, "G": g}, "layer_norm",
                        extents={"u": 1, "r": d}, outputs=["O"])
        (back,) = b.extern("reshape", [ln], shape=(bsz, t, d))
        out.append(b.build([back]))
    for bsz, h, t, d in ((2, 2, 3, 4), (1, 3, 2, 2)):  # heads merged back, then the output projection
        b = GraphBuilder(f"merge_heads_{h}")
        x = b.input("x", (bsz, t, h, d))
        w = b.constant(rng.standard_normal((h * d, 5)).astype(np.float32), "w")
        (r,) = b.extern("reshape", [x], shape=(bsz, t, h * d))
        out.append(b.build([b.compute1("O[a,i,j] += X[a,i,k] * W[k,j]", {"X": r, "W": w}, "proj")]))
    for bsz, c, n in ((2, 3, 4), (3, 2, 3)):  # (b, c, 4) -> (b, 4c) read with a run-time weight: re-indexed, not split
        b = GraphBuilder(f"merged_channels_input_weight_{c}")
        x, w = b.input("x", (bsz, c, 4)), b.input("w", (n, 4 * c))
        (r,) = b.extern("reshape", [x], shape=(bsz, 4 * c))
        out.append(b.build([b.compute1("O[a,j] += X[a,k] * W[j,k]", {"X": r, "W": w}, "proj")]))
    for bsz, t, c in ((2, 3, 4), (3, 2, 2)):  # rows read as their digits already (t*a + i), columns merged
        b = GraphBuilder(f"digits_and_merged_{c}")
        x, w = b.input("x", (bsz, t, c, 2)), b.input("w", (3, 2 * c))
        (r,) = b.extern("reshape", [x], shape=(bsz * t, 2 * c))
        out.append(b.build([b.compute1(f"O[a,i,j] += X[{t}*a+i,k] * W[j,k]", {"X": r, "W": w}, "proj",
                                       extents={"a": bsz, "i": t})]))
    for bsz, c, n in ((2, 3, 4), (3, 2, 2)):  # transpose, merging reshape, contraction: read through both at once
        b = GraphBuilder(f"transposed_merged_channels_{c}")
        x, w = b.input("x", (4, bsz, c)), b.input("w", (n, 4 * c))
        t = b.compute1("O[a,k,r] = X[r,a,k]", {"X": x}, "transpose")
        (r,) = b.extern("reshape", [t], shape=(bsz, 4 * c))
        out.append(b.build([b.compute1("O[a,j] += X[a,k] * W[j,k]", {"X": r, "W": w}, "proj")]))
    return out


def _write_back_examples() -> list[Graph]:
    rng = np.random.default_rng(1)
    out = []
    for m, k, n in ((3, 4, 6), (2, 5, 4)):  # a matmul whose output is transposed and split: C[i, 2*a+b] -> O[a, i, b]
        b = GraphBuilder(f"matmul_split_transposed_{n}")
        x = b.input("x", (m, k))
        w = b.constant(rng.standard_normal((k, n)).astype(np.float32), "w")
        mm = b.compute1("O[i,j] += X[i,k] * W[k,j]", {"X": x, "W": w}, "matmul")
        out.append(b.build([b.compute1("O[a,i,c] = X[i,2*a+c]", {"X": mm}, "transpose", extents={"a": n // 2, "c": 2})]))
    for m, k, n in ((3, 4, 6), (2, 3, 8)):  # a matmul's output reshaped (split), then transposed: O[a, i, b]
        b = GraphBuilder(f"matmul_reshaped_transposed_{n}")
        x, w = b.input("x", (m, k)), b.input("w", (k, n))
        mm = b.compute1("O[i,j] += X[i,k] * W[k,j]", {"X": x, "W": w}, "matmul")
        (r,) = b.extern("reshape", [mm], shape=(m, n // 2, 2))
        out.append(b.build([b.compute1("O[a,i,c] = X[i,a,c]", {"X": r}, "transpose")]))
    for h, w_ in ((3, 4), (4, 2)):  # an elementwise op with an index-valued term, then a transpose
        b = GraphBuilder(f"scaled_transposed_{h}")
        x = b.input("x", (2, h, w_))
        s = b.compute1("O[a,i,j] = X[a,i,j] * 2.0 + i", {"X": x}, "scale")
        out.append(b.build([b.compute1("O[j,a,i] = X[a,i,j]", {"X": s}, "transpose")]))
    return out


# (X^T)[i, j] read as X[j, i]: a copy op substituted into the index maps of the compute ops reading it
INLINE_COPY = Rule("inline_copy_into_readers", "movement",
                   "C(T) with T[d] = X[f(d)] a copy (transpose, slice) = C reading X[f(g)] wherever it read T[g]",
                   copy_sites, inline_copy, _transpose_examples, polynomial=True)
REMOVE_IDENTITY = Rule("remove_identity_movement", "movement",
                       "reshape(X, shape(X)) = X and O[d] = X[d] = X: an identity copy or reshape is its input",
                       identity_sites, remove_identity, _identity_examples, polynomial=True)
MERGE_RESHAPES = Rule("merge_reshapes", "movement", "reshape(reshape(X, s1), s2) = reshape(X, s2)",
                      reshape_chain_sites, merge_reshapes, _reshape_chain_examples, polynomial=True)
READ_THROUGH_RESHAPE = Rule("read_through_reshape", "movement",
                            "reshape(X, (.., n1, n2, ..))[.., a, b, ..] = X[.., a*n2 + b, ..] (and back, when the reader "
                            "indexes the merged axis as a*n2 + b with a < n1, b < n2)",
                            split_reshape_sites, read_through_reshape, _split_reshape_examples, polynomial=True)
SPLIT_LOOPS = Rule("split_loops_through_merging_reshape", "movement",
                   "C(reshape(X, (.., n1*n2, ..))) = reshape(C'(X)) with C's loop over the merged axis split in (n1, n2) "
                   "(and X = T[f(d)], a copy, read by C' as T[f(g)])",
                   merge_reshape_sites, split_loops_through_reshape, _merge_reshape_examples, polynomial=True)

WRITE_BACK_COPY = Rule("write_back_copy_in_producer", "movement",
                       "T[d] = C[f(d)] with f a transpose and split of axes, C read by T only = C's loops split and "
                       "its write-back indexed T[f^-1(e)]: the producer writes the copy's layout",
                       write_back_sites, write_back_copy, _write_back_examples, polynomial=True)

RULES = [INLINE_COPY, REMOVE_IDENTITY, MERGE_RESHAPES, READ_THROUGH_RESHAPE, SPLIT_LOOPS, WRITE_BACK_COPY]
