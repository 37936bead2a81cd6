"""Normalizations: layer/RMS norm over trailing axes, group and instance norm over channel groups, inference
batch norm, local response norm."""

from __future__ import annotations

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import bcast_index, dims, idx, lit, norm_axis, reshape_alias


def _norm_over_tail(
    b: GraphBuilder,
    x: str,
    scale: str | None,
    bias: str | None,
    axis: int,
    eps: float,
    center: bool,
    name: str,
    stats: bool = False,
) -> str | list[str]:
    shape = b.shape(x)
    rank = len(shape)
    a = norm_axis(axis, rank)
    if a > 1 and all(len(b.shape(t)) <= rank - a for t in (scale, bias) if t is not None):
        # leading axes folded into one row axis by a free reshape: one row loop to parallelize and to
        # compute each row's statistics at ([batch, seq, hidden] in transformers)
        kept = tuple(shape[:a]) + (1,) * (rank - a)
        flat = reshape_alias(b, x, (int(np.prod(shape[:a], dtype=np.int64)), *shape[a:]))
        out = _norm_over_tail(b, flat, scale, bias, 1, eps, center, name, stats)
        if not stats:
            return reshape_alias(b, out, shape)
        y, mu, r = out
        return [reshape_alias(b, y, shape), reshape_alias(b, mu, kept), reshape_alias(b, r, kept)]
    ds = dims(rank)
    n = int(np.prod(shape[a:], dtype=np.int64))
    full = idx(ds)
    keep = idx(ds[:a] + [f"u{k}" for k in range(a, rank)])
    red = idx(ds[:a] + [f"r{k}" for k in range(a, rank)])
    zero = idx(ds[:a] + ["0"] * (rank - a))
    ext = dict(zip(ds, shape, strict=False))
    ext.update({f"u{k}": 1 for k in range(a, rank)})
    ext.update({f"r{k}": shape[k] for k in range(a, rank)})
    inputs = {"X": x}
    if center:
        # float32 rows are summed in float64: the mean of a constant row is then exact, so it centers to exactly
        # zero (as onnxruntime's double accumulators do), instead of a rounding residue a following norm blows up
        wide = b.type(x).dtype == "float32"
        lines = [
            f"S[{keep}] += cast_float64(X[{red}])" if wide else f"S[{keep}] += X[{red}]",
            f"Mu[{keep}] = cast_float32(S[{keep}] / {n}.0)" if wide else f"Mu[{keep}] = S[{keep}] / {n}.0",
            f"D[{full}] = X[{full}] - Mu[{zero}]",
            f"Q[{keep}] += D[{red}] * D[{red}]",
            f"R[{keep}] = rsqrt(Q[{keep}] / {n}.0 + {lit(eps)})",
            f"Y[{full}] = D[{full}] * R[{zero}]",
        ]
    else:
        lines = [
            f"Q[{keep}] += X[{red}] * X[{red}]",
            f"R[{keep}] = rsqrt(Q[{keep}] / {n}.0 + {lit(eps)})",
            f"Y[{full}] = X[{full}] * R[{zero}]",
        ]
    tail = shape[a:]
    result = "Y"
    expr = f"Y[{full}]"
    if scale is not None:
        inputs["G"] = scale
        expr = f"{expr} * G[{idx(bcast_index(b.shape(scale), shape, ds))}]"
        np.broadcast_shapes(b.shape(scale), tail)
    if bias is not None:
        inputs["Bi"] = bias
        expr = f"{expr} + Bi[{idx(bcast_index(b.shape(bias), shape, ds))}]"
        np.broadcast_shapes(b.shape(bias), tail)
    if scale is not None or bias is not None:
        lines.append(f"O[{full}] = {expr}")
        result = "O"
    if stats:  # also the mean and 1/std, with the normalized axes kept as size 1 (ONNX LayerNormalization)
        return b.compute("\n".join(lines), inputs, name, extents=ext, outputs=[result, "Mu", "R"])
    return b.compute1("\n".join(lines), inputs, name, extents=ext, outputs=[result])


def layer_norm(
    b: GraphBuilder,
    x: str,
    scale: str | None = None,
    bias: str | None = None,
    axis: int = -1,
    eps: float = 1e-5,
) -> str:
    return _norm_over_tail(b, x, scale, bias, axis, eps, True, "layer_norm")


def layer_norm_with_stats(
    b: GraphBuilder,
    x: str,
    scale: str | None = None,
    bias: str | None = None,
    axis: int = -1,
    eps: float = 1e-5,
) -> list[str]:
    """[y, mean, inv_std]; mean and inv_std keep the normalized axes as size 1."""
    return _norm_over_tail(b, x, scale, bias, axis, eps, True, "layer_norm", stats=True)


def rms_norm(b: GraphBuilder, x: str, scale: str | None = None, axis: int = -1, eps: float = 1e-6) -> str:
    return _norm_over_tail(b, x, scale, None, axis, eps, False, "rms_norm")


def batch_norm(b: GraphBuilder, x: str, scale: str, bias: str, mean: str, var: str, eps: float = 1e-5) -> str:
    """Inference batch norm over channel axis 1."""
    shape = b.shape(x)
    if len(shape) < 2:
        raise ValueError(f"batch_norm needs rank >= 2, got shape {shape}")
    for t in (scale, bias, mean, var):
        if b.shape(t) != (shape[1],):
            raise ValueError(f"batch_norm: parameter shape {b.shape(t)} does not match {shape[1]} channels")
    ds = dims(len(shape))
    c = ds[1]
    full = idx(ds)
    src = f"O[{full}] = (X[{full}] - M[{c}]) * (G[{c}] * rsqrt(V[{c}] + {lit(eps)})) + B[{c}]"
    return b.compute1(src, {"X": x, "G": scale, "B": bias, "M": mean, "V": var}, "batch_norm")


def lrn(
    b: GraphBuilder, x: str, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0
) -> str:
    """ONNX LRN across channels (axis 1)."""
    shape = b.shape(x)
    ds = dims(len(shape))
    lo = (size - 1) // 2
    full = idx(ds)
    win = idx([ds[0], f"{ds[1]}+k-{lo}"] + ds[2:])
    src = (
        f"S[{full}] += X[{win}] * X[{win}]\n"
        f"O[{full}] = X[{full}] / pow({lit(bias)} + {lit(alpha / size)} * S[{full}], {lit(beta)})"
    )
    ext = dict(zip(ds, shape, strict=False))
    ext["k"] = size
    return b.compute1(src, {"X": x}, "lrn", extents=ext, padding={"X": 0.0}, outputs=["O"])


def group_norm(b: GraphBuilder, x: str, scale: str, bias: str, num_groups: int, eps: float = 1e-5) -> str:
    """Normalize each of ``num_groups`` channel groups over its channels and spatial axes, then scale and shift
    per channel (torch group_norm, ONNX GroupNormalization-21): x (N, C, *spatial), scale and bias (C,)."""
    shape = b.shape(x)
    if len(shape) < 2:
        raise ValueError(f"group_norm needs rank >= 2 (N, C, ...), got shape {shape}")
    c = shape[1]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"group_norm: {c} channels do not split into {num_groups} groups")
    for t in (scale, bias):
        if b.shape(t) != (c,):
            raise ValueError(f"group_norm: scale/bias shape {b.shape(t)} does not match {c} channels")
    cg = c // num_groups
    spatial = int(np.prod(shape[2:], dtype=np.int64))
    # free reshapes: x as (N, G, C/G, S) normalized over its last two axes, scale and bias as (G, C/G, 1)
    xg = reshape_alias(b, x, (shape[0], num_groups, cg, spatial))
    g = reshape_alias(b, scale, (num_groups, cg, 1))
    bi = reshape_alias(b, bias, (num_groups, cg, 1))
    y = _norm_over_tail(b, xg, g, bi, 2, eps, True, "group_norm")
    return reshape_alias(b, y, shape)


def instance_norm(b: GraphBuilder, x: str, scale: str, bias: str, eps: float = 1e-5) -> str:
    """Normalize each channel of each sample over its spatial axes, then scale and shift per channel."""
    shape = b.shape(x)
    if len(shape) < 2:
        raise ValueError(f"instance_norm needs rank >= 2 (N, C, ...), got shape {shape}")
    return group_norm(b, x, scale, bias, shape[1], eps)
