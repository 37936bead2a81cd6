"""Reshapes, transposes, slicing, indexing by Python values, concatenation, splitting and padding."""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, T, _dims, aten, function, method


# =================================================================================================
# Movement
# =================================================================================================
@method("view", "reshape")
def _view(cx: Ctx, x: T, *shape: Any) -> T:
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise cx.fail("view(dtype) is not supported")
    return cx.reshape(x, _dims(shape))


@function(torch.reshape)
def _reshape(cx: Ctx, x: T, shape: Sequence[int]) -> T:
    return cx.reshape(x, _dims([shape]))


@method("view_as", "reshape_as")
def _view_as(cx: Ctx, x: T, other: T) -> T:
    return cx.reshape(x, cx.shape(other))


@function(torch.flatten)
@method("flatten")
def _flatten(cx: Ctx, x: T, start_dim: int = 0, end_dim: int = -1) -> T:
    s = cx.shape(x)
    if not s:
        return cx.reshape(x, (1,))
    a, e = cx.axis(start_dim, len(s)), cx.axis(end_dim, len(s))
    return cx.reshape(x, s[:a] + (math.prod(s[a:e + 1]),) + s[e + 1:])


@function(torch.unflatten)
@method("unflatten")
def _unflatten(cx: Ctx, x: T, dim: int, sizes: Sequence[int]) -> T:
    s = cx.shape(x)
    d = cx.axis(dim, len(s))
    return cx.reshape(x, s[:d] + tuple(sizes) + s[d + 1:])


@function(torch.squeeze)
@method("squeeze")
def _squeeze(cx: Ctx, x: T, dim: Any = None) -> T:
    s = cx.shape(x)
    if dim is None:
        axes = [i for i, e in enumerate(s) if e == 1]
    else:
        axes = [cx.axis(d, len(s)) for d in ([dim] if isinstance(dim, int) else dim)]
        axes = [a for a in axes if s[a] == 1]  # torch ignores non-1 dims
    return cx.reshape(x, [e for i, e in enumerate(s) if i not in axes])


@function(torch.unsqueeze)
@method("unsqueeze")
def _unsqueeze(cx: Ctx, x: T, dim: int) -> T:
    s = list(cx.shape(x))
    d = cx.axis(dim, len(s) + 1)
    return cx.reshape(x, s[:d] + [1] + s[d:])


@function(torch.transpose, torch.swapaxes, torch.swapdims)
@method("transpose", "swapaxes", "swapdims")
def _transpose(cx: Ctx, x: T, dim0: int, dim1: int) -> T:
    return cx.swap(x, dim0, dim1)


@function(torch.t)
@method("t")
def _t(cx: Ctx, x: T) -> T:
    return cx.swap(x, 0, 1) if cx.rank(x) == 2 else x


@function(torch.permute)
@method("permute")
def _permute(cx: Ctx, x: T, *dims: Any) -> T:
    return cx.transpose(x, _dims(dims))


@method("expand")
def _expand(cx: Ctx, x: T, *sizes: Any) -> T:
    sizes = _dims(sizes)
    s = cx.shape(x)
    lead = len(sizes) - len(s)
    shape = [s[i - lead] if (e == -1 and i >= lead) else e for i, e in enumerate(sizes)]
    if tuple(shape) == s:
        return x
    return T(ops.expand(cx.b, x, shape))


@method("expand_as")
def _expand_as(cx: Ctx, x: T, other: T) -> T:
    return _expand(cx, x, cx.shape(other))


@function(torch.cat, torch.concat, torch.concatenate)
def _cat(cx: Ctx, tensors: Sequence[Any], dim: int = 0, *, axis: int | None = None) -> T:
    if axis is not None:
        dim = axis
    ts = [cx.tensor(t) for t in tensors]
    ts = [t for t in ts if math.prod(cx.shape(t)) > 0 or cx.rank(t) > 1]  # torch skips empty 1-D tensors
    if len(ts) == 1:
        return ts[0]
    return T(ops.concat(cx.b, ts, cx.axis(dim, cx.rank(ts[0]))))


@function(torch.stack)
def _stack(cx: Ctx, tensors: Sequence[Any], dim: int = 0) -> T:
    ts = [cx.tensor(t) for t in tensors]
    d = cx.axis(dim, cx.rank(ts[0]) + 1)
    ts = [_unsqueeze(cx, t, d) for t in ts]
    return ts[0] if len(ts) == 1 else T(ops.concat(cx.b, ts, d))


def _split_sizes(cx: Ctx, x: T, split: Any, dim: int) -> tuple[int, list[int]]:
    d = cx.axis(dim, cx.rank(x))
    n = cx.shape(x)[d]
    if isinstance(split, int):
        sizes = [split] * (n // split) + ([n % split] if n % split else [])
    else:
        sizes = [int(s) for s in split]
    return d, sizes


def _split_parts(cx: Ctx, x: T, d: int, sizes: list[int]) -> tuple[T, ...]:
    if len(sizes) == 1:
        return (x,)
    parts, start = [], 0
    for s in sizes:
        parts.append(cx.slice_axis(x, d, start, start + s))
        start += s
    return tuple(parts)


@function(torch.split)
@method("split")
def _split(cx: Ctx, x: T, split_size_or_sections: Any, dim: int = 0) -> tuple[T, ...]:
    d, sizes = _split_sizes(cx, x, split_size_or_sections, dim)
    return _split_parts(cx, x, d, sizes)


@function(torch.chunk)
@method("chunk")
def _chunk(cx: Ctx, x: T, chunks: int, dim: int = 0) -> tuple[T, ...]:
    d = cx.axis(dim, cx.rank(x))
    n = cx.shape(x)[d]
    size = -(-n // chunks)
    return _split(cx, x, size, d)


@function(torch.unbind)
@method("unbind")
def _unbind(cx: Ctx, x: T, dim: int = 0) -> tuple[T, ...]:
    d = cx.axis(dim, cx.rank(x))
    s = cx.shape(x)
    return tuple(cx.reshape(cx.slice_axis(x, d, i, i + 1), s[:d] + s[d + 1:]) for i in range(s[d]))


@function(torch.narrow)
@method("narrow")
def _narrow(cx: Ctx, x: T, dim: int, start: int, length: int) -> T:
    d = cx.axis(dim, cx.rank(x))
    return cx.slice_axis(x, d, start, start + length)


def index_axis(idx: tuple[Any, ...], k: int, out_rank: int) -> int:
    """The axis of the result of indexing with ``idx`` (slices, ints, at most one Ellipsis; ints drop their
    axis) that entry ``k`` (a slice) maps to."""
    def is_int(i: Any) -> bool:
        return isinstance(i, int) and not isinstance(i, bool)
    if Ellipsis in idx[:k]:
        return out_rank - 1 - sum(1 for i in idx[k + 1:] if not is_int(i))
    return k - sum(1 for i in idx[:k] if is_int(i))


@function(operator.getitem)
def _getitem(cx: Ctx, x: T, index: Any) -> T:
    idx = index if isinstance(index, tuple) else (index,)
    # a list of ints indexes like an int64 tensor
    idx = tuple(cx.const(np.asarray(i, dtype=np.int64)) if isinstance(i, list) and all(
        isinstance(e, int) and not isinstance(e, bool) for e in i) else i for i in idx)
    tensors = [k for k, i in enumerate(idx) if isinstance(i, T)]
    if tensors:
        k = tensors[0]
        if len(tensors) > 1 or cx.dtype(idx[k]) not in ("int64", "int32") or None in idx:
            raise cx.fail("advanced indexing is only supported with one integer index tensor among slices")
        rest = _getitem(cx, x, idx[:k] + (slice(None),) + idx[k + 1:])
        axis = index_axis(idx, k, cx.rank(rest))
        return T(ops.gather(cx.b, rest, idx[k], axis=axis))
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if sum(1 for i in idx if i is Ellipsis) > 1:
        raise cx.fail("more than one Ellipsis in an index")
    if Ellipsis in idx:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (cx.rank(x) - n_real) + idx[k + 1:]
    shape: list[int] = []
    axis = 0
    out = x
    for i in idx:
        if i is None:
            shape.append(1)
            continue
        if axis >= cx.rank(x):
            raise cx.fail("too many indices")
        n = cx.shape(x)[axis]
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step <= 0:
                raise cx.fail("slices with a non-positive step are not supported")
            out = cx.slice_axis(out, axis, start, stop, step)
            shape.append(cx.shape(out)[axis])
        elif isinstance(i, int):
            if not -n <= i < n:
                raise cx.fail(f"index {i} out of range for size {n}")
            i %= n
            out = cx.slice_axis(out, axis, i, i + 1)
        else:
            raise cx.fail(f"unsupported index {i!r}")
        axis += 1
    shape += list(cx.shape(out)[axis:])
    return cx.reshape(out, shape)


@function(builtins.getattr)
def _getattr(cx: Ctx, x: T, attr: str) -> Any:
    if attr == "shape":
        return torch.Size(cx.shape(x))
    if attr == "ndim":
        return cx.rank(x)
    if attr == "dtype":
        return getattr(torch, cx.dtype(x))
    if attr == "T":
        return cx.transpose(x, list(range(cx.rank(x)))[::-1])
    if attr == "mT":
        return cx.swap(x, -2, -1)
    raise cx.fail(f"unsupported tensor attribute .{attr}")


@method("size")
def _size(cx: Ctx, x: T, dim: int | None = None) -> Any:
    s = cx.shape(x)
    return torch.Size(s) if dim is None else s[cx.axis(dim, len(s))]


@method("dim", "ndimension")
def _dim(cx: Ctx, x: T) -> int:
    return cx.rank(x)


@method("numel", "nelement")
def _numel(cx: Ctx, x: T) -> int:
    return math.prod(cx.shape(x))


@function(F.pad)
def _pad(cx: Ctx, x: T, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> T:
    if mode != "constant":
        raise cx.fail(f"F.pad mode={mode!r} is not supported")
    r = cx.rank(x)
    begins, ends = [0] * r, [0] * r
    for k in range(len(pad) // 2):  # torch lists (left, right) pairs from the last dim backwards
        begins[r - 1 - k], ends[r - 1 - k] = int(pad[2 * k]), int(pad[2 * k + 1])
    if any(p < 0 for p in begins + ends):
        raise cx.fail("negative padding is not supported")
    return T(ops.pad(cx.b, x, begins + ends, value=0.0 if value is None else value))


@function(torch.repeat_interleave)
@method("repeat_interleave")
def _repeat_interleave(cx: Ctx, x: T, repeats: Any, dim: int | None = None, *, output_size: int | None = None) -> T:
    if not isinstance(repeats, int):
        raise cx.fail("repeat_interleave with a tensor of repeats is not supported")
    if dim is None:
        x, dim = cx.reshape(x, (-1,)), 0
    s = cx.shape(x)
    d = cx.axis(dim, len(s))
    y = cx.reshape(x, s[:d + 1] + (1,) + s[d + 1:])
    y = T(ops.expand(cx.b, y, s[:d + 1] + (repeats,) + s[d + 1:]))
    return cx.reshape(y, s[:d] + (s[d] * repeats,) + s[d + 1:])


@method("repeat")
def _repeat(cx: Ctx, x: T, *sizes: Any) -> T:
    reps = _dims(sizes)
    s = (1,) * (len(reps) - cx.rank(x)) + cx.shape(x)
    y = cx.reshape(x, s)
    # (r0, s0, r1, s1, ...) by expanding a (1, s0, 1, s1, ...) view, then merging each pair
    inter = tuple(v for r, n in zip(reps, s, strict=True) for v in (1, n))
    y = T(ops.expand(cx.b, cx.reshape(y, inter), tuple(v for r, n in zip(reps, s, strict=True) for v in (r, n))))
    return cx.reshape(y, tuple(r * n for r, n in zip(reps, s, strict=True)))


@function(torch.tile)
def _tile(cx: Ctx, x: T, dims: Any) -> T:
    return _repeat(cx, x, *_dims([dims]))


aten("repeat")(lambda cx, x, repeats: _repeat(cx, x, *repeats))


@function(torch.flip)
@method("flip")
@aten("flip")
def _flip(cx: Ctx, x: T, *dims: Any) -> T:
    for d in _dims(dims):
        a = cx.axis(d, cx.rank(x))
        n = cx.shape(x)[a]
        x = T(ops.gather(cx.b, x, cx.const(np.arange(n - 1, -1, -1, dtype=np.int64)), axis=a))
    return x


@function(torch.roll)
@method("roll")
@aten("roll")
def _roll(cx: Ctx, x: T, shifts: Any, dims: Any = None) -> T:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        shape = cx.shape(x)
        return cx.reshape(_roll(cx, cx.reshape(x, (-1,)), shifts, 0), shape)
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    for s, d in zip(shifts, dims, strict=True):
        a = cx.axis(d, cx.rank(x))
        n = cx.shape(x)[a]
        k = s % n if n else 0
        if k:
            x = T(ops.concat(cx.b, [cx.slice_axis(x, a, n - k, n), cx.slice_axis(x, a, 0, n - k)], a))
    return x
