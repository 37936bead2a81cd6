"""Enumerate small op programs over a world of symbolic inputs, fingerprinting each on random inputs.

Terms are built bottom-up by op count (up to ``max_ops``), each op applied only to *representatives*:
the first term seen with its fingerprint. A term whose fingerprint was seen before is not extended
further; it becomes a candidate substitution with the representative (TASO's pruning of rules whose
left side contains a smaller rule's left side follows: a left side is built from representatives only).

A fingerprint is the symbolic result shape, the float64 values (random normal inputs) rounded to 6
decimals, and for polynomial terms the exact values modulo a small prime (random residue inputs).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rewrite_rules.generator.core_ops import CORE_OPS, Shape, concrete_attrs

PRIME = 1_000_003  # fingerprints only (verification uses 2^61-1); int64 products stay below 2^63


@dataclass(frozen=True)
class World:
    """Inputs with symbolic shapes, the ops enumerated over them, and the extents used to evaluate them."""

    name: str
    inputs: tuple[tuple[str, Shape], ...]
    ops: tuple[str, ...]
    fingerprint_binding: tuple[tuple[str, int], ...]
    example_bindings: tuple[tuple[tuple[str, int], ...], ...]
    max_ops: int = 3


def _b(**kw: int) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(kw.items()))


WORLDS: tuple[World, ...] = (
    World("matrix", (("A", ("p", "q")), ("B", ("p", "q")), ("C", ("p", "q")), ("D", ("q", "r")), ("E", ("q", "r")),
                     ("F", ("r", "s"))),
          ("add", "mul", "relu", "matmul", "transpose", "concat", "slice"),
          _b(p=3, q=4, r=5, s=6), (_b(p=2, q=3, r=4, s=5), _b(p=5, q=2, r=3, s=4), _b(p=2, q=2, r=2, s=2))),
    World("conv", (("X", ("n", "c", "h", "w")), ("Y", ("n", "c", "h", "w")), ("W", ("o", "c", "3", "3")),
                   ("V", ("o", "c", "3", "3"))),
          ("add", "relu", "conv3x3", "concat"),
          _b(n=2, c=3, o=4, h=5, w=6), (_b(n=1, c=2, o=3, h=4, w=5), _b(n=2, c=3, o=2, h=3, w=4))),
    # real convs carry a bias and have any odd kernel (same padding); sibling weights have their own channels
    World("conv_bias", (("X", ("n", "c", "h", "w")), ("W", ("o", "c", "k", "k")), ("V", ("u", "c", "k", "k")),
                        ("B", ("o",)), ("D", ("u",))),
          ("convb", "relu", "concat", "enlarge"),
          _b(n=2, c=3, o=4, u=2, h=5, w=6, k=3), (_b(n=1, c=2, o=3, u=2, h=4, w=5, k=1),
                                                  _b(n=2, c=3, o=2, u=3, h=5, w=4, k=3))),
    World("conv_same", (("X", ("n", "c", "h", "w")), ("W", ("o", "c", "k", "k")), ("V", ("u", "c", "k", "k"))),
          ("convk", "concat"),
          _b(n=2, c=3, o=4, u=2, h=5, w=6, k=3), (_b(n=1, c=2, o=3, u=2, h=4, w=5, k=1),
                                                  _b(n=2, c=3, o=2, u=3, h=5, w=4, k=3))),
    # transformer projections: batched activations (b, p, q) against 2-D weights, per-column biases
    World("batched", (("X", ("b", "p", "q")), ("Y", ("b", "p", "q")), ("W", ("q", "r")), ("V", ("q", "s")),
                      ("C", ("r",)), ("E", ("r",))),
          ("matmul", "addb", "add", "concat", "transpose_last"),
          _b(b=2, p=3, q=4, r=5, s=3), (_b(b=2, p=2, q=3, r=4, s=2), _b(b=3, p=4, q=2, r=3, s=5))),
    # per-column ops on sibling results of their own widths (a merge's outputs): how they commute with a concat
    World("columns", (("A", ("b", "p", "r")), ("B", ("b", "p", "s")), ("C", ("r",)), ("E", ("s",))),
          ("addb", "concat"),
          _b(b=2, p=3, r=4, s=3), (_b(b=2, p=2, r=3, s=2), _b(b=3, p=2, r=2, s=4))),
    World("reshape", (("A", ("p", "q")), ("B", ("p", "q"))),
          ("add", "mul", "relu", "transpose", "flatten", "unflatten"),
          _b(p=3, q=4), (_b(p=2, q=3), _b(p=4, q=5))),
)


@dataclass(eq=False)
class Term:
    id: int
    op: str | None  # None: a world input
    attrs: tuple[tuple[str, Any], ...]
    args: tuple[int, ...]
    shape: Shape
    size: int  # ops in the tree
    value: np.ndarray = field(repr=False)
    residue: np.ndarray | None = field(repr=False)  # mod PRIME, polynomial terms only
    name: str | None = None  # the input's name
    dag: frozenset[int] = frozenset()  # ids of the op terms it is made of (shared subterms once)

    @property
    def polynomial(self) -> bool:
        return self.residue is not None


@dataclass
class Enumeration:
    world: World
    terms: list[Term]
    pairs: list[tuple[int, int]]  # (term, representative with the same fingerprint)
    representatives: int


def _key(shape: Shape, value: np.ndarray, residue: np.ndarray | None) -> tuple:
    h = hashlib.sha1((np.round(value, 6) + 0.0).tobytes())
    if residue is not None:
        h.update(residue.tobytes())
    return shape, h.hexdigest()


def enumerate_world(world: World, max_ops: int | None = None, ops: tuple[str, ...] | None = None,
                    seed: int = 0) -> Enumeration:
    rng = np.random.default_rng(seed)
    binding = dict(world.fingerprint_binding)
    terms: list[Term] = []
    first: dict[tuple, int] = {}
    reps: dict[int, list[int]] = {0: []}
    pairs: list[tuple[int, int]] = []
    for name, shape in world.inputs:
        conc = tuple(int(d) if d.isdigit() else binding[d] for d in shape)
        t = Term(len(terms), None, (), (), shape, 0, rng.standard_normal(conc),
                 rng.integers(0, PRIME, conc, dtype=np.int64), name)
        terms.append(t)
        first[_key(shape, t.value, t.residue)] = t.id
        reps[0].append(t.id)

    def offer(op_name: str, args: tuple[int, ...], size: int) -> None:
        op = CORE_OPS[op_name]
        kids = [terms[a] for a in args]
        shapes = [k.shape for k in kids]
        for attrs in op.attr_choices(shapes):
            shape = op.shape(shapes, attrs)
            if shape is None:
                continue
            conc = concrete_attrs(attrs, binding)
            value = op.numpy([k.value for k in kids], conc)
            residue = None
            if op.polynomial and all(k.polynomial for k in kids):
                residue = np.ascontiguousarray(op.numpy([k.residue for k in kids], conc) % PRIME)
            dag = frozenset().union(*(k.dag for k in kids))
            t = Term(len(terms), op_name, tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                      for k, v in attrs.items())), args, shape, size,
                     np.ascontiguousarray(value), residue)
            t.dag = dag | {t.id}
            terms.append(t)
            key = _key(shape, t.value, residue)
            if key in first:
                pairs.append((t.id, first[key]))
            else:
                first[key] = t.id
                reps[size].append(t.id)

    names = world.ops if ops is None else tuple(o for o in world.ops if o in ops)
    for size in range(1, (world.max_ops if max_ops is None else max_ops) + 1):
        reps[size] = []
        for op_name in names:
            op = CORE_OPS[op_name]
            if op.arity == 1:
                for a in list(reps[size - 1]):
                    offer(op_name, (a,), size)
            elif op.arity == 2:
                for s1 in range(size):
                    for a in list(reps[s1]):
                        for c in list(reps[size - 1 - s1]):
                            offer(op_name, (a, c), size)
            else:
                for s1 in range(size):
                    for s2 in range(size - s1):
                        for a in list(reps[s1]):
                            for c in list(reps[s2]):
                                for d in list(reps[size - 1 - s1 - s2]):
                                    offer(op_name, (a, c, d), size)
    return Enumeration(world, terms, pairs, sum(len(v) for v in reps.values()))
