"""Region ops of detection models: RoiAlign (opsets 10, 16) as the ``roi_align`` extern."""

from __future__ import annotations

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx


@_conv("RoiAlign")
def _roi_align(c: _Ctx, x):
    """``coordinate_transformation_mode`` from opset 16 (``half_pixel`` by default there; before it, the
    old ``output_half_pixel`` rule)."""
    mode = str(c.attr("mode", "avg")).lower()
    ctm = str(c.attr("coordinate_transformation_mode", "half_pixel" if c.opset >= 16 else "output_half_pixel"))
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise OnnxImportError(f"RoiAlign coordinate_transformation_mode {ctm!r} is not supported")
    b = c.b
    batch = x[2]
    if b.type(batch).dtype != "int64":
        batch = ops.cast(b, batch, "int64")
    (y,) = b.extern("roi_align", [x[0], x[1], batch], name="roi_align", height=int(c.attr("output_height", 1)),
                    width=int(c.attr("output_width", 1)), sampling_ratio=int(c.attr("sampling_ratio", 0)),
                    spatial_scale=float(c.attr("spatial_scale", 1.0)), mode=mode, half_pixel=ctm == "half_pixel")
    return y
