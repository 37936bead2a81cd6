"""Spectral ops: DFT (opsets 17, 20) and STFT, as matmuls with constant cosine/sine matrices.

A length-n transform along one axis is two (n x K) contractions per real/imaginary part, which the
optimizer sees as ordinary matmuls; ``dft_length`` zero-pads or truncates the signal first.
"""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx


def _fit(c: _Ctx, t: str, axis: int, n: int) -> str:
    """Zero-pad or truncate ``t`` along ``axis`` to length n."""
    shape = c.b.shape(t)
    if shape[axis] > n:
        return ops.slice_(c.b, t, [0], [n], [axis])
    if shape[axis] < n:
        pads = [0] * (2 * len(shape))
        pads[len(shape) + axis] = n - shape[axis]
        return ops.pad(c.b, t, pads, 0.0)
    return t


def dft(c: _Ctx, x: str, axis: int, n: int, inverse: bool, onesided: bool) -> str:
    """x (..., 1 | 2) real or complex (last axis), transformed along ``axis``; the ONNX DFT's result layout."""
    b = c.b
    shape = b.shape(x)
    rank = len(shape)
    axis %= rank
    if axis == rank - 1 or shape[-1] not in (1, 2):
        raise OnnxImportError(f"DFT: axis {axis} of shape {shape} (the last axis holds real/imaginary parts)")
    out_dt = b.type(x).dtype
    dt = "float64"  # twiddles and sums in double, as numpy's FFT (a float32 sum leaves ~1e-6 where 0 is exact)
    x = ops.cast(b, x, dt)
    parts = [ops.reshape(b, p, shape[:-1]) for p in ops.split(b, x, rank - 1, [1] * shape[-1])]
    real, imag = parts[0], (parts[1] if len(parts) > 1 else None)
    length = n // 2 + 1 if inverse and onesided else n  # input samples (or bins) the transform reads
    perm = [k for k in range(rank - 1) if k != axis] + [axis]
    back = list(np.argsort(perm))
    real = ops.transpose(b, _fit(c, real, axis, length), perm)
    imag = None if imag is None else ops.transpose(b, _fit(c, imag, axis, length), perm)
    src = np.arange(length)
    if inverse and onesided:  # a Hermitian spectrum's first n//2+1 bins -> n real samples
        k, t = src[:, None], np.arange(n)[None, :]
        w = np.where((k == 0) | (2 * k == n), 1.0, 2.0)
        cos, sin = w * np.cos(2 * np.pi * k * t / n) / n, w * np.sin(2 * np.pi * k * t / n) / n
        out = ops.matmul(b, real, b.constant(cos.astype(dt), dtype=dt))
        if imag is not None:
            out = ops.sub(b, out, ops.matmul(b, imag, b.constant(sin.astype(dt), dtype=dt)))
        outs = [out]
    else:
        bins = n // 2 + 1 if onesided and not inverse else n
        m, k = src[:, None], np.arange(bins)[None, :]
        scale = 1.0 / n if inverse else 1.0
        sign = 1.0 if inverse else -1.0  # e^{sign * 2 pi i k m / n}
        cos = b.constant((np.cos(2 * np.pi * k * m / n) * scale).astype(dt), dtype=dt)
        sin = b.constant((sign * np.sin(2 * np.pi * k * m / n) * scale).astype(dt), dtype=dt)
        re, im = ops.matmul(b, real, cos), ops.matmul(b, real, sin)
        if imag is not None:  # (a + ib)(cos + i s) = a cos - b s + i (a s + b cos)
            re = ops.sub(b, re, ops.matmul(b, imag, sin))
            im = ops.add(b, im, ops.matmul(b, imag, cos))
        outs = [re, im]
    outs = [ops.unsqueeze(b, ops.transpose(b, o, back), [rank - 1]) for o in outs]
    return ops.cast(b, outs[0] if len(outs) == 1 else ops.concat(b, outs, rank - 1), out_dt)


@_conv("DFT")
def _dft(c: _Ctx, x):
    shape = c.b.shape(x[0])
    if c.opset >= 20:
        ax = c.ints(x[2] if len(x) > 2 else None, "DFT axis")
        axis = ax[0] if ax else -2
    else:
        axis = int(c.attr("axis", 1))
    axis %= len(shape)
    inverse, onesided = bool(c.attr("inverse", 0)), bool(c.attr("onesided", 0))
    nv = c.ints(x[1] if len(x) > 1 else None, "DFT dft_length")
    if nv:
        n = nv[0]
    else:
        n = 2 * (shape[axis] - 1) if inverse and onesided else shape[axis]
    return dft(c, x[0], axis, n, inverse, onesided)


@_conv("STFT")
def _stft(c: _Ctx, x):
    """signal (batch, length, 1 | 2) -> (batch, frames, bins, 2): windowed frames, each transformed."""
    b = c.b
    batch, length, parts = b.shape(x[0])
    step = c.ints(x[1], "STFT frame_step")[0]
    window = x[2] if len(x) > 2 else None
    fl = c.ints(x[3] if len(x) > 3 else None, "STFT frame_length")
    frame = fl[0] if fl else (b.shape(window)[0] if window is not None else None)
    if frame is None:
        raise OnnxImportError("STFT needs a window or a frame_length")
    frames = 1 + (length - frame) // step
    index = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    t = ops.gather(b, x[0], b.constant(index.astype(np.int64), dtype="int64"), 1)  # (batch, frames, frame, parts)
    if window is not None:
        t = ops.mul(b, t, ops.reshape(b, window, [1, 1, frame, 1]))
    return dft(c, t, 2, frame, False, bool(c.attr("onesided", 1)))
