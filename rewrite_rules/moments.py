"""A weighted variance around a weighted mean in one pass over the data, with a shift that keeps it exact enough.

    Rs += w;  N += w*V;  MU = N / Rs;  D += w*(V - MU)^2
  = K = V at one point;  Rs += w;  S1 += w*(V - K);  S2 += w*(V - K)^2;  MU = K + S1/Rs;  D = S2 - S1*S1/Rs

The second pass of the left side reads MU, a result of the first pass, so ``V`` must be stored or computed
twice; the right side reads ``V`` once (both sums fold into the contraction's write-back). Around an arbitrary
origin ``D = sum w V^2 - (sum w V)^2 / Rs`` cancels catastrophically when the mean is large against the
spread; around a shift ``K`` drawn from the data itself (``V`` at the first point of the reduced dims,
recomputed from the inputs as a small contraction of its own), ``(MU - K)^2`` is of the order of the variance
and the subtraction loses only a few bits: the shifted-data algorithm, which Chan, Golub and LeVeque analyse
beside the pairwise (per-tile) merge. ``V`` must be a contraction of the same compute and ``w`` a tensor the
compute does not compute after ``V``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Binary, product_accesses, substitute_dims
from superopt.ir.graph import Graph
from superopt.ir.statement import Statement


def _factors(e) -> list | None:
    if isinstance(e, Binary) and e.op == "*":
        a, b = _factors(e.a), _factors(e.b)
        return None if a is None or b is None else a + b
    return [e]


def _match(compute: Compute, d: Statement) -> dict | None:
    """The statements of the pattern whose second pass is ``d``, or None."""
    if d.reduce != "+=" or d.padding:
        return None
    fs = _factors(d.expr)
    if fs is None or len(fs) != 3:
        return None
    diffs = [f for f in fs if isinstance(f, Binary) and f.op == "-"]
    weights = [f for f in fs if isinstance(f, Access)]
    if len(diffs) != 2 or diffs[0] != diffs[1] or len(weights) != 1:
        return None
    x, m = diffs[0].a, diffs[0].b
    w = weights[0]
    own = tuple(Affine.dim(dd) for dd in d.out_dims)
    if not (isinstance(x, Access) and isinstance(m, Access) and m.index == own):
        return None
    by = {s.out: s for s in compute.statements}
    mu, v = by.get(m.tensor), by.get(x.tensor)
    if mu is None or v is None or mu.reduce != "=" or not isinstance(mu.expr, Binary) or mu.expr.op != "/":
        return None
    n_acc, rs_acc = mu.expr.a, mu.expr.b
    if not (isinstance(n_acc, Access) and isinstance(rs_acc, Access)) or n_acc.index != tuple(
            Affine.dim(dd) for dd in mu.out_dims) or mu.out_dims != d.out_dims:
        return None
    n, rs = by.get(n_acc.tensor), by.get(rs_acc.tensor)
    if n is None or rs is None or n.extents != d.extents or n.out_dims != d.out_dims or n.padding or rs.padding:
        return None
    nf = _factors(n.expr)
    if nf is None or sorted(map(repr, nf)) != sorted(map(repr, [w, x])) or rs.reduce != "+=" or n.reduce != "+=":
        return None
    # Rs sums the same weights: its dims renamed to d's through the weight's index are d's
    rs_w = rs.expr if isinstance(rs.expr, Access) else None
    if rs_w is None or rs_w.tensor != w.tensor or not all(ix.is_plain_dim for ix in rs_w.index + w.index) \
            or not all(ix.is_plain_dim for ix in rs_acc.index):
        return None
    rename = {a.dims[0]: Affine.dim(b.dims[0]) for a, b in zip(rs_w.index, w.index, strict=True)}
    if substitute_dims(rs.expr, rename) != w or tuple(rename[dd].dims[0] for dd in rs.out_dims if dd in rename) \
            != tuple(ix.dims[0] for ix in rs_acc.index):
        return None
    accs = product_accesses(v.expr)
    if v.reduce != "+=" or v.padding or not accs or len(accs) != 2 or not all(ix.is_plain_dim for ix in x.index):
        return None
    order = [s.out for s in compute.statements]
    if w.tensor in order and order.index(w.tensor) > order.index(v.out):
        return None
    readers = [s for s in compute.statements if n.out in s.inputs() and s is not mu]
    if readers or n.out in compute.outputs:
        return None
    return {"d": d, "mu": mu, "n": n, "rs": rs, "v": v, "x": x, "w": w}


def shifted_moments_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if node.is_extern:
            continue
        for st in node.op.statements:
            if _match(node.op, st) is not None:
                yield (node.name, st.out)


def shifted_moments(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    c = node.op
    st = next((s for s in c.statements if s.out == site[1]), None) if not node.is_extern else None
    got = None if st is None else _match(c, st)
    if got is None:
        raise RuleNotApplicable(f"{site}: no weighted variance around a weighted mean")
    d, mu, n, rs, v, x, w = (got[k] for k in ("d", "mu", "n", "rs", "v", "x", "w"))
    used = set(c.type_of)
    k_name, s1_name, s2_name = (fresh_name(f"{d.out}_{tag}", used) for tag in ("shift", "s1", "s2"))
    # K[d's out dims] = V at the first point of the dims d sums over: V's own sum, those dims set to 0
    v_dim_of = {ix.dims[0]: vd for ix, vd in zip(x.index, v.out_dims, strict=True)}  # d's dim -> V's dim
    at_zero = {v_dim_of[dd]: Affine.of({}, 0) for dd in d.reduce_dims if dd in v_dim_of}
    keep = {v_dim_of[dd]: Affine.dim(dd) for dd in d.out_dims if dd in v_dim_of}
    k_expr = substitute_dims(v.expr, {**at_zero, **keep})
    k_ext = tuple((dd, nn) for dd, nn in d.extents if dd in d.out_dims) + tuple(
        (vd, nn) for vd, nn in v.extents if vd in v.reduce_dims)
    shift = Statement(k_name, d.out_dims, "+=", k_expr, k_ext, v.padding)
    own = tuple(Affine.dim(dd) for dd in d.out_dims)
    dev = Binary("-", x, Access(k_name, own))
    s1 = Statement(s1_name, d.out_dims, "+=", Binary("*", w, dev), d.extents, ())
    s2 = Statement(s2_name, d.out_dims, "+=", Binary("*", Binary("*", w, dev), dev), d.extents, ())
    rs_at = next(a for a in mu.expr.accesses() if a.tensor == rs.out)
    mo = tuple(Affine.dim(dd) for dd in mu.out_dims)
    s1_mu = Access(s1_name, mo)
    new_mu = replace(mu, expr=Binary("+", Access(k_name, mo), Binary("/", s1_mu, rs_at)))
    rs_d = next(a for a in substitute_dims(mu.expr, dict(zip(mu.out_dims, own, strict=True))).accesses()
                 if a.tensor == rs.out)
    new_d = Statement(d.out, d.out_dims, "=", Binary("-", Access(s2_name, own), Binary(
        "/", Binary("*", Access(s1_name, own), Access(s1_name, own)), rs_d)), tuple(
        (dd, nn) for dd, nn in d.extents if dd in d.out_dims), ())
    out: list[Statement] = []
    for s in c.statements:
        if s is v:
            out += [shift, s]
        elif s is n:
            continue
        elif s is mu:
            out += [s1, s2, new_mu]
        elif s is d:
            out.append(new_d)
        else:
            out.append(s)
    t = c.type_of[d.out]
    types = dict(c.types)
    types.pop(n.out, None)
    types.update({k_name: t, s1_name: t, s2_name: t})
    new_op = Compute(c.inputs, c.outputs, tuple(out), tuple(types.items()))
    return replace(graph, nodes=tuple(replace(nd, op=new_op) if nd is node else nd for nd in graph.nodes))


# EM routing's two passes over a windowed contraction: a weighted mean, then a weighted variance around it
EM = """V[b,o,x,y,i,p] += P[b,x+kx,y+ky,i,r] * W[kx,ky,i,o,r,p]
Rs[b,o] += R[b,o,x,y,i]
N[b,o,p] += R[b,o,x,y,i] * V[b,o,x,y,i,p]
MU[b,o,p] = N[b,o,p] / Rs[b,o]
D[b,o,p] += R[b,o,x,y,i] * (V[b,o,x,y,i,p] - MU[b,o,p]) * (V[b,o,x,y,i,p] - MU[b,o,p])
VAR[b,o,p] = D[b,o,p] / Rs[b,o]"""


def _examples() -> list[Graph]:
    b = GraphBuilder("em_routing")
    ins = {"P": b.input("p", (2, 6, 6, 3, 4)), "W": b.input("w", (3, 3, 3, 2, 4, 5)), "R": b.input("r", (2, 2, 4, 4, 3))}
    mu, var = b.compute(EM, ins, "em", outputs=["MU", "VAR"])
    b2 = GraphBuilder("weighted_rows")  # rows of a matmul, weighted per column
    x, y, wt = b2.input("x", (4, 6)), b2.input("y", (6, 5)), b2.input("wt", (4, 5))
    (var2,) = b2.compute("T[i,j] += X[i,k] * Y[k,j]\nRs[i] += Q[i,j]\nN[i] += Q[i,j] * T[i,j]\nMU[i] = N[i] / Rs[i]\n"
                         "D[i] += Q[i,j] * (T[i,j] - MU[i]) * (T[i,j] - MU[i])\nVAR[i] = D[i] / Rs[i] + 0.0",
                         {"X": x, "Y": y, "Q": wt}, "rows", outputs=["VAR"])
    return [b.build([mu, var]), b2.build([var2])]


# a one-pass weighted variance: the exploration family, for the graph search (it is not smaller, only one pass)
SHIFTED_MOMENTS = Rule("shifted_moments", "exploration",
                       "sum w (V - N/Rs)^2 = S2 - S1^2/Rs with S1 = sum w (V - K), S2 = sum w (V - K)^2, K = V at one point",
                       shifted_moments_sites, shifted_moments, _examples)

RULES = [SHIFTED_MOMENTS]
