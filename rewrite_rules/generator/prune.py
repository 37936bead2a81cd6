"""From fingerprint-equal pairs to distinct candidate rules (TASO's pruning, on symbolic terms).

- orientation: the side with more ops (shared subterms counted once) is the left-hand side; on a tie
  the rule is an *exploration* rule (family ``exploration``: equal size, for search, not for greedy);
- trivial: sides equal up to the operand order of commutative ops (the matcher tries both orders);
- unmatchable: the left side applies a binary op to one tensor twice (op functions build such an op
  with a single input, so it never occurs in a real graph in that form);
- renamed duplicates: the same rule after renaming inputs and extent symbols (the canonical key is
  the least spelling over all input orders, symbols named by first appearance);
- instances: a rule obtained from another by identifying inputs (``A+(B+B)`` from ``A+(B+C)``) or by
  substituting an input for a subterm of the left side, everywhere (``concat(concat(A,B),C@D)`` from
  ``concat(concat(A,B),C)``, ``(A+B)^T^T = A+B`` from ``A^T^T = A``): the general rule's matcher already
  finds those sites.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import permutations

from rewrite_rules.generator import dims
from rewrite_rules.generator.core_ops import CORE_OPS, Shape
from rewrite_rules.generator.enumerate import Enumeration, Term, World
from rewrite_rules.generator.pattern import Program, RuleData, Step

SYMBOL_NAMES = "pqrstuvw"
INPUT_NAMES = "ABCDEFGH"


@dataclass(frozen=True, eq=False)
class Candidate:
    world: World
    terms: list[Term]
    lhs: int
    rhs: int
    key: str  # canonical spelling
    inputs: tuple[str, ...]  # world inputs in canonical order
    symbols: tuple[str, ...]  # world symbols in canonical order
    exploration: bool


class _View:
    """Spelling of a pair of terms under an identification of inputs and a substitution of subterms."""

    def __init__(self, terms: list[Term], shape_of: dict[str, Shape], merge: dict[str, str] | None = None,
                 subst: dict[int, str] | None = None) -> None:
        self.terms, self.merge, self.subst = terms, merge or {}, subst or {}
        self.shape_of = dict(shape_of)
        for tid, name in self.subst.items():
            self.shape_of[name] = terms[tid].shape

    def leaf(self, tid: int) -> str | None:
        if tid in self.subst:
            return self.subst[tid]
        t = self.terms[tid]
        return self.merge.get(t.name, t.name) if t.op is None else None

    def inputs(self, tid: int, out: dict[str, None]) -> dict[str, None]:
        leaf = self.leaf(tid)
        if leaf is not None:
            out.setdefault(leaf)
            return out
        for a in self.terms[tid].args:
            self.inputs(a, out)
        return out

    def text(self, tid: int, var: dict[str, str], sym: dict[str, str]) -> str:
        leaf = self.leaf(tid)
        if leaf is not None:
            return var[leaf]
        t = self.terms[tid]
        args = [self.text(a, var, sym) for a in t.args]
        if CORE_OPS[t.op].commutative:
            args.sort()
        attrs = ",".join(f"{k}={_attr_text(v, sym)}" for k, v in t.attrs)
        return f"{t.op}[{attrs}]({','.join(args)})"

    def canonical(self, lhs: int, rhs: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        used = tuple(self.inputs(lhs, {}))
        best = None
        for order in permutations(used):
            var = {v: INPUT_NAMES[i] for i, v in enumerate(order)}
            sym = _symbols_of(order, self.shape_of)
            head = ";".join(f"{var[v]}:{','.join(dims.rename(d, sym) for d in self.shape_of[v])}" for v in order)
            key = f"{head}|{self.text(lhs, var, sym)}=>{self.text(rhs, var, sym)}"
            if best is None or key < best[0]:
                best = (key, order, tuple(sym))
        assert best is not None
        return best


def _attr_text(v, sym: dict[str, str]) -> str:
    if isinstance(v, str):
        return dims.rename(v, sym)
    if isinstance(v, tuple):
        return "(" + ",".join(_attr_text(x, sym) for x in v) + ")"
    return str(v)


def _symbols_of(order: tuple[str, ...], shape_of: dict[str, Shape]) -> dict[str, str]:
    sym: dict[str, str] = {}
    for v in order:
        for d in shape_of[v]:
            for s in sorted(dims.symbols(d)):
                sym.setdefault(s, SYMBOL_NAMES[len(sym)])
    return sym


def _partitions(items: list[str]) -> Iterator[list[list[str]]]:
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[head], *part]
        for k in range(len(part)):
            yield part[:k] + [[head, *part[k]]] + part[k + 1:]


def _merges(view: _View, used: list[str]) -> Iterator[dict[str, str]]:
    """Every non-trivial identification of inputs of equal shape."""
    by_shape: dict[Shape, list[str]] = {}
    for v in used:
        by_shape.setdefault(view.shape_of[v], []).append(v)
    choices: list[list[dict[str, str]]] = []
    for group in by_shape.values():
        choices.append([{v: blk[-1] for blk in p for v in blk} for p in _partitions(group)])
    def product(k: int, acc: dict[str, str]) -> Iterator[dict[str, str]]:
        if k == len(choices):
            if any(a != b for a, b in acc.items()):
                yield dict(acc)
            return
        for c in choices[k]:
            yield from product(k + 1, {**acc, **c})
    yield from product(0, {})


def _op_subterms(terms: list[Term], tid: int) -> set[int]:
    return {i for i in terms[tid].dag}


def candidates(e: Enumeration) -> tuple[list[Candidate], dict[str, int]]:
    """Distinct, non-redundant candidate rules of an enumeration, and how many pairs each pruning step dropped."""
    terms = e.terms
    shape_of = dict(e.world.inputs)
    plain = _View(terms, shape_of)
    stats = {"pairs": len(e.pairs), "trivial": 0, "unmatchable": 0, "rhs_reads_more": 0, "renamed_duplicates": 0,
             "instances": 0}
    seen: dict[str, Candidate] = {}
    ident = {n: n for n in shape_of}
    for a, r in e.pairs:
        ta, tr = terms[a], terms[r]
        lhs, rhs = (a, r) if len(ta.dag) >= len(tr.dag) else (r, a)
        if plain.text(lhs, ident, {}) == plain.text(rhs, ident, {}):
            stats["trivial"] += 1
            continue
        if any(len(terms[i].args) == 2 and terms[i].args[0] == terms[i].args[1] for i in terms[lhs].dag):
            stats["unmatchable"] += 1
            continue
        if not set(plain.inputs(rhs, {})) <= set(plain.inputs(lhs, {})):
            stats["rhs_reads_more"] += 1
            continue
        key, order, syms = plain.canonical(lhs, rhs)
        if key in seen:
            stats["renamed_duplicates"] += 1
            continue
        seen[key] = Candidate(e.world, terms, lhs, rhs, key, order, syms, len(terms[lhs].dag) == len(terms[rhs].dag))
    # instances of a kept rule: by identifying its inputs, or by a shared subterm standing for an input
    instances: set[str] = set()
    for c in seen.values():
        for merge in _merges(plain, list(c.inputs)):
            instances.add(_View(terms, shape_of, merge=merge).canonical(c.lhs, c.rhs)[0])
    kept = []
    for c in seen.values():
        general = c.key in instances
        for s in sorted(_op_subterms(terms, c.lhs) - {c.lhs}):
            view = _View(terms, shape_of, subst={s: "_Z"})
            if not set(view.inputs(c.rhs, {})) <= set(view.inputs(c.lhs, {})):
                continue
            g = view.canonical(c.lhs, c.rhs)[0]
            general = general or g in seen or g in instances
        if general:
            stats["instances"] += 1
        else:
            kept.append(c)
    return kept, stats


def _renamed_attr(v, sym: dict[str, str]):
    if isinstance(v, str):
        return dims.rename(v, sym)
    if isinstance(v, tuple):
        return tuple(_renamed_attr(x, sym) for x in v)
    return v


def _program(terms: list[Term], tid: int, var: dict[str, str], sym: dict[str, str]) -> Program:
    steps: list[Step] = []
    name: dict[int, str] = {}

    def visit(i: int) -> str:
        t = terms[i]
        if t.op is None:
            return var[t.name]
        if i not in name:
            args = tuple(visit(a) for a in t.args)
            name[i] = f"t{len(steps)}"
            steps.append(Step(name[i], t.op, args, tuple((k, _renamed_attr(v, sym)) for k, v in t.attrs)))
        return name[i]

    out = visit(tid)
    return Program(tuple(steps), (out,))


ELEMENTWISE_BINDINGS = (((dims.SHAPE_VARIABLE, (3, 4)),), ((dims.SHAPE_VARIABLE, (5,)),),
                        ((dims.SHAPE_VARIABLE, (2, 3, 2)),))


def rule_data(c: Candidate) -> RuleData:
    """The candidate as stored data: inputs ``A, B, ..`` and symbols ``p, q, ..`` in canonical order; a rule
    of elementwise ops over inputs of one shape is stated for any shape (``*S``)."""
    shape_of = dict(c.world.inputs)
    var = {v: INPUT_NAMES[i] for i, v in enumerate(c.inputs)}
    sym = {s: SYMBOL_NAMES[i] for i, s in enumerate(c.symbols)}
    lhs, rhs = _program(c.terms, c.lhs, var, sym), _program(c.terms, c.rhs, var, sym)
    inputs = tuple((var[v], tuple(dims.rename(d, sym) for d in shape_of[v])) for v in c.inputs)
    bindings = tuple(tuple(sorted((sym[k], n) for k, n in b if k in sym)) for b in c.world.example_bindings)
    ops = lhs.ops() + rhs.ops()
    if all(CORE_OPS[o].elementwise for o in ops) and len({s for _, s in inputs}) == 1:
        inputs = tuple((n, (dims.SHAPE_VARIABLE,)) for n, _ in inputs)
        bindings = ELEMENTWISE_BINDINGS
    names = [n for n, _ in inputs]
    math = f"{lhs.text(names)} = {rhs.text(names)}"
    name = "gen_" + hashlib.sha1(c.key.encode()).hexdigest()[:10]
    polynomial = all(CORE_OPS[o].polynomial for o in ops)
    return RuleData(name, "exploration" if c.exploration else "generated", math, polynomial, inputs, lhs, rhs, bindings)
