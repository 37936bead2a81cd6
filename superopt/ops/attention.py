"""Scaled dot-product attention as one compute op (scores, masked softmax, weighted sum)."""

from __future__ import annotations

import math

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import bcast_index, dims, idx, lit


def scaled_dot_product_attention(
    b: GraphBuilder,
    q: str,
    k: str,
    v: str,
    mask: str | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> str:
    """torch scaled_dot_product_attention (inference): q [..., L, E], k [..., S, E], v [..., S, Ev].

    A bool mask keeps positions where it is true; a float mask is added to the scores.
    """
    qs, ks, vs = b.shape(q), b.shape(k), b.shape(v)
    if len(qs) < 2 or ks[-1] != qs[-1] or vs[-2] != ks[-2]:
        raise ValueError(f"attention: shapes q {qs}, k {ks}, v {vs} do not fit")
    L, E, S, F = qs[-2], qs[-1], ks[-2], vs[-1]
    batch = tuple(np.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2]))
    bd = dims(len(batch), "b")
    sc = 1.0 / math.sqrt(E) if scale is None else float(scale)
    bq = bcast_index(qs[:-2], batch, bd)
    bk = bcast_index(ks[:-2], batch, bd)
    bv = bcast_index(vs[:-2], batch, bd)
    o_ij, o_iu, o_i0 = idx(bd + ["i", "j"]), idx(bd + ["i", "u"]), idx(bd + ["i", "0"])
    lines = [f"T[{o_ij}] += Q[{idx(bq + ['i', 'e'])}] * K[{idx(bk + ['j', 'e'])}]"]
    score = f"T[{o_ij}] * {lit(sc)}"
    inputs = {"Q": q, "K": k, "V": v}
    if mask is not None:
        ms = b.shape(mask)
        np.broadcast_shapes(ms, batch + (L, S))
        mread = f"Mk[{idx(bcast_index(ms, batch + (L, S), bd + ['i', 'j']))}]"
        inputs["Mk"] = mask
        score = f"where({mread}, {score}, -inf)" if b.type(mask).dtype == "bool" else f"{score} + {mread}"
    if is_causal:
        score = f"where(j <= i, {score}, -inf)"
    lines += [
        f"Sc[{o_ij}] = {score}",
        f"M[{o_iu}] max= Sc[{o_ij}]",
        f"Ex[{o_ij}] = exp(Sc[{o_ij}] - M[{o_i0}])",
        f"Z[{o_iu}] += Ex[{o_ij}]",
        f"P[{o_ij}] = Ex[{o_ij}] / Z[{o_i0}]",
        f"O[{idx(bd + ['i', 'f'])}] += P[{o_ij}] * V[{idx(bv + ['j', 'f'])}]",
    ]
    ext = dict(zip(bd, batch, strict=False))
    ext.update(i=L, j=S, e=E, f=F, u=1)
    # an index may be bound in a statement that does not use it: keep only what each statement needs
    return b.compute1("\n".join(lines), inputs, "attention", extents=ext, outputs=["O"])
