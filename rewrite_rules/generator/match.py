"""Generated rules on real graphs: match a left-hand program, bind its symbolic extents, build the right-hand one.

A node matches a pattern step when :func:`~rewrite_rules.generator.core_ops.classify` recognises it
as that core op (commutative ops in either operand order); a pattern input binds a graph tensor (the
same input always the same tensor); the symbolic extents bind from the bound tensors' shapes and
every attribute (concat axis, slice bounds, reshape shape) must evaluate to what the node has. The
matched nodes other than the root must be read only inside the match (else rewriting would keep
them alive and duplicate work). A site is ``(root node name, bound tensor per pattern input...)``.
"""

from __future__ import annotations

import weakref
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
    roots: tuple[str, ...]  # the nodes computing the pattern's outputs, by name
    binding: tuple[tuple[str, Any], ...]  # symbol -> extent (``*S`` -> a shape)


class _Matcher:
    def __init__(self, graph: Graph, data: RuleData) -> None:
        self.graph = graph
        self.inputs = dict(data.inputs)
        self.prog: Program = data.lhs
        self.step = data.lhs.step_of
        index = graph_index(graph)
        self.of_node, self.by_op, self.position = index.of_node, index.by_op, index.position
        self.producer = graph.producer
        self.ordered = _interchangeable(data)

    def at(self, root: Node) -> Iterator[Match]:
        """Matches whose first output is ``root``'s; a multi-output pattern's further outputs are nodes after
        the previous one in graph order when its outputs are interchangeable (any order is the same match)."""
        if len(root.outputs) != 1:
            return
        seen = set()
        for vars_, nodes, attrs in self._tensor(self.prog.outputs[0], root.outputs[0], {}, {}, {}):
            for v, n, a in self._more(1, root, vars_, nodes, attrs):
                m = self._finish(v, n, a)
                if m is not None and (m.tensors, m.roots) not in seen:
                    seen.add((m.tensors, m.roots))
                    yield m

    def _more(self, k: int, prev: Node, vars_: dict, nodes: dict, attrs: dict):
        if k == len(self.prog.outputs):
            yield vars_, nodes, attrs
            return
        p = self.prog.outputs[k]
        step = self.step[p]
        after = self.position[id(prev)]
        bound = [vars_[a] for a in step.args if a in vars_]  # a root reads a bound tensor: look among its readers
        pool = self.graph.consumers.get(bound[0], []) if bound else self.by_op.get(step.op, [])
        taken = {id(n) for n in nodes.values()}
        for node in sorted({id(n): n for n in pool}.values(), key=lambda n: self.position[id(n)]):
            if self.ordered and self.position[id(node)] <= after or id(node) in taken or len(node.outputs) != 1:
                continue
            for v, n, a in self._tensor(p, node.outputs[0], vars_, nodes, attrs):
                yield from self._more(k + 1, node, v, n, a)

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
        if len(node.inputs) != len(step.args):
            return
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
            if p in self.prog.outputs:
                continue
            out = node.outputs[0]
            if out in self.graph.outputs or any(id(c) not in inner for c in self.graph.consumers.get(out, [])):
                return None
        roots = tuple(nodes[p].name for p in self.prog.outputs)
        return Match(tuple(sorted(vars_.items())), tuple(nodes.items()), roots, tuple(sorted(binding.items())))


def _interchangeable(data: RuleData) -> bool:
    """Whether a multi-output pattern's outputs are alike up to renaming their own inputs and extents (then
    matching them in graph order only finds each site once)."""
    if len(data.lhs.outputs) == 1:
        return True
    step = data.lhs.step_of
    shape_of = dict(data.inputs)
    args = [[a for a in step[o].args if a in shape_of] for o in data.lhs.outputs]
    readers: dict[str, set[int]] = {}
    for k, xs in enumerate(args):
        for x in xs:
            for d in shape_of[x]:
                for s in dims.symbols(d):
                    readers.setdefault(s, set()).add(k)
    common = {s for s, ks in readers.items() if len(ks) > 1}

    def sig(x: str) -> tuple[str, ...]:
        return tuple(d if dims.symbols(d) <= common else "_" for d in shape_of[x])

    return len({(step[o].op, tuple(map(sig, xs))) for o, xs in zip(data.lhs.outputs, args)}) == 1


@dataclass(frozen=True)
class _Index:
    by_op: dict[str, list[Node]]  # core op -> the nodes computing it
    of_node: dict[int, list[tuple[str, Attrs]]]  # id(node) -> what it computes
    position: dict[int, int]  # id(node) -> its index in graph order


# the last few graphs seen, held weakly: a strong hold kept eight graphs and their constants (every weight
# of a model, in each layout a rewrite made) alive until the next compile
_INDEX: list[tuple[weakref.ref, _Index]] = []


def graph_index(graph: Graph) -> _Index:
    """``graph``'s nodes classified as core ops (cached for the last few graphs seen)."""
    for ref, index in _INDEX:
        if ref() is graph:
            return index
    by_op: dict[str, list[Node]] = {}
    of_node: dict[int, list[tuple[str, Attrs]]] = {}
    for node in graph.nodes:
        of_node[id(node)] = found = classify(graph, node)
        for op, _ in found:
            by_op.setdefault(op, []).append(node)
    index = _Index(by_op, of_node, {id(n): k for k, n in enumerate(graph.nodes)})
    _INDEX[:] = [(weakref.ref(graph), index), *((r, i) for r, i in _INDEX if r() is not None)][:8]
    return index


def _roots(graph: Graph, data: RuleData) -> Iterator[Node]:
    yield from graph_index(graph).by_op.get(data.lhs.step_of[data.lhs.output].op, [])


def rule_sites(graph: Graph, data: RuleData) -> Iterator[Site]:
    """Sites ``(root node names..., bound tensor per pattern input...)``: one root per pattern output."""
    m = _Matcher(graph, data)
    order = data.input_names
    for root in _roots(graph, data):
        for match in m.at(root):
            tensors = dict(match.tensors)
            yield (*match.roots, *(tensors[n] for n in order))


def rewrite_at(graph: Graph, data: RuleData, site: Site) -> Graph:
    k = len(data.lhs.outputs)
    roots, bound = tuple(str(s) for s in site[:k]), tuple(site[k:])
    root = node_named(graph, roots[0])
    order = data.input_names
    for match in _Matcher(graph, data).at(root):
        tensors = dict(match.tensors)
        if match.roots == roots and tuple(tensors[n] for n in order) == bound:
            return _rewrite(graph, data, match)
    raise RuleNotApplicable(f"{data.name} does not match at {site}")


def _topological(nodes: list[Node], ready: set[str]) -> list[Node]:
    """``nodes`` in an order where each reads only tensors written before it (the given order where it is)."""
    out: list[Node] = []
    have = set(ready)
    pending = list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in have for i in n.inputs):
                out.append(n)
                have.update(n.outputs)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise RuleNotApplicable("the rewrite would create a cycle")
        pending = rest
    return out


def _rewrite(graph: Graph, data: RuleData, match: Match) -> Graph:
    by_name = {n.name: n for _, n in match.nodes}
    roots = [by_name[r] for r in match.roots]
    outs = [r.outputs[0] for r in roots]
    dropped = {n.outputs[0] for _, n in match.nodes if n.name not in match.roots}
    b = GraphBuilder(graph.name)
    b.types = dict(graph.type_of)
    b.constants = {n: c.array for n, c in graph.constants}
    b._node_names = {n.name for n in graph.nodes}
    built = build_program(b, data.rhs, dict(match.tensors), dict(match.binding), fold_constants=True)
    for t, out in zip(built, outs):
        if b.types[t] != graph.type_of[out]:
            raise RuleNotApplicable(f"{data.name}: the right-hand side is {b.types[t]}, not {graph.type_of[out]}")
    rename: dict[str, str] = {}
    for t, out in zip(built, outs):
        if any(t in n.outputs for n in b.nodes) and t not in rename:
            rename[t] = out
        elif out in graph.outputs or t in rename:  # an existing tensor, but the output keeps its name: copy it
            ix = ",".join(f"i{k}" for k in range(len(b.types[t].shape)))
            rename[b.compute1(f"O[{ix}] = X[{ix}]", {"X": t}, "copy")] = out
        else:  # readers of the root's output read the existing tensor instead
            dropped.add(out)
            rename[out] = t
    new_nodes = list(b.nodes)

    def wire(n: Node) -> Node:
        return replace(n, inputs=tuple(rename.get(i, i) for i in n.inputs),
                       outputs=tuple(rename.get(o, o) for o in n.outputs))

    matched = {id(n) for _, n in match.nodes}
    nodes: list[Node] = []
    for n in graph.nodes:
        if n is roots[0]:
            nodes += [wire(x) for x in new_nodes]
        elif id(n) not in matched:
            nodes.append(wire(n) if rename else n)
    if len(roots) > 1:  # the merged op reads what every root read: later producers move before it
        nodes = _topological(nodes, set(graph.inputs) | {n for n, _ in graph.constants} | set(b.constants))
    gone = dropped | {k for k in rename if k not in outs}
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

