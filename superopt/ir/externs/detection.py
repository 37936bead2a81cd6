"""Extern kind ``roi_align``: ONNX RoiAlign, bilinear samples of regions of interest pooled to a fixed grid.

``roi_align(height, width, sampling_ratio, spatial_scale, mode, half_pixel)`` on ``(X (N, C, H, W), rois
(R, 4) as x1, y1, x2, y2, batch_indices (R,))`` gives ``(R, C, height, width)``. Each output bin averages
(``mode="avg"``) or takes the largest of (``"max"``: of the weighted corner values, as onnxruntime does) a
grid of bilinear samples, ``sampling_ratio`` per axis (0: ceil(roi extent / bins), per roi). A sample
farther than one pixel outside the map is 0; one nearer is clamped to the border (the ONNX reference's rules).
"""

from __future__ import annotations

import math

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType, is_float


def _axis_taps(v: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per sample coordinate: valid flag, low and high pixel, and their weights."""
    valid = (v >= -1.0) & (v <= size)
    v = np.maximum(v, 0.0)
    low = np.floor(v).astype(np.int64)
    end = low >= size - 1
    low = np.where(end, size - 1, low)
    high = np.where(end, size - 1, low + 1)
    v = np.where(end, low, v)
    frac = v - low
    return valid, low, high, 1.0 - frac, frac


def _roi_align(xs, a):
    x, rois, batch = xs
    _, ch, h, w = x.shape
    ph, pw, sr = a["height"], a["width"], a["sampling_ratio"]
    out = np.zeros((rois.shape[0], ch, ph, pw), x.dtype)
    shift = 0.5 if a["half_pixel"] else 0.0
    for r in range(rois.shape[0]):
        x0, y0, x1, y1 = (float(v) * a["spatial_scale"] - shift for v in rois[r, :4])
        rw, rh = x1 - x0, y1 - y0
        if not a["half_pixel"]:  # malformed rois become 1x1
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = sr if sr > 0 else math.ceil(rh / ph)
        gw = sr if sr > 0 else math.ceil(rw / pw)
        if gh * gw == 0:
            continue
        ys = y0 + np.arange(ph)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh  # (ph, gh)
        xs_ = x0 + np.arange(pw)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw  # (pw, gw)
        vy, ylo, yhi, wylo, wyhi = _axis_taps(ys, h)
        vx, xlo, xhi, wxlo, wxhi = _axis_taps(xs_, w)
        wylo, wyhi = wylo * vy, wyhi * vy
        data = x[int(batch[r])]  # (C, H, W)
        terms = []
        for yi, wy in ((ylo, wylo), (yhi, wyhi)):
            for xi, wx in ((xlo, wxlo), (xhi, wxhi)):
                vals = data[:, yi[:, :, None, None], xi[None, None, :, :]]  # (C, ph, gh, pw, gw)
                wt = (wy[:, :, None, None] * wx[None, None, :, :]) * vx[None, None, :, :]
                terms.append(vals * wt)
        if a["mode"] == "avg":
            out[r] = (sum(terms).sum(axis=(2, 4)) / max(gh * gw, 1)).astype(x.dtype)
        else:
            out[r] = np.max(np.maximum.reduce(terms), axis=(2, 4)).astype(x.dtype)
    return [out]


def _roi_align_type(ts, a):
    x, rois, batch = ts
    if x.rank != 4 or not is_float(x.dtype):
        raise ValueError(f"roi_align: X must be a float (N, C, H, W) tensor, not {x}")
    if rois.rank != 2 or rois.shape[1] != 4 or batch.shape != (rois.shape[0],):
        raise ValueError(f"roi_align: rois {rois.shape} and batch_indices {batch.shape} must be (R, 4) and (R,)")
    if a["mode"] not in ("avg", "max"):
        raise ValueError(f"roi_align: mode must be 'avg' or 'max', not {a['mode']!r}")
    return [TensorType((rois.shape[0], x.shape[1], a["height"], a["width"]), x.dtype)]


register("roi_align", _roi_align, _roi_align_type)
