"""The extern ops (sorting, scans, data-dependent indexing, resize) against independent oracles:
onnx.reference on one-node models, onnxruntime, and eager torch; run by the reference interpreter
and, for a few graphs, compiled."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from superopt.api import OptimizeConfig, compile_graph
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.ir.types import dtype_name
from superopt.ops.indexing import gather_elements, gather_nd, one_hot, scatter_elements, scatter_nd
from superopt.ops.resize import resize
from superopt.ops.scan import cumprod, cumsum
from superopt.ops.sorting import argmax, argmin, argsort, sort, topk

ONNX_ELEM = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
             "int32": TensorProto.INT32, "bool": TensorProto.BOOL}
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Every test draws the same data however tests are ordered or split between workers."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def onnx_model(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None, n_out: int = 1,
               opset: int = 19, out_dtype: str | None = None, **attrs) -> onnx.ModelProto:
    """A one-node model: ``inputs`` are graph inputs, ``consts`` initializers, in the node's input order
    given by ``attrs.pop('order')`` (default: inputs then consts; '' leaves an optional input out)."""
    consts = consts or {}
    order = attrs.pop("order", list(inputs) + list(consts))
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, order, outs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, ONNX_ELEM[dtype_name(v.dtype)], v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, ONNX_ELEM[out_dtype] if out_dtype else TensorProto.UNDEFINED, None)
         for o in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def onnx_reference(op: str, inputs: dict[str, np.ndarray], consts=None, n_out: int = 1, opset: int = 19,
                   **attrs) -> list[np.ndarray]:
    model = onnx_model(op, inputs, consts, n_out, opset, **attrs)
    return list(ReferenceEvaluator(model).run(None, inputs))


def onnxruntime_run(op: str, inputs: dict[str, np.ndarray], consts=None, out_dtype: str = "float32", opset: int = 19,
                    **attrs) -> list[np.ndarray]:
    model = onnx_model(op, inputs, consts, 1, opset, out_dtype, **attrs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, inputs))


def run_op(build: Callable[..., str | list[str]], feeds: dict[str, np.ndarray], float_dtype=np.float32) -> list[np.ndarray]:
    """Build ``build(b, *inputs)`` over graph inputs shaped like ``feeds`` and run the reference interpreter
    (which evaluates every float tensor in ``float_dtype``)."""
    b = GraphBuilder()
    names = [b.input(k, v.shape, dtype_name(v.dtype)) for k, v in feeds.items()]
    outs = build(b, *names)
    outs = [outs] if isinstance(outs, str) else list(outs)
    graph = b.build(outs)
    got = evaluate(graph, dict(zip(names, feeds.values(), strict=True)), dtype=float_dtype)
    return [got[o] for o in outs]


def assert_same(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 0.0, atol: float = 0.0) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def ties(shape, dtype=np.float32, levels: int = 4) -> np.ndarray:
    """Values from a few levels, so that most entries tie with others."""
    return RNG.integers(-levels, levels, size=shape).astype(dtype)


# ---- sorting ------------------------------------------------------------------------------------
TOPK_CASES = [  # shape, axis, k (n >= 64 and 8k <= n takes the partition path)
    ((3, 7), -1, 3), ((3, 7), 0, 2), ((2, 5, 4), 1, 5), ((2, 200), 1, 5), ((130, 3), 0, 16), ((6,), 0, 0),
]


@pytest.mark.parametrize("shape,axis,k", TOPK_CASES)
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_topk_ties_match_onnx(shape, axis, k, largest, dtype):
    x = ties(shape, dtype)
    want = onnx_reference("TopK", {"x": x}, {"k": np.array([k], np.int64)}, n_out=2, axis=axis, largest=int(largest))
    got = run_op(lambda b, x: topk(b, x, k, axis=axis, largest=largest), {"x": x})
    assert_same(got, want)


def test_topk_nan_counts_as_largest_like_onnx():
    x = ties((2, 100))
    x[0, [3, 50]] = np.nan
    for largest in (True, False):
        want = onnx_reference("TopK", {"x": x}, {"k": np.array([4], np.int64)}, n_out=2, largest=int(largest))
        assert_same(run_op(lambda b, x, lg=largest: topk(b, x, 4, largest=lg), {"x": x}), want)


@pytest.mark.parametrize("shape,axis", [((4, 9), -1), ((4, 9), 0), ((2, 3, 70), 2)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_are_stable_like_torch(shape, axis, descending):
    x = ties(shape)
    values, indices = torch.sort(torch.from_numpy(x), dim=axis, descending=descending, stable=True)
    got = run_op(lambda b, x: [*sort(b, x, axis, descending), argsort(b, x, axis, descending)], {"x": x})
    assert_same(got, [values.numpy(), indices.numpy(), indices.numpy()])


@pytest.mark.parametrize("fn,op", [(argmax, "ArgMax"), (argmin, "ArgMin")])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("select_last_index", [False, True])
def test_argmax_argmin_ties_match_onnx(fn, op, axis, keepdims, select_last_index):
    x = ties((3, 5, 4), levels=2)
    want = onnx_reference(op, {"x": x}, axis=axis, keepdims=int(keepdims), select_last_index=int(select_last_index))
    got = run_op(lambda b, x: fn(b, x, axis, keepdims, select_last_index), {"x": x})
    assert_same(got, want)


# ---- scans --------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive,reverse", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_cumsum_matches_onnx(axis, exclusive, reverse, dtype):
    x = ties((3, 4, 5), dtype, levels=9)
    want = onnx_reference("CumSum", {"x": x}, {"axis": np.array(axis, np.int64)}, exclusive=int(exclusive),
                          reverse=int(reverse))
    assert_same(run_op(lambda b, x: cumsum(b, x, axis, exclusive, reverse), {"x": x}), want, rtol=1e-6)


def _cumprod_oracle(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """Each output as the product of the slice it covers, one position at a time."""
    n = x.shape[axis]
    parts = []
    for i in range(n):
        cover = range(i + exclusive, n) if reverse else range(0, i + 1 - exclusive)
        parts.append(np.prod(np.take(x, list(cover), axis=axis), axis=axis, dtype=x.dtype))
    return np.stack(parts, axis=axis)


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("exclusive,reverse", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumprod_matches_slice_products(axis, exclusive, reverse, dtype):
    x = RNG.integers(-3, 4, size=(4, 5)).astype(dtype)
    want = _cumprod_oracle(x, axis % 2, exclusive, reverse)
    assert_same(run_op(lambda b, x: cumprod(b, x, axis, exclusive, reverse), {"x": x}), [want], rtol=1e-6)
    if not (exclusive or reverse):
        assert_same([want], [torch.cumprod(torch.from_numpy(x), dim=axis).numpy()], rtol=1e-6)


# ---- gathers and scatters -----------------------------------------------------------------------
@pytest.mark.parametrize("data_shape,idx_shape,axis", [
    ((4, 5), (3, 5), 0), ((4, 5), (4, 7), 1), ((3, 4, 5), (3, 2, 5), -2), ((3, 4, 5), (2, 3, 5), -2), ((6,), (9,), 0),
    ((4, 5), (2, 3), 1),
])
def test_gather_elements_matches_onnx(data_shape, idx_shape, axis):
    data = RNG.standard_normal(data_shape).astype(np.float32)
    n = data_shape[axis]
    idx = RNG.integers(-n, n, size=idx_shape).astype(np.int64)
    if all(i == d for k, (i, d) in enumerate(zip(idx_shape, data_shape)) if k != axis % len(data_shape)):
        want = onnx_reference("GatherElements", {"data": data, "idx": idx}, axis=axis)
    else:  # indices narrower than data off the axis: onnx.reference refuses them, torch.gather takes them
        want = [torch.gather(torch.from_numpy(data), axis, torch.from_numpy(idx % n)).numpy()]
    assert_same(run_op(lambda b, d, i: gather_elements(b, d, i, axis), {"data": data, "idx": idx}), want)


def _unique_positions(n: int, count: int, shape) -> np.ndarray:
    """``count`` distinct positions per column (no duplicate targets), some written as negative indices."""
    cols = [RNG.permutation(n)[:count] for _ in range(int(np.prod(shape)))]
    idx = np.stack(cols, axis=-1).reshape((count, *shape))
    return np.where(RNG.random(idx.shape) < 0.5, idx - n, idx).astype(np.int64)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_matches_onnx(reduction, axis):
    data = RNG.standard_normal((5, 6)).astype(np.float32)
    other = 6 if axis == 0 else 5
    if reduction == "none":  # duplicate targets leave the result undefined
        idx = np.moveaxis(_unique_positions(data.shape[axis], 3, (other - 1,)), 0, axis)
    else:
        idx = RNG.integers(-data.shape[axis], data.shape[axis], size=(3, 4) if axis == 0 else (4, 3)).astype(np.int64)
    upd = RNG.standard_normal(idx.shape).astype(np.float32)
    want = onnx_reference("ScatterElements", {"data": data, "idx": idx, "upd": upd}, opset=18, axis=axis,
                          reduction=reduction)
    got = run_op(lambda b, d, i, u: scatter_elements(b, d, i, u, axis, reduction), {"data": data, "idx": idx, "upd": upd})
    assert_same(got, want, rtol=1e-6)


@pytest.mark.parametrize("data_shape,idx_shape,batch_dims", [
    ((4, 5), (3, 2), 0), ((4, 5), (3, 1), 0), ((3, 4, 5), (2, 2, 2), 0), ((2, 4, 5), (2, 3, 1), 1),
    ((2, 4, 5), (2, 1), 1), ((2, 3, 4, 5), (2, 3, 6, 2), 2), ((2, 3, 4), (2, 3, 1), 2), ((5,), (1,), 0),
])
def test_gather_nd_matches_onnx(data_shape, idx_shape, batch_dims):
    data = RNG.standard_normal(data_shape).astype(np.float32)
    m = idx_shape[-1]
    ext = np.array(data_shape[batch_dims:batch_dims + m] or [1])
    idx = np.floor(RNG.random(idx_shape) * 2 * ext - ext).astype(np.int64)  # in [-n, n)
    want = onnx_reference("GatherND", {"data": data, "idx": idx}, batch_dims=batch_dims)
    assert_same(run_op(lambda b, d, i: gather_nd(b, d, i, batch_dims), {"data": data, "idx": idx}), want)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("data_shape,m", [((6, 4), 1), ((6, 4), 2), ((3, 4, 5), 2)])
def test_scatter_nd_matches_onnx(reduction, data_shape, m):
    data = RNG.standard_normal(data_shape).astype(np.float32)
    cells = list(itertools.product(*[range(n) for n in data_shape[:m]]))
    if reduction == "none":  # distinct targets
        picks = RNG.permutation(len(cells))[:4]
    else:  # repeated targets combine
        picks = RNG.integers(0, len(cells), size=6)
    idx = np.array([cells[p] for p in picks], np.int64).reshape(2, -1, m)
    idx = np.where(RNG.random(idx.shape) < 0.3, idx - np.array(data_shape[:m]), idx)
    upd = RNG.standard_normal(idx.shape[:-1] + data_shape[m:]).astype(np.float32)
    want = onnx_reference("ScatterND", {"data": data, "idx": idx, "upd": upd}, opset=18, reduction=reduction)
    got = run_op(lambda b, d, i, u: scatter_nd(b, d, i, u, reduction), {"data": data, "idx": idx, "upd": upd})
    assert_same(got, want, rtol=1e-6)


@pytest.mark.parametrize("idx_shape,axis", [((3, 4), -1), ((3, 4), 0), ((3, 4), 1), ((5,), 0), ((), -1)])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32, np.float32])
def test_one_hot_matches_onnx(idx_shape, axis, idx_dtype):
    depth = 5
    idx = RNG.integers(-7, 8, size=idx_shape).astype(idx_dtype)  # some out of range in both directions
    values = np.array([-1.5, 2.0], np.float32)
    want = onnx_reference("OneHot", {"idx": idx, "values": values}, {"depth": np.array(depth, np.int64)},
                          order=["idx", "depth", "values"], axis=axis)
    assert_same(run_op(lambda b, i, v: one_hot(b, i, depth, v, axis), {"idx": idx, "values": values}), want)


def test_one_hot_truncates_float_indices_like_onnxruntime():
    idx = np.array([0.7, 2.9, -1.2, 3.5], np.float32)
    values = np.array([0, 1], np.int64)
    want = onnxruntime_run("OneHot", {"idx": idx}, {"depth": np.array(4, np.int64), "values": values}, "int64",
                           order=["idx", "depth", "values"])
    assert_same(run_op(lambda b, i, v: one_hot(b, i, 4, v), {"idx": idx, "values": values}), want)


# ---- resize -------------------------------------------------------------------------------------
COORDINATE_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize"]
INTERPOLATIONS = [("nearest", nm, False) for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")] + [
    ("linear", "round_prefer_floor", False), ("cubic", "round_prefer_floor", False), ("cubic", "round_prefer_floor", True)]
RESIZE_SHAPES = [  # 1-d (the first axis is kept) and 2-d, up and down
    ((2, 5), (2, 8)), ((2, 7), (2, 3)), ((3, 4), (5, 9)), ((6, 5), (4, 2)), ((4, 6), (7, 3)),
]


def _roi(rank: int) -> list[float]:
    """A region of interest reaching outside the input on some axes (no sample lands on a rounding tie)."""
    begins, ends = [0.13, -0.21, 0.07][:rank], [0.87, 1.19, 0.61][:rank]
    return begins + ends


def _resize_onnx_inputs(x, sizes, scales, ctm):
    roi = np.array(_roi(x.ndim) if ctm == "tf_crop_and_resize" else [], np.float32)
    consts = {"roi": roi}
    if scales is not None:
        consts["scales"] = np.array(scales, np.float32)
        order = ["x", "roi", "scales"]
    else:
        consts["sizes"] = np.array(sizes, np.int64)
        order = ["x", "roi", "", "sizes"]
    return consts, order


def _resize_ours(x, sizes, scales, mode, ctm, nearest_mode, exclude_outside, a=-0.75):
    roi = _roi(x.ndim) if ctm == "tf_crop_and_resize" else None
    return run_op(lambda b, x: resize(b, x, sizes, scales, mode, ctm, nearest_mode, a, exclude_outside, 9.0, roi),
                  {"x": x})


@pytest.mark.parametrize("shape,sizes", RESIZE_SHAPES, ids=[f"{s}->{o}" for s, o in RESIZE_SHAPES])
@pytest.mark.parametrize("ctm", COORDINATE_MODES)
@pytest.mark.parametrize("mode,nearest_mode,exclude_outside", INTERPOLATIONS)
def test_resize_matches_onnx_reference(shape, sizes, ctm, mode, nearest_mode, exclude_outside):
    x = RNG.standard_normal(shape).astype(np.float32)
    consts, order = _resize_onnx_inputs(x, sizes, None, ctm)
    want = onnx_reference("Resize", {"x": x}, consts, order=order, mode=mode, coordinate_transformation_mode=ctm,
                          nearest_mode=nearest_mode, exclude_outside=int(exclude_outside), extrapolation_value=9.0,
                          cubic_coeff_a=-0.5)
    got = _resize_ours(x, sizes, None, mode, ctm, nearest_mode, exclude_outside, a=-0.5)
    assert_same(got, want, rtol=1e-5, atol=1e-6)


GIVEN_SCALES = [((2, 5), (1.0, 0.75)), ((5, 4), (1.25, 2.5)), ((4, 6), (0.5, 1.5)), ((3, 5), (2.0, 0.2))]


@pytest.mark.parametrize("shape,scales", GIVEN_SCALES)
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"])
@pytest.mark.parametrize("mode,nearest_mode,exclude_outside", [INTERPOLATIONS[0], INTERPOLATIONS[1], *INTERPOLATIONS[4:]])
def test_resize_with_given_scales_matches_onnxruntime(shape, scales, ctm, mode, nearest_mode, exclude_outside):
    """The given scale (not out/in) maps coordinates; out = floor(in * scale); a length-1 output under
    pytorch_half_pixel samples position 0 (as the spec and onnxruntime; onnx.reference uses -0.5)."""
    x = RNG.standard_normal(shape).astype(np.float32)
    sizes = [int(np.floor(n * s)) for n, s in zip(shape, scales, strict=True)]
    consts, order = _resize_onnx_inputs(x, sizes, scales, ctm)
    # align_corners with a scale whose in * scale is not whole: the ONNX spec and its node tests (and
    # onnx.reference) divide by the unrounded resized length, onnxruntime by the rounded one; we follow the spec
    spec_only = ctm == "align_corners" and any(n * s != int(n * s) for n, s in zip(shape, scales, strict=True))
    run = onnx_reference if spec_only else onnxruntime_run
    want = run("Resize", {"x": x}, consts, order=order, mode=mode, coordinate_transformation_mode=ctm,
               nearest_mode=nearest_mode, exclude_outside=int(exclude_outside))
    got = _resize_ours(x, sizes, scales, mode, ctm, nearest_mode, exclude_outside)
    assert_same(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,sizes", [((2, 9), (2, 4)), ((11, 7), (3, 2)), ((5, 6), (9, 2)), ((3, 4), (6, 8))])
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("mode,exclude_outside", [("linear", False), ("cubic", False), ("cubic", True)])
def test_resize_antialias_matches_onnx_reference(shape, sizes, ctm, mode, exclude_outside):
    x = RNG.standard_normal(shape).astype(np.float32)
    consts, order = _resize_onnx_inputs(x, sizes, None, ctm)
    want = onnx_reference("Resize", {"x": x}, consts, order=order, mode=mode, coordinate_transformation_mode=ctm,
                          exclude_outside=int(exclude_outside), antialias=1)
    got = run_op(lambda b, x: resize(b, x, sizes, None, mode, ctm, exclude_outside=exclude_outside, antialias=True),
                 {"x": x})
    assert_same(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("torch_mode", ["bilinear", "bicubic"])
def test_resize_antialias_matches_torch(torch_mode):
    x = RNG.standard_normal((1, 2, 12, 9)).astype(np.float32)
    want = F.interpolate(torch.from_numpy(x), size=(5, 4), mode=torch_mode, antialias=True).numpy()
    mode = "linear" if torch_mode == "bilinear" else "cubic"
    a = -0.5 if mode == "cubic" else -0.75  # torch's antialiased bicubic uses Keys' a = -0.5
    got = run_op(lambda b, x: resize(b, x, want.shape, None, mode, "pytorch_half_pixel", cubic_coeff_a=a,
                                     exclude_outside=True, antialias=True), {"x": x})  # torch drops outside taps
    assert_same(got, [want], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_resize_keeps_the_element_type_like_onnx(mode, dtype):
    """Integers interpolate in float64 and round back (round half to even, saturating), as onnx.reference
    (whose cubic weights are float32: the attribute a is a numpy float32)."""
    x = RNG.integers(-50, 50, size=(3, 4)).astype(dtype)
    consts, order = _resize_onnx_inputs(x, (5, 7), None, "half_pixel")
    want = onnx_reference("Resize", {"x": x}, consts, order=order, mode=mode)
    assert_same(run_op(lambda b, x: resize(b, x, (5, 7), mode=mode), {"x": x}, np.float64), want,
                rtol=1e-5 if mode == "cubic" else 1e-12, atol=1e-4 if mode == "cubic" else 0.0)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "floor", "ceil"])
def test_resize_tf_half_pixel_for_nn_matches_onnxruntime_opset11(nearest_mode):
    x = RNG.standard_normal((1, 1, 5, 6)).astype(np.float32)
    consts = {"roi": np.array([], np.float32), "scales": np.array([], np.float32),
              "sizes": np.array([1, 1, 8, 4], np.int64)}
    want = onnxruntime_run("Resize", {"x": x}, consts, opset=11, mode="nearest", nearest_mode=nearest_mode,
                           coordinate_transformation_mode="tf_half_pixel_for_nn")
    got = run_op(lambda b, x: resize(b, x, (1, 1, 8, 4), None, "nearest", "tf_half_pixel_for_nn", nearest_mode), {"x": x})
    assert_same(got, want)


@pytest.mark.parametrize("torch_mode,align", [("nearest", None), ("bilinear", False), ("bilinear", True),
                                               ("bicubic", False), ("bicubic", True)])
@pytest.mark.parametrize("factor", [2.0, 0.5, 1.5])
def test_resize_matches_torch_interpolate(torch_mode, align, factor):
    x = RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    want = F.interpolate(torch.from_numpy(x), scale_factor=factor, mode=torch_mode, align_corners=align).numpy()
    mode = {"nearest": "nearest", "bilinear": "linear", "bicubic": "cubic"}[torch_mode]
    ctm = "asymmetric" if mode == "nearest" else ("align_corners" if align else "pytorch_half_pixel")
    got = run_op(lambda b, x: resize(b, x, want.shape, (1.0, 1.0, factor, factor), mode, ctm, "floor"), {"x": x})
    assert_same(got, [want], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,sizes,ctm,nearest_mode", [
    ((1, 2, 3, 4), (1, 2, 6, 8), "asymmetric", "floor"),  # x2 up: repeat
    ((1, 2, 3, 4), (1, 2, 9, 12), "half_pixel", "round_prefer_floor"),  # x3 up: repeat
    ((1, 2, 6, 8), (1, 2, 3, 4), "asymmetric", "floor"),  # x1/2 down: stride 2
    ((1, 2, 6, 8), (1, 2, 3, 2), "half_pixel", "round_prefer_ceil"),  # strides 2 and 4, offsets
    ((2, 6, 5), (2, 1, 10), "align_corners", "round_prefer_floor"),  # a constant row, repeat
])
def test_regular_nearest_resize_is_index_notation(shape, sizes, ctm, nearest_mode):
    x = RNG.standard_normal(shape).astype(np.float32)
    b = GraphBuilder()
    xi = b.input("x", shape)
    y = resize(b, xi, sizes, coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    graph = b.build([y])
    assert not any(n.is_extern and n.op.kind == "resize" for n in graph.nodes), graph.text()
    got = evaluate(graph, {"x": x})[y]
    consts, order = _resize_onnx_inputs(x, sizes, None, ctm)
    want = onnx_reference("Resize", {"x": x}, consts, order=order, mode="nearest", coordinate_transformation_mode=ctm,
                          nearest_mode=nearest_mode)
    assert_same([got], want)


def test_irregular_nearest_resize_stays_extern():
    b = GraphBuilder()
    y = resize(b, b.input("x", (1, 1, 4, 5)), (1, 1, 7, 3))
    assert [n.op.kind for n in b.build([y]).nodes if n.is_extern] == ["resize"]


# ---- compiled graphs, float64 evaluation, constants, errors ------------------------------------
@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    from superopt.runtime.compiler import CompilerConfig

    config = OptimizeConfig(compiler=CompilerConfig(cache_dir=tmp_path_factory.mktemp("kernels")), cost_model=None)
    return lambda graph: compile_graph(graph, config)


def test_compiled_graph_with_externs_matches_interpreter(compiled):
    """Externs between compute kernels, in planned buffers and as graph outputs, compiled and interpreted."""
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4, 6))
    i = b.input("i", (2, 5), "int64")
    on_off = b.constant(np.array([0.0, 1.0], np.float32))
    h = b.compute1("O[n,c,h,w] = X[n,c,h,w] * 2.0", {"X": x})
    up = resize(b, h, (2, 3, 8, 12))  # index notation (repeat)
    lin = resize(b, h, (2, 3, 7, 5), mode="linear")  # extern
    vals, idx = topk(b, lin, 3, axis=-1)
    cs = cumsum(b, vals, axis=2, exclusive=True)
    am = argmax(b, up, axis=1, keepdims=False)
    hot = one_hot(b, i, 6, on_off, axis=1)
    picked = gather_elements(b, lin, idx, axis=3)
    s = b.compute1("O[n,c,h,k] = X[n,c,h,k] + Y[n,c,h,k]", {"X": cs, "Y": picked})
    graph = b.build([s, am, hot, idx])
    feeds = {"x": RNG.standard_normal((2, 3, 4, 6)).astype(np.float32),
             "i": RNG.integers(-6, 6, size=(2, 5)).astype(np.int64)}
    want = evaluate(graph, feeds)
    got = compiled(graph)(feeds)
    for name in graph.outputs:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    wide = evaluate(graph, feeds, dtype=np.float64)  # float64 verification runs the externs in float64
    np.testing.assert_allclose(wide[s], want[s], rtol=1e-4, atol=1e-5)
    assert wide[s].dtype == np.float64 and wide[idx].dtype == np.int64


def test_constant_inputs_fold_to_constants():
    b = GraphBuilder()
    c = b.constant(np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 5.0]], np.float32))
    vals, idx = topk(b, c, 2)
    cs = cumsum(b, c, axis=1, reverse=True)
    assert not b.nodes
    np.testing.assert_array_equal(b.const_value(vals), [[3, 2], [5, 5]])
    np.testing.assert_array_equal(b.const_value(idx), [[0, 2], [1, 2]])
    np.testing.assert_array_equal(b.const_value(cs), [[6, 3, 2], [10, 10, 5]])


def _build_error(build: Callable[[GraphBuilder], object]) -> str:
    b = GraphBuilder()
    b.input("x", (3, 4))
    b.input("i", (3, 4), "int64")
    b.input("f", (3, 4), "float32")
    with pytest.raises((ValueError, TypeError, IndexError)) as err:
        build(b)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("build,cause", [
    (lambda b: topk(b, "x", 5), "k=5"),
    (lambda b: sort(b, "x", axis=2), "axis 2"),
    (lambda b: argmax(b, b.constant(np.float32(1.0))), "scalar"),
    (lambda b: cumsum(b, b.input("m", (3,), "bool"), 0), "bool"),
    (lambda b: gather_elements(b, "x", "f"), "int64 or int32"),
    (lambda b: gather_elements(b, "x", b.constant(np.array([[0], [4]])), axis=0), "index 4"),
    (lambda b: gather_elements(b, "x", b.input("j", (3,), "int64")), "rank"),
    (lambda b: scatter_elements(b, "x", "i", "x", reduction="sum"), "reduction 'sum'"),
    (lambda b: scatter_elements(b, "x", "i", "i"), "updates are int64"),
    (lambda b: gather_nd(b, "x", b.input("j", (2, 3), "int64")), "length 3"),
    (lambda b: gather_nd(b, "x", b.constant(np.array([[-4, 0]])), 0), "index -4"),
    (lambda b: scatter_nd(b, "x", b.constant(np.array([[0]])), b.input("u", (1, 3))), "updates shape"),
    (lambda b: one_hot(b, "i", 0, b.constant(np.array([0.0, 1.0], np.float32))), "depth"),
    (lambda b: one_hot(b, "i", 3, b.constant(np.array([0.0, 1.0, 2.0], np.float32))), "values"),
    (lambda b: resize(b, "x", (3, 4, 5)), "one entry per axis"),
    (lambda b: resize(b, "x", (6, 8), mode="area"), "mode 'area'"),
    (lambda b: resize(b, "x", (6, 8), coordinate_transformation_mode="corners"), "corners"),
    (lambda b: resize(b, "x", (6, 8), scales=(2.0,)), "scales"),
    (lambda b: resize(b, "x", (6, 8), coordinate_transformation_mode="tf_crop_and_resize", roi=(0, 1)), "roi"),
])
def test_bad_input_is_a_one_line_error_naming_the_cause(build, cause):
    assert cause in _build_error(build)


def test_run_time_index_out_of_range_names_it():
    b = GraphBuilder()
    x, i = b.input("x", (3, 4)), b.input("i", (2, 4), "int64")
    graph = b.build([gather_elements(b, x, i, axis=0)])
    with pytest.raises(IndexError, match="index 3 is out of range for an axis of extent 3"):
        evaluate(graph, {"x": np.zeros((3, 4), np.float32), "i": np.full((2, 4), 3)})
