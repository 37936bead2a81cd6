"""Sampling grids: AffineGrid (opset 20), a matmul of theta with a constant grid of normalized positions."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx


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
