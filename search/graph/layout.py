"""The global layout choice: per tensor NCHW or blocked NCHWc (8 or 16 channels), for the whole graph.

Candidates: the graph as it is (NCHW), and for each block B the graph where every conv (a compute node
with a contraction over the channel axis of an activation) is blocked, conversions are then pushed
through the ops that can take the blocked layout (elementwise, residual adds, pooling, concat: the
``sink_conversion`` rule) and cancelled (``cancel_conversions``) until no pair is left. Conversions
remain only at the graph's edges and around ops that cannot take the layout (a reshape into a gemm,
LRN's window across channels, a channel count that is no multiple of B). Each candidate is costed by
``cost`` (a callable Graph -> seconds; by default :func:`layout_cost`) and the cheapest wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rewrite_rules import RuleNotApplicable
from rewrite_rules.grouped_conv import split_where
from rewrite_rules.layout_choice import (
    BLOCKS,
    absorb_all,
    activation_locals,
    block_node_in,
    blockable,
    cancel_all,
    conversion_kind,
    conversions,
)
from superopt.ir.flops import flop_count
from superopt.ir.graph import Graph, Node
from superopt.ir.prune import prune_graph
from superopt.schedule.blocked_conv import conv_efficiency
from superopt.target import Target

LAYOUTS = ("auto", "nchw", "nchw8c", "nchw16c")


@dataclass(frozen=True)
class LayoutReport:
    chosen: str  # "nchw", "nchw8c" or "nchw16c"
    costs: tuple[tuple[str, float], ...]  # candidate -> estimated seconds
    blocked_nodes: tuple[str, ...]  # compute nodes running on blocked tensors
    conversions: int  # conversion nodes left in the chosen graph
    conversions_at: tuple[str, ...]  # what each remaining conversion connects: "input x", "node -> node"
    stop_reason: str


def is_conv(graph: Graph, node: Node) -> bool:
    """A compute node with a contraction that reduces over the channel axis of an activation (NCHW or blocked)."""
    if node.is_extern:
        return False
    consts = {local for local, g in zip(node.op.inputs, node.inputs) if g in graph.constant}
    acts = {n for n, t in node.op.types if t.rank in (4, 5) and n not in consts}  # NCHW or blocked
    for st in node.op.statements:
        if st.reduce != "+=" or not st.reduce_dims:
            continue
        for a in st.expr.accesses():
            # a plain channel index, or a grouped conv's ci + Cin*g
            if a.tensor in acts and len(a.index) >= 3 and any(
                    c == 1 and d in st.reduce_dims for d, c in a.index[1].terms):
                return True
    return False


def _reads_only_conversions(graph: Graph, node: Node, block: int) -> bool:
    acts, _ = activation_locals(graph, node)
    ins = [g for local, g in zip(node.op.inputs, node.inputs) if local in acts]
    if not ins:
        return False
    for g in ins:
        r = graph.producer.get(g)
        if r is None or not r.is_extern or r.op.kind != "reshape":
            return False
        f = graph.producer.get(r.inputs[0])
        if f is None or conversion_kind(graph, f) != ("from", block):
            return False
    return True


def blocked_graph(graph: Graph, block: int) -> tuple[Graph, list[str]]:
    """Every conv blocked (a grouped conv first split into a conv per group when its channels per group
    are multiples of the block), conversions pushed through what follows and cancelled; the blocked nodes."""
    graph = split_where(graph, block)
    done: list[str] = []
    for name in [n.name for n in graph.nodes if is_conv(graph, n)]:
        node = next(n for n in graph.nodes if n.name == name)
        if blockable(graph, node, block):
            graph = block_node_in(graph, name, block)
            done.append(name)
    graph = cancel_all(graph)  # (validated and without dead code: the steps below keep it so, unchecked)
    changed = True
    while changed:  # (until a whole pass blocks nothing)
        changed = False
        k = 0
        while k < len(graph.nodes):
            node = graph.nodes[k]
            k += 1
            if node.name in done or node.is_extern or conversion_kind(graph, node) is not None:
                continue
            if _reads_only_conversions(graph, node, block) and blockable(graph, node, block):
                try:
                    graph = cancel_all(block_node_in(graph, node.name, block, check=False), check=False,
                                       reading={*node.inputs, *node.outputs})
                except RuleNotApplicable:
                    continue
                done.append(node.name)
                changed = True
                # the scan goes on after the node: blocking it changes what reads it, never what it reads, so
                # no node before it became blockable (a scan from the start, per node blocked, was quadratic)
                k = next(i for i, n in enumerate(graph.nodes) if n.name == node.name) + 1
    # the steps were not validated one by one (each a full pass over a graph of thousands of nodes): the
    # result is, once; the weights the blocked nodes no longer read are dropped
    return absorb_all(prune_graph(graph)), done


def blocked_kernels(graph: Graph) -> list[str]:
    """Compute nodes that read or write a blocked (NCHWc) tensor. The learned schedule model, trained on
    NCHW kernels, mispredicts them (it picked 4-row tiles for a blocked 3x3 conv, too few FMA chains, where
    the default takes 7): the pipeline schedules them with the default heuristic. So are a Winograd conv's
    kernels (``rewrite_rules.winograd``: rank 5 and 7 tensors of channel blocks), new to the model: it picked
    an inlined output transform without unrolling, which recomputes the transform for every output."""
    def blocked(name: str) -> bool:
        t = graph.type_of[name]
        return t.rank >= 5 and t.shape[-1] in BLOCKS

    return [n.name for n in graph.nodes if not n.is_extern and any(blocked(x) for x in n.inputs + n.outputs)]


def _bytes(graph: Graph, names) -> int:
    return sum(graph.type_of[n].nbytes for n in names)


def _is_window(graph: Graph, node: Node) -> bool:
    """A reduction over a window of an activation that is no conv (pooling)."""
    return not is_conv(graph, node) and any(st.reduce != "=" and st.reduce_dims for st in node.op.statements)


def layout_cost(target: Target, bandwidth: float = 20e9, peak: float | None = None, nchw_conv_efficiency: float = 0.85,
                nchw_window_slowdown: float = 4.0) -> Callable[[Graph], float]:
    """A roofline over kernels that sees layouts: max(flops / ceiling, bytes / bandwidth) per compute node.

    A conv on blocked tensors whose register tile is two vectors wide reaches the ceiling (its vector loop
    over output-channel lanes loads and stores contiguously, each broadcast feeds two FMAs); with one vector
    half of it (a broadcast per FMA): :func:`superopt.schedule.blocked_conv.conv_efficiency`; on NCHW
    ``nchw_conv_efficiency`` of it (the output tile is stored transposed, with a stride of H*W, so its stores
    scatter; benchmarks/layout.py measures the two layouts side by side). A pooling window on NCHW vectorizes
    along a strided row: ``nchw_window_slowdown`` times its memory time (each vector load gathers across rows).
    A conversion costs its bytes at ``bandwidth`` (64 channels at 56 x 56 move 1.6 MB in and out). A
    conversion that a conv's pad stage
    absorbs (``absorb_conversion``) is no longer a node and costs nothing. ``peak`` defaults to the
    target's FMA pipes x lanes x 2 flops x 3 GHz per thread."""
    lanes = target.lanes("float32")
    ceiling = peak if peak is not None else target.fma_units * 2 * lanes * 3e9 * target.threads

    def blocked_shape(graph: Graph, n: Node) -> tuple[int, ...] | None:
        for o in n.outputs:
            t = graph.type_of[o]
            if t.rank == 5 and t.shape[-1] in BLOCKS:
                return t.shape
        return None

    def cost(graph: Graph) -> float:
        total = 0.0
        for n in graph.nodes:
            if n.is_extern:
                continue
            io = _bytes(graph, n.inputs) + _bytes(graph, n.outputs)
            if conversion_kind(graph, n) is not None:
                total += io / bandwidth
                continue
            blocked = blocked_shape(graph, n)
            memory = io / bandwidth
            if is_conv(graph, n):
                eff = conv_efficiency(target, blocked[-1], blocked[1]) if blocked else nchw_conv_efficiency
                total += max(flop_count(n.op) / (ceiling * eff), memory)
            else:
                total += memory * (nchw_window_slowdown if blocked is None and _is_window(graph, n) else 1.0)
        return total

    return cost


def _describe(graph: Graph, node: Node) -> str:
    src = node.inputs[0]
    p = graph.producer.get(src)
    if conversion_kind(graph, node)[0] == "from":
        outs = [c.name for r in graph.consumers.get(node.outputs[0], []) for c in graph.consumers.get(r.outputs[0], [])]
        ends = [o for r in graph.consumers.get(node.outputs[0], []) for o in r.outputs if o in graph.outputs]
        return f"{p.name if p else src} -> {', '.join(outs + [f'output {e}' for e in ends]) or 'nothing'}"
    return f"{'input ' + src if p is None else p.name} -> {', '.join(c.name for c in graph.consumers.get(node.outputs[0], []))}"


def choose_layouts(graph: Graph, target: Target, cost: Callable[[Graph], float] | None = None,
                   layout: str = "auto") -> tuple[Graph, LayoutReport]:
    """The graph with its layouts chosen (``layout``: "auto" picks the cheapest candidate under ``cost``;
    "nchw", "nchw8c", "nchw16c" force one) and a report. Inputs and outputs keep their NCHW layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    cost = cost or layout_cost(target)
    candidates: dict[str, tuple[Graph, list[str]]] = {"nchw": (graph, [])}
    blocks = BLOCKS if layout == "auto" else tuple(int(layout[4:-1]) for _ in [0] if layout != "nchw")
    for b in blocks:
        candidates[f"nchw{b}c"] = blocked_graph(graph, b)
    costs = {name: cost(g) for name, (g, _) in candidates.items()}
    if layout == "auto":
        # ties: no change first, then the larger block (fewer, longer vector runs)
        prefer = ["nchw", *(f"nchw{b}c" for b in sorted(BLOCKS, reverse=True))]
        chosen = min(costs, key=lambda k: (costs[k], prefer.index(k) if k in prefer else len(prefer)))
        reason = f"cheapest of {len(costs)} candidates under the cost"
    else:
        chosen, reason = layout, f"layout {layout} requested"
    g, done = candidates[chosen]
    conv = conversions(g)
    report = LayoutReport(chosen, tuple((k, v) for k, v in costs.items() if math.isfinite(v)), tuple(done), len(conv),
                          tuple(_describe(g, n) for n in conv), reason)
    return g, report
