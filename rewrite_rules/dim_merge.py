"""A contraction's output dims that run together in every tensor as one: ``C[k,j,i] += A[j,i,r] * B[k,r]`` over
``n = j*I + i``, on ``reshape(A, (J*I, R))`` and ``reshape(C, (K, J*I))``.

Dims that every tensor indexes in the same order, next to each other and whole, address memory as one dim of their
product: reshaping the op's tensors to that one dim is a free alias, and the kernel walks one loop where it walked
two. It matters for the output's innermost dim, which the register tile's vector columns run along: where its extent
is no multiple of the vector width, the columns fused with the dim outside it split only by whole rows of it (146
columns of ``i`` under ``j``: one tile of 146 by 2 rows, or a linear loop that no operand may be packed for), and over
the merged dim they split in whole vectors with a packed panel (``jiml,kml->kji``, 7 x 146 columns: 1.36x on 2 threads
of an Intel Xeon). Merging other dims (a contraction's reduction dims) gained nothing on the contractions measured
and lost on some, so only the chain that ends at the output's innermost dim merges.

It applies to an op of one contraction statement (``+=`` over reduction dims) whose every index is a plain dim and
whose every tensor is read once, where the chain is all the output dims of each operand that reads it (the merged
dim is then that operand's one free dim, as in a matrix product); a layout move of the layout pass
(``search.graph.rewrite``), never a graph search move.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from rewrite_rules import Rule, RuleNotApplicable, Site, node_named
from rewrite_rules.graph_edit import reads_constant, with_reshaped_tensors
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, IndexValue, map_expr
from superopt.ir.graph import Graph
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType

FAMILY = "layout_pass"


def _plain(ix: Affine) -> str | None:
    """The dim a plain index ``d`` names (coefficient 1, no constant), else None."""
    terms = list(ix.terms)
    return terms[0][0] if len(terms) == 1 and terms[0][1] == 1 and ix.const == 0 else None


def _chain(op: Compute) -> tuple[str, ...] | None:
    """The output dims, outermost first, that merge with the output's innermost one; None when fewer than two do."""
    if len(op.statements) != 1:
        return None
    st = op.statements[0]
    if st.reduce != "+=" or not st.reduce_dims or st.padding or not st.out_dims:
        return None
    if any(isinstance(e, IndexValue) for e in st.expr.walk()):
        return None
    accesses = [*st.expr.accesses(), Access(st.out, tuple(Affine.dim(d) for d in st.out_dims))]
    if len({a.tensor for a in accesses}) != len(accesses):
        return None  # a tensor read twice (or the output read): one reshape cannot serve two index patterns
    dims: list[list[str]] = []
    for a in accesses:
        names = [_plain(ix) for ix in a.index]
        if any(n is None for n in names) or len(set(names)) != len(names):
            return None  # (a diagonal's dim twice: merging would drop both)
        dims.append([n for n in names if n is not None])
    types, ext = op.type_of, st.extent
    chain = [st.out_dims[-1]]
    for d in reversed(st.out_dims[:-1]):
        ok = True
        for a, names in zip(accesses, dims):
            if (d in names) != (chain[0] in names):
                ok = False
            elif d in names:
                at = names.index(d)
                # next to the chain, and whole (a slice's axis is no free reshape)
                ok = names.index(chain[0]) == at + 1 and types[a.tensor].shape[at] == ext[d]
            if not ok:
                break
        if not ok:
            break
        chain.insert(0, d)
    if any(types[a.tensor].shape[names.index(chain[-1])] != ext[chain[-1]]
           for a, names in zip(accesses, dims) if chain[-1] in names):
        return None
    out = set(st.out_dims)
    if any(chain[0] in names and out & set(names) != set(chain) for names in dims[:-1]):
        # an operand with output dims besides the chain: the merged dim is one of its several free dims, and the
        # default then tiles it beside another of them (B[m,l,j,k,n]'s l, j under k: 0.70x)
        return None
    return tuple(chain) if len(chain) > 1 else None


def _merge_op(op: Compute, chain: tuple[str, ...]) -> tuple[Compute, set[str]]:
    """The op over one dim (named as the chain's outermost) for ``chain``, and the tensors it reshapes."""
    st = op.statements[0]
    ext = st.extent
    head, rest = chain[0], set(chain[1:])
    merged: set[str] = set()

    def sub(e):
        if isinstance(e, Access) and any(_plain(ix) == head for ix in e.index):
            merged.add(e.tensor)
            return Access(e.tensor, tuple(ix for ix in e.index if _plain(ix) not in rest))
        return e

    expr = map_expr(st.expr, sub)
    merged.add(st.out)
    n = math.prod(ext[d] for d in chain)
    extents = tuple((d, n if d == head else e) for d, e in st.extents if d not in rest)
    new_st = Statement(st.out, tuple(d for d in st.out_dims if d not in rest), st.reduce, expr, extents, st.padding)
    accesses = {a.tensor: a for a in st.expr.accesses()} | {st.out: Access(st.out, tuple(Affine.dim(d)
                                                                                         for d in st.out_dims))}
    types = []
    for t, tt in op.types:
        if t in merged:
            names = [_plain(ix) for ix in accesses[t].index]
            at = names.index(head)
            shape = tt.shape[:at] + (n,) + tt.shape[at + len(chain):]
            tt = TensorType(shape, tt.dtype)
        types.append((t, tt))
    return Compute(op.inputs, op.outputs, (new_st,), tuple(types)), merged


def dim_merge_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if not node.is_extern and (chain := _chain(node.op)) is not None \
                and not reads_constant(graph, node, _merge_op(node.op, chain)[1]):
            yield (node.name,)  # (a constant operand reshaped would be a pass of its own)


def merge_dims(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    if node.is_extern or (chain := _chain(node.op)) is None:
        raise RuleNotApplicable(f"{site[0]!r} is no contraction whose output's innermost dims merge")
    op, merged = _merge_op(node.op, chain)
    return with_reshaped_tensors(graph, node, op, merged, "merged")


def merge_dims_where(graph: Graph, lanes: int) -> Graph:
    """Every contraction whose output's innermost dim, no multiple of ``lanes`` long, merges with the dims outside
    it (one that is a multiple already splits into whole vectors)."""
    for (name,) in list(dim_merge_sites(graph)):
        op = node_named(graph, name).op
        st = op.statements[0]
        if st.extent[st.out_dims[-1]] % lanes:
            graph = merge_dims(graph, (name,))
    return graph


def _examples() -> list[Graph]:
    from superopt.builder import GraphBuilder

    out = []
    b = GraphBuilder("permuted_contraction")
    a = b.input("A", (3, 5, 4, 2))
    w = b.input("B", (6, 4, 2))
    out.append(b.build([b.compute1("C[k,j,i] += A[j,i,m,l] * B[k,m,l]", {"A": a, "B": w}, "contract")]))
    b = GraphBuilder("three_merged_dims")
    a = b.input("A", (3, 4, 3, 5))
    w = b.input("B", (3, 2))
    out.append(b.build([b.compute1("C[n,i,j,k] += A[r,i,j,k] * B[r,n] * 0.5", {"A": a, "B": w}, "contract")]))
    return out


MERGE_DIMS = Rule("merge_output_dims_of_contraction", FAMILY,
                  "sum_r A[.., j, i, ..] * B[..] over (j, i) = the same over n = j*I + i of reshape(A, (.., J*I, ..))",
                  dim_merge_sites, merge_dims, _examples, polynomial=True)
RULES: list[Rule] = [MERGE_DIMS]

__all__ = ["MERGE_DIMS", "RULES", "merge_dims", "merge_dims_where", "dim_merge_sites"]
