"""Graph validation: the fast paths (a difference from the graph validated last, and one pass per node) accept
exactly the graphs the full check accepts, and a broken graph raises a one-line GraphError naming the cause."""

from __future__ import annotations

import gc
import weakref
from dataclasses import fields, replace

import numpy as np
import pytest

from search.graph.rewrite import RewriteConfig, search_rewrites
from superopt.frontends.light_models import randomized_light_model
from superopt.frontends.onnx_frontend import import_onnx
from superopt.ir import graph as graph_module
from superopt.ir.graph import Graph, GraphError
from superopt.ir.prune import prune_graph
from superopt.ir.types import TensorType
from superopt.target import host_target


@pytest.fixture(scope="module")
def squeezenet() -> Graph:
    return prune_graph(import_onnx(randomized_light_model("squeezenet")))


def unchecked(graph: Graph, **changes) -> Graph:
    """``graph`` with ``changes``, built without validation (a graph no constructor would let through)."""
    g = object.__new__(Graph)
    for f in fields(Graph):
        object.__setattr__(g, f.name, changes.get(f.name, getattr(graph, f.name)))
    return g


def fast_accepts(graph: Graph, base: Graph | None) -> bool:
    static = graph._static(base)
    return static is not None and (base is not None and graph._valid_from(base, static)
                                   or graph._valid_fast(static))


def full_accepts(graph: Graph) -> bool:
    try:
        graph._validate_full()
    except GraphError as err:
        assert "\n" not in str(err) and str(err)
        return False
    return True


def broken_variants(g: Graph):
    """(what is wrong, the changed fields) for graphs a few edits away from the valid ``g``."""
    nodes, types = list(g.nodes), dict(g.types)
    producer = g.producer
    for k in range(1, len(nodes)):
        n = nodes[k]
        if any(producer.get(i) is nodes[k - 1] for i in n.inputs):  # swapped with its producer
            swapped = [*nodes[:k - 1], n, nodes[k - 1], *nodes[k + 1:]]
            yield "read before defined", {"nodes": tuple(swapped)}
            yield "producer dropped", {"nodes": tuple(nodes[:k - 1] + nodes[k:])}
            break
    compute = [n for n in nodes if not n.is_extern]
    victim = compute[len(compute) // 2]
    out = victim.outputs[0]
    wrong = TensorType(tuple(d + 1 for d in types[out].shape), types[out].dtype)
    yield "output retyped", {"types": tuple((k, wrong if k == out else t) for k, t in g.types)}
    yield "output untyped", {"types": tuple((k, t) for k, t in g.types if k != out)}
    yield "node duplicated", {"nodes": (*nodes, replace(victim, name=victim.name + "_again"))}
    yield "node name reused", {"nodes": tuple(replace(n, name=nodes[0].name) if n is victim else n for n in nodes)}
    name, c = g.constants[0]
    yield "constant of another shape", {"constants": ((name, type(c)(np.zeros(c.array.size + 1, c.array.dtype))),
                                                      *g.constants[1:])}
    yield "input also a constant", {"constants": (*g.constants, (g.inputs[0], c))}
    yield "graph output never defined", {"outputs": (*g.outputs, "nowhere")}


def test_fast_validation_rejects_what_the_full_check_rejects(squeezenet):
    g = squeezenet
    assert fast_accepts(g, None) and fast_accepts(g, g) and full_accepts(g)
    seen = 0
    for what, changes in broken_variants(g):
        bad = unchecked(g, **changes)
        assert not full_accepts(bad), what
        assert not fast_accepts(bad, g), what  # as a step from the valid graph
        assert not fast_accepts(bad, None), what
        Graph(g.inputs, g.outputs, g.nodes, g.types, g.constants, g.name)  # the graph validated last: g
        with pytest.raises(GraphError) as err:
            replace(g, **changes)
        assert "\n" not in str(err.value), what
        seen += 1
    assert seen >= 9


def test_rewrite_search_gives_the_same_graph_with_full_validation(monkeypatch):
    """Every graph the rewrite pass builds gets the same verdict from the fast path as from the full check,
    and the pass returns the same graph when every graph is checked in full."""
    config = RewriteConfig(host_target(), graph_budget_s=600.0, graph_expansions=2)
    graphs = [prune_graph(import_onnx(randomized_light_model(m))) for m in ("squeezenet", "resnet50")]
    verdicts = {"fast": 0}
    full_validate = Graph._validate_full

    def both(self: Graph) -> None:
        last = graph_module._LAST_VALID[0]
        base = last() if last is not None else None
        ok = fast_accepts(self, base)
        assert ok == full_accepts(self) or not ok  # never accepts what the full check rejects
        verdicts["fast"] += ok
        full_validate(self)
        graph_module._LAST_VALID[0] = graph_module.weakref.ref(self)

    fast = [search_rewrites(g, config)[0].digest() for g in graphs]
    monkeypatch.setattr(Graph, "validate", both)
    checked = [search_rewrites(g, config)[0].digest() for g in graphs]
    assert checked == fast
    assert verdicts["fast"] > 100
    monkeypatch.setattr(Graph, "validate", full_validate)
    assert [search_rewrites(g, config)[0].digest() for g in graphs] == fast


def test_validation_keeps_no_graph_alive(squeezenet):
    """The graph validated last is only weakly referenced: dropping a graph frees it (and its weights)."""
    g = replace(squeezenet, name="copy")
    replace(g, name="next")  # validated against g
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is None


def _same_readers(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(len(a[t]) == len(b[t]) and all(x is y for x, y in zip(a[t], b[t])) for t in b)


def test_a_steps_readers_and_producers_are_those_of_a_pass_over_every_node(squeezenet):
    """A graph proven valid as a step from the graph validated before it patches that graph's readers,
    producers and nodes by name (rather than a pass over every node): the same lists, in the same order, as the full pass gives,
    along a chain of rewrites (fusions, folds, hoists: nodes replaced, dropped and added) and a node that
    reads one tensor twice."""
    from rewrite_rules import EXPLORATION_FAMILIES, RuleNotApplicable
    from search.graph.search import default_rules

    rules = [r for r in default_rules() if r.family not in EXPLORATION_FAMILIES]
    g, derived = squeezenet, 0
    for _ in range(40):
        assert g.consumers and g.producer and g.node_of  # (the base's answers: what a step patches)
        site_rule = next(((r, s) for r in rules for s in r.matches(g)), None)
        if site_rule is None:
            break
        try:
            new = site_rule[0].apply(g, site_rule[1])
        except RuleNotApplicable:
            break
        derived += graph_module._STEPS.get(id(new), (lambda: None,))[0]() is new
        full = unchecked(new)  # (built without validation: no step to patch from)
        assert _same_readers(new.consumers, full.consumers)
        assert new.producer.keys() == full.producer.keys()
        assert all(new.producer[t] is full.producer[t] for t in full.producer)
        assert new.node_of.keys() == full.node_of.keys() and all(new.node_of[k] is full.node_of[k] for k in full.node_of)
        g = new
    assert derived >= 20

    # a new node reading one tensor twice, in front of the readers of that tensor
    x = g.inputs[0]
    t = g.type_of[x]
    ix = ",".join(f"i{k}" for k in range(t.rank))
    from superopt.lang import compile_op

    op = compile_op(f"O[{ix}] = X[{ix}] + Y[{ix}]", {"X": t.shape, "Y": t.shape})
    twice = graph_module.Node("twice", op, (x, x), ("twice_out",))
    assert g.consumers and g.producer
    new = replace(g, nodes=(twice, *g.nodes), types=g.types + (("twice_out", op.type_of["O"]),),
                  outputs=g.outputs + ("twice_out",))
    assert graph_module._STEPS[id(new)][0]() is new
    assert _same_readers(new.consumers, unchecked(new).consumers)
    assert new.consumers[x][:2] == [twice, twice]
