"""Pooling: max/average windows as max=/+= reductions over kernel dims."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import dims, idx, lit
from superopt.ops.contraction import conv_out_size
from superopt.ops.reduce import reduce


def _window(b: GraphBuilder, x: str, kernel, strides, pads, dilations, ceil_mode):
    xs = b.shape(x)
    nd = len(kernel)
    if len(xs) != nd + 2:
        raise ValueError(f"pool: input {xs} does not match a {nd}-d kernel")
    sp, ks = dims(nd, "y"), dims(nd, "k")
    outs = [
        conv_out_size(xs[2 + d], kernel[d], strides[d], pads[d], pads[nd + d], dilations[d], ceil_mode)
        for d in range(nd)
    ]
    if min(outs) <= 0:
        raise ValueError(f"pool: input {xs} is too small for kernel {tuple(kernel)}")
    win = []
    for d in range(nd):
        term = f"{strides[d]}*{sp[d]}+{dilations[d]}*{ks[d]}"
        win.append(term + (f"-{pads[d]}" if pads[d] else ""))
    ext = {"n": xs[0], "c": xs[1]}
    ext.update(zip(sp, outs, strict=False))
    ext.update(zip(ks, kernel, strict=False))
    return sp, win, outs, ext


def max_pool(
    b: GraphBuilder,
    x: str,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    ceil_mode: bool = False,
) -> str:
    sp, win, outs, ext = _window(b, x, kernel, strides, pads, dilations, ceil_mode)
    src = f"O[{idx(['n', 'c'] + sp)}] max= X[{idx(['n', 'c'] + win)}]"
    return b.compute1(src, {"X": x}, "max_pool", extents=ext, padding={"X": -np.inf})


def max_pool2d(
    b: GraphBuilder, x: str, kernel, strides, pads=(0, 0, 0, 0), dilations=(1, 1), ceil_mode: bool = False
) -> str:
    return max_pool(b, x, tuple(kernel), tuple(strides), tuple(pads), tuple(dilations), ceil_mode)


def avg_pool(
    b: GraphBuilder,
    x: str,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    ceil_mode: bool = False,
    count_include_pad: bool = False,
) -> str:
    nd = len(kernel)
    sp, win, outs, ext = _window(b, x, kernel, strides, pads, (1,) * nd, ceil_mode)
    xs = b.shape(x)
    # per-axis count of window taps inside the input (or inside input + explicit padding)
    counts = []
    for d in range(nd):
        lo, hi = (-pads[d], xs[2 + d] + pads[nd + d]) if count_include_pad else (0, xs[2 + d])
        start = np.arange(outs[d]) * strides[d] - pads[d]
        taps = start[:, None] + np.arange(kernel[d])[None, :]
        counts.append(((taps >= lo) & (taps < hi)).sum(1))
    div = counts[0].astype(np.float64)
    for cnt in counts[1:]:
        div = np.multiply.outer(div, cnt)
    o = idx(["n", "c"] + sp)
    inputs = {"X": x}
    if np.all(div == div.flat[0]):
        tail = f" / {lit(float(div.flat[0]))}"
    else:
        inputs["D"] = b.constant(div.astype(b.type(x).dtype), "pool_divisor")
        tail = f" / D[{idx(sp)}]"
    src = f"S[{o}] += X[{idx(['n', 'c'] + win)}]\nO[{o}] = S[{o}]{tail}"
    padded = any(pads) or ceil_mode
    return b.compute1(
        src, inputs, "avg_pool", extents=ext, padding={"X": 0.0} if padded else None, outputs=["O"]
    )


def avg_pool2d(
    b: GraphBuilder,
    x: str,
    kernel,
    strides,
    pads=(0, 0, 0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = False,
) -> str:
    return avg_pool(b, x, tuple(kernel), tuple(strides), tuple(pads), ceil_mode, count_include_pad)


def global_avg_pool(b: GraphBuilder, x: str) -> str:
    return reduce(b, x, "mean", list(range(2, len(b.shape(x)))), keepdims=True)


def global_max_pool(b: GraphBuilder, x: str) -> str:
    return reduce(b, x, "max", list(range(2, len(b.shape(x)))), keepdims=True)


def adaptive_avg_pool2d(b: GraphBuilder, x: str, out_hw: Sequence[int]) -> str:
    n, c, h, w = b.shape(x)
    oh, ow = out_hw
    if h % oh == 0 and w % ow == 0:
        kh, kw = h // oh, w // ow
        return avg_pool2d(b, x, (kh, kw), (kh, kw))
    mats = []
    for size, o in ((h, oh), (w, ow)):
        m = np.zeros((o, size))
        for i in range(o):
            s, e = (i * size) // o, -(-((i + 1) * size) // o)
            m[i, s:e] = 1.0 / (e - s)
        mats.append(b.constant(m.astype(b.type(x).dtype), "adaptive_pool"))
    src = "O[n,c,i,j] += X[n,c,h,w] * Ph[i,h] * Pw[j,w]"
    return b.compute1(src, {"X": x, "Ph": mats[0], "Pw": mats[1]}, "adaptive_avg_pool")
