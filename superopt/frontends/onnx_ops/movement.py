"""Data movement: reshapes, transposes, concatenation, slicing, gathers, padding, tiling."""

from __future__ import annotations

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx


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


@_conv("Pad")
def _pad(c: _Ctx, x):
    mode = c.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
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
    return ops.pad(c.b, x[0], pads, value)


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
