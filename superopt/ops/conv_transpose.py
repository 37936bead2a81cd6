"""Transposed convolution (ONNX ConvTranspose, torch conv_transpose{1,2,3}d) in index notation.

y[o] = sum over i, k with i*s + k*d - p_begin = o of x[i] * w[k], per axis. Two lowerings:

- phase split (dilation 1, pads >= 0): the uncropped output z[o'] (o' = o + p_begin) is computed as
  z[s*q + r] = sum_m x[q - m] * w[s*m + r] (taps k = s*m + r, zero past the kernel), one statement over (q, r)
  whose output reshapes freely into z; a second node crops z to [p_begin, p_begin + size) and adds the bias.
  No multiply touches a zero of the input. A constant w is rearranged once into w'[m, r] (reversed in m).
- stride spread (any dilation): x is spread into a zero-filled buffer U (U[i*s] = x[i]), after which
  y[o] = sum_k U[o + p_begin - k*d] w[k] is an ordinary stride-1 convolution whose out-of-range reads are zero
  padding; it multiplies s^nd times as many terms, most of them zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import dims, idx, reshape_alias


def _spread(b: GraphBuilder, x: str, strides: Sequence[int]) -> str:
    """x with s-1 zeros after every element along each spatial axis (shape (n, c, H*s, ...))."""
    shape = b.shape(x)
    nd = len(shape) - 2
    if all(s == 1 for s in strides):
        return x
    hs, rs = dims(nd, "h"), dims(nd, "r")
    out_ix = ["n", "c"]
    ext = {"n": shape[0], "c": shape[1]}
    for d in range(nd):
        out_ix.append(hs[d])
        ext[hs[d]] = shape[2 + d]
        if strides[d] > 1:
            out_ix.append(rs[d])
            ext[rs[d]] = strides[d]
    phase = " + ".join(rs[d] for d in range(nd) if strides[d] > 1)
    src = f"U[{idx(out_ix)}] = where({phase} == 0, X[{idx(['n', 'c'] + hs)}], 0)"
    u = b.compute1(src, {"X": x}, "conv_transpose_spread", extents=ext)
    return reshape_alias(b, u, (shape[0], shape[1], *(shape[2 + d] * strides[d] for d in range(nd))))


def _per_axis(v: Sequence[int] | int | None, n: int, default: int, what: str) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    t = (int(v),) * n if isinstance(v, (int, np.integer)) else tuple(int(a) for a in v)
    if len(t) != n:
        raise ValueError(f"conv_transpose: {what} has {len(t)} values, expected {n}")
    return t


def conv_transpose(
    b: GraphBuilder,
    x: str,
    w: str,
    bias: str | None = None,
    strides: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    groups: int = 1,
    output_padding: Sequence[int] | None = None,
) -> str:
    """N-d transposed convolution, channels first: x (N, C_in, *spatial), w (C_in, C_out/groups, *kernel);
    pads = (begin..., end...); output size (H - 1) * s - p_begin - p_end + d * (k - 1) + output_padding + 1."""
    xs, ws = b.shape(x), b.shape(w)
    nd = len(xs) - 2
    if nd < 1 or len(ws) != nd + 2:
        raise ValueError(f"conv_transpose: input {xs} and weight {ws} must both be (batch/channels + {max(nd, 1)}-d)")
    strides = _per_axis(strides, nd, 1, "strides")
    dilations = _per_axis(dilations, nd, 1, "dilations")
    output_padding = _per_axis(output_padding, nd, 0, "output_padding")
    pads = _per_axis(pads, 2 * nd, 0, "pads")
    if min(strides + dilations) < 1 or groups < 1:
        raise ValueError(f"conv_transpose: strides {strides}, dilations {dilations} and groups {groups} must be >= 1")
    c = xs[1]
    if ws[0] != c or c % groups:
        raise ValueError(f"conv_transpose: input {xs} and weight {ws} do not fit {groups} group(s)")
    ks = ws[2:]
    outs = [
        (xs[2 + d] - 1) * strides[d] - pads[d] - pads[nd + d] + dilations[d] * (ks[d] - 1) + output_padding[d] + 1
        for d in range(nd)
    ]
    if min(outs) <= 0:
        raise ValueError(f"conv_transpose: input {xs}, weight {ws} and pads {pads} give output size {outs}")
    if all(dl == 1 for dl in dilations) and min(pads) >= 0:
        return _phase_split(b, x, w, bias, strides, pads, groups, outs)
    return _spread_conv(b, x, w, bias, strides, pads, dilations, groups, outs)


def _check_bias(b: GraphBuilder, bias: str | None, co: int) -> None:
    if bias is not None and b.shape(bias) != (co,):
        raise ValueError(f"conv_transpose: bias {b.shape(bias)} does not match {co} output channels")


def _phase_split(
    b: GraphBuilder,
    x: str,
    w: str,
    bias: str | None,
    strides: Sequence[int],
    pads: Sequence[int],
    groups: int,
    outs: Sequence[int],
) -> str:
    xs, ws = b.shape(x), b.shape(w)
    nd = len(xs) - 2
    n, c = xs[0], xs[1]
    cig, cog = c // groups, ws[1]
    co = cog * groups
    _check_bias(b, bias, co)
    ks = ws[2:]
    taps = [-(-ks[d] // strides[d]) for d in range(nd)]  # M: taps per phase
    qn = [-(-(pads[d] + outs[d]) // strides[d]) for d in range(nd)]  # Q: z covers [0, Q*s) >= [0, p_begin + size)
    qs, rs, ms = dims(nd, "q"), dims(nd, "r"), dims(nd, "m")
    phased = [d for d in range(nd) if strides[d] > 1]
    cin = f"g*{cig}+ci" if groups > 1 else "ci"
    z_ix = ["n", "g", "co"] if groups > 1 else ["n", "co"]
    ext = {"n": n, "ci": cig, "co": cog}
    if groups > 1:
        ext["g"] = groups
    for d in range(nd):
        z_ix += [qs[d], rs[d]] if d in phased else [qs[d]]
        ext.update({qs[d]: qn[d], ms[d]: taps[d]})
        if d in phased:
            ext[rs[d]] = strides[d]
    wv = b.const_value(w)
    padding = {"X": 0.0}
    if wv is not None:  # w'[.., m, r] = w[.., s*(M-1-m) + r], zero past the kernel: then x is read forward in m
        wp = np.pad(wv, [(0, 0), (0, 0)] + [(0, taps[d] * strides[d] - ks[d]) for d in range(nd)])
        shape = list(ws[:2])
        for d in range(nd):
            shape += [taps[d], strides[d]] if d in phased else [taps[d]]
        wp = wp.reshape(shape)
        m_axes = [2 + d + sum(1 for e in phased if e < d) for d in range(nd)]
        w = b.constant(np.ascontiguousarray(np.flip(wp, axis=tuple(m_axes))), dtype=wv.dtype.name)
        x_ix = [f"{qs[d]}+{ms[d]}" + (f"-{taps[d] - 1}" if taps[d] > 1 else "") for d in range(nd)]
        w_ix = []
        for d in range(nd):
            w_ix += [ms[d], rs[d]] if d in phased else [ms[d]]
    else:
        x_ix = [f"{qs[d]}-{ms[d]}" for d in range(nd)]
        w_ix = [f"{strides[d]}*{ms[d]}+{rs[d]}" if d in phased else ms[d] for d in range(nd)]
        if any(taps[d] * strides[d] != ks[d] for d in range(nd)):
            padding["W"] = 0.0
    src = f"Z[{idx(z_ix)}] += X[{idx(['n', cin, *x_ix])}] * W[{idx([cin, 'co', *w_ix])}]"
    full = [qn[d] * strides[d] for d in range(nd)]
    crop = any(pads[d] or full[d] != outs[d] for d in range(nd))
    inputs = {"X": x, "W": w}
    result = "Z"
    if bias is not None and not crop:  # the bias joins the contraction's node
        inputs["Bi"] = bias
        src += f"\nO[{idx(z_ix)}] = Z[{idx(z_ix)}] + Bi[{'g*' + str(cog) + '+co' if groups > 1 else 'co'}]"
        result = "O"
    z = b.compute1(src, inputs, "conv_transpose", extents=ext, padding=padding, outputs=[result])
    z = reshape_alias(b, z, (n, co, *full))
    if not crop:
        return z
    ys = dims(nd, "y")
    read = f"Z[{idx(['n', 'c'] + [f'{ys[d]}+{pads[d]}' if pads[d] else ys[d] for d in range(nd)])}]"
    crop_in = {"Z": z}
    if bias is not None:
        crop_in["Bi"] = bias
        read += " + Bi[c]"
    ext = {"n": n, "c": co, **dict(zip(ys, outs))}
    # every read is in range; padding only stops the parser binding an uncropped axis to Z's full extent
    return b.compute1(f"O[{idx(['n', 'c', *ys])}] = {read}", crop_in, "conv_transpose_crop", extents=ext,
                      padding={"Z": 0.0})


def _spread_conv(
    b: GraphBuilder,
    x: str,
    w: str,
    bias: str | None,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    groups: int,
    outs: Sequence[int],
) -> str:
    xs, ws = b.shape(x), b.shape(w)
    nd = len(xs) - 2
    n, c = xs[0], xs[1]
    cig, cog = c // groups, ws[1]
    co = cog * groups
    _check_bias(b, bias, co)
    ks = ws[2:]
    u = _spread(b, x, strides)
    ys, kd = dims(nd, "y"), dims(nd, "k")
    wv = b.const_value(w)
    if wv is not None:  # flipped once here: the read of U runs forward in k, as in an ordinary convolution
        w = b.constant(np.ascontiguousarray(np.flip(wv, axis=tuple(range(2, nd + 2)))), dtype=wv.dtype.name)
    win = []
    for d in range(nd):
        dl = dilations[d]
        if wv is not None:
            off = pads[d] - dl * (ks[d] - 1)
            term = f"{ys[d]}+{dl}*{kd[d]}"
        else:
            off = pads[d]
            term = f"{ys[d]}-{dl}*{kd[d]}"
        win.append(term + (f"+{off}" if off > 0 else f"-{-off}" if off < 0 else ""))
    cin = f"g*{cig}+ci" if groups > 1 else "ci"
    cout = f"g*{cog}+co" if groups > 1 else "co"
    o_idx = ["n", "g", "co", *ys] if groups > 1 else ["n", "co", *ys]
    ext = {"n": n, "ci": cig, "co": cog, **dict(zip(ys, outs)), **dict(zip(kd, ks))}
    if groups > 1:
        ext["g"] = groups
    src = f"P[{idx(o_idx)}] += U[{idx(['n', cin, *win])}] * W[{idx([cin, 'co', *kd])}]"
    inputs = {"U": u, "W": w}
    result = "P"
    if bias is not None:
        inputs["Bi"] = bias
        src += f"\nO[{idx(o_idx)}] = P[{idx(o_idx)}] + Bi[{cout}]"
        result = "O"
    out = b.compute1(src, inputs, "conv_transpose", extents=ext, padding={"U": 0.0}, outputs=[result])
    return reshape_alias(b, out, (n, co, *outs))
