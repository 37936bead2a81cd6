"""Control flow: If, Loop and Scan (Scan-8 through an old-version adapter), with branches and bodies imported
by superopt's own importer.

Each branch or body becomes a one-graph ONNX model: its formal inputs (typed from the values that will
flow in: a Loop's carried values from their initial values, a Scan's slices from its scanned inputs),
then the values it reads from the enclosing graph. :func:`import_onnx_model` imports it strictly (a node
with no native lowering inside makes the whole control-flow node fall back), with the enclosing graph's
constants bound, so shape arithmetic inside folds. The node then becomes an ``if``, ``loop`` or ``scan``
extern (:mod:`superopt.ir.externs.control_flow`) holding the imported Graphs; they run compiled.

An If whose condition is a constant when importing is resolved then: the chosen branch is inlined (and
folds to constants where everything it reads is constant). A Loop with scan outputs needs its trip count
when importing (it fixes their shapes).

The importer hands a converter of a node with subgraphs the node's inputs (``""`` ones as None) followed by
the values its subgraphs read from the enclosing graph, in :func:`outer_scope_reads` order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from superopt import ops
from superopt.builder import GraphBuilder
from superopt.frontends.onnx_fallback import outer_scope_reads
from superopt.frontends.onnx_ops.context import NeedsConstant, OnnxImportError, _conv, _Ctx
from superopt.frontends.onnx_ops.old_versions import ADAPTERS
from superopt.ir.externs import run_time_shaped
from superopt.ir.externs.control_flow import Body
from superopt.ir.graph import Graph
from superopt.ir.types import TensorType

ONNX_ELEM = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE, "int64": onnx.TensorProto.INT64,
             "int32": onnx.TensorProto.INT32, "bool": onnx.TensorProto.BOOL}
INT64_MAX = np.iinfo(np.int64).max
MAX_UNROLL = 64  # the most iterations a Loop is unrolled to when its body cannot run as one compiled Graph


def _split(c: _Ctx, ins: list) -> tuple[list, list[tuple[str, str]]]:
    """The node's own inputs (padded with None to its input count) and its outer reads (ONNX name, tensor)."""
    n = len(c.node.input)
    own = list(ins[:n]) + [None] * max(0, n - len(ins))
    outer = list(zip(outer_scope_reads(c.node), ins[n:], strict=True))
    return own, outer


def _subgraph(c: _Ctx, name: str) -> onnx.GraphProto:
    for a in c.node.attribute:
        if a.name == name and a.type == onnx.AttributeProto.GRAPH:
            return a.g
    raise OnnxImportError(f"{c.node.op_type} has no {name!r} subgraph")


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_ELEM[t.dtype], t.shape)


def import_body(c: _Ctx, g: onnx.GraphProto, formal: Sequence[TensorType | str], outer: Sequence[tuple[str, str]],
                what: str, every_read: bool = False) -> tuple[Graph, list[str]]:
    """Import subgraph ``g`` as a Graph. Its formal inputs are given as types (values the extern passes in
    at run time) or as enclosing-graph tensors; the outer reads it needs follow (all of ``outer`` with
    ``every_read``). Tensors that are constants are bound (folded inside); the Graph's inputs are the
    rest, in order, and the enclosing-graph tensors among them are returned (formal ones first)."""
    from superopt.frontends.onnx_frontend import import_onnx_model  # the importer imports the converters

    b = c.b
    if len(g.input) != len(formal):
        raise OnnxImportError(f"{what} takes {len(g.input)} inputs but the node gives it {len(formal)}")
    bound = {i.name for i in g.input} | {t.name for t in g.initializer}
    reads = set(outer_scope_reads(helper.make_node("If", [], [], then_branch=g)))  # the names g reads from outside
    made = {x for n in g.node for x in n.output}
    reads |= {o.name for o in g.output if o.name not in bound and o.name not in made}
    if every_read and any(n in bound for n, _ in outer):
        raise OnnxImportError(f"{what} defines a name it also reads from the enclosing graph")
    outer_used = [(n, t) for n, t in outer if (every_read or n in reads) and n not in bound]
    given = [(i.name, f) for i, f in zip(g.input, formal) if isinstance(f, str)] + outer_used
    ins = [_value_info(i.name, f if isinstance(f, TensorType) else b.type(f)) for i, f in zip(g.input, formal)]
    ins += [_value_info(n, b.type(t)) for n, t in outer_used]
    model = helper.make_model(
        helper.make_graph(list(g.node), _name(g.name or what), ins, list(g.output), initializer=list(g.initializer)),
        opset_imports=[helper.make_opsetid("", c.opset)])
    consts = {n: b.const_value(t) for n, t in given if b.const_value(t) is not None}
    try:
        im = import_onnx_model(model, bind=consts, strict=True)
    except NeedsConstant as err:  # the caller may bind the graph input it comes from and try again
        onnx_name = {_name(n): n for n, _ in outer_used}.get(err.tensor or "")
        raise NeedsConstant(f"{what}: {err}", tensor=onnx_name) from None
    except OnnxImportError as err:
        raise OnnxImportError(f"{what}: {err}") from None
    if any(any(run_time_shaped(n)) for n in im.graph.nodes):
        raise OnnxImportError(f"{what} gives a value whose shape is known only at run time (NonZero, Unique, ...)")
    runtime = {n: t for n, t in given if n not in consts}
    return im.graph, [runtime[n] for n in im.input_names if n in runtime]


def _name(s: str) -> str:
    """A name as the graph builder cleans it."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", s)
    return s if s and not s[0].isdigit() else "t_" + s


def inline(b: GraphBuilder, graph: Graph, args: Sequence[str]) -> list[str]:
    """Copy ``graph``'s nodes into ``b`` with its inputs bound to ``args``; its outputs as ``b`` tensors."""
    m = dict(zip(graph.inputs, args, strict=True))
    for n, cst in graph.constants:
        m[n] = b.constant(cst.array, dtype=cst.array.dtype.name)
    for node in graph.nodes:
        ins = [m[i] for i in node.inputs]
        if node.is_extern:
            outs = b.extern(node.op.kind, ins, name=node.name, **node.op.attr)
        else:
            outs = b.add_compute(node.op, ins, name=node.name)
        m.update(zip(node.outputs, outs, strict=True))
    return [m[o] for o in graph.outputs]


def _scalar(c: _Ctx, t: str | None) -> np.ndarray | None:
    v = None if t is None else c.b.const_value(t)
    return None if v is None else np.asarray(v).reshape(-1)


@_conv("If")
def _if(c: _Ctx, ins):
    own, outer = _split(c, ins)
    cond = _scalar(c, own[0])
    then_g, else_g = _subgraph(c, "then_branch"), _subgraph(c, "else_branch")
    if cond is not None:  # resolved when importing: inline the branch taken
        if cond.size != 1:
            raise OnnxImportError(f"If condition must hold one element, not {cond.size}")
        g = then_g if bool(cond[0]) else else_g
        body, args = import_body(c, g, [], outer, "then branch" if bool(cond[0]) else "else branch")
        return inline(c.b, body, args)
    then_b, args = import_body(c, then_g, [], outer, "then branch", every_read=True)
    else_b, _ = import_body(c, else_g, [], outer, "else branch", every_read=True)  # the same inputs
    return c.b.extern("if", [own[0], *args], name="if", then_body=Body(then_b), else_body=Body(else_b))


@_conv("Loop")
def _loop(c: _Ctx, ins):
    own, outer = _split(c, ins)
    b = c.b
    m_t, cond_t, carried = own[0], own[1], own[2:]
    body_g = _subgraph(c, "body")
    n_scan = len(body_g.output) - 1 - len(carried)
    limit, go = _scalar(c, m_t), _scalar(c, cond_t)
    trips = -1
    if n_scan > 0:
        if m_t is None:
            raise OnnxImportError("a Loop with scan outputs and no trip count has outputs of run-time length")
        if limit is None:
            raise NeedsConstant(f"Loop trip count ({c.node.input[0]!r}) must be a constant: it fixes the length of "
                                "its scan outputs", tensor=c.node.input[0])
        trips = max(int(limit[0]), 0) if go is None or bool(go[0]) else 0
    formal = [TensorType((), "int64"), TensorType((), "bool"), *(b.type(t) for t in carried)]
    try:
        body, args = import_body(c, body_g, formal, outer, "loop body")
    except OnnxImportError as err:  # e.g. the body needs its iteration number as a constant: unroll it
        if limit is None or int(limit[0]) > MAX_UNROLL:
            raise
        return _unroll(c, body_g, own, outer, int(limit[0]), str(err))
    m_in = m_t if m_t is not None else b.constant(np.array(INT64_MAX, np.int64), dtype="int64")
    cond_in = cond_t if cond_t is not None else b.constant(np.array(True), dtype="bool")
    return b.extern("loop", [m_in, cond_in, *carried, *args], name="loop", body=Body(body), n_carried=len(carried),
                    trips=trips)


def _unroll(c: _Ctx, g: onnx.GraphProto, own: list, outer: list[tuple[str, str]], limit: int, why: str) -> list[str]:
    """The Loop as ``limit`` copies of its body (fewer if its condition turns false), each imported with its
    iteration number as a constant; the condition must be a constant when importing at every step."""
    b = c.b
    go_t = own[1] if own[1] is not None else b.constant(np.array(True), dtype="bool")
    carried = list(own[2:])
    nc = len(carried)
    scans: list[list[str]] = []
    for i in range(limit):
        go = _scalar(c, go_t)
        if go is None:
            raise NeedsConstant(f"{why}; unrolling it needs a condition known when importing",
                                tensor=c.node.input[1] if i == 0 else None)
        if not bool(go[0]):
            break
        it = b.constant(np.array(i, np.int64), dtype="int64")
        body, args = import_body(c, g, [it, go_t, *carried], outer, f"loop body (iteration {i})")
        outs = inline(b, body, args)
        go_t, carried = outs[0], outs[1:1 + nc]
        scans.append(outs[1 + nc:])
    n_scan = len(g.output) - 1 - nc
    if n_scan and not scans:
        raise OnnxImportError(f"{why}; unrolled, it runs no iteration, which leaves its scan outputs untyped")
    stacked = [ops.concat(b, [ops.unsqueeze(b, s[k], [0]) for s in scans], 0) for k in range(n_scan)]
    return [*carried, *stacked]


@_conv("Scan")
def _scan(c: _Ctx, ins):
    if c.opset < 9:
        raise OnnxImportError("Scan-8 goes through its adapter (a batch axis and sequence_lens)")
    return _scan_node(c, ins)


def _scan8(c: _Ctx, ins: list, conv: object, since: int) -> list[str]:
    """Scan-8: inputs ``sequence_lens`` (all the full length, or omitted), then states and scanned values with
    a leading batch axis; per batch element, a Scan-9 over its slices (``directions`` for the scanned inputs),
    the results stacked back on the batch axis."""
    b = c.b
    own, outer = _split(c, ins)
    lens, rest = own[0], own[1:]
    n_in = int(c.attr("num_scan_inputs"))
    scanned = rest[len(rest) - n_in:]
    batch, steps = b.shape(scanned[0])[:2]
    if lens is not None:
        v = b.const_value(lens)
        if v is None or np.any(np.asarray(v) != steps):
            raise OnnxImportError("Scan-8 with sequence_lens shorter than the sequence has no native lowering")
    directions = [int(d) for d in c.attr("directions", [0] * n_in)]
    node = helper.make_node("Scan", list(c.node.input[1:]), list(c.node.output), body=_subgraph(c, "body"),
                            num_scan_inputs=n_in, scan_input_directions=directions)
    per_batch = []
    for k in range(batch):
        parts = [ops.squeeze(b, ops.slice_(b, t, [k], [k + 1], [0]), [0]) for t in rest]
        ctx = _Ctx(b, c.opset, node, {"num_scan_inputs": n_in, "scan_input_directions": directions})
        per_batch.append(_scan_node(ctx, [*parts, *(t for _, t in outer)]))
    return [ops.concat(b, [ops.unsqueeze(b, outs[j], [0]) for outs in per_batch], 0) for j in range(len(per_batch[0]))]


ADAPTERS[("Scan", 8)] = _scan8


def _scan_node(c: _Ctx, ins):
    own, outer = _split(c, ins)
    b = c.b
    n_in = int(c.attr("num_scan_inputs"))
    n_state = len(own) - n_in
    state, scanned = own[:n_state], own[n_state:]
    ranks = [len(b.shape(t)) for t in scanned]
    in_axes = [a % r if r else a for a, r in zip(c.attr("scan_input_axes", [0] * n_in), ranks)]
    in_rev = [bool(d) for d in c.attr("scan_input_directions", [0] * n_in)]
    slices = [TensorType(b.shape(t)[:a] + b.shape(t)[a + 1:], b.type(t).dtype) for t, a in zip(scanned, in_axes)]
    body, args = import_body(c, _subgraph(c, "body"), [*(b.type(t) for t in state), *slices], outer, "scan body")
    n_out = len(body.outputs) - n_state
    out_ranks = [len(body.type_of[o].shape) + 1 for o in body.outputs[n_state:]]
    out_axes = [a % r for a, r in zip(c.attr("scan_output_axes", [0] * n_out), out_ranks)]
    out_rev = [bool(d) for d in c.attr("scan_output_directions", [0] * n_out)]
    return b.extern("scan", [*state, *scanned, *args], name="scan", body=Body(body), n_state=n_state,
                    in_axes=in_axes, in_reverse=in_rev, out_axes=out_axes, out_reverse=out_rev)
