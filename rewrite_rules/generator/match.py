"""Generated rules on real graphs: match a left-hand program, bind its symbolic extents, build the right-hand one.

A node matches a pattern step when :func:`~rewrite_rules.generator.core_ops.classify` recognises it
as that core op (commutative ops in either operand order); a pattern input binds a graph tensor (the
same input always the same tensor); the symbolic extents bind from the bound tensors' shapes and
every attribute (concat axis, slice bounds, reshape shape) must evaluate to what the node has. The
matched nodes other than the root must be read only inside the match (else rewriting would keep
them alive and duplicate work). A site is ``(root node name, bound tensor per pattern input...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from rewrite_rules import Rule, RuleNotApplicable, Site, node_named
from rewrite_rules.generator import dims
from rewrite_rules.generator.core_ops import CORE_OPS, Attrs, classify, concrete_attrs
from rewrite_rules.generator.pattern import Program, RuleData, build_program
from superopt.builder import GraphBuilder
from superopt.ir.graph import Constant, Graph, Node


@dataclass(frozen=True)
class Match:
    tensors: tuple[tuple[str, str], ...]  # pattern input -> graph tensor
    nodes: tuple[tuple[str, Node], ...]  # pattern step output -> graph node
    binding: tuple[tuple[str, Any], ...]  # symbol -> extent (``*S`` -> a shape)


class _Matcher:
    def __init__(self, graph: Graph, data: RuleData) -> None:
        self.graph = graph
        self.inputs = dict(data.inputs)
        self.prog: Program = data.lhs
        self.step = data.lhs.step_of
        self.of_node = graph_index(graph).of_node
        self.producer = graph.producer

    def at(self, root: Node) -> Iterator[Match]:
        if len(root.outputs) != 1:
            return
        seen = set()
        for vars_, nodes, attrs in self._tensor(self.prog.output, root.outputs[0], {}, {}, {}):
            m = self._finish(vars_, nodes, attrs)
            if m is not None and m.tensors not in seen:
                seen.add(m.tensors)
                yield m

    def _tensor(self, p: str, g: str, vars_: dict, nodes: dict, attrs: dict):
        if p in self.inputs:
            cur = vars_.get(p)
            if cur is None:
                yield {**vars_, p: g}, nodes, attrs
            elif cur == g:
                yield vars_, nodes, attrs
            return
        if p in nodes:
            if nodes[p].outputs[0] == g:
                yield vars_, nodes, attrs
            return
        node = self.producer.get(g)
        if node is None or len(node.outputs) != 1 or any(n is node for n in nodes.values()):
            return
        step = self.step[p]
        for op, at in self.of_node[id(node)]:
            if op != step.op:
                continue
            orders = [node.inputs]
            if CORE_OPS[op].commutative and node.inputs[::-1] != node.inputs:
                orders.append(node.inputs[::-1])
            for ins in orders:
                yield from self._args(step.args, ins, vars_, {**nodes, p: node}, {**attrs, p: at})

    def _args(self, ps, gs, vars_, nodes, attrs):
        if not ps:
            yield vars_, nodes, attrs
            return
        for v, n, a in self._tensor(ps[0], gs[0], vars_, nodes, attrs):
            yield from self._args(ps[1:], gs[1:], v, n, a)

    def _finish(self, vars_: dict[str, str], nodes: dict[str, Node], attrs: dict[str, Attrs]) -> Match | None:
        t = self.graph.type_of
        binding: dict[str, Any] = {}
        dtypes = {t[g].dtype for g in vars_.values()}
        if len(dtypes) != 1 or dtypes.pop() not in ("float32", "float64"):
            return None
        deferred = []
        for p, shape in self.inputs.items():
            conc = t[vars_[p]].shape
            if shape == (dims.SHAPE_VARIABLE,):
                if binding.setdefault(dims.SHAPE_VARIABLE, conc) != conc:
                    return None
                continue
            if len(shape) != len(conc):
                return None
            for d, n in zip(shape, conc):
                if d.isidentifier():
                    if binding.setdefault(d, n) != n:
                        return None
                else:
                    deferred.append((d, n))
        try:
            if any(dims.value(d, binding) != n for d, n in deferred):
                return None
            for p in nodes:
                want = concrete_attrs(self.step[p].attr, binding)
                if any(attrs[p].get(k) != v for k, v in want.items()):
                    return None
        except KeyError:
            return None
        inner = {id(n) for n in nodes.values()}
        for p, node in nodes.items():
            if p == self.prog.output:
                continue
            out = node.outputs[0]
            if out in self.graph.outputs or any(id(c) not in inner for c in self.graph.consumers.get(out, [])):
                return None
        return Match(tuple(sorted(vars_.items())), tuple(nodes.items()), tuple(sorted(binding.items())))


@dataclass(frozen=True)
class _Index:
    by_op: dict[str, list[Node]]  # core op -> the nodes computing it
    of_node: dict[int, list[tuple[str, Attrs]]]  # id(node) -> what it computes


_INDEX: list[tuple[Graph, _Index]] = []  # the last few graphs seen


def graph_index(graph: Graph) -> _Index:
    """``graph``'s nodes classified as core ops (cached for the last few graphs seen)."""
    for g, index in _INDEX:
        if g is graph:
            return index
    by_op: dict[str, list[Node]] = {}
    of_node: dict[int, list[tuple[str, Attrs]]] = {}
    for node in graph.nodes:
        of_node[id(node)] = found = classify(graph, node)
        for op, _ in found:
            by_op.setdefault(op, []).append(node)
    index = _Index(by_op, of_node)
    _INDEX.insert(0, (graph, index))
    del _INDEX[8:]
    return index


def _roots(graph: Graph, data: RuleData) -> Iterator[Node]:
    yield from graph_index(graph).by_op.get(data.lhs.step_of[data.lhs.output].op, [])


def rule_sites(graph: Graph, data: RuleData) -> Iterator[Site]:
    m = _Matcher(graph, data)
    order = data.input_names
    for root in _roots(graph, data):
        for match in m.at(root):
            tensors = dict(match.tensors)
            yield (root.name, *(tensors[n] for n in order))


def rewrite_at(graph: Graph, data: RuleData, site: Site) -> Graph:
    root = node_named(graph, str(site[0]))
    order = data.input_names
    for match in _Matcher(graph, data).at(root):
        tensors = dict(match.tensors)
        if tuple(tensors[n] for n in order) == tuple(site[1:]):
            return _rewrite(graph, data, root, match)
    raise RuleNotApplicable(f"{data.name} does not match at {site}")


def _rewrite(graph: Graph, data: RuleData, root: Node, match: Match) -> Graph:
    out = root.outputs[0]
    matched = {id(n) for _, n in match.nodes}
    dropped = {n.outputs[0] for _, n in match.nodes if n is not root}
    b = GraphBuilder(graph.name)
    b.types = dict(graph.type_of)
    b.constants = {n: c.array for n, c in graph.constants}
    b._node_names = {n.name for n in graph.nodes}
    t = build_program(b, data.rhs, dict(match.tensors), dict(match.binding))
    if b.types[t] != graph.type_of[out]:
        raise RuleNotApplicable(f"{data.name}: the right-hand side is {b.types[t]}, not {graph.type_of[out]}")
    new_nodes = list(b.nodes)
    rename: dict[str, str] = {}
    if any(t in n.outputs for n in new_nodes):
        rename[t] = out
    elif out in graph.outputs:  # the result is an existing tensor, but the output keeps its name: copy it
        ix = ",".join(f"i{k}" for k in range(len(b.types[t].shape)))
        c = b.compute1(f"O[{ix}] = X[{ix}]", {"X": t}, "copy")
        new_nodes = list(b.nodes)
        rename[c] = out
    else:  # readers of the root's output read the existing tensor instead
        dropped.add(out)
        rename[out] = t

    def wire(n: Node) -> Node:
        return replace(n, inputs=tuple(rename.get(i, i) for i in n.inputs),
                       outputs=tuple(rename.get(o, o) for o in n.outputs))

    nodes: list[Node] = []
    for n in graph.nodes:
        if n is root:
            nodes += [wire(x) for x in new_nodes]
        elif id(n) not in matched:
            nodes.append(wire(n) if rename else n)
    gone = dropped | {k for k in rename if k != out}
    used = {i for n in nodes for i in n.inputs} | set(graph.outputs)
    types = [(n, ty) for n, ty in graph.types if n not in gone]
    have = {n for n, _ in types}
    types += [(n, ty) for n, ty in b.types.items() if n not in have and n not in gone and n not in rename]
    consts = list(graph.constants)
    for n, a in b.constants.items():
        if n not in graph.constant and n in used:
            consts.append((n, Constant(a)))
    keep = {n for n, _ in consts} | set(graph.inputs) | {o for n in nodes for o in n.outputs}
    return Graph(graph.inputs, graph.outputs, tuple(nodes), tuple((n, ty) for n, ty in types if n in keep),
                 tuple(consts), graph.name)


def make_rule(data: RuleData) -> Rule:
    """A :class:`Rule` whose ``matches``/``apply`` work on any graph, with ``data``'s examples."""
    return Rule(data.name, data.family, data.math,
                lambda graph: rule_sites(graph, data),
                lambda graph, site: rewrite_at(graph, data, site),
                lambda: [data.example(k) for k in range(len(data.bindings))],
                data.polynomial)

