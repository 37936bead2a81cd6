"""Extern kinds whose output shapes depend on input values (see ``run_time_shape`` in the registry):
``nonzero``, ``unique`` and ``nms``. Their inferred shapes are upper bounds; the arrays are exact.

- ``nonzero``: int64 (rank, count) indices of the non-zero entries, in row-major order (ONNX NonZero).
- ``unique(axis, sorted, outputs)``: the distinct values (flattened, or distinct slices along ``axis``),
  ascending or in order of first appearance; ``outputs`` names the results wanted, a subset of
  ``values, indices`` (first occurrences), ``inverse`` (per input element or slice; its shape is static)
  and ``counts`` (ONNX Unique).
- ``nms(center_point_box, bound)`` on ``(boxes (B, N, 4), scores (B, C, N), max_per_class, iou_threshold,
  score_threshold)`` (the last three of one element, or empty: 0, 0 and no threshold): greedy non-maximum
  suppression per batch and class, int64 (selected, 3) rows ``(batch, class, box)`` (ONNX
  NonMaxSuppression). ``bound`` is the most rows it can give (for the upper-bound shape).
"""

from __future__ import annotations

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType

UNIQUE_OUTPUTS = ("values", "indices", "inverse", "counts")


# ---- nonzero -----------------------------------------------------------------------------------------
def _nonzero(xs, a):
    x = np.asarray(xs[0])
    return [np.array(np.nonzero(x.reshape(x.shape or (1,))), dtype=np.int64).reshape(x.ndim or 1, -1)[:x.ndim or 1]]


def _nonzero_type(ts, a):
    x = ts[0]
    return [TensorType((max(x.rank, 1), x.size), "int64")]


register("nonzero", _nonzero, _nonzero_type, run_time_shape=lambda a: [True])


# ---- unique ------------------------------------------------------------------------------------------
def _unique(xs, a):
    x = np.asarray(xs[0])
    axis = a["axis"]
    src = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else axis
    values, first, inverse, counts = np.unique(src, return_index=True, return_inverse=True, return_counts=True,
                                               axis=axis)
    inverse = inverse.reshape(-1)
    if not a["sorted"]:  # order of first appearance
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values, first, counts, inverse = np.take(values, order, axis=ax), first[order], counts[order], rank[inverse]
    found = {"values": values, "indices": first, "inverse": inverse, "counts": counts}
    return [found[o] if o == "values" else found[o].astype(np.int64) for o in a["outputs"]]


def _unique_type(ts, a):
    x = ts[0]
    axis = a["axis"]
    if axis is not None and not 0 <= axis < x.rank:
        raise ValueError(f"unique: axis {axis} is out of range for rank {x.rank}")
    if any(o not in UNIQUE_OUTPUTS for o in a["outputs"]):
        raise ValueError(f"unique: outputs must be among {UNIQUE_OUTPUTS}, not {a['outputs']}")
    n = x.size if axis is None else x.shape[axis]
    types = {"values": TensorType((x.size,) if axis is None else x.shape, x.dtype),
             "indices": TensorType((n,), "int64"), "inverse": TensorType((n,), "int64"),
             "counts": TensorType((n,), "int64")}
    return [types[o] for o in a["outputs"]]


register("unique", _unique, _unique_type, run_time_shape=lambda a: [o != "inverse" for o in a["outputs"]])


# ---- nms ---------------------------------------------------------------------------------------------
def _corners(box: np.ndarray, center: bool) -> tuple:
    """(y_min, x_min, y_max, x_max) of a box given as two corners (either order) or as its centre and size,
    in the boxes' element type (as the ONNX reference computes)."""
    if center:
        xc, yc, w, h = box
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    y1, x1, y2, x2 = box
    return min(y1, y2), min(x1, x2), max(y1, y2), max(x1, x2)


def _suppresses(a: tuple, b: tuple, iou_threshold: float) -> bool:
    """Whether two boxes overlap by more than the threshold (intersection over union)."""
    ih = min(a[2], b[2]) - max(a[0], b[0])
    iw = min(a[3], b[3]) - max(a[1], b[1])
    if ih <= 0 or iw <= 0:
        return False
    inter = ih * iw
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    union = area_a + area_b - inter
    if area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return inter / union > iou_threshold


def _nms(xs, a):
    boxes, scores = xs[0], xs[1]
    keep = max(int(np.asarray(xs[2]).reshape(-1)[0]), 0) if xs[2].size else 0
    iou = np.asarray(xs[3]).reshape(-1)[0] if xs[3].size else 0.0
    threshold = np.asarray(xs[4]).reshape(-1)[0] if xs[4].size else None
    center = bool(a["center_point_box"])
    rows = []
    for bi in range(boxes.shape[0]):
        corners = [_corners(bx, center) for bx in boxes[bi]]
        for ci in range(scores.shape[1]):
            s = scores[bi, ci]
            order = [int(k) for k in np.lexsort((np.arange(s.size), -s.astype(np.float64)))]  # best first, ties: low index
            if threshold is not None:
                order = [k for k in order if s[k] > threshold]
            chosen: list[int] = []
            for k in order:
                if len(chosen) >= keep:
                    break
                if not any(_suppresses(corners[k], corners[j], iou) for j in chosen):
                    chosen.append(k)
                    rows.append((bi, ci, k))
    return [np.array(rows, dtype=np.int64).reshape(-1, 3)]


def _nms_type(ts, a):
    boxes, scores = ts[0], ts[1]
    if boxes.rank != 3 or boxes.shape[2] != 4 or scores.rank != 3 or scores.shape[::2] != boxes.shape[:2]:
        raise ValueError(f"nms: boxes {boxes.shape} and scores {scores.shape} must be (B, N, 4) and (B, C, N)")
    return [TensorType((a["bound"], 3), "int64")]


register("nms", _nms, _nms_type, run_time_shape=lambda a: [True])
