"""Data movement: reshapes, transposes, concatenation, slicing, gathers, padding, tiling."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops import indexing


@_conv("Reshape")
def _reshape(c: _Ctx, x):
    shape = c.ints(x[1], "Reshape shape")
    src = c.b.shape(x[0])
    if not c.attr("allowzero", 0):
        shape = [src[k] if s == 0 else s for k, s in enumerate(shape)]
    return ops.reshape(c.b, x[0], shape)


@_conv("Flatten")
def _flatten(c, x):
    return ops.flatten(c.b, x[0], c.attr("axis", 1))


@_conv("Squeeze", "Unsqueeze")
def _squeeze(c: _Ctx, x):
    axes = c.ints(x[1] if len(x) > 1 else None, "axes") if c.opset >= 13 else c.attr("axes")
    if c.node.op_type == "Squeeze":
        return ops.squeeze(c.b, x[0], axes)
    return ops.unsqueeze(c.b, x[0], axes)


@_conv("Transpose")
def _transpose(c, x):
    return ops.transpose(c.b, x[0], c.attr("perm"))


@_conv("Concat")
def _concat(c, x):
    return ops.concat(c.b, x, c.attr("axis"))


@_conv("Slice")
def _slice(c: _Ctx, x):
    if c.opset < 10:
        starts, ends, axes, steps = c.attr("starts"), c.attr("ends"), c.attr("axes"), None
    else:
        starts, ends = c.ints(x[1], "Slice starts"), c.ints(x[2], "Slice ends")
        axes = c.ints(x[3] if len(x) > 3 else None, "Slice axes")
        steps = c.ints(x[4] if len(x) > 4 else None, "Slice steps")
    return ops.slice_(c.b, x[0], starts, ends, axes, steps)


@_conv("Split")
def _split(c: _Ctx, x):
    shape = c.b.shape(x[0])
    axis = c.attr("axis", 0)
    n_out = len(c.node.output)
    sizes = c.ints(x[1] if len(x) > 1 else None, "Split sizes") if c.opset >= 13 else c.attr("split")
    if not sizes:
        n = c.attr("num_outputs", n_out)
        dim = shape[axis]
        chunk = -(-dim // n)
        sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
    return ops.split(c.b, x[0], axis, sizes)


@_conv("Expand")
def _expand(c, x):
    return ops.expand(c.b, x[0], c.ints(x[1], "Expand shape"))


@_conv("Gather")
def _gather(c, x):
    return ops.gather(c.b, x[0], x[1], c.attr("axis", 0))


@_conv("Compress")
def _compress(c: _Ctx, x):
    """The slices along ``axis`` (of the flattened input when unset) where the condition is true; the condition
    may be shorter than the axis (the rest is dropped). The output's length is the condition's count of trues,
    so the condition must be a compile-time value (the backend binds a condition input per value)."""
    cond = np.asarray(c.const(x[1], "Compress condition")).reshape(-1).astype(bool)
    axis = c.attr("axis")
    t = x[0]
    if axis is None:
        t, axis = ops.reshape(c.b, t, [-1]), 0
    shape = c.b.shape(t)
    axis = int(axis) + (len(shape) if int(axis) < 0 else 0)
    if not 0 <= axis < len(shape) or cond.size > shape[axis]:
        raise OnnxImportError(f"Compress condition of length {cond.size} does not fit axis {c.attr('axis')} of "
                              f"shape {tuple(c.b.shape(x[0]))}")
    keep = np.nonzero(cond)[0].astype(np.int64)
    if keep.size == 0:
        out = list(shape)
        out[axis] = 0
        return c.b.constant(np.zeros(out, c.b.type(t).np_dtype), dtype=c.b.type(t).dtype)
    return ops.gather(c.b, t, c.b.constant(keep, dtype="int64"), axis)


@_conv("Pad")
def _pad(c: _Ctx, x):
    mode = c.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise OnnxImportError(f"Pad mode {mode!r} is not supported")
    rank = len(c.b.shape(x[0]))
    if c.opset < 11:
        pads, value = c.attr("pads"), c.attr("value", 0.0)
    else:
        pads = c.ints(x[1], "Pad pads")
        v = c.const(x[2] if len(x) > 2 else None, "Pad value")
        value = 0.0 if v is None or v.size == 0 else v.item()
        axes = c.ints(x[3] if len(x) > 3 else None, "Pad axes")
        if axes is not None:
            full = [0] * (2 * rank)
            for k, a in enumerate(axes):
                a %= rank
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = full
    if mode != "constant":
        return _pad_by_gather(c, x[0], pads, mode)
    return ops.pad(c.b, x[0], pads, value)


def _pad_by_gather(c: _Ctx, t: str, pads: list[int], mode: str) -> str:
    """reflect / edge / wrap padding: per padded axis, a gather with the constant index map numpy.pad gives."""
    shape = c.b.shape(t)
    rank = len(shape)
    for a in range(rank):
        lo, hi = pads[a], pads[rank + a]
        if lo == 0 and hi == 0:
            continue
        src = np.arange(shape[a])[max(-lo, 0) : shape[a] - max(-hi, 0)]  # negative pads crop first
        index = np.pad(src, (max(lo, 0), max(hi, 0)), mode=mode)
        t = ops.gather(c.b, t, c.b.constant(index.astype(np.int64), dtype="int64"), a)
    return t


@_conv("Tile")
def _tile(c: _Ctx, x):
    reps = c.ints(x[1], "Tile repeats")
    t = x[0]
    shape = list(c.b.shape(t))
    for a, r in enumerate(reps):
        if r == 1:
            continue
        pre, post = shape[:a], shape[a + 1 :]
        t = ops.reshape(c.b, t, pre + [1, shape[a]] + post)
        t = ops.expand(c.b, t, pre + [r, shape[a]] + post)
        shape[a] *= r
        t = ops.reshape(c.b, t, shape)
    return t


@_conv("Trilu")
def _trilu(c: _Ctx, x):
    k = c.ints(x[1] if len(x) > 1 else None, "Trilu k")
    return ops.trilu(c.b, x[0], k[0] if k else 0, bool(c.attr("upper", 1)))


@_conv("DepthToSpace")
def _depth_to_space(c: _Ctx, x):
    """(N, C, H, W) -> (N, C / bs^2, H * bs, W * bs); DCR takes the block from the outer channel bits, CRD inner."""
    n, ch, h, w = c.b.shape(x[0])
    bs = int(c.attr("blocksize"))
    if ch % (bs * bs):
        raise OnnxImportError(f"DepthToSpace: {ch} channels are not a multiple of blocksize^2 = {bs * bs}")
    co = ch // (bs * bs)
    if str(c.attr("mode", "DCR")) == "CRD":
        t = ops.transpose(c.b, ops.reshape(c.b, x[0], [n, co, bs, bs, h, w]), [0, 1, 4, 2, 5, 3])
    else:
        t = ops.transpose(c.b, ops.reshape(c.b, x[0], [n, bs, bs, co, h, w]), [0, 3, 4, 1, 5, 2])
    return ops.reshape(c.b, t, [n, co, h * bs, w * bs])


@_conv("SpaceToDepth")
def _space_to_depth(c: _Ctx, x):
    """(N, C, H, W) -> (N, C * bs^2, H / bs, W / bs), the inverse of DepthToSpace (mode from opset 28)."""
    n, ch, h, w = c.b.shape(x[0])
    bs = int(c.attr("blocksize"))
    if h % bs or w % bs:
        raise OnnxImportError(f"SpaceToDepth: spatial shape {(h, w)} is not a multiple of blocksize {bs}")
    t = ops.reshape(c.b, x[0], [n, ch, h // bs, bs, w // bs, bs])
    perm = [0, 1, 3, 5, 2, 4] if str(c.attr("mode", "DCR")) == "CRD" else [0, 3, 5, 1, 2, 4]
    return ops.reshape(c.b, ops.transpose(c.b, t, perm), [n, ch * bs * bs, h // bs, w // bs])


@_conv("CenterCropPad")
def _center_crop_pad(c: _Ctx, x):
    """Crop or zero-pad each listed axis to the wanted length around its centre (the odd cell goes at the end)."""
    shape = c.b.shape(x[0])
    rank = len(shape)
    want = c.ints(x[1], "CenterCropPad shape")
    axes = [a % rank for a in c.attr("axes", list(range(rank)))]
    pads = [0] * (2 * rank)
    for a, s in zip(axes, want, strict=True):
        d = s - shape[a]  # > 0 pads, < 0 crops (negative pads)
        lo = abs(d) // 2
        pads[a], pads[rank + a] = (lo, d - lo) if d > 0 else (-lo, d + lo)
    return ops.pad(c.b, x[0], pads, 0.0)


@_conv("ReverseSequence")
def _reverse_sequence(c: _Ctx, x):
    """Reverse the first sequence_lens[b] steps along time_axis for each batch entry (lengths must be constant)."""
    shape = c.b.shape(x[0])
    lens = c.ints(x[1], "ReverseSequence sequence_lens")
    bax, tax = int(c.attr("batch_axis", 1)), int(c.attr("time_axis", 0))
    idx = np.broadcast_to(np.arange(shape[tax]).reshape([-1 if k == tax else 1 for k in range(len(shape))]), shape).copy()
    for bi, n in enumerate(lens):
        sel = [slice(None)] * len(shape)
        sel[bax], sel[tax] = bi, slice(0, n)
        idx[tuple(sel)] = np.flip(idx[tuple(sel)], axis=tax - (1 if bax < tax else 0))
    return indexing.gather_elements(c.b, x[0], c.b.constant(idx.astype(np.int64), dtype="int64"), tax)
