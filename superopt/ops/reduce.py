"""Reductions and softmax, as index-notation reductions (+=, max=, min=, *=)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import dims, idx, lift, norm_axis, reshape_alias

_OPS = {"sum": "+=", "mean": "+=", "max": "max=", "min": "min=", "prod": "*="}


def _axes(axes: int | Sequence[int] | None, rank: int) -> list[int]:
    if axes is None:
        return list(range(rank))
    if isinstance(axes, (int, np.integer)):
        axes = [int(axes)]
    return sorted({norm_axis(int(a), rank) for a in axes})


def reduce(
    b: GraphBuilder, x: str, kind: str, axes: int | Sequence[int] | None, keepdims: bool = True
) -> str:
    if kind not in _OPS:
        raise ValueError(f"unknown reduction {kind!r}; known: {list(_OPS)}")
    if b.type(x).dtype == "bool" and kind in ("max", "min", "prod"):  # any / all
        from superopt.ops.elementwise import cast

        return cast(b, reduce(b, cast(b, x, "int32"), kind, axes, keepdims), "bool")
    x = lift(b, x)
    shape = b.shape(x)
    rank = len(shape)
    ax = _axes(axes, rank)
    ds = dims(rank)
    keep = [f"u{k}" if k in ax else d for k, d in enumerate(ds)]  # u: extent-1 kept axes
    read = [f"r{k}" if k in ax else d for k, d in enumerate(ds)]
    extents = {keep[k]: (1 if k in ax else shape[k]) for k in range(rank)}
    extents.update({read[k]: shape[k] for k in ax})
    src = f"S[{idx(keep)}] {_OPS[kind]} X[{idx(read)}]"
    if kind == "mean":
        n = int(np.prod([shape[k] for k in ax], dtype=np.int64))
        src += f"\nO[{idx(keep)}] = S[{idx(keep)}] / {n}.0"
    out = b.compute1(src, {"X": x}, f"reduce_{kind}", extents=extents)
    if not keepdims:
        out = reshape_alias(b, out, [s for k, s in enumerate(shape) if k not in ax])
    return out


def _softmax(b: GraphBuilder, x: str, axis: int, log: bool) -> str:
    x0 = x
    x = lift(b, x)
    shape = b.shape(x)
    rank = len(shape)
    a = norm_axis(axis, rank)
    if rank > 2 and a == rank - 1:
        # over the last axis: rows of a 2-D view (a free reshape), so that the scheduler sees one row loop
        # to parallelize and compute each row's max and sum at (attention's [batch, heads, L, S] scores)
        flat = reshape_alias(b, x, (int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]))
        return reshape_alias(b, _softmax(b, flat, 1, log), b.shape(x0))
    ds = dims(rank)
    full = idx(ds)
    red = idx(["0" if k == a else d for k, d in enumerate(ds)])
    keep = idx(["u" if k == a else d for k, d in enumerate(ds)])
    rd = idx(["r" if k == a else d for k, d in enumerate(ds)])
    lines = [f"M[{keep}] max= X[{rd}]", f"E[{full}] = exp(X[{full}] - M[{red}])", f"Z[{keep}] += E[{rd}]"]
    if log:
        lines.append(f"O[{full}] = X[{full}] - M[{red}] - log(Z[{red}])")
    else:  # one reciprocal per row, then multiplies: a 512-bit divide takes ~16 cycles, a multiply 0.5
        lines += [f"R[{keep}] = 1.0 / Z[{keep}]", f"O[{full}] = E[{full}] * R[{red}]"]
    ext = dict(zip(ds, shape, strict=False))
    ext.update(u=1, r=shape[a])
    out = b.compute1(
        "\n".join(lines), {"X": x}, "log_softmax" if log else "softmax", extents=ext, outputs=["O"]
    )
    return reshape_alias(b, out, b.shape(x0))


def softmax(b: GraphBuilder, x: str, axis: int = -1) -> str:
    return _softmax(b, x, axis, False)


def log_softmax(b: GraphBuilder, x: str, axis: int = -1) -> str:
    return _softmax(b, x, axis, True)
