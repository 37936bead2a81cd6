"""Machine verification of a rewrite rule: every site on every example, rewritten, computes the same.

:func:`verify_rule` applies the rule at every site it matches in each of its example graphs and
compares the rewritten graph with the original:

- **float64**: the reference interpreter on random inputs (several seeds), every output within a
  relative tolerance of the largest output magnitude (a rule may store a folded constant in
  float32, so the tolerance is not zero);
- **finite field** (rules marked ``polynomial``): inputs are random residues modulo a large
  prime and every operation is exact modular arithmetic (:class:`ModP` elements in numpy object
  arrays, float constants read as the exact rationals they are), so no rounding can hide an error.
  An op that is not polynomial (a comparison, ``max``, ``exp``...) cannot run over the field: it is
  evaluated as an uninterpreted function of its inputs (equal op, equal inputs: equal outputs), so the
  context around a site may be anything, and a rule that claims ``polynomial`` but changes such an
  op fails the check.

It also checks the interface: the rewritten graph keeps the inputs, outputs and their types, and
its :func:`~superopt.ir.canonical.graph_digest` differs (a rule must change something).
A failure raises :class:`RuleVerificationError` with a one-line message naming the rule, the
example and site, the check and the error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site
from superopt.interp import evaluate, evaluate_compute
from superopt.ir.canonical import graph_digest
from superopt.ir.externs import evaluate_extern
from superopt.ir.graph import Graph
from superopt.ir.types import is_float

FIELD_PRIME = (1 << 61) - 1  # a Mersenne prime: two different polynomials of small degree agree with chance ~deg/p
FLOAT_RTOL = 1e-6  # relative to the largest output magnitude (float32-stored folded constants round at ~6e-8)


class RuleVerificationError(AssertionError):
    """A rule rewrote a graph into one that computes something else (or broke the graph's interface)."""


@dataclass(frozen=True)
class RuleCheck:
    """What :func:`verify_rule` checked: examples, sites, evaluations, and the largest float error seen."""

    rule: str
    examples: int
    sites: int
    float_evaluations: int
    field_evaluations: int
    max_float_error: float


def _hash_int(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


class ModP:
    """An element of the field of integers modulo :data:`FIELD_PRIME` (numpy object arrays hold these).

    Ints and floats mix in exactly: a float is the rational it stores (a dyadic fraction), mapped
    into the field. What is not field arithmetic is *uninterpreted* but deterministic: a unary
    function (``exp``, ``tanh``...: numpy calls the element's method of that name) maps each value to a
    pseudo-random one, and comparisons (so ``max``, ``relu``, ``where``) follow a pseudo-random total
    order of the field. Data movement around such ops is then checked exactly, and dropping or
    changing one shows; identities that need the real order (``relu(2x) = 2 relu(x)``) are not
    polynomial and fail here, as they should for a rule marked polynomial."""

    __slots__ = ("v",)

    def __init__(self, v: int) -> None:
        self.v = v % FIELD_PRIME

    @staticmethod
    def of(x) -> ModP:
        if isinstance(x, ModP):
            return x
        if isinstance(x, (bool, np.bool_)):
            return ModP(int(x))
        if isinstance(x, (int, np.integer)):
            return ModP(int(x))
        if isinstance(x, (float, np.floating)):
            if not np.isfinite(x):
                raise TypeError(f"{x} has no value in the finite field")
            f = Fraction(float(x))
            return ModP(f.numerator * pow(f.denominator, -1, FIELD_PRIME))
        raise TypeError(f"cannot read {type(x).__name__} {x!r} as a field element")

    def __add__(self, o):
        return ModP(self.v + ModP.of(o).v)

    __radd__ = __add__

    def __sub__(self, o):
        return ModP(self.v - ModP.of(o).v)

    def __rsub__(self, o):
        return ModP(ModP.of(o).v - self.v)

    def __mul__(self, o):
        return ModP(self.v * ModP.of(o).v)

    __rmul__ = __mul__

    def __truediv__(self, o):
        d = ModP.of(o).v
        if d == 0:
            raise ZeroDivisionError("division by zero in the finite field")
        return ModP(self.v * pow(d, -1, FIELD_PRIME))

    def __rtruediv__(self, o):
        return ModP.of(o) / self

    def __neg__(self):
        return ModP(-self.v)

    def __pos__(self):
        return self

    def _rank(self) -> int:
        return _hash_int("order", self.v)

    def __lt__(self, o) -> bool:
        return self._rank() < ModP.of(o)._rank()

    def __le__(self, o) -> bool:
        return self._rank() <= ModP.of(o)._rank()

    def __gt__(self, o) -> bool:
        return self._rank() > ModP.of(o)._rank()

    def __ge__(self, o) -> bool:
        return self._rank() >= ModP.of(o)._rank()

    def __abs__(self) -> ModP:
        return ModP(_hash_int("abs", self.v))

    def __getattr__(self, name: str):  # numpy calls x.exp(), x.tanh()... on object arrays
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args: ModP(_hash_int(name, self.v))

    def __eq__(self, o) -> bool:
        try:
            return self.v == ModP.of(o).v
        except TypeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self.v)

    def __repr__(self) -> str:
        return f"ModP({self.v})"


def _residues(a) -> np.ndarray:
    """An array of field values (ModP, or the plain numbers a padded read yields) as Python ints."""
    arr = np.asarray(a, dtype=object)
    return np.vectorize(lambda x: ModP.of(x).v, otypes=[object])(arr) if arr.size else arr


def _uninterpreted(node, ins: list[np.ndarray], out_types) -> list[np.ndarray]:
    """Outputs of a node that is not polynomial, as an uninterpreted function: residues drawn from a hash
    of the node's op and its input values, so the same op on the same values gives the same outputs in
    both graphs (and a rule that changes a non-polynomial op shows as a mismatch)."""
    from superopt.ir.canonical import canonicalize

    h = hashlib.sha256((node.op.text() if node.is_extern else canonicalize(node.op).digest()).encode())
    for a in ins:
        arr = np.asarray(a)
        h.update(repr((arr.shape, _residues(arr).tolist() if arr.dtype == object else arr.tolist())).encode())
    rng = np.random.default_rng(int.from_bytes(h.digest()[:8], "little"))
    outs = []
    for t in out_types:
        if is_float(t.dtype):
            arr = np.empty(t.size, dtype=object)
            arr[:] = [ModP(int(x)) for x in rng.integers(0, 1 << 62, size=t.size, dtype=np.int64)]
            outs.append(arr.reshape(t.shape))
        else:
            outs.append(rng.integers(0, 2, t.shape).astype(t.np_dtype))
    return outs


def evaluate_field(graph: Graph, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``graph``'s outputs computed exactly over the field: ``feed`` holds residues for float inputs
    (ints for integer inputs); float constants enter as the exact rationals they store. A node that
    cannot run over the field (exp, max, a comparison of field values...) is an uninterpreted function
    of its inputs (:func:`_uninterpreted`): context around a polynomial rule's site need not be polynomial."""
    to_field = np.vectorize(ModP.of, otypes=[object])
    env: dict[str, np.ndarray] = {}
    for n in graph.inputs:
        t = graph.type_of[n]
        env[n] = to_field(np.asarray(feed[n], dtype=object)) if is_float(t.dtype) else np.asarray(feed[n])
    for n, c in graph.constants:
        a = c.array
        env[n] = to_field(a.astype(object)) if is_float(c.type.dtype) else a
    for node in graph.nodes:
        ins = [env[i] for i in node.inputs]
        try:
            with np.errstate(all="ignore"):
                if node.is_extern:
                    outs = evaluate_extern(node.op.kind, ins, node.op.attr)
                else:
                    outs = evaluate_compute(node.op, ins, object)
        except (TypeError, AttributeError, ValueError):
            outs = _uninterpreted(node, ins, [graph.type_of[o] for o in node.outputs])
        for name, val in zip(node.outputs, outs):
            env[name] = val
    return {o: env[o] for o in graph.outputs}


def field_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Random residues for float inputs, small random ints for integer ones, random bits for bools."""
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for n in graph.inputs:
        t = graph.type_of[n]
        if is_float(t.dtype):
            vals = [int(x) for x in rng.integers(0, 1 << 62, size=t.size, dtype=np.int64)]
            feed[n] = np.array(vals, dtype=object).reshape(t.shape)
        elif t.dtype == "bool":
            feed[n] = rng.random(t.shape) < 0.5
        else:
            feed[n] = rng.integers(0, 2, t.shape).astype(t.np_dtype)
    return feed


def float_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Standard normal float inputs (in float64, so no input rounding), small ints, random bools."""
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for n in graph.inputs:
        t = graph.type_of[n]
        if is_float(t.dtype):
            feed[n] = rng.standard_normal(t.shape)
        elif t.dtype == "bool":
            feed[n] = rng.random(t.shape) < 0.5
        else:
            feed[n] = rng.integers(0, 2, t.shape).astype(t.np_dtype)
    return feed


def float_error(want: np.ndarray, got: np.ndarray) -> float:
    """Largest |got - want| over max(1, largest |want|); inf where NaN/inf patterns differ or shapes do."""
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    if want.shape != got.shape:
        return float("inf")
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(want[~finite], got[~finite], equal_nan=True):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(1.0, float(np.abs(want[finite]).max()))
    return float(np.abs(got[finite] - want[finite]).max()) / scale


def _interface_problem(before: Graph, after: Graph) -> str | None:
    if after.inputs != before.inputs:
        return f"inputs changed from {list(before.inputs)} to {list(after.inputs)}"
    if after.outputs != before.outputs:
        return f"outputs changed from {list(before.outputs)} to {list(after.outputs)}"
    for n in before.inputs + before.outputs:
        if after.type_of[n] != before.type_of[n]:
            return f"tensor {n!r} changed type from {before.type_of[n]} to {after.type_of[n]}"
    if graph_digest(after) == graph_digest(before):
        return "the rewritten graph is the same graph (equal graph_digest): the rule changed nothing"
    return None


def _first_field_mismatch(want: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> str | None:
    for o, w in want.items():
        w, g = _residues(w), _residues(got[o])
        if w.shape != g.shape:
            return f"output {o!r} has shape {g.shape}, expected {w.shape}"
        bad = np.argwhere(w != g)
        if len(bad):
            i = tuple(int(x) for x in bad[0])
            return f"output {o!r} differs mod p at {len(bad)} of {w.size} elements (first at {i})"
    return None


def verify_rule(rule: Rule, seeds: Iterable[int] = (0, 1), field_seeds: Iterable[int] = (0,),
                checks: tuple[str, ...] = ("float64", "field"), rtol: float = FLOAT_RTOL,
                examples: list[Graph] | None = None) -> RuleCheck:
    """Check ``rule`` at every site of every example (``examples`` or ``rule.examples()``).

    ``checks`` selects the float64 comparison and/or the exact finite-field one (the latter only
    runs for ``rule.polynomial``). Raises :class:`RuleVerificationError` naming the rule, example,
    site and error at the first failure; returns a :class:`RuleCheck` otherwise."""
    seeds, field_seeds = tuple(seeds), tuple(field_seeds)
    graphs = rule.examples() if examples is None else examples
    if not graphs:
        raise RuleVerificationError(f"rule {rule.name}: has no example graphs")
    n_sites = n_float = n_field = 0
    worst = 0.0
    for k, graph in enumerate(graphs):
        where = f"rule {rule.name}: example {k} ({graph.name})"
        try:
            sites: list[Site] = rule.sites(graph)
        except Exception as e:  # noqa: BLE001 - any crash in matches is a verification failure
            raise RuleVerificationError(f"{where}: matches() raised {type(e).__name__}: {e}") from e
        if not sites:
            raise RuleVerificationError(f"{where}: the rule matches nowhere in its own example")
        want_float = {s: evaluate(graph, float_inputs(graph, s), np.float64) for s in seeds} if "float64" in checks else {}
        want_field: dict[int, dict[str, np.ndarray]] = {}
        for site in sites:
            at = f"{where} at site {site}"
            try:
                new = rule.apply(graph, site)
            except RuleNotApplicable as e:
                raise RuleVerificationError(f"{at}: matches() yielded the site but apply() refused it: {e}") from e
            except Exception as e:  # noqa: BLE001
                raise RuleVerificationError(f"{at}: apply() raised {type(e).__name__}: {e}") from e
            problem = _interface_problem(graph, new)
            if problem:
                raise RuleVerificationError(f"{at}: {problem}")
            n_sites += 1
            for s in want_float:
                got = evaluate(new, float_inputs(graph, s), np.float64)
                err = max(float_error(want_float[s][o], got[o]) for o in graph.outputs)
                n_float += 1
                worst = max(worst, err)
                if not err <= rtol:
                    raise RuleVerificationError(
                        f"{at}: float64 outputs differ (seed {s}): max error {err:.3g} relative to the output scale "
                        f"> {rtol:g}")
            if "field" in checks and rule.polynomial:
                for s in field_seeds:
                    feed = field_inputs(graph, s)
                    if s not in want_field:
                        want_field[s] = evaluate_field(graph, feed)
                    got_field = evaluate_field(new, feed)
                    n_field += 1
                    mismatch = _first_field_mismatch(want_field[s], got_field)
                    if mismatch:
                        raise RuleVerificationError(f"{at}: exact finite-field check failed (seed {s}, mod 2^61-1): "
                                                    f"{mismatch}")
    return RuleCheck(rule.name, len(graphs), n_sites, n_float, n_field, worst)


__all__ = ["FIELD_PRIME", "ModP", "RuleCheck", "RuleVerificationError", "evaluate_field", "field_inputs",
           "float_error", "float_inputs", "verify_rule"]
