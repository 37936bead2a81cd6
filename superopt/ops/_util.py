"""Helpers shared by the op builders: dimension names, literals, broadcasting, rank-0 lifting."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from superopt.builder import GraphBuilder


def dims(n: int, prefix: str = "i") -> list[str]:
    return [f"{prefix}{k}" for k in range(n)]


def lit(v: float | int | bool) -> str:
    """A number as op-language source text."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v)) if v >= 0 else f"({int(v)})"
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "(-inf)"
    r = repr(v)
    if "e" not in r and "." not in r:
        r += ".0"
    return r if v >= 0 else f"({r})"


def idx(terms: Sequence[str]) -> str:
    return ",".join(terms)


def bcast_index(shape: Sequence[int], out_shape: Sequence[int], names: Sequence[str]) -> list[str]:
    """Index of a right-aligned broadcast operand: size-1 axes read element 0."""
    k, r = len(shape), len(out_shape)
    return ["0" if s == 1 and out_shape[r - k + i] != 1 else names[r - k + i] for i, s in enumerate(shape)]


def reshape_alias(b: GraphBuilder, x: str, shape: Sequence[int]) -> str:
    shape = tuple(int(s) for s in shape)
    if b.shape(x) == shape:
        return x
    if b.const_value(x) is not None:
        return b.constant(np.reshape(b.const_value(x), shape))
    return b.extern("reshape", [x], shape=shape)[0]


def lift(b: GraphBuilder, x: str) -> str:
    """Rank-0 tensors become shape (1,) (index notation needs at least one index)."""
    return reshape_alias(b, x, (1,)) if len(b.shape(x)) == 0 else x


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def ewise(
    b: GraphBuilder,
    template: str,
    xs: Sequence[str],
    name: str = "ewise",
    out_shape: Sequence[int] | None = None,
) -> str:
    """Elementwise op with numpy broadcasting; ``template`` reads operand k as ``{k}``."""
    shapes = [b.shape(x) for x in xs]
    shape = tuple(np.broadcast_shapes(*shapes)) if out_shape is None else tuple(out_shape)
    if out_shape is not None:
        np.broadcast_shapes(shape, *shapes)
    if len(shape) == 0:
        out = ewise(b, template, [lift(b, x) for x in xs], name, (1,))
        return reshape_alias(b, out, ())
    if 0 in shape:
        raise ValueError(f"{name}: empty result shape {shape} is not supported")
    ds = dims(len(shape))
    locs = [f"A{k}" for k in range(len(xs))]
    inputs: dict[str, str] = {}
    reads = []
    for k, x in enumerate(xs):
        x = lift(b, x)
        inputs[locs[k]] = x
        reads.append(f"{locs[k]}[{idx(bcast_index(b.shape(x), shape, ds))}]")
    # the same graph tensor twice -> one local name
    seen: dict[str, str] = {}
    for k, x in enumerate(list(inputs.values())):
        if x in seen:
            reads[k] = reads[k].replace(f"A{k}[", f"{seen[x]}[", 1)
            del inputs[f"A{k}"]
        else:
            seen[x] = f"A{k}"
    src = f"O[{idx(ds)}] = " + template.format(*reads)
    return b.compute1(src, inputs, name, extents=dict(zip(ds, shape, strict=False)))
