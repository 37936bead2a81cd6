"""Normalizations beyond Layer/Batch norm: Instance, Group, RMS, mean-variance and Lp normalization."""

from __future__ import annotations

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import ewise, lit, norm_axis


def _affine(c: _Ctx, y: str, scale: str, bias: str | None) -> str:
    if bias is None:
        return ops.mul(c.b, y, scale)
    return ewise(c.b, "{0} * {1} + {2}", [y, scale, bias], "affine", c.b.shape(y))


@_conv("InstanceNormalization")
def _instance_norm(c: _Ctx, x):
    rank = len(c.b.shape(x[0]))
    if rank < 3:
        raise OnnxImportError(f"InstanceNormalization needs rank >= 3 (N, C, D...), got rank {rank}")
    return ops.instance_norm(c.b, x[0], x[1], x[2], c.attr("epsilon", 1e-5))


@_conv("GroupNormalization")
def _group_norm(c: _Ctx, x):
    shape = c.b.shape(x[0])
    n, ch, rank = shape[0], shape[1], len(shape)
    groups = int(c.attr("num_groups"))
    if groups <= 0 or ch % groups:
        raise OnnxImportError(f"GroupNormalization: {ch} channels do not split into {groups} groups")
    eps = c.attr("epsilon", 1e-5)
    if c.opset >= 21:  # scale and bias per channel
        return ops.group_norm(c.b, x[0], x[1], x[2], groups, eps)
    # opset 18: scale and bias per group, broadcast over each group's channels
    grouped = ops.reshape(c.b, x[0], [n, groups, -1])
    y = ops.reshape(c.b, ops.layer_norm(c.b, grouped, None, None, 2, eps), shape)
    g = [c.b.shape(t)[0] for t in x[1:3]]
    if g != [groups, groups]:
        raise OnnxImportError(f"GroupNormalization-18: scale/bias need {groups} values (one per group), got {g}")
    y = ops.reshape(c.b, y, [n, groups, ch // groups, *shape[2:]])
    sc, bi = (ops.reshape(c.b, t, [groups] + [1] * (rank - 1)) for t in x[1:3])
    return ops.reshape(c.b, _affine(c, y, sc, bi), shape)


@_conv("RMSNormalization")
def _rms_norm(c: _Ctx, x):
    return ops.rms_norm(c.b, x[0], x[1], c.attr("axis", -1), c.attr("epsilon", 1e-5))


@_conv("MeanVarianceNormalization")
def _mvn(c: _Ctx, x):
    """(X - mean) / (sqrt(mean(X^2) - mean^2) + 1e-9) over ``axes`` (the onnx reference's formula)."""
    axes = c.attr("axes", [0, 2, 3])
    mean = ops.reduce(c.b, x[0], "mean", axes, keepdims=True)
    sq_mean = ops.reduce(c.b, ops.mul(c.b, x[0], x[0]), "mean", axes, keepdims=True)
    return ewise(c.b, "({0} - {1}) / (sqrt({2} - {1} * {1}) + 1e-09)", [x[0], mean, sq_mean], "mvn")


@_conv("LpNormalization")
def _lp_norm(c: _Ctx, x):
    """x / ||x||_p along ``axis`` (p 1 or 2); 0 where the norm is 0."""
    p = int(c.attr("p", 2))
    if p not in (1, 2):
        raise OnnxImportError(f"LpNormalization with p={p} is not supported (p must be 1 or 2)")
    axis = norm_axis(c.attr("axis", -1), len(c.b.shape(x[0])))
    mag = ops.unary(c.b, "abs", x[0]) if p == 1 else ops.mul(c.b, x[0], x[0])
    norm = ops.reduce(c.b, mag, "sum", [axis], keepdims=True)
    if p == 2:
        norm = ops.unary(c.b, "sqrt", norm)
    zero = lit(0.0)
    return ewise(c.b, f"where({{1}} == {zero}, {zero}, {{0}} / {{1}})", [x[0], norm], "lp_normalization")
