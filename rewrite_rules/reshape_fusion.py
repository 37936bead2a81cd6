"""An elementwise op after a merging reshape joins the op producing the reshape's input.

A grouped conv writes ``P[n, g, c, y, x]`` and a reshape merges ``(g, c)`` into the channels; its batch norm,
relu and channel shuffle read the merged tensor. Fusion needs the reader to read its producer's output at its
own index, which the reshape in between hides, and splitting the reader's loop over the merged axis (the move
``split_loops_through_merging_reshape``) changes no cost on its own: a search that keeps only improving moves
never takes it. This move is the two as one: split the reader's loops in ``(g, c)``, so it reads ``P`` at
its own index, then fuse it into ``P``'s producer (its per-channel constants read at ``C*g + c``, a
channel shuffle after it written by the producer's write-back).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, node_named
from rewrite_rules.fusion import _is_elementwise_reader, elementwise_fusion_sites, fuse_elementwise_into_producer
from rewrite_rules.movement import _merge_plan, split_loops_through_reshape
from superopt.builder import GraphBuilder
from superopt.ir.graph import Graph


def _candidate(graph: Graph, reshape_name: str, reader_name: str) -> bool:
    """The reshape's input comes from a compute op read by the reshape only, the reader reads the reshape's
    output elementwise and is its only reader."""
    reshape, reader = node_named(graph, reshape_name), node_named(graph, reader_name)
    if reader.is_extern:  # (an extern reader has no loops to split)
        return False
    src, merged = reshape.inputs[0], reshape.outputs[0]
    prod = graph.producer.get(src)
    if prod is None or prod.is_extern or len(prod.outputs) != 1 or src in graph.outputs or merged in graph.outputs:
        return False
    if [n.name for n in graph.consumers.get(src, [])] != [reshape.name]:
        return False
    if any(n is not reader for n in graph.consumers.get(merged, [])):
        return False
    locals_ = [x for x, g in zip(reader.op.inputs, reader.inputs) if g == merged]
    return len(locals_) == 1 and _is_elementwise_reader(reader.op, locals_[0])


def fuse_through_reshape_sites(graph: Graph) -> Iterator[Site]:
    # (the cheap checks first: a graph search enumerates the sites of every rule at every expansion)
    for node in graph.nodes:
        if not (node.is_extern and node.op.kind == "reshape"):
            continue
        readers = graph.consumers.get(node.outputs[0], [])
        if len(readers) != 1 or not _candidate(graph, node.name, readers[0].name):
            continue
        if _merge_plan(graph, node, readers[0]) is not None:
            yield (node.name, readers[0].name)


def fuse_through_reshape(graph: Graph, site: Site) -> Graph:
    reshape, reader = node_named(graph, site[0]), node_named(graph, site[1])
    if not _candidate(graph, reshape.name, reader.name):
        raise RuleNotApplicable(f"{reader.name!r} reads {reshape.name!r} otherwise than one elementwise reader")
    src = reshape.inputs[0]
    producer = graph.producer[src].name
    split = split_loops_through_reshape(graph, site)
    fuse = (producer, reader.name)
    if fuse not in set(elementwise_fusion_sites(split)):
        raise RuleNotApplicable(f"{reader.name!r} does not read {producer!r}'s output elementwise once split")
    return fuse_elementwise_into_producer(split, fuse)


def _examples() -> list[Graph]:
    rng = np.random.default_rng(0)
    # a grouped 1x1 conv into its merging reshape, then a batch norm with relu that shuffles the channels
    b = GraphBuilder("grouped_conv_bn_shuffle")
    x = b.input("x", (1, 6, 4, 4))
    w = b.constant(rng.standard_normal((8, 3)).astype(np.float32), "w")
    p = b.compute1("P[n,g,co,y,x] += X[n,ci+3*g,y,x] * W[co+4*g,ci]", {"X": x, "W": w}, "gconv")
    (m,) = b.extern("reshape", [p], shape=(1, 8, 4, 4))
    s = b.constant(rng.uniform(0.5, 1.5, 8).astype(np.float32), "s")
    t = b.constant(rng.standard_normal(8).astype(np.float32), "t")
    y = b.compute1("T[n,c,y,x] = X[n,c,y,x] * S[c] + B[c]\nO[n,a,g,y,x] = relu(T[n,a+4*g,y,x])",
                   {"X": m, "S": s, "B": t}, "bn_relu_shuffle",
                   extents={"a": 4, "g": 2}, outputs=["O"])
    (z,) = b.extern("reshape", [y], shape=(1, 8, 4, 4))
    out = [b.build([z])]
    # a depthwise conv's [n, c, 1, y, x] merged back to channels, then a plain affine
    b = GraphBuilder("depthwise_affine")
    x = b.input("x", (1, 4, 5, 5))
    w = b.constant(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w")
    p = b.compute1("P[n,g,co,y,x] += X[n,g,y+kh-1,x+kw-1] * W[g+co,0,kh,kw]", {"X": x, "W": w}, "dw",
                   extents={"y": 5, "x": 5, "co": 1}, padding={"X": 0.0})
    (m,) = b.extern("reshape", [p], shape=(1, 4, 5, 5))
    a = b.constant(rng.uniform(0.5, 1.5, 4).astype(np.float32), "a")
    out.append(b.build([b.compute1("O[n,c,y,x] = X[n,c,y,x] * A[c] - 0.5", {"X": m, "A": a}, "affine")]))
    return out


FUSE_THROUGH_RESHAPE = Rule("fuse_through_merging_reshape", "fusion",
                            "f(reshape(P, (.., G*C, ..)))[.., C*g + c, ..] = reshape((f' . P))[.., g, c, ..] for an "
                            "elementwise f reading P only through the reshape",
                            fuse_through_reshape_sites, fuse_through_reshape, _examples)
RULES: list[Rule] = [FUSE_THROUGH_RESHAPE]
