"""Ops whose output shapes depend on input values: NonZero, Unique, NonMaxSuppression.

With constant inputs they fold when importing (exact shapes). Otherwise they become externs whose outputs
have shapes known only at run time (``nonzero``, ``unique``, ``nms`` in
:mod:`superopt.ir.externs.data_dependent`): such an output may only be a graph output that no node reads;
the executor refuses any other use with a one-line error naming the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from superopt.frontends.onnx_ops.context import _conv, _Ctx
from superopt.ir.externs import evaluate_extern
from superopt.ops._util import norm_axis


def _extern(c: _Ctx, kind: str, ins: list[str], name: str, **attrs: Any) -> list[str]:
    """The extern, or its values as constants when every input is one."""
    b = c.b
    values = [b.const_value(t) for t in ins]
    if all(v is not None for v in values):
        outs = evaluate_extern(kind, values, attrs)
        return [b.constant(v, dtype=v.dtype.name) for v in outs]
    return b.extern(kind, ins, name=name, **attrs)


@_conv("NonZero")
def _nonzero(c: _Ctx, x):
    return _extern(c, "nonzero", [x[0]], "nonzero")[0]


@_conv("Unique")
def _unique(c: _Ctx, x):
    axis = c.attr("axis")
    axis = None if axis is None else norm_axis(int(axis), len(c.b.shape(x[0])))
    names = ("values", "indices", "inverse", "counts")
    wanted = [names[k] for k, o in enumerate(c.node.output) if o]
    outs = iter(_extern(c, "unique", [x[0]], "unique", axis=axis, sorted=bool(c.attr("sorted", 1)),
                        outputs=tuple(wanted)))
    return [next(outs) if o else "" for o in c.node.output]


@_conv("NonMaxSuppression")
def _nms(c: _Ctx, x):
    b = c.b
    x = list(x) + [None] * (5 - len(x))
    boxes, scores = x[0], x[1]
    nb, n = b.shape(boxes)[:2]
    classes = b.shape(scores)[1]
    dtypes = ["int64", b.type(boxes).dtype, b.type(boxes).dtype]  # max per class, iou and score thresholds
    extra = [t if t is not None else b.constant(np.zeros(0, dt), dtype=dt) for t, dt in zip(x[2:], dtypes)]
    keep = b.const_value(extra[0])
    per_class = n if keep is None or keep.size == 0 else min(max(int(keep.reshape(-1)[0]), 0), n)
    if keep is not None and keep.size == 0:
        per_class = 0
    return _extern(c, "nms", [boxes, scores, *extra], "nms", center_point_box=int(c.attr("center_point_box", 0)),
                   bound=nb * classes * per_class)[0]
