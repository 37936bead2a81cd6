"""Contractions: matmul (numpy semantics), gemm, linear, convolutions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import bcast_index, dims, idx, lit, reshape_alias


def matmul(b: GraphBuilder, x: str, y: str) -> str:
    xs, ys = b.shape(x), b.shape(y)
    if not xs or not ys:
        raise ValueError("matmul: operands must be at least 1-D")
    k = xs[-1]
    ky = ys[0] if len(ys) == 1 else ys[-2]
    if k != ky:
        raise ValueError(f"matmul: inner dimensions differ: {xs} @ {ys}")
    xb = xs[:-2] if len(xs) >= 2 else ()
    yb = ys[:-2] if len(ys) >= 2 else ()
    batch = tuple(np.broadcast_shapes(xb, yb))
    bd = dims(len(batch), "b")
    xi = bcast_index(xb, batch, bd) + (["i"] if len(xs) >= 2 else []) + ["k"]
    yi = bcast_index(yb, batch, bd) + ["k"] + (["j"] if len(ys) >= 2 else [])
    out = bd + (["i"] if len(xs) >= 2 else []) + (["j"] if len(ys) >= 2 else [])
    ext = dict(zip(bd, batch, strict=False))
    if len(xs) >= 2:
        ext["i"] = xs[-2]
    if len(ys) >= 2:
        ext["j"] = ys[-1]
    ext["k"] = k
    if not out:  # vector . vector -> scalar
        r = b.compute1("O[u] += X[k] * Y[k]", {"X": x, "Y": y}, "matmul", extents={"u": 1, "k": k})
        return reshape_alias(b, r, ())
    src = f"O[{idx(out)}] += X[{idx(xi)}] * Y[{idx(yi)}]"
    inputs = {"X": x, "Y": y} if x != y else {"X": x}
    if x == y:
        src = src.replace("Y[", "X[")
    return b.compute1(src, inputs, "matmul", extents=ext)


def gemm(
    b: GraphBuilder,
    a: str,
    bb: str,
    c: str | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
) -> str:
    sa, sb = b.shape(a), b.shape(bb)
    if len(sa) != 2 or len(sb) != 2:
        raise ValueError(f"gemm: operands must be 2-D, got {sa} and {sb}")
    m, k = (sa[1], sa[0]) if trans_a else sa
    k2, n = (sb[1], sb[0]) if trans_b else sb
    if k != k2:
        raise ValueError(
            f"gemm: inner dimensions differ: {sa}{'^T' if trans_a else ''} @ {sb}{'^T' if trans_b else ''}"
        )
    ai = "A[k,i]" if trans_a else "A[i,k]"
    bi = "B[j,k]" if trans_b else "B[k,j]"
    prod = f"{ai} * {bi}" + ("" if alpha == 1.0 else f" * {lit(alpha)}")
    inputs = {"A": a, "B": bb}
    if c is None or beta == 0.0:
        return b.compute1(f"O[i,j] += {prod}", inputs, "gemm", extents={"i": m, "j": n})
    np.broadcast_shapes(b.shape(c), (m, n))
    inputs["C"] = c
    ci = idx(bcast_index(b.shape(c), (m, n), ["i", "j"])) if b.shape(c) else None
    cread = f"C[{ci}]" if ci is not None else None
    if cread is None:
        c = reshape_alias(b, c, (1,))
        inputs["C"] = c
        cread = "C[0]"
    cterm = cread if beta == 1.0 else f"{cread} * {lit(beta)}"
    src = f"P[i,j] += {prod}\nO[i,j] = P[i,j] + {cterm}"
    return b.compute1(src, inputs, "gemm", extents={"i": m, "j": n}, outputs=["O"])


def linear(b: GraphBuilder, x: str, w: str, bias: str | None = None) -> str:
    """torch.nn.functional.linear: x @ w.T + bias."""
    xs, ws = b.shape(x), b.shape(w)
    if len(ws) != 2 or xs[-1] != ws[1]:
        raise ValueError(f"linear: input {xs} does not match weight {ws}")
    bd = dims(len(xs) - 1, "b")
    ext = dict(zip(bd, xs[:-1], strict=False))
    ext.update(j=ws[0], k=ws[1])
    src = f"P[{idx(bd + ['j'])}] += X[{idx(bd + ['k'])}] * W[j,k]"
    inputs = {"X": x, "W": w}
    if bias is not None:
        if b.shape(bias) not in ((ws[0],), (1,)):
            raise ValueError(f"linear: bias {b.shape(bias)} does not match {ws[0]} outputs")
        inputs["Bi"] = bias
        bi = "0" if b.shape(bias) == (1,) and ws[0] != 1 else "j"
        src += f"\nO[{idx(bd + ['j'])}] = P[{idx(bd + ['j'])}] + Bi[{bi}]"
    return b.compute1(src, inputs, "linear", extents=ext, outputs=["O" if bias is not None else "P"])


def conv_out_size(
    size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dil: int, ceil_mode: bool = False
) -> int:
    span = size + pad_lo + pad_hi - dil * (k - 1) - 1
    if ceil_mode:
        out = -(-span // stride) + 1
        if (out - 1) * stride >= size + pad_lo:  # last window must start inside the input or left padding
            out -= 1
        return out
    return span // stride + 1


def convnd(
    b: GraphBuilder,
    x: str,
    w: str,
    bias: str | None,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    groups: int,
) -> str:
    """N-d convolution, channels first; pads = (begin..., end...)."""
    xs, ws = b.shape(x), b.shape(w)
    nd = len(xs) - 2
    if len(ws) != nd + 2:
        raise ValueError(f"conv: weight {ws} does not match input {xs}")
    n, c = xs[0], xs[1]
    co, cig = ws[0], ws[1]
    if c != cig * groups or co % groups:
        raise ValueError(f"conv: input {xs} and weight {ws} do not fit {groups} group(s)")
    cog = co // groups
    sp = dims(nd, "y")
    ks = dims(nd, "k")
    outs = [
        conv_out_size(xs[2 + d], ws[2 + d], strides[d], pads[d], pads[nd + d], dilations[d])
        for d in range(nd)
    ]
    if min(outs) <= 0:
        raise ValueError(f"conv: input {xs} is too small for kernel {ws[2:]}")
    win = []
    for d in range(nd):
        s, dl, p = strides[d], dilations[d], pads[d]
        term = f"{s}*{sp[d]}+{dl}*{ks[d]}"
        win.append(term + (f"-{p}" if p else ""))
    ext = {"n": n, "ci": cig, "co": cog, "g": groups}
    ext.update(zip(sp, outs, strict=False))
    ext.update({ks[d]: ws[2 + d] for d in range(nd)})
    inputs = {"X": x, "W": w}
    cin = f"g*{cig}+ci" if groups > 1 else "ci"
    cout = f"g*{cog}+co" if groups > 1 else "co"
    o_idx = ["n", "g", "co"] + sp if groups > 1 else ["n", "co"] + sp
    if groups == 1:
        del ext["g"]
    src = f"P[{idx(o_idx)}] += X[{idx(['n', cin] + win)}] * W[{idx([cout, 'ci'] + ks)}]"
    result = "P"
    if bias is not None:
        if b.shape(bias) != (co,):
            raise ValueError(f"conv: bias {b.shape(bias)} does not match {co} output channels")
        inputs["Bi"] = bias
        src += f"\nO[{idx(o_idx)}] = P[{idx(o_idx)}] + Bi[{cout}]"
        result = "O"
    padded = any(pads)
    out = b.compute1(
        src, inputs, "conv", extents=ext, padding={"X": 0.0} if padded else None, outputs=[result]
    )
    return reshape_alias(b, out, (n, co, *outs))


def conv2d(
    b: GraphBuilder,
    x: str,
    w: str,
    bias: str | None = None,
    strides=(1, 1),
    pads=(0, 0, 0, 0),
    dilations=(1, 1),
    groups: int = 1,
) -> str:
    """NCHW conv; pads = (top, left, bottom, right)."""
    return convnd(b, x, w, bias, tuple(strides), tuple(pads), tuple(dilations), groups)


def conv1d(
    b: GraphBuilder,
    x: str,
    w: str,
    bias: str | None = None,
    strides=(1,),
    pads=(0, 0),
    dilations=(1,),
    groups: int = 1,
) -> str:
    """NCW conv; pads = (left, right)."""
    return convnd(b, x, w, bias, tuple(strides), tuple(pads), tuple(dilations), groups)
