"""Rename-invariant workloads: one canonical spelling of a compute op's local names.

Two compute ops that differ only in what their tensors and dimensions are called compute the same
thing and want the same schedule, so the tuning database keys on the canonical form:

- inputs ``in0, in1, ..`` and outputs ``out0, out1, ..`` in their positional order (kernels are
  called positionally, so a graph node may swap its op for the canonical one without rewiring);
- temporaries ``t0, t1, ..`` in statement order;
- dimensions ``d0, d1, ..`` per statement, in the statement's loop (extent) order;
- the optional dimension names of tensor types are dropped, and ``types`` is ordered inputs,
  then statement results.

Extent order, statement order and everything else that is structure, not naming, is kept: the
canonical op is the same program spelled with other names, so a trace written for it (in canonical
stage and loop names) applies to every op with that canonical form.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Expr, IndexValue, map_expr
from superopt.ir.graph import Extern, Graph, Node
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType


@dataclass(frozen=True)
class Canonical:
    """A canonical compute and the renaming that produced it (original local name -> canonical)."""

    compute: Compute
    tensor_names: tuple[tuple[str, str], ...]

    @property
    def rename(self) -> dict[str, str]:
        return dict(self.tensor_names)


def _tensor_names(compute: Compute) -> dict[str, str]:
    names = {n: f"in{i}" for i, n in enumerate(compute.inputs)}
    for i, n in enumerate(compute.outputs):
        names.setdefault(n, f"out{i}")  # an output that is an input keeps its input name
    k = 0
    for st in compute.statements:
        if st.out not in names:
            names[st.out] = f"t{k}"
            k += 1
    return names


def _rename_affine(a: Affine, dims: Mapping[str, str]) -> Affine:
    return Affine.of({dims[d]: c for d, c in a.terms}, a.const)


def _rename_statement(st: Statement, tensors: Mapping[str, str]) -> Statement:
    dims = {d: f"d{i}" for i, (d, _) in enumerate(st.extents)}

    def node(e: Expr) -> Expr:
        if isinstance(e, Access):
            return Access(tensors[e.tensor], tuple(_rename_affine(ix, dims) for ix in e.index))
        if isinstance(e, IndexValue):
            return IndexValue(_rename_affine(e.index, dims))
        return e

    return Statement(
        out=tensors[st.out],
        out_dims=tuple(dims[d] for d in st.out_dims),
        reduce=st.reduce,
        expr=map_expr(st.expr, node),
        extents=tuple((dims[d], n) for d, n in st.extents),
        padding=tuple(sorted((tensors[t], v) for t, v in st.padding)),
    )


def canonical_form(compute: Compute) -> Canonical:
    """The canonical compute plus the tensor renaming (see the module docstring for the scheme)."""
    tensors = _tensor_names(compute)
    t = compute.type_of
    order = list(compute.inputs) + [st.out for st in compute.statements]
    types = tuple((tensors[n], TensorType(t[n].shape, t[n].dtype)) for n in order)
    statements = tuple(_rename_statement(st, tensors) for st in compute.statements)
    c = Compute(tuple(tensors[n] for n in compute.inputs), tuple(tensors[n] for n in compute.outputs),
                statements, types)
    return Canonical(c, tuple(tensors.items()))


def canonicalize(compute: Compute) -> Compute:
    """``compute`` with canonical tensor and dimension names: equal (and equal digest) for any two
    ops that differ only in naming. Idempotent."""
    return canonical_form(compute).compute


def canonicalize_kernels(graph: Graph) -> Graph:
    """Every compute node's op replaced by its canonical form (node inputs/outputs are positional,
    so the graph's own tensor names and wiring do not change)."""
    nodes = tuple(n if n.is_extern else Node(n.name, canonicalize(n.op), n.inputs, n.outputs) for n in graph.nodes)
    return graph.replace(nodes=nodes)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def structural_hashes(graph: Graph, op_digest: Callable[[Compute | Extern], str] | None = None
                      ) -> tuple[dict[str, str], list[str]]:
    """Hash-consing: (tensor -> hash, one hash per node in graph order).

    Each tensor's hash is built from what defines it: a graph input from its position and type, a
    constant from its content, a node output from the node's op digest (``op_digest``; default: the
    canonical compute's digest or an extern's text), its input tensors' hashes and the output position.
    Names (of nodes, tensors, the graph) do not enter any hash."""
    if op_digest is None:
        memo: dict[int, str] = {}

        def op_digest(op: Compute | Extern) -> str:
            if id(op) not in memo:
                memo[id(op)] = op.text() if isinstance(op, Extern) else canonicalize(op).digest()
            return memo[id(op)]

    tensor: dict[str, str] = {}
    for k, name in enumerate(graph.inputs):
        t = graph.type_of[name]
        tensor[name] = _sha(f"input {k} {t.shape} {t.dtype}")
    for name, c in graph.constants:
        tensor[name] = _sha(f"const {c.digest()}")
    nodes = []
    for node in graph.nodes:
        head = f"{op_digest(node.op)} ({','.join(tensor[i] for i in node.inputs)})"
        nodes.append(_sha(head))
        for k, o in enumerate(node.outputs):
            tensor[o] = _sha(f"{head} -> {k}")
    return tensor, nodes


def graph_digest(graph: Graph) -> str:
    """A rename-invariant structural digest of what ``graph`` computes (hash-consing, see
    :func:`structural_hashes`): the outputs' hashes in order, so node and tensor names, the graph's
    name and the order of independent nodes do not matter, and dead nodes are ignored. Graph search
    uses it to deduplicate explored graphs and to key caches."""
    tensor, _ = structural_hashes(graph)
    return _sha("outputs " + ",".join(tensor[o] for o in graph.outputs))


def workload_key(compute: Compute, constant_inputs: Iterable[str] = frozenset()) -> str:
    """Digest of the canonical compute plus which of its inputs are constants (given in
    ``compute``'s own local names; constness changes the best schedule: constants are packed once)."""
    form = canonical_form(compute)
    rename = form.rename
    unknown = sorted(set(constant_inputs) - set(compute.inputs))
    if unknown:
        raise ValueError(f"constant input(s) {unknown} are not inputs of the compute ({list(compute.inputs)})")
    consts = sorted(rename[n] for n in constant_inputs)
    h = hashlib.sha256(form.compute.digest().encode())
    h.update(("\nconst " + ",".join(consts)).encode())
    return h.hexdigest()


def canonical_constants(compute: Compute, constant_inputs: Iterable[str]) -> frozenset[str]:
    """``constant_inputs`` (local names of ``compute``) in canonical names."""
    rename = canonical_form(compute).rename
    return frozenset(rename[n] for n in constant_inputs)


__all__ = ["Canonical", "canonical_constants", "canonical_form", "canonicalize", "canonicalize_kernels",
           "graph_digest", "structural_hashes", "workload_key"]
