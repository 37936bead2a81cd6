"""Sampling grids: AffineGrid (opset 20), a matmul of theta with a constant grid of normalized positions, and
GridSample (opsets 16, 20), per-tap gathers weighted elementwise."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops import indexing
from superopt.ops._util import ewise, lit


def _positions(n: int, align_corners: bool) -> np.ndarray:
    """Normalized [-1, 1] coordinates of n samples: the end samples' centres, or the cells' centres."""
    if align_corners:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0


@_conv("AffineGrid")
def _affine_grid(c: _Ctx, x):
    """theta (N, 2, 3) with size (N, C, H, W) -> (N, H, W, 2); theta (N, 3, 4) with (N, C, D, H, W) -> (N, D, H, W, 3)."""
    size = c.ints(x[1], "AffineGrid size")
    spatial = size[2:]
    nd = len(spatial)
    if nd not in (2, 3) or c.b.shape(x[0])[1:] != (nd, nd + 1):
        raise OnnxImportError(f"AffineGrid: theta {c.b.shape(x[0])} and size {size} are neither 2-D nor 3-D")
    align = bool(c.attr("align_corners", 0))
    axes = np.meshgrid(*[_positions(s, align) for s in spatial], indexing="ij")  # per spatial axis (D,) H, W
    coords = [a.reshape(-1) for a in reversed(axes)]  # x (width) first, then y (, z)
    base = np.stack([*coords, np.ones(coords[0].size)], axis=0)  # (nd + 1, positions)
    dt = c.b.type(x[0]).dtype
    grid = ops.matmul(c.b, x[0], c.b.constant(base.astype(dt), dtype=dt))  # (N, nd, positions)
    return ops.reshape(c.b, ops.transpose(c.b, grid, [0, 2, 1]), [size[0], *spatial, nd])


_CUBIC_A = -0.75


def _reflect(v: str, lo: float, hi: float) -> str:
    """Reflect a coordinate by the near border until it lies in [lo, hi] (the onnx reference's rule)."""
    rng = lit(hi - lo)
    lo_s, hi_s = lit(lo), lit(hi)
    below = (f"where(mod(floor(({lo_s} - {v}) / {rng}), 2.0) == 0.0, {lo_s} + (({lo_s} - {v}) - floor(({lo_s} - {v}) / {rng})"
             f" * {rng}), {hi_s} - (({lo_s} - {v}) - floor(({lo_s} - {v}) / {rng}) * {rng}))")
    above = (f"where(mod(floor(({v} - {hi_s}) / {rng}), 2.0) == 0.0, {hi_s} - (({v} - {hi_s}) - floor(({v} - {hi_s}) / {rng})"
             f" * {rng}), {lo_s} + (({v} - {hi_s}) - floor(({v} - {hi_s}) / {rng}) * {rng}))")
    return f"where({v} < {lo_s}, {below}, where({v} > {hi_s}, {above}, {v}))"


def _cubic_weights(t: str) -> list[str]:
    a = lit(_CUBIC_A)
    u = [f"({t} + 1.0)", t, f"(1.0 - {t})", f"(2.0 - {t})"]
    far = lambda s: f"((({a} * {s} - 5.0 * {a}) * {s} + 8.0 * {a}) * {s} - 4.0 * {a})"  # noqa: E731
    near = lambda s: f"((({a} + 2.0) * {s} - ({a} + 3.0)) * {s} * {s} + 1.0)"  # noqa: E731
    return [far(u[0]), near(u[1]), near(u[2]), far(u[3])]


@_conv("GridSample")
def _grid_sample(c: _Ctx, x):
    """Sample X (N, C, *S) at the grid's normalized positions (N, *O, nd), nearest / N-linear / N-cubic, with
    zeros, border or reflection padding: per axis, tap indices and weights; per tap combination, one
    gather_elements over the flattened spatial positions."""
    b = c.b
    xs, gs = b.shape(x[0]), b.shape(x[1])
    spatial, out = list(xs[2:]), list(gs[1:-1])
    nd = len(spatial)
    if gs[-1] != nd or gs[0] != xs[0]:
        raise OnnxImportError(f"GridSample: grid {gs} does not fit input {xs}")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(str(c.attr("mode", "linear")), str(c.attr("mode", "linear")))
    pad = str(c.attr("padding_mode", "zeros"))
    align = bool(c.attr("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or pad not in ("zeros", "border", "reflection"):
        raise OnnxImportError(f"GridSample mode {mode!r} / padding_mode {pad!r} is not supported")
    dt = b.type(x[0]).dtype
    n, ch = xs[0], xs[1]
    q = int(np.prod(out))
    per_axis = []  # per spatial axis: [(index tensor int64, weight tensor)] over its taps
    for i, d in enumerate(spatial):
        g = ops.reshape(b, ops.slice_(b, x[1], [nd - 1 - i], [nd - i], [len(gs) - 1]), [n, q])
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        coord = f"({{0}} + 1.0) / 2.0 * {lit(d - 1.0)}" if align else f"(({{0}} + 1.0) * {lit(float(d))} - 1.0) / 2.0"
        if mode == "nearest":
            coord = f"round({coord})"
        if pad == "border":
            coord = f"where(or({coord} < {lit(lo)}, {coord} > {lit(hi)}), min(max({coord}, 0.0), {lit(d - 1.0)}), {coord})"
        elif pad == "reflection":
            coord = _reflect(f"({coord})", lo, hi)
        v = ewise(b, coord, [g], "grid_coord")
        if mode == "nearest":
            taps = [("trunc", "1.0")]
            base, t = v, None
        else:
            base = ewise(b, "floor({0})", [v], "grid_floor")
            t = ewise(b, "{0} - {1}", [v, base], "grid_frac")
            if mode == "linear":
                taps = [(0, "(1.0 - {1})"), (1, "{1}")]
            else:
                taps = [(k - 1, w.replace("t_", "{1}")) for k, w in enumerate(_cubic_weights("t_"))]
        entries = []
        for off, wexpr in taps:
            # nearest: truncate toward zero (a reflected coordinate need not be whole); else the tap's offset
            pos = "({0} - fmod({0}, 1.0))" if off == "trunc" else f"({{0}} + {lit(float(off))})"
            if pad == "zeros":
                valid = f"and({pos} >= 0.0, {pos} <= {lit(d - 1.0)})"
                weight = f"where({valid}, {wexpr}, 0.0)"
                index = f"min(max({pos}, 0.0), {lit(d - 1.0)})"
            elif pad == "border":
                weight, index = wexpr, f"min(max({pos}, 0.0), {lit(d - 1.0)})"
            else:
                refl = _reflect(pos, lo, hi)
                weight, index = wexpr, f"min(max(({refl}) - fmod(({refl}), 1.0), 0.0), {lit(d - 1.0)})"
            w_t = None
            if "{0}" in weight or "{1}" in weight:  # operands: {0} the base position, {1} the fraction
                used = [k for k in (0, 1) if f"{{{k}}}" in weight]
                expr = weight
                for j, k in enumerate(used):
                    expr = expr.replace(f"{{{k}}}", f"{{A{j}}}")
                expr = expr.replace("{A0}", "{0}").replace("{A1}", "{1}")
                w_t = ewise(b, f"cast_{dt}({expr})", [[base, t if mode != "nearest" else None][k] for k in used],
                            "grid_weight")
            entries.append((ewise(b, f"cast_int64({index})", [base], "grid_index"), w_t))
        per_axis.append(entries)
    flat_x = ops.reshape(b, x[0], [n, ch, int(np.prod(spatial))])
    strides = [int(np.prod(spatial[i + 1:])) for i in range(nd)]
    total = None
    for combo in np.ndindex(*[len(e) for e in per_axis]):
        picks = [per_axis[i][k] for i, k in enumerate(combo)]
        terms = " + ".join(f"{{{i}}} * {s}" for i, s in enumerate(strides))
        flat = ewise(b, f"cast_int64({terms})", [p[0] for p in picks], "grid_flat")
        where = ops.expand(b, ops.reshape(b, flat, [n, 1, q]), [n, ch, q])
        val = indexing.gather_elements(b, flat_x, where, 2)
        ws = [p[1] for p in picks if p[1] is not None]
        if ws:
            wt = ws[0]
            for w in ws[1:]:
                wt = ops.mul(b, wt, w)
            val = ops.mul(b, val, ops.reshape(b, wt, [n, 1, q]))
        total = val if total is None else ops.add(b, total, val)
    return ops.reshape(b, total, [n, ch, *out])


@_conv("DeformConv")
def _deform_conv(c: _Ctx, x):
    """2-D deformable convolution (opsets 19, 22): per offset group, the input sampled bilinearly (zeros
    outside) at each kernel tap's shifted position -- a GridSample over pixel positions normalized with
    align_corners -- times the mask, then a grouped contraction with the weights in index notation."""
    b = c.b
    xs, ws = b.shape(x[0]), b.shape(x[1])
    if len(xs) != 4:
        raise OnnxImportError(f"DeformConv: only 2-D inputs are supported, not rank {len(xs)}")
    n, ch, h, w = xs
    oc, cpg, kh, kw = ws
    if h < 2 or w < 2:
        raise OnnxImportError(f"DeformConv: an input extent of 1 ({h}x{w}) has no normalized grid position")
    groups, og = int(c.attr("group", 1)), int(c.attr("offset_group", 1))
    sh, sw = c.attr("strides", [1, 1])
    dh, dw = c.attr("dilations", [1, 1])
    pt, pl = c.attr("pads", [0, 0, 0, 0])[:2]
    off = x[2]
    oh, ow = b.shape(off)[2:]
    k = kh * kw
    if ch != cpg * groups or oc % groups or ch % og or b.shape(off)[1] != og * k * 2:
        raise OnnxImportError(f"DeformConv: X {xs}, W {ws}, offset {b.shape(off)} do not fit group {groups}, "
                              f"offset_group {og}")
    dt = b.type(x[0]).dtype
    taps = np.arange(k)
    base_y = (-pt + sh * np.arange(oh))[None, :, None] + (taps // kw * dh)[:, None, None] + 0 * np.arange(ow)
    base_x = (-pl + sw * np.arange(ow))[None, None, :] + (taps % kw * dw)[:, None, None] + 0 * np.arange(oh)[:, None]
    off6 = ops.reshape(b, off, [n, og, k, 2, oh, ow])
    sample = _Ctx(b, max(c.opset, 20), c.node, {"mode": "linear", "padding_mode": "zeros", "align_corners": 1})
    cpo = ch // og
    cols = []
    for g in range(og):
        grid = []
        for axis, base, extent in ((1, base_x, w), (0, base_y, h)):  # GridSample takes (x, y)
            d = ops.reshape(b, ops.slice_(b, off6, [g, axis], [g + 1, axis + 1], [1, 3]), [n, k, oh, ow])
            pos = ops.add(b, d, b.constant(base.astype(dt), dtype=dt))
            norm = ewise(b, f"{{0}} / {lit(extent - 1.0)} * 2.0 - 1.0", [pos], "deform_grid")
            grid.append(ops.reshape(b, norm, [n, k * oh, ow, 1]))
        xg = ops.slice_(b, x[0], [g * cpo], [(g + 1) * cpo], [1]) if og > 1 else x[0]
        col = ops.reshape(b, _grid_sample(sample, [xg, ops.concat(b, grid, 3)]), [n, cpo, k, oh, ow])
        if len(x) > 4 and x[4] is not None:
            m = ops.slice_(b, ops.reshape(b, x[4], [n, og, k, oh, ow]), [g], [g + 1], [1])
            col = ops.mul(b, col, m)
        cols.append(col)
    cols = ops.concat(b, cols, 1) if og > 1 else cols[0]
    y = ops.einsum(b, "ngckij,gock->ngoij", ops.reshape(b, cols, [n, groups, cpg, k, oh, ow]),
                   ops.reshape(b, x[1], [groups, oc // groups, cpg, k]))
    y = ops.reshape(b, y, [n, oc, oh, ow])
    if len(x) > 3 and x[3] is not None:
        y = ops.add(b, y, ops.reshape(b, x[3], [1, oc, 1, 1]))
    return y
