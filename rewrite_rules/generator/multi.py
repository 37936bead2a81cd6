"""Multi-output merge rules (TASO's key ones), derived from single-output rules of a concat of siblings.

A generated rule ``concat_a(L(X, W), L(X, V)) = R(X, concat(W, V))`` where the two concatenated terms are
*siblings* (the same ops over a shared input ``X`` and their own inputs ``W`` / ``V``) says: the two ops
reading ``X`` are one op over the concatenated inputs, followed by slices. As a rule on graphs, its left
side has several outputs, one per sibling (``conv(X, W1, B1)``, ``conv(X, W2, B2)``: two nodes reading the
same tensor), and its right side computes ``R`` once and slices each old output out of it. It is stated
for ``n`` siblings (n = 2 and 3: inception's parallel 1x1 convs, Q/K/V): each sibling's own inputs and
its own extent symbols are cloned per sibling, the concatenations of sibling inputs in ``R`` become
n-ary, and the slice bounds are the running sums of the siblings' extents. The rules are verified like
every other (their examples have one output per sibling). Family ``exploration``: the merged op and
its slices are more nodes than the siblings, so a graph search (with a cost) decides, never greedy.

The same derivation also states the binary rule for an n-ary concat of siblings (``concat1(relu(X0), ..,
relu(X3)) = relu(concat1(X0, .., X3))``): a real concat has as many inputs as a model gives it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from rewrite_rules.generator import dims
from rewrite_rules.generator.core_ops import CORE_OPS, Shape
from rewrite_rules.generator.enumerate import Term, World
from rewrite_rules.generator.pattern import Program, RuleData, Step
from rewrite_rules.generator.prune import Candidate

SIBLINGS = (2, 3)  # merged siblings
LIFTED = (3, 4)  # arguments of an n-ary concat (the binary rule is the generated one)


def _sibling_map(terms: list[Term], a: int, b: int, sigma: dict[str, str]) -> bool:
    """Extend ``sigma`` (inputs of ``a`` -> inputs of ``b``) so that term ``b`` is term ``a`` renamed."""
    ta, tb = terms[a], terms[b]
    if ta.op is None or tb.op is None:
        if ta.op is not None or tb.op is not None:
            return False
        if sigma.setdefault(ta.name, tb.name) != tb.name:
            return False
        return list(sigma.values()).count(tb.name) == 1
    if ta.op != tb.op or ta.attrs != tb.attrs or len(ta.args) != len(tb.args):
        return False
    return all(_sibling_map(terms, x, y, sigma) for x, y in zip(ta.args, tb.args))


def _symbol_map(shape_of: dict[str, Shape], sigma: dict[str, str]) -> dict[str, str] | None:
    tau: dict[str, str] = {}
    for x, y in sigma.items():
        sx, sy = shape_of[x], shape_of[y]
        if len(sx) != len(sy):
            return None
        for dx, dy in zip(sx, sy):
            if dx == dy:
                continue
            if not (dx.isidentifier() and dy.isidentifier()) or tau.setdefault(dx, dy) != dy:
                return None
    return tau


def _steps(terms: list[Term], tid: int, leaf, steps: list[Step], memo: dict[int, str], prefix: str,
           concat_of: dict[tuple[str, str], list[str]] | None = None) -> str:
    """Append term ``tid``'s ops to ``steps`` (inputs spelled by ``leaf``; ``concat_of``: a concat of two
    inputs spelled as the n-ary concat of the given inputs); the name of its result."""
    t = terms[tid]
    if t.op is None:
        return leaf(t.name)
    if tid not in memo:
        pair = tuple(terms[a].name for a in t.args) if all(terms[a].op is None for a in t.args) else None
        if concat_of is not None and t.op == "concat" and pair in concat_of:
            args = tuple(concat_of[pair])
        else:
            args = tuple(_steps(terms, a, leaf, steps, memo, prefix, concat_of) for a in t.args)
        memo[tid] = f"{prefix}{len(steps)}"
        steps.append(Step(memo[tid], t.op, args, t.attrs))
    return memo[tid]


def merge_rules(world: World, kept: list[Candidate]) -> list[RuleData]:
    """The n-sibling merge rules of the kept candidates whose one side concatenates two siblings."""
    out: list[RuleData] = []
    shape_of = dict(world.inputs)
    for c in kept:
        terms = c.terms
        for cat, r in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
            t = terms[cat]
            if t.op != "concat" or any(terms[a].op is None for a in t.args) or terms[r].op == "concat":
                continue
            sigma: dict[str, str] = {}
            if not _sibling_map(terms, t.args[0], t.args[1], sigma):
                continue
            shared = sorted(x for x, y in sigma.items() if x == y)
            own = sorted(x for x, y in sigma.items() if x != y)
            if not own or set(sigma[x] for x in own) & set(sigma):
                continue
            tau = _symbol_map(shape_of, {x: sigma[x] for x in own})
            if tau is None:
                continue
            if shared:  # siblings reading one tensor: merged
                merged = _derive(world, c, t, r, sigma, shared, own, tau, lift=False)
                out += merged
                if _enlarges(kept, terms[t.args[0]].op):
                    out += [m for m in map(_mixed_kernels, merged[:1]) if m is not None]
            if cat == c.lhs:  # the concat of siblings is the bigger side: the same for an n-ary concat
                out += _derive(world, c, t, r, sigma, shared, own, tau, lift=True)
    return out


def _derive(world: World, c: Candidate, cat: Term, r: int, sigma: dict[str, str], shared: list[str], own: list[str],
            tau: dict[str, str], lift: bool) -> list[RuleData]:
    """``lift=False``: the n-sibling merge (several outputs); ``lift=True``: the rule itself for an n-ary concat
    of siblings (n = 3, 4: inception's four-way concats), one output (``generated`` when it has fewer ops:
    the n siblings' ops become one, so even a binary ``exploration`` rule shrinks lifted)."""
    terms = c.terms
    shape_of = dict(world.inputs)
    # R may read a sibling's own input only as concat(x, sigma(x)) along the axis of x's own symbol
    pairs = {(x, sigma[x]) for x in own}
    uses: list[tuple[str, ...]] = []

    def check(tid: int, parent_ok: bool) -> bool:
        u = terms[tid]
        if u.op is None:
            return parent_ok or u.name in shared
        names = tuple(terms[a].name for a in u.args) if all(terms[a].op is None for a in u.args) else ()
        if u.op == "concat" and len(names) == 2 and names[0] == names[1] and names[0] in shared:
            return True
        if u.op == "concat" and len(names) == 2 and names in pairs:
            uses.append((terms[u.args[0]].name, terms[u.args[1]].name))
            return True
        return all(check(a, False) for a in u.args)

    if not check(r, False) or {x for x, _ in uses} != set(own):
        return []
    axis = dict(cat.attrs)["axis"]
    # each sibling has its own extent along the concatenated axis (unless a shared input fixes it)
    fixed = {y for x in shared for d in shape_of[x] for y in dims.symbols(d)}
    clone = sorted(set(tau) | (dims.symbols(terms[cat.args[0]].shape[axis]) - fixed))
    if not all(s in clone for s in dims.symbols(terms[cat.args[0]].shape[axis])):
        return []  # the concatenated axis must be the siblings' own extent
    binding0 = [dict(b) for b in world.example_bindings]
    out = []
    for n in (LIFTED if lift else SIBLINGS):
        sym_of = [{s: (s if k == 0 else f"{s}{k}") for s in clone} for k in range(n)]

        def inp(x: str, k: int) -> str:
            return x if x in shared else f"{x}{k}"

        inputs: list[tuple[str, Shape]] = [(x, shape_of[x]) for x in shared]
        for k in range(n):
            inputs += [(inp(x, k), tuple(dims.rename(d, sym_of[k]) for d in shape_of[x])) for x in own]
        # left side: sibling k is args[0] with its own inputs renamed to clone k
        lsteps: list[Step] = []
        louts = []
        for k in range(n):
            memo: dict[int, str] = {}
            before = len(lsteps)
            o = _steps(terms, cat.args[0], lambda name, k=k: inp(name, k), lsteps, memo, "t")
            lsteps[before:] = [Step(s.out, s.op, s.args, tuple((a, _rename_attr(v, sym_of[k])) for a, v in s.attrs))
                               for s in lsteps[before:]]
            louts.append(o)
        # right side: R with each concat(x, sigma(x)) n-ary over the clones, then a slice per sibling
        rsteps: list[Step] = []
        concat_of = {(x, sigma[x]): [inp(x, k) for k in range(n)] for x in own}
        concat_of.update({(x, x): [x] * n for x in shared})  # a shared input, once per sibling
        merged = _steps(terms, r, lambda name: name, rsteps, {}, "m", concat_of)
        start = "0"
        routs = []
        for k in range(n):
            size = dims.rename(terms[cat.args[0]].shape[axis], sym_of[k])
            name = f"s{k}"
            rsteps.append(Step(name, "slice", (merged,), (("axis", axis), ("size", size), ("start", start))))
            routs.append(name)
            start = dims.add(start, size)
        bindings = []
        for b in binding0:
            nb = {s: v for s, v in b.items() if any(s in dims.symbols(d) for _, sh in inputs for d in sh)}
            for k in range(1, n):
                for s in clone:
                    nb[sym_of[k][s]] = b[s] + k
            bindings.append(tuple(sorted(nb.items())))
        if lift:
            lsteps.append(Step(f"t{len(lsteps)}", "concat", tuple(louts), cat.attrs))
            louts = [lsteps[-1].out]
            rsteps, routs = rsteps[:-n], [merged]
        lhs, rhs = Program(tuple(lsteps), tuple(louts)), Program(tuple(rsteps), tuple(routs))
        names = [x for x, _ in inputs]
        math = f"{lhs.text(names)} = {rhs.text(names)}"
        key = f"{n}|{lift}|{c.key}"
        polynomial = all(CORE_OPS[s.op].polynomial for s in lsteps + rsteps)
        family = "generated" if lift and len(lsteps) > len(rsteps) else "exploration"
        prefix = "gen_nary_" if lift else "gen_merge_"
        out.append(RuleData(prefix + hashlib.sha1(key.encode()).hexdigest()[:10], family, math,
                            polynomial, tuple(inputs), lhs, rhs, tuple(bindings)))
    return out


def _rename_attr(v, sym: dict[str, str]):
    if isinstance(v, str):
        return dims.rename(v, sym)
    if isinstance(v, tuple):
        return tuple(_rename_attr(x, sym) for x in v)
    return v


def _enlarges(kept: list[Candidate], conv: str | None) -> bool:
    """Whether a kept rule states ``conv(X, enlarge(W), ..) = conv(X, W, ..)`` (a kernel zero-padded by one
    computes the same same-padded conv)."""
    for c in kept:
        lhs, rhs = c.terms[c.lhs], c.terms[c.rhs]
        if lhs.op == conv and rhs.op == conv and len(lhs.args) > 1 and c.terms[lhs.args[1]].op == "enlarge" \
                and c.terms[lhs.args[1]].args[0] == rhs.args[1] and lhs.args[0] == rhs.args[0]:
            return True
    return False


def _mixed_kernels(data: RuleData) -> RuleData | None:
    """A two-sibling conv merge where the second sibling's kernel is larger by two (squeezenet's expand 1x1
    and 3x3 over one input): the first sibling's weights are enlarged (zero-padded) before the concat.
    The composition of the merge with the enumerated ``conv(X, enlarge(W), ..) = conv(X, W, ..)``."""
    kernels = [x for x, sh in data.inputs if len(sh) == 4 and sh[2] == sh[3] == "k"]
    first = [x for x in kernels if x.endswith("0")]
    second = [x for x in kernels if x.endswith("1")]
    if len(first) != 1 or len(second) != 1:
        return None
    w0, w1 = first[0], second[0]
    big = dims.add("k", "2")
    inputs = tuple((x, sh[:2] + (big, big) if x == w1 else sh) for x, sh in data.inputs)
    steps = [Step("e0", "enlarge", (w0,))]
    for st in data.rhs.steps:
        steps.append(Step(st.out, st.op, tuple("e0" if a == w0 else a for a in st.args), st.attrs))
    rhs = Program(tuple(steps), data.rhs.outputs)
    names = [x for x, _ in inputs]
    math = f"{data.lhs.text(names)} = {rhs.text(names)}"
    name = "gen_merge_" + hashlib.sha1(f"mixed|{data.name}".encode()).hexdigest()[:10]
    return RuleData(name, "exploration", math, data.polynomial, inputs, data.lhs, rhs, data.bindings)


# ---- merges through a distributing op: (f(L0, C0), f(L1, C1)) = split(f(R, concat(C0, C1))) ----------------------

@dataclass(frozen=True)
class Distributor:
    """An enumerated rule ``concat_a(f(A, C), f(B, E)) = f(concat_a(A, B), concat_b(C, E))`` over inputs: the op
    ``f`` applied to each sibling's output and its own operand (a per-column bias) commutes with the concat."""

    op: str
    pos: int  # the argument of f that is the concatenated tensor
    tensor: Shape  # its shape in the world (A)
    other: Shape  # the own operand's shape (C)
    axis: int  # a
    other_axis: int  # b
    attrs: tuple


def distributors(world: World, kept: list[Candidate]) -> list[Distributor]:
    shape_of = dict(world.inputs)
    out = []
    for c in kept:
        terms = c.terms
        for cat, r in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
            t, u = terms[cat], terms[r]
            if t.op != "concat" or u.op is None or u.op == "concat" or len(u.args) != 2:
                continue
            f0, f1 = (terms[a] for a in t.args)
            if f0.op != u.op or f1.op != u.op or f0.attrs != u.attrs or f1.attrs != u.attrs:
                continue
            if any(terms[a].op is not None for a in f0.args + f1.args):
                continue
            cats = [terms[a] for a in u.args]
            if any(x.op != "concat" or any(terms[a].op is not None for a in x.args) for x in cats):
                continue
            for pos in (0, 1):
                want = [(terms[f0.args[k]].name, terms[f1.args[k]].name) for k in (pos, 1 - pos)]
                got = [tuple(terms[a].name for a in cats[k].args) for k in (pos, 1 - pos)]
                a_name, c_name = want[0][0], want[1][0]
                if want == got and dict(cats[pos].attrs) == dict(t.attrs) and len({*want[0], *want[1]}) == 4:
                    out.append(Distributor(u.op, pos, shape_of[a_name], shape_of[c_name], dict(t.attrs)["axis"],
                                           dict(cats[1 - pos].attrs)["axis"], u.attrs))
    return out


def _program_shapes(program: Program, inputs: dict[str, Shape]) -> dict[str, Shape]:
    shapes = dict(inputs)
    for s in program.steps:
        shape = CORE_OPS[s.op].shape([shapes[a] for a in s.args], s.attr)
        if shape is None:
            raise ValueError(f"{s.op} does not apply to {[shapes[a] for a in s.args]}")
        shapes[s.out] = shape
    return shapes


def through(merge: RuleData, d: Distributor) -> RuleData | None:
    """The merge followed by ``d.op`` on every sibling (each with its own operand): one ``d.op`` on the merged
    result over the concatenated operands, then the split (Q/K/V projections with their biases)."""
    cuts = [merge.rhs.step_of[o] for o in merge.rhs.outputs]
    if any(c.op != "slice" for c in cuts) or cuts[0].attr["axis"] != d.axis:
        return None
    inputs = dict(merge.inputs)
    shapes = _program_shapes(merge.lhs, inputs)
    new_inputs = list(merge.inputs)
    lsteps, louts = list(merge.lhs.steps), []
    own = []
    for k, o in enumerate(merge.lhs.outputs):
        shape = shapes[o]
        if len(shape) != len(d.tensor) or not all(x.isidentifier() for x in d.tensor):
            return None
        unify = dict(zip(d.tensor, shape))
        try:
            other = tuple(unify[x] if x in unify else x for x in d.other)
        except KeyError:
            return None
        name = f"Z{k}"
        new_inputs.append((name, other))
        own.append(name)
        args = (o, name) if d.pos == 0 else (name, o)
        lsteps.append(Step(f"f{k}", d.op, args, d.attrs))
        louts.append(f"f{k}")
    cut_of = {c.out for c in cuts}
    rsteps = [s for s in merge.rhs.steps if s.out not in cut_of]
    merged = cuts[0].args[0]
    rsteps.append(Step("zc", "concat", tuple(own), (("axis", d.other_axis),)))
    rsteps.append(Step("fm", d.op, (merged, "zc") if d.pos == 0 else ("zc", merged), d.attrs))
    routs = []
    for k, c in enumerate(cuts):
        rsteps.append(Step(f"s{k}", "slice", ("fm",), c.attrs))
        routs.append(f"s{k}")
    lhs, rhs = Program(tuple(lsteps), tuple(louts)), Program(tuple(rsteps), tuple(routs))
    names = [x for x, _ in new_inputs]
    math = f"{lhs.text(names)} = {rhs.text(names)}"
    name = "gen_merge_" + hashlib.sha1(f"through|{merge.name}|{d}".encode()).hexdigest()[:10]
    polynomial = merge.polynomial and CORE_OPS[d.op].polynomial
    return RuleData(name, "exploration", math, polynomial, tuple(new_inputs), lhs, rhs, merge.bindings)
