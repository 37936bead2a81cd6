"""Data movement: reshapes (aliases), transposes, slices, concatenation, padding, gathers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import bcast_index, dims, idx, lift, norm_axis, reshape_alias


def _copy_or_const(b: GraphBuilder, shape: Sequence[int], dtype: str) -> str:
    return b.constant(np.zeros(tuple(shape), dtype))


def reshape(b: GraphBuilder, x: str, shape: Sequence[int]) -> str:
    """Row-major reshape; one entry may be -1."""
    shape = [int(s) for s in shape]
    size = int(np.prod(b.shape(x), dtype=np.int64))
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: more than one -1 in {shape}")
    if -1 in shape:
        rest = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if rest == 0 or size % rest:
            raise ValueError(f"reshape: cannot reshape {b.shape(x)} into {shape}")
        shape[shape.index(-1)] = size // rest
    if int(np.prod(shape, dtype=np.int64)) != size:
        raise ValueError(f"reshape: cannot reshape {b.shape(x)} into {tuple(shape)}")
    return reshape_alias(b, x, shape)


def flatten(b: GraphBuilder, x: str, axis: int = 1) -> str:
    shape = b.shape(x)
    a = axis + len(shape) if axis < 0 else axis
    if not 0 <= a <= len(shape):
        raise ValueError(f"flatten: axis {axis} out of range for rank {len(shape)}")
    lead = int(np.prod(shape[:a], dtype=np.int64))
    return reshape_alias(b, x, (lead, int(np.prod(shape[a:], dtype=np.int64))))


def squeeze(b: GraphBuilder, x: str, axes: Sequence[int] | None = None) -> str:
    shape = b.shape(x)
    if axes is None:
        axes = [k for k, s in enumerate(shape) if s == 1]
    ax = {norm_axis(a, len(shape)) for a in axes}
    for a in ax:
        if shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} of shape {shape} is not 1")
    return reshape_alias(b, x, [s for k, s in enumerate(shape) if k not in ax])


def unsqueeze(b: GraphBuilder, x: str, axes: Sequence[int]) -> str:
    shape = list(b.shape(x))
    r = len(shape) + len(axes)
    ax = sorted(norm_axis(a, r) for a in axes)
    for a in ax:
        shape.insert(a, 1)
    return reshape_alias(b, x, shape)


def transpose(b: GraphBuilder, x: str, perm: Sequence[int] | None = None) -> str:
    shape = b.shape(x)
    r = len(shape)
    perm = list(reversed(range(r))) if perm is None else [norm_axis(p, r) for p in perm]
    if sorted(perm) != list(range(r)):
        raise ValueError(f"transpose: {perm} is not a permutation of {r} axes")
    if perm == list(range(r)):
        return x
    v = b.const_value(x)
    if v is not None:
        return b.constant(np.transpose(v, perm))
    ds = dims(r)
    return b.compute1(f"O[{idx([ds[p] for p in perm])}] = X[{idx(ds)}]", {"X": x}, "transpose")


def concat(b: GraphBuilder, xs: Sequence[str], axis: int) -> str:
    xs = [lift(b, x) for x in xs]
    shapes = [b.shape(x) for x in xs]
    r = len(shapes[0])
    a = norm_axis(axis, r)
    for s in shapes:
        if len(s) != r or any(s[k] != shapes[0][k] for k in range(r) if k != a):
            raise ValueError(f"concat: shapes {shapes} do not match outside axis {a}")
    vals = [b.const_value(x) for x in xs]
    if all(v is not None for v in vals):
        return b.constant(np.concatenate(vals, axis=a))
    parts = [(x, s[a]) for x, s in zip(xs, shapes, strict=False) if s[a] > 0]
    out_shape = list(shapes[0])
    out_shape[a] = sum(n for _, n in parts)
    ds = dims(r)
    inputs: dict[str, str] = {}
    local: dict[str, str] = {}
    for x, _ in parts:
        if x not in local:
            local[x] = f"A{len(local)}"
            inputs[local[x]] = x
    expr = None
    offsets = np.cumsum([0] + [n for _, n in parts])
    for k in reversed(range(len(parts))):
        x, n = parts[k]
        ix = list(ds)
        ix[a] = f"{ds[a]}-{offsets[k]}" if offsets[k] else ds[a]
        read = f"{local[x]}[{idx(ix)}]"
        expr = read if expr is None else f"where({ds[a]} < {offsets[k + 1]}, {read}, {expr})"
    padding = {n: 0.0 for n in inputs} if len(parts) > 1 else None
    return b.compute1(
        f"O[{idx(ds)}] = {expr}",
        inputs,
        "concat",
        extents=dict(zip(ds, out_shape, strict=False)),
        padding=padding,
    )


def _strided(
    b: GraphBuilder, x: str, starts: Sequence[int], steps: Sequence[int], out: Sequence[int], name: str
) -> str:
    shape = b.shape(x)
    if tuple(out) == tuple(shape) and all(s == 0 for s in starts) and all(t == 1 for t in steps):
        return x
    v = b.const_value(x)
    if v is not None or 0 in out:
        if v is None:
            return _copy_or_const(b, out, b.type(x).dtype)
        sl = tuple(
            slice(s, s + t * n if s + t * n >= 0 else None, t)
            for s, t, n in zip(starts, steps, out, strict=False)
        )
        return b.constant(v[sl])
    ds = dims(len(shape))
    ix = []
    for d, s, t in zip(ds, starts, steps, strict=False):
        term = d if t == 1 else f"{t}*{d}"
        ix.append(f"{term}+{s}" if s else term)
    # every read is in range; padding only stops the parser binding a sliced plain dim to X's full extent
    return b.compute1(
        f"O[{idx(ds)}] = X[{idx(ix)}]",
        {"X": x},
        name,
        extents=dict(zip(ds, out, strict=False)),
        padding={"X": 0.0},
    )


def slice_(
    b: GraphBuilder,
    x: str,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
) -> str:
    """Python/ONNX slicing: negative indices count from the end, out-of-range bounds clamp."""
    shape = b.shape(x)
    r = len(shape)
    axes = list(range(len(starts))) if axes is None else [norm_axis(a, r) for a in axes]
    steps = [1] * len(starts) if steps is None else list(steps)
    st, sp, out = [0] * r, [1] * r, list(shape)
    for a, s0, e0, t in zip(axes, starts, ends, steps, strict=False):
        if t == 0:
            raise ValueError("slice: step cannot be 0")
        big = np.iinfo(np.int64).max // 2
        s0, e0 = int(max(min(s0, big), -big)), int(max(min(e0, big), -big))
        rng = range(*slice(s0, e0, int(t)).indices(shape[a]))
        st[a], sp[a], out[a] = (rng.start if len(rng) else 0), int(t), len(rng)
    return _strided(b, x, st, sp, out, "slice")


def split(b: GraphBuilder, x: str, axis: int, sizes: Sequence[int]) -> list[str]:
    shape = b.shape(x)
    a = norm_axis(axis, len(shape))
    if sum(sizes) != shape[a]:
        raise ValueError(f"split: sizes {list(sizes)} do not add up to {shape[a]}")
    outs, off = [], 0
    for n in sizes:
        outs.append(slice_(b, x, [off], [off + n], [a]))
        off += n
    return outs


def expand(b: GraphBuilder, x: str, shape: Sequence[int]) -> str:
    """Bidirectional broadcast of x against ``shape`` (ONNX Expand)."""
    out = tuple(np.broadcast_shapes(b.shape(x), tuple(int(s) for s in shape)))
    if out == b.shape(x):
        return x
    x = lift(b, x)
    ds = dims(len(out))
    return b.compute1(
        f"O[{idx(ds)}] = X[{idx(bcast_index(b.shape(x), out, ds))}]",
        {"X": x},
        "expand",
        extents=dict(zip(ds, out, strict=False)),
    )


def gather(b: GraphBuilder, x: str, indices: str, axis: int = 0) -> str:
    shape = b.shape(x)
    a = norm_axis(axis, len(shape))
    iv = b.const_value(indices)
    if iv is not None:
        iv = np.where(iv < 0, iv + shape[a], iv).astype(np.int64)
        if iv.size and (iv.min() < 0 or iv.max() >= shape[a]):
            raise ValueError(f"gather: index out of range for axis {a} of extent {shape[a]}")
        xv = b.const_value(x)
        if xv is not None:
            return b.constant(np.take(xv, iv, axis=a))
        ds = dims(len(shape))
        if iv.ndim == 0:  # one index: drop the axis
            out_dims = ds[:a] + ds[a + 1 :]
            if not out_dims:
                return reshape_alias(b, _strided(b, x, [int(iv)], [1], [1], "gather"), ())
            ix = list(ds)
            ix[a] = str(int(iv))
            return b.compute1(
                f"O[{idx(out_dims)}] = X[{idx(ix)}]",
                {"X": x},
                "gather",
                extents={d: shape[k] for k, d in enumerate(ds) if k != a},
            )
        flat = iv.reshape(-1)
        if iv.ndim == 1 and iv.size >= 1:
            step = int(flat[1] - flat[0]) if flat.size > 1 else 1
            if np.array_equal(flat, flat[0] + step * np.arange(flat.size)):
                st = [0] * len(shape)
                sp = [1] * len(shape)
                out = list(shape)
                st[a], sp[a], out[a] = int(flat[0]), step, flat.size
                return _strided(b, x, st, sp, out, "gather")
    return b.extern("gather", [x, indices], axis=a)[0]


def pad(b: GraphBuilder, x: str, pads: Sequence[int], value: float = 0.0) -> str:
    """Constant padding; pads = (begin_0, ..., begin_r-1, end_0, ..., end_r-1), negative pads crop."""
    shape = b.shape(x)
    r = len(shape)
    if len(pads) != 2 * r:
        raise ValueError(f"pad: expected {2 * r} pad values for rank {r}, got {len(pads)}")
    out = [shape[k] + pads[k] + pads[r + k] for k in range(r)]
    if min(out, default=1) < 0:
        raise ValueError(f"pad: pads {list(pads)} crop more than shape {shape}")
    if 0 in out:
        return _copy_or_const(b, out, b.type(x).dtype)
    if not any(pads):
        return x
    ds = dims(r)
    ix = [f"{d}-{p}" if p > 0 else (f"{d}+{-p}" if p < 0 else d) for d, p in zip(ds, pads[:r], strict=False)]
    src = f"O[{idx(ds)}] = X[{idx(ix)}]"
    return b.compute1(
        src, {"X": x}, "pad", extents=dict(zip(ds, out, strict=False)), padding={"X": float(value)}
    )


__all__ = [
    "reshape",
    "flatten",
    "squeeze",
    "unsqueeze",
    "transpose",
    "concat",
    "slice_",
    "split",
    "expand",
    "gather",
    "pad",
]
