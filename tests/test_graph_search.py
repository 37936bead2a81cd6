"""Graph search (search/graph/search.py) and the graph cost (search/graph/cost.py).

Planted graphs have answers known by exhaustive enumeration of every reachable graph: one where
greedy applies a rewrite the cost rejects, one where only passing through a worse graph (TASO's
alpha) reaches the best. Rewritten graphs are checked against the original with the reference
interpreter in float64. The light resnet50 and inception_v1 are searched within 10 seconds.
"""

import time
from dataclasses import replace

import numpy as np
import pytest

from rewrite_rules import Rule, RuleNotApplicable, fresh_name, node_named, rewrite_greedy
from rewrite_rules.algebraic import HOIST_CONSTANTS
from rewrite_rules.fusion import FUSE_ELEMENTWISE
from search.graph.cost import Ceilings, GraphCost, padded_reads, workspace_bytes
from search.graph.search import (
    STOP_EXHAUSTED,
    STOP_EXPANSIONS,
    STOP_NO_RULE,
    STOP_TIME,
    GraphDigests,
    GraphSearchConfig,
    search_graph,
)
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.interp.inputs import random_inputs
from superopt.ir.canonical import graph_digest
from superopt.ir.graph import Graph, Node
from superopt.lang import compile_op

CEILINGS = Ceilings(flops_per_s=1e11, bytes_per_s=1e10, launch_s=5e-6, source="test ceilings")


def cost() -> GraphCost:
    return GraphCost(CEILINGS)


def same_outputs(a: Graph, b: Graph, seed: int = 0, rtol: float = 1e-9) -> None:
    feed = random_inputs(a, seed)
    ra, rb = evaluate(a, feed, np.float64), evaluate(b, dict(zip(b.inputs, feed.values())), np.float64)
    for oa, ob in zip(a.outputs, b.outputs):
        np.testing.assert_allclose(rb[ob], ra[oa], rtol=rtol, atol=1e-12)


def reachable(graph: Graph, rules: list[Rule], limit: int = 500) -> list[Graph]:
    """Every graph the rules reach from ``graph`` (deduplicated by digest): the ground truth for small graphs."""
    digest = GraphDigests()
    seen, todo, out = {digest(graph)}, [graph], [graph]
    while todo:
        g = todo.pop()
        for rule in rules:
            for site in rule.sites(g):
                try:
                    new = rule.apply(g, site)
                except RuleNotApplicable:
                    continue
                d = digest(new)
                if d not in seen:
                    seen.add(d)
                    todo.append(new)
                    out.append(new)
                    assert len(out) <= limit, "planted graph too large for exhaustive enumeration"
    return out


# -- planted graphs -------------------------------------------------------------------------------------------


def scaled_relu(n: int = 256, m: int = 512) -> Graph:
    """A = X[i,j] * (c[j] * d[i]); B = relu(A). Hoisting c[j] * d[i] (greedy's first rule) precomputes an
    n x m constant: one fewer multiply per element, but as many more bytes read as X itself."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("scaled_relu")
    x = b.input("x", (n, m))
    c = b.constant(rng.standard_normal(m).astype(np.float32), "c")
    d = b.constant(rng.standard_normal(n).astype(np.float32), "d")
    a = b.compute1("O[i,j] = X[i,j] * (C[j] * D[i])", {"X": x, "C": c, "D": d}, "scale")
    return b.build([b.compute1("O[i,j] = relu(A[i,j])", {"A": a}, "relu")])


def shared_producer(n: int = 512) -> Graph:
    """P = 2x read by two consumers (C1 = P + 1, C2 = 3P): neither can absorb P while both read it."""
    b = GraphBuilder("shared")
    x = b.input("x", (n, n))
    p = b.compute1("O[i,j] = X[i,j] * 2.0", {"X": x}, "p")
    c1 = b.compute1("O[i,j] = P[i,j] + 1.0", {"P": p}, "c1")
    c2 = b.compute1("O[i,j] = P[i,j] * 3.0", {"P": p}, "c2")
    return b.build([c1, c2])


def _duplicate_sites(graph: Graph):
    for n in graph.nodes:
        if not n.is_extern and len(n.outputs) == 1 and n.outputs[0] not in graph.outputs:
            readers = graph.consumers.get(n.outputs[0], [])
            if len(readers) >= 2:
                yield (n.name, readers[0].name)


def _duplicate(graph: Graph, site) -> Graph:
    p, c = node_named(graph, site[0]), node_named(graph, site[1])
    (t,) = p.outputs
    if c not in graph.consumers.get(t, []) or len(graph.consumers[t]) < 2:
        raise RuleNotApplicable(f"{site[1]!r} is not one of several readers of {site[0]!r}")
    t2 = fresh_name(t, set(graph.type_of))
    copy = Node(fresh_name(p.name, {n.name for n in graph.nodes}), p.op, p.inputs, (t2,))
    reader = replace(c, inputs=tuple(t2 if i == t else i for i in c.inputs))
    nodes = []
    for n in graph.nodes:
        nodes += [copy, reader] if n is c else [n]
    return replace(graph, nodes=tuple(nodes), types=graph.types + ((t2, graph.type_of[t]),))


# recompute instead of materialize: a node read by several consumers is copied for one of them (an exploration
# move: it grows the graph and costs more until the copies are fused into their readers)
DUPLICATE = Rule("duplicate_shared_producer", "exploration", "y = f(x) read twice = two evaluations of f(x)",
                 _duplicate_sites, _duplicate, lambda: [shared_producer(8)])


def small_cnn(seed: int = 0, channels: int = 4) -> Graph:
    """conv -> batch norm -> relu -> conv -> batch norm -> + x -> relu -> max pool, at small shapes."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("small_cnn")
    c = channels
    x = b.input("x", (1, c, 8, 8))

    def conv_bn(inp: str, name: str) -> str:
        w = b.constant((rng.standard_normal((c, c, 3, 3)) * 0.3).astype(np.float32), f"{name}_w")
        y = b.compute1("O[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]", {"X": inp, "W": w}, name,
                       extents={"y": 8, "x": 8}, padding={"X": 0.0})
        g, bias, m = (b.constant(rng.standard_normal(c).astype(np.float32), f"{name}_{k}") for k in "gbm")
        v = b.constant((rng.random(c) + 0.5).astype(np.float32), f"{name}_v")
        return b.compute1("O[n,c,y,x] = (A[n,c,y,x] - M[c]) * (G[c] * rsqrt(V[c] + 0.00001)) + B[c]",
                          {"A": y, "G": g, "B": bias, "M": m, "V": v}, f"{name}_bn")

    h = b.compute1("O[n,c,y,x] = relu(A[n,c,y,x])", {"A": conv_bn(x, "conv1")}, "relu1")
    s = b.compute1("O[n,c,y,x] = A[n,c,y,x] + S[n,c,y,x]", {"A": conv_bn(h, "conv2"), "S": x}, "add")
    r = b.compute1("O[n,c,y,x] = relu(A[n,c,y,x])", {"A": s}, "relu2")
    pool = b.compute1("O[n,c,y,x] max= X[n,c,2*y+k0-1,2*x+k1-1]", {"X": r}, "pool",
                      extents={"k0": 3, "k1": 3, "y": 4, "x": 4}, padding={"X": float("-inf")})
    return b.build([pool])


# -- the cost ---------------------------------------------------------------------------------------------------


def test_fusing_saves_the_intermediate_round_trip_and_a_launch():
    b = GraphBuilder("chain")
    x = b.input("x", (512, 512))
    y = b.compute1("O[i,j] = X[i,j] * 2.0", {"X": x}, "double")
    g = b.build([b.compute1("O[i,j] = Y[i,j] + 1.0", {"Y": y}, "inc")])
    fused = FUSE_ELEMENTWISE.first(g)
    assert fused is not None and len(fused.nodes) == 1
    nbytes = 512 * 512 * 4
    c = cost()
    # both kernels memory-bound: each moves its input and output once; fused, the intermediate never moves
    assert c(g) == pytest.approx(2 * (2 * nbytes / CEILINGS.bytes_per_s + CEILINGS.launch_s), rel=1e-12)
    assert c(g) - c(fused) == pytest.approx(2 * nbytes / CEILINGS.bytes_per_s + CEILINGS.launch_s, rel=1e-9)


def test_compute_bound_kernel_costs_its_flops_and_externs_their_bytes():
    b = GraphBuilder("mm")
    a, w = b.input("a", (64, 256)), b.input("w", (256, 64))
    y = b.compute1("O[i,j] += A[i,k] * B[k,j]", {"A": a, "B": w}, "mm")
    g = b.build(b.extern("reshape", [y], shape=(64 * 64,)))
    c = cost()
    flops = 2 * 64 * 64 * 256
    assert c.node(g, g.nodes[0]) == pytest.approx(flops / CEILINGS.flops_per_s + CEILINGS.launch_s)
    assert c.node(g, g.nodes[1]) == 0.0  # reshape is an alias: no data moves


def test_workspace_counts_only_stored_temporaries():
    def op(src):
        shapes = {"X": (64, 32), "A": (64, 16), "B": (16, 32)}
        return compile_op(src, {k: v for k, v in shapes.items() if f"{k}[" in src})

    # a row reduction read at a broadcast index is stored: written once, read once
    assert workspace_bytes(op("S[i] += X[i,j]\nO[i,j] = X[i,j] - S[i]")) == 2 * 64 * 4
    # an elementwise temporary is inlined into its reader
    assert workspace_bytes(op("T[i,j] = X[i,j] * 2.0\nO[i] += T[i,j]")) == 0
    # a contraction read at its own index is the register tile's epilogue
    assert workspace_bytes(op("P[i,j] += A[i,k] * B[k,j]\nO[i,j] = relu(P[i,j]) + X[i,j]")) == 0
    # a contraction read by a reduction at its own index is folded into its write-back (ReduceEpilogue)
    assert workspace_bytes(op("P[i,j] += A[i,k] * B[k,j]\nO[i] += P[i,j] * P[i,j]")) == 0
    # read by a reduction at a shifted index, it is stored: written once, read once
    assert workspace_bytes(op("P[i,j] += A[i,k] * B[k,j]\nO[i] += P[i,j] * P[i,31-j]")) == 2 * 64 * 32 * 4


def test_a_chained_reduction_costs_its_contraction_twice_or_its_round_trip():
    """EM routing's variance reads the mean, computed after the votes V: the default computes V again for it
    where that is cheaper than storing V (a short reduction), so the roofline counts V's flops twice; with
    a long reduction V is stored and its round trip counted. The one-pass rewrite needs neither."""
    from rewrite_rules.moments import EM
    from search.graph.cost import recompute_flops
    from superopt.ir.flops import statement_flops

    def em(r):
        return compile_op(EM, {"P": (2, 7, 7, 3, r), "W": (3, 3, 3, 4, r, 16), "R": (2, 4, 5, 5, 3)},
                          outputs=["MU", "VAR"])

    short = em(4)
    v = next(st for st in short.statements if st.out == "V")
    rs = 3 * short.type_of["Rs"].nbytes  # the sum of the weights, stored and read by MU and VAR
    assert recompute_flops(short) == statement_flops(v) and workspace_bytes(short) == rs
    long = em(512)
    assert recompute_flops(long) == 0 and workspace_bytes(long) == 3 * long.type_of["V"].nbytes + rs


def test_padded_window_reads_are_counted():
    g = small_cnn()
    conv = next(n for n in g.nodes if n.name == "conv1")
    assert padded_reads(conv.op) == 1 * 4 * 8 * 8 * 4 * 3 * 3  # every iteration reads the padded input once
    bn = next(n for n in g.nodes if n.name == "conv1_bn")
    assert padded_reads(bn.op) == 0
    # a conv's image against weights with output channels of their own is read off the vector loop
    assert padded_reads(conv.op, products=True) == 0


def test_a_depthwise_convs_bounds_checked_reads_cost_it_a_padded_copy():
    """A depthwise conv's image carries every output dim, so the schedule vectorizes over it with its bounds
    checks (``padded_product_ops`` per read); a max pool's window is no product (``padded_read_ops``).
    The default graph search gives the depthwise conv a padded copy, and the pool none."""
    from superopt import ops
    from superopt.api import OptimizeConfig, rewrite_graph

    b = GraphBuilder("dw")
    x = b.input("x", (1, 32, 28, 28))
    w = b.constant(np.random.default_rng(0).standard_normal((32, 1, 3, 3)).astype(np.float32), "w")
    dw = ops.conv2d(b, x, w, None, pads=(1, 1, 1, 1), groups=32)
    graph = b.build([dw])
    (node,) = [n for n in graph.nodes if not n.is_extern]
    assert padded_reads(node.op, products=True) == padded_reads(node.op) == 32 * 28 * 28 * 9
    rewritten, applied = rewrite_graph(graph, OptimizeConfig())[:2]
    assert "materialize_padding" in applied
    feed = {"x": np.random.default_rng(1).standard_normal((1, 32, 28, 28)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(rewritten, feed)[rewritten.outputs[0]],
                               evaluate(graph, feed)[graph.outputs[0]], rtol=1e-5, atol=1e-5)
    pb = GraphBuilder("pool")
    px = pb.input("x", (1, 8, 16, 16))
    pool = pb.build([ops.max_pool2d(pb, px, (3, 3), (1, 1), (1, 1, 1, 1))])
    (pn,) = [n for n in pool.nodes if not n.is_extern]
    assert padded_reads(pn.op) > 0 and padded_reads(pn.op, products=True) == 0


def test_digests_are_rename_invariant_and_tell_recompute_from_share():
    digests = GraphDigests()
    a, b = small_cnn(0), small_cnn(0)
    renamed = b.replace(nodes=tuple(replace(n, name=n.name + "_x") for n in b.nodes), name="other")
    assert digests(a) == digests(renamed) and graph_digest(a) == graph_digest(renamed)
    assert digests(a) != digests(small_cnn(1))  # other weights
    fused = FUSE_ELEMENTWISE.first(a)
    assert digests(fused) != digests(a)
    g = shared_producer(4)
    copied = DUPLICATE.first(g)
    assert graph_digest(copied) == graph_digest(g)  # the same values are computed...
    assert digests(copied) != digests(g)  # ...by three kernels or by four


# -- planted graphs with known answers ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["backtracking", "mcts"])
def test_search_leaves_out_a_rewrite_the_cost_rejects(strategy):
    g = scaled_relu()
    rules = [HOIST_CONSTANTS, FUSE_ELEMENTWISE]
    c = cost()
    optimum = min(c(x) for x in reachable(g, rules))
    greedy, rep = rewrite_greedy(g, rules)
    assert rep.applied[0] == "hoist_constant_subexpressions"
    assert c(greedy) > optimum * 1.2  # greedy's first move reads an n x m constant instead of two vectors
    best, report = search_graph(g, c, GraphSearchConfig(strategy=strategy, budget_s=30, max_expansions=50), rules)
    assert report.cost_after == pytest.approx(optimum, rel=1e-12) and c(best) == report.cost_after
    assert report.applied == ("fuse_elementwise_into_producer",) and len(best.nodes) == 1
    assert len(best.constants) == len(g.constants)  # nothing hoisted
    assert report.stop_reason in (STOP_EXHAUSTED, STOP_EXPANSIONS)
    same_outputs(g, best)


def test_graph_search_budgets_and_stop_kinds():
    """One expansion allowed: the expansion budget stops it (kind "trials"); no limit on expansions: the search
    runs until its queue is exhausted, whatever the count."""
    g = scaled_relu()
    rules = [HOIST_CONSTANTS, FUSE_ELEMENTWISE]
    _, one = search_graph(g, cost(), GraphSearchConfig(budget_s=30, max_expansions=1), rules)
    assert one.stop_reason == STOP_EXPANSIONS and one.stop_reason.kind == "trials"
    _, unlimited = search_graph(g, cost(), GraphSearchConfig(budget_s=30, max_expansions=None), rules)
    assert unlimited.stop_reason.kind == "exhausted" and unlimited.expansions > 1


def test_alpha_lets_backtracking_pass_through_a_worse_graph():
    g = shared_producer()
    rules = [DUPLICATE, FUSE_ELEMENTWISE]
    c = cost()
    graphs = reachable(g, rules)
    optimum = min(c(x) for x in graphs)
    assert optimum < 0.8 * c(g)  # two kernels reading x beat three kernels around a shared intermediate
    # with no relaxation the only move (copying p, 1/3 more traffic) is never taken
    best, report = search_graph(g, c, GraphSearchConfig(alpha=1.0, budget_s=30), rules)
    assert best is g and report.applied == () and report.stop_reason == STOP_EXHAUSTED
    best, report = search_graph(g, c, GraphSearchConfig(alpha=1.2, budget_s=30), rules)
    assert report.cost_after == pytest.approx(c(g))  # the copy costs more than 1.2x the best: pruned
    best, report = search_graph(g, c, GraphSearchConfig(alpha=1.5, budget_s=30), rules)
    assert report.cost_after == pytest.approx(optimum, rel=1e-12)
    assert report.applied[0] == "duplicate_shared_producer" and len(best.nodes) == 2
    assert report.applied.count("fuse_elementwise_into_producer") == 2
    same_outputs(g, best)


def test_mcts_finds_the_planted_optimum_and_is_deterministic():
    g = shared_producer()
    rules = [DUPLICATE, FUSE_ELEMENTWISE]
    c = cost()
    optimum = min(c(x) for x in reachable(g, rules))
    cfg = GraphSearchConfig(strategy="mcts", alpha=1.5, budget_s=30, max_expansions=30, seed=3)
    runs = [search_graph(g, cost(), cfg, rules) for _ in range(2)]
    assert runs[0][1].cost_after == pytest.approx(optimum, rel=1e-12)
    assert graph_digest(runs[0][0]) == graph_digest(runs[1][0]) and runs[0][1].applied == runs[1][1].applied
    same_outputs(g, runs[0][0])


def test_no_rule_applies():
    b = GraphBuilder("lone")
    x = b.input("x", (4, 4))
    g = b.build([b.compute1("O[i,j] = X[i,j] * 2.0", {"X": x}, "double")])
    for strategy in ("backtracking", "mcts"):
        best, report = search_graph(g, cost(), GraphSearchConfig(strategy=strategy), [FUSE_ELEMENTWISE])
        assert best is g and report.stop_reason == STOP_NO_RULE and report.expansions <= 1
    made = []
    best, report = search_graph(g, lambda: made.append(1), GraphSearchConfig(), [FUSE_ELEMENTWISE])
    assert report.stop_reason == STOP_NO_RULE and not made  # the cost (measured ceilings) is not even made


# -- the registered rules on real graphs ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["backtracking", "mcts"])
def test_search_is_deterministic_under_a_seed_and_computes_the_same(strategy):
    g = small_cnn()
    cfg = GraphSearchConfig(strategy=strategy, budget_s=60, max_expansions=6, seed=5)
    (a, ra), (b, rb) = search_graph(g, cost(), cfg), search_graph(g, cost(), cfg)
    assert graph_digest(a) == graph_digest(b) and ra.applied == rb.applied and ra.sites == rb.sites
    assert ra.stop_reason == STOP_EXPANSIONS and ra.expansions == 6
    assert ra.cost_after < ra.cost_before and cost()(a) == pytest.approx(ra.cost_after)
    assert not FUSE_ELEMENTWISE.sites(a)  # every fusion the cost wants (all of them) was made
    greedy = search_graph(g, cost(), replace(cfg, strategy="greedy"))[1]
    assert ra.cost_after <= greedy.cost_after * (1 + 1e-9)
    same_outputs(g, a, rtol=1e-6)  # folding batch norm into the weights rounds differently


def test_budgets_are_respected():
    g = small_cnn()
    _, rep = search_graph(g, cost(), GraphSearchConfig(max_expansions=2, budget_s=60))
    assert rep.expansions == 2 and rep.stop_reason == STOP_EXPANSIONS
    _, rep = search_graph(g, cost(), GraphSearchConfig(strategy="mcts", max_expansions=2, budget_s=60))
    assert rep.expansions == 2 and rep.stop_reason == STOP_EXPANSIONS
    _, rep = search_graph(g, cost(), GraphSearchConfig(max_expansions=10**6, budget_s=0.2))
    assert rep.stop_reason == STOP_TIME and rep.elapsed_s < 2.0
    with pytest.raises(ValueError, match="unknown graph search strategy"):
        GraphSearchConfig(strategy="annealing")


@pytest.fixture(scope="module")
def light_graphs():
    pytest.importorskip("onnxruntime")
    from superopt.frontends.light_models import randomized_light_model
    from superopt.frontends.onnx_frontend import import_onnx_model
    from superopt.ir.prune import prune_graph

    return {name: prune_graph(import_onnx_model(randomized_light_model(name)).graph)
            for name in ("resnet50", "inception_v1")}


@pytest.mark.parametrize("name", ["resnet50", "inception_v1"])
def test_light_model_search_finishes_within_10_seconds(light_graphs, name):
    g = light_graphs[name]
    c = cost()
    t0 = time.perf_counter()
    # 8 s (or 30 expansions, about 3 s on a quiet machine: the suite stays lean) with a 2 s margin for a busy one
    best, report = search_graph(g, c, GraphSearchConfig(budget_s=8.0, max_expansions=30))
    assert time.perf_counter() - t0 < 10.0 and report.elapsed_s < 10.0
    assert report.stop_reason in (STOP_TIME, STOP_EXPANSIONS, STOP_EXHAUSTED)
    assert report.cost_after < 0.75 * report.cost_before and report.cost_after == pytest.approx(c(best))
    assert not FUSE_ELEMENTWISE.sites(best)  # every elementwise op (batch norm, relu, residual add) fused
    if name == "inception_v1":  # greedy takes seconds here (far longer on resnet50's 176 nodes)
        greedy = search_graph(g, c, GraphSearchConfig(strategy="greedy"))[1]
        assert report.cost_after <= greedy.cost_after * (1 + 1e-9)


def test_a_rule_that_raises_is_named_in_the_report_and_the_search_goes_on():
    def broken(graph, site):
        raise ValueError("planted bug")

    bad = Rule("planted_broken_rule", "planted", "x = x", FUSE_ELEMENTWISE.matches, broken, lambda: [])
    g = scaled_relu(8, 8)
    best, report = search_graph(g, cost(), GraphSearchConfig(budget_s=30), [bad, FUSE_ELEMENTWISE])
    assert report.applied == ("fuse_elementwise_into_producer",)
    assert len(report.rule_errors) == 1 and "planted_broken_rule" in report.rule_errors[0]
    assert "planted bug" in str(report)


def test_a_model_with_absolute_kernel_times_replaces_the_roofline():
    class PerStatement:  # a stand-in learned model: 1 ms per statement, none for single-statement kernels
        def kernel_seconds(self, compute, target, constant_inputs):
            return 1e-3 * len(compute.statements) if len(compute.statements) > 1 else None

    from superopt.target import avx512_target

    g = small_cnn()
    c = GraphCost(CEILINGS, avx512_target(), PerStatement())
    roof = GraphCost(CEILINGS, avx512_target())  # (the roofline refined by each kernel's default schedule)
    assert "learned kernel times" in c.method
    for n in g.nodes:  # every node of small_cnn is one statement: the roofline answers
        assert c.node(g, n) == roof.node(g, n)
    fused = FUSE_ELEMENTWISE.first(g)
    merged = next(n for n in fused.nodes if len(n.op.statements) == 2)
    assert c.node(fused, merged) == 2e-3
    assert "gives no absolute kernel times" in GraphCost(CEILINGS, avx512_target(), object()).method


def test_optimize_runs_the_graph_search_and_reports_it(kernel_cache):
    from superopt.api import OptimizeConfig, optimize, search_rewrites

    g = small_cnn()
    prog = optimize(g, OptimizeConfig(compiler=kernel_cache, cost_model=None))
    rep = prog.report
    assert rep.graph_search["strategy"] == "backtracking" and rep.graph_search["stop_reason"]
    assert rep.rewrites == len(rep.graph_search["applied"]) > 0 and rep.max_error <= 1e-3
    assert rep.graph_search["cost_after"] < rep.graph_search["cost_before"]
    assert "graph search (backtracking)" in str(rep)
    x = random_inputs(g, 1)["x"]
    np.testing.assert_allclose(prog(x)[0], evaluate(g, {"x": x}, np.float64)[g.outputs[0]], rtol=1e-4, atol=1e-5)
    off, none = search_rewrites(g, OptimizeConfig(compiler=kernel_cache, fuse=False))
    assert none is None and graph_digest(off) == graph_digest(g) and len(off.nodes) == len(g.nodes)
    greedy, report = search_rewrites(g, OptimizeConfig(compiler=kernel_cache, graph_search="greedy"))
    assert report.strategy == "greedy" and report.stop_reason == STOP_NO_RULE and report.applied
    same_outputs(g, greedy, rtol=1e-6)


@pytest.mark.parametrize("strategy", ["backtracking", "mcts"])
def test_finish_descent_applies_the_first_descent_even_when_costing_the_start_spent_the_budget(strategy):
    """On a loaded machine costing the start graph can take longer than the whole budget: the search must
    still take the first descent (never worse than greedy), not return the start with no rule applied."""
    g = small_cnn()
    tiny = GraphSearchConfig(strategy=strategy, budget_s=1e-9, finish_descent=True)
    best, rep = search_graph(g, cost(), tiny)
    one, rep_one = search_graph(g, cost(), replace(tiny, budget_s=60, max_expansions=1))
    assert rep.applied and rep.cost_after < rep.cost_before and rep.stop_reason == STOP_TIME
    assert rep.cost_after == pytest.approx(rep_one.cost_after, rel=1e-12)
    same_outputs(g, best, rtol=1e-5)  # (folded constants are rounded to float32)
    _, cut = search_graph(g, cost(), replace(tiny, finish_descent=False))
    assert not cut.applied and cut.stop_reason == STOP_TIME  # without it the budget stops the search at once


def test_the_second_phase_order_from_the_start_runs_whole_only_where_the_first_descent_left_budget(monkeypatch):
    """The start is descended in both phase orders (simplifications first, then fusion first), each whole so
    that the search is never worse than a greedy pass in either order; but where the first descent spent the
    budget (a large graph), the second is cut by it like any other move instead of doubling the time."""
    import search.graph.search as gs

    calls = []
    batch = gs._Explorer.batch

    def recorded(self, state, passes, cut=True, fusion_first=False):
        calls.append((fusion_first, cut))
        return batch(self, state, passes, cut=cut, fusion_first=fusion_first)

    monkeypatch.setattr(gs._Explorer, "batch", recorded)
    g = small_cnn()
    for budget in (1e-9, 60.0):
        calls.clear()
        _, rep = search_graph(g, cost(), GraphSearchConfig(budget_s=budget, max_expansions=1, finish_descent=True))
        assert rep.applied and calls[:2] == [(False, False), (True, budget < 1)], (budget, calls)


def test_a_descent_matched_against_its_own_rules_finds_what_matching_every_rule_found(monkeypatch):
    """A batch descent never applies an exploration move, so its graphs are matched against the other rules
    only: the same moves, in the same order, with the same keys and estimates, and the same search result
    as when every rule's sites were enumerated on every graph of the descent."""
    import search.graph.search as gs
    from rewrite_rules import EXPLORATION_FAMILIES

    g = small_cnn(channels=16)  # (channels in blocks of 8 and 16: the layout exploration's moves match)
    rules = gs.default_rules()
    config = GraphSearchConfig(budget_s=1e-6, finish_descent=True)  # (the start's first descent, whatever the time)
    best, report = search_graph(g, cost(), config, rules)
    assert report.applied

    ex = gs._Explorer(rules, cost(), gs._Budget(float("inf"), None))
    for graph in (g, best):
        state = ex.state(graph, ()) or gs._State(graph, ex.cost(graph), (), "")
        every = ex.moves(gs._State(graph, state.cost, (), ""))
        assert any(m.rule.family in EXPLORATION_FAMILIES for m in every)  # (there is something to leave out)
        own = ex.moves(gs._State(graph, state.cost, (), ""), exploration=False)

        def seen(moves):
            return [(m.rule.name, m.site, m.key, m.estimate) for m in moves]

        assert seen(own) == seen(m for m in every if m.rule.family not in EXPLORATION_FAMILIES)

    init = gs._Explorer.__init__

    def every_rule_in_descents(self, *a, **kw):
        init(self, *a, **kw)
        self.descent_rules = self.rules

    monkeypatch.setattr(gs._Explorer, "__init__", every_rule_in_descents)
    best_all, report_all = search_graph(g, cost(), config, rules)
    assert GraphDigests()(best_all) == GraphDigests()(best)
    assert report_all.applied == report.applied and report_all.cost_after == report.cost_after
