"""A declarative table of op cases: how to build each op, its inputs, and an independent reference.

Every backend (reference interpreter, C, CUDA) runs the same table: :func:`case_graph` builds the Graph
and seeded inputs, and ``case.reference(*inputs)`` gives the expected outputs (numpy / torch, never
superopt code).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from scipy.special import erf as _erf

from superopt import ops
from superopt.builder import GraphBuilder
from superopt.ir.graph import Graph

Shape = tuple[int, ...]


@dataclass(frozen=True)
class OpCase:
    name: str
    build: Callable[[GraphBuilder, list[str]], str | list[str]]
    inputs: Sequence[tuple[Shape, str]]
    reference: Callable[..., np.ndarray | list[np.ndarray]]
    rtol: float = 1e-5
    atol: float = 1e-6
    # per-input generator: (rng, shape, dtype) -> array; default standard normal / small ints / random bools
    gen: Sequence[Callable | None] = field(default_factory=tuple)
    # inputs that are built as graph constants (by position) instead of graph inputs
    const_inputs: Sequence[int] = ()


def _default_gen(rng: np.random.Generator, shape: Shape, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-5, 6, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def positive(rng, shape, dtype):
    return (rng.random(shape) + 0.5).astype(dtype)


def case_inputs(case: OpCase, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for k, (shape, dtype) in enumerate(case.inputs):
        g = case.gen[k] if k < len(case.gen) and case.gen[k] is not None else _default_gen
        out.append(np.asarray(g(rng, tuple(shape), dtype)))
    return out


def case_graph(case: OpCase, seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    """The case as a Graph and its input feed (by graph input name)."""
    values = case_inputs(case, seed)
    b = GraphBuilder(case.name)
    names, feed = [], {}
    for k, v in enumerate(values):
        if k in case.const_inputs:
            names.append(b.constant(v, f"c{k}", dtype=v.dtype.name))
        else:
            n = b.input(f"x{k}", v.shape, v.dtype.name)
            names.append(n)
            feed[n] = v
    out = case.build(b, names)
    outs = out if isinstance(out, list) else [out]
    return b.build(outs), feed


def case_reference(case: OpCase, seed: int = 0) -> list[np.ndarray]:
    r = case.reference(*case_inputs(case, seed))
    return [np.asarray(x) for x in (r if isinstance(r, (list, tuple)) else [r])]


# ---- independent references ---------------------------------------------------------------------
def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _n(t):
    return t.detach().numpy()


def _softmax(x, axis):
    return _n(torch.softmax(_t(x), axis))


def _layer_norm(x, g, bb, axis, eps):
    shape = x.shape[axis:]
    return _n(F.layer_norm(_t(x), shape, _t(g), _t(bb), eps))


def _conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, pads=None):
    xt = _t(x)
    if pads is not None:  # (top, left, bottom, right)
        xt = F.pad(xt, (pads[1], pads[3], pads[0], pads[2]))
    return _n(F.conv2d(xt, _t(w), None if bias is None else _t(bias), stride, padding, dilation, groups))


def _avg_pool_exclude(x, k, s, pads):
    """numpy loop reference: average over taps inside the input."""
    n, c, h, w = x.shape
    oh = (h + pads[0] + pads[2] - k[0]) // s[0] + 1
    ow = (w + pads[1] + pads[3] - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * s[0] - pads[0], j * s[1] - pads[1]
            ys, xs = slice(max(y0, 0), min(y0 + k[0], h)), slice(max(x0, 0), min(x0 + k[1], w))
            out[:, :, i, j] = x[:, :, ys, xs].mean(axis=(2, 3))
    return out


def _lrn(x, size, alpha, beta, bias):
    """ONNX LRN: window [c - floor((size-1)/2), c + ceil((size-1)/2)] over channels."""
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (lo, hi), (0, 0), (0, 0)))
    s = sum(sq[:, k : k + x.shape[1]] for k in range(size))
    return (x / (bias + alpha / size * s) ** beta).astype(x.dtype)


def _sdpa(q, k, v, mask=None, causal=False):
    return _n(
        F.scaled_dot_product_attention(
            _t(q), _t(k), _t(v), attn_mask=None if mask is None else _t(mask), is_causal=causal
        )
    )


def _bn(x, g, bb, m, v, eps=1e-5):
    return _n(F.batch_norm(_t(x), _t(m), _t(v), _t(g), _t(bb), False, 0.0, eps))


F32 = "float32"
CASES: list[OpCase] = [
    # elementwise
    OpCase("add_bcast", lambda b, x: ops.add(b, *x), [((2, 3, 4), F32), ((3, 1), F32)], np.add),
    OpCase(
        "sub_scalar_const",
        lambda b, x: ops.sub(b, *x),
        [((2, 3), F32), ((), F32)],
        np.subtract,
        const_inputs=(1,),
    ),
    OpCase("mul_rank0", lambda b, x: ops.mul(b, *x), [((), F32), ((), F32)], np.multiply),
    OpCase("div", lambda b, x: ops.div(b, *x), [((4, 5), F32), ((5,), F32)], np.divide, gen=(None, positive)),
    OpCase(
        "pow",
        lambda b, x: ops.pow_(b, *x),
        [((3, 4), F32), ((4,), F32)],
        np.power,
        rtol=1e-5,
        gen=(positive, None),
    ),
    OpCase("maximum", lambda b, x: ops.maximum(b, *x), [((2, 1, 4), F32), ((3, 1), F32)], np.maximum),
    OpCase("minimum", lambda b, x: ops.minimum(b, *x), [((2, 3), F32), ((2, 3), F32)], np.minimum),
    OpCase("add_int", lambda b, x: ops.add(b, *x), [((2, 3), "int64"), ((3,), "int64")], np.add),
    OpCase("where", lambda b, x: ops.where(b, *x), [((2, 3), "bool"), ((3,), F32), ((2, 1), F32)], np.where),
    OpCase(
        "clip", lambda b, x: ops.clip(b, x[0], -0.5, 0.7), [((3, 4), F32)], lambda x: np.clip(x, -0.5, 0.7)
    ),
    OpCase("relu", lambda b, x: ops.relu(b, x[0]), [((3, 4), F32)], lambda x: np.maximum(x, 0)),
    OpCase("gelu", lambda b, x: ops.gelu(b, x[0]), [((3, 4), F32)], lambda x: _n(F.gelu(_t(x)))),
    OpCase(
        "gelu_tanh",
        lambda b, x: ops.gelu(b, x[0], approximate="tanh"),
        [((3, 4), F32)],
        lambda x: _n(F.gelu(_t(x), approximate="tanh")),
    ),
    OpCase("silu", lambda b, x: ops.silu(b, x[0]), [((3, 4), F32)], lambda x: _n(F.silu(_t(x)))),
    OpCase("sigmoid", lambda b, x: ops.sigmoid(b, x[0]), [((3, 4), F32)], lambda x: _n(torch.sigmoid(_t(x)))),
    OpCase("tanh", lambda b, x: ops.tanh(b, x[0]), [((3, 4), F32)], np.tanh),
    OpCase("erf", lambda b, x: ops.erf(b, x[0]), [((3, 4), F32)], lambda x: _erf(x).astype(np.float32)),
    OpCase("exp", lambda b, x: ops.unary(b, "exp", x[0]), [((3, 4), F32)], np.exp),
    OpCase("sqrt", lambda b, x: ops.unary(b, "sqrt", x[0]), [((3, 4), F32)], np.sqrt, gen=(positive,)),
    OpCase(
        "cast_int",
        lambda b, x: ops.cast(b, x[0], "int64"),
        [((3, 4), F32)],
        lambda x: (x * 3).astype(np.int64) * 0 + x.astype(np.int64),
    ),
    OpCase(
        "cast_float",
        lambda b, x: ops.cast(b, x[0], "float32"),
        [((3, 4), "int64")],
        lambda x: x.astype(np.float32),
    ),
    OpCase("scale", lambda b, x: ops.scale(b, x[0], 0.25), [((3, 4), F32)], lambda x: x * np.float32(0.25)),
    # reductions
    OpCase(
        "reduce_sum",
        lambda b, x: ops.reduce(b, x[0], "sum", [1]),
        [((2, 3, 4), F32)],
        lambda x: x.sum(1, keepdims=True),
    ),
    OpCase(
        "reduce_mean_nokeep",
        lambda b, x: ops.reduce(b, x[0], "mean", [0, 2], keepdims=False),
        [((2, 3, 4), F32)],
        lambda x: x.mean((0, 2)),
    ),
    OpCase(
        "reduce_max_all",
        lambda b, x: ops.reduce(b, x[0], "max", None, keepdims=False),
        [((2, 3, 4), F32)],
        lambda x: x.max(),
    ),
    OpCase(
        "reduce_min",
        lambda b, x: ops.reduce(b, x[0], "min", [-1]),
        [((2, 3, 4), F32)],
        lambda x: x.min(-1, keepdims=True),
    ),
    OpCase(
        "reduce_prod",
        lambda b, x: ops.reduce(b, x[0], "prod", [2]),
        [((2, 3, 4), F32)],
        lambda x: x.prod(2, keepdims=True),
    ),
    OpCase("softmax", lambda b, x: ops.softmax(b, x[0], 1), [((2, 5, 3), F32)], lambda x: _softmax(x, 1)),
    OpCase(
        "log_softmax",
        lambda b, x: ops.log_softmax(b, x[0]),
        [((2, 5), F32)],
        lambda x: _n(torch.log_softmax(_t(x), -1)),
    ),
    # normalization
    OpCase(
        "layer_norm",
        lambda b, x: ops.layer_norm(b, *x, axis=-1),
        [((2, 3, 8), F32), ((8,), F32), ((8,), F32)],
        lambda x, g, bb: _layer_norm(x, g, bb, -1, 1e-5),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "layer_norm_2axes",
        lambda b, x: ops.layer_norm(b, *x, axis=1),
        [((2, 3, 4), F32), ((3, 4), F32), ((3, 4), F32)],
        lambda x, g, bb: _layer_norm(x, g, bb, 1, 1e-5),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "rms_norm",
        lambda b, x: ops.rms_norm(b, *x),
        [((2, 3, 8), F32), ((8,), F32)],
        lambda x, g: _n(F.rms_norm(_t(x), (8,), _t(g), 1e-6)),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "batch_norm",
        lambda b, x: ops.batch_norm(b, *x),
        [((2, 3, 4, 5), F32), ((3,), F32), ((3,), F32), ((3,), F32), ((3,), F32)],
        _bn,
        gen=(None, None, None, None, positive),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "lrn",
        lambda b, x: ops.lrn(b, x[0], 3, 1e-2, 0.75, 1.0),
        [((2, 6, 3, 3), F32)],
        lambda x: _lrn(x, 3, 1e-2, 0.75, 1.0),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "lrn_even",
        lambda b, x: ops.lrn(b, x[0], 4, 1e-1, 0.75, 2.0),
        [((1, 7, 2, 2), F32)],
        lambda x: _lrn(x, 4, 1e-1, 0.75, 2.0),
        rtol=1e-4,
        atol=1e-5,
    ),
    # contractions
    OpCase("matmul_2d", lambda b, x: ops.matmul(b, *x), [((3, 4), F32), ((4, 5), F32)], np.matmul, rtol=1e-4),
    OpCase(
        "matmul_batch_bcast",
        lambda b, x: ops.matmul(b, *x),
        [((2, 1, 3, 4), F32), ((5, 4, 2), F32)],
        np.matmul,
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "matmul_vec_mat",
        lambda b, x: ops.matmul(b, *x),
        [((4,), F32), ((2, 4, 3), F32)],
        np.matmul,
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "matmul_mat_vec",
        lambda b, x: ops.matmul(b, *x),
        [((2, 3, 4), F32), ((4,), F32)],
        np.matmul,
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "matmul_vec_vec",
        lambda b, x: ops.matmul(b, *x),
        [((4,), F32), ((4,), F32)],
        np.matmul,
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "gemm",
        lambda b, x: ops.gemm(b, *x, alpha=0.5, beta=2.0, trans_a=True, trans_b=True),
        [((4, 3), F32), ((5, 4), F32), ((5,), F32)],
        lambda a, bb, c: 0.5 * a.T @ bb.T + 2.0 * c,
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "gemm_plain",
        lambda b, x: ops.gemm(b, *x),
        [((3, 4), F32), ((4, 5), F32), ((3, 1), F32)],
        lambda a, bb, c: a @ bb + c,
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "linear",
        lambda b, x: ops.linear(b, *x),
        [((2, 3, 4), F32), ((5, 4), F32), ((5,), F32)],
        lambda x, w, bb: _n(F.linear(_t(x), _t(w), _t(bb))),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "conv2d",
        lambda b, x: ops.conv2d(b, *x, pads=(1, 1, 1, 1)),
        [((2, 3, 6, 6), F32), ((4, 3, 3, 3), F32), ((4,), F32)],
        lambda x, w, bb: _conv(x, w, bb, padding=1),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "conv2d_strided_dilated",
        lambda b, x: ops.conv2d(b, *x, strides=(2, 1), pads=(1, 0, 2, 1), dilations=(1, 2)),
        [((1, 2, 7, 8), F32), ((3, 2, 3, 2), F32)],
        lambda x, w: _conv(x, w, stride=(2, 1), dilation=(1, 2), pads=(1, 0, 2, 1)),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "conv2d_grouped",
        lambda b, x: ops.conv2d(b, *x, groups=2, pads=(1, 1, 1, 1)),
        [((1, 4, 5, 5), F32), ((6, 2, 3, 3), F32), ((6,), F32)],
        lambda x, w, bb: _conv(x, w, bb, padding=1, groups=2),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "conv2d_depthwise",
        lambda b, x: ops.conv2d(b, *x, groups=3, strides=(2, 2)),
        [((1, 3, 7, 7), F32), ((3, 1, 3, 3), F32)],
        lambda x, w: _conv(x, w, stride=2, groups=3),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "conv1d",
        lambda b, x: ops.conv1d(b, *x, pads=(1, 2)),
        [((2, 3, 9), F32), ((4, 3, 3), F32)],
        lambda x, w: _n(F.conv1d(F.pad(_t(x), (1, 2)), _t(w))),
        rtol=1e-4,
        atol=1e-5,
    ),
    # pooling
    OpCase(
        "max_pool2d",
        lambda b, x: ops.max_pool2d(b, x[0], (3, 3), (2, 2), (1, 1, 1, 1)),
        [((1, 2, 7, 7), F32)],
        lambda x: _n(F.max_pool2d(_t(x), 3, 2, 1)),
    ),
    OpCase(
        "max_pool2d_ceil",
        lambda b, x: ops.max_pool2d(b, x[0], (3, 3), (2, 2), ceil_mode=True),
        [((1, 2, 8, 8), F32)],
        lambda x: _n(F.max_pool2d(_t(x), 3, 2, ceil_mode=True)),
    ),
    OpCase(
        "max_pool2d_dilated",
        lambda b, x: ops.max_pool2d(b, x[0], (2, 2), (1, 1), dilations=(2, 2)),
        [((1, 2, 6, 6), F32)],
        lambda x: _n(F.max_pool2d(_t(x), 2, 1, dilation=2)),
    ),
    OpCase(
        "avg_pool2d_include_pad",
        lambda b, x: ops.avg_pool2d(b, x[0], (3, 3), (2, 2), (1, 1, 1, 1), count_include_pad=True),
        [((1, 2, 7, 7), F32)],
        lambda x: _n(F.avg_pool2d(_t(x), 3, 2, 1, count_include_pad=True)),
    ),
    OpCase(
        "avg_pool2d_exclude_pad",
        lambda b, x: ops.avg_pool2d(b, x[0], (3, 3), (2, 2), (1, 1, 1, 1)),
        [((1, 2, 7, 7), F32)],
        lambda x: _avg_pool_exclude(x, (3, 3), (2, 2), (1, 1, 1, 1)),
    ),
    OpCase(
        "avg_pool2d_ceil",
        lambda b, x: ops.avg_pool2d(b, x[0], (2, 2), (2, 2), (0, 0, 0, 0), ceil_mode=True),
        [((1, 2, 5, 5), F32)],
        lambda x: _n(F.avg_pool2d(_t(x), 2, 2, ceil_mode=True)),
    ),
    OpCase(
        "global_avg_pool",
        lambda b, x: ops.global_avg_pool(b, x[0]),
        [((2, 3, 4, 5), F32)],
        lambda x: x.mean((2, 3), keepdims=True),
    ),
    OpCase(
        "adaptive_avg_pool2d",
        lambda b, x: ops.adaptive_avg_pool2d(b, x[0], (3, 2)),
        [((1, 2, 7, 5), F32)],
        lambda x: _n(F.adaptive_avg_pool2d(_t(x), (3, 2))),
    ),
    OpCase(
        "adaptive_avg_pool2d_even",
        lambda b, x: ops.adaptive_avg_pool2d(b, x[0], (2, 2)),
        [((1, 2, 4, 6), F32)],
        lambda x: _n(F.adaptive_avg_pool2d(_t(x), (2, 2))),
    ),
    # movement
    OpCase(
        "reshape", lambda b, x: ops.reshape(b, x[0], (4, -1)), [((2, 3, 4), F32)], lambda x: x.reshape(4, -1)
    ),
    OpCase(
        "flatten", lambda b, x: ops.flatten(b, x[0], 2), [((2, 3, 4, 5), F32)], lambda x: x.reshape(6, 20)
    ),
    OpCase(
        "squeeze",
        lambda b, x: ops.squeeze(b, x[0], [1, 3]),
        [((2, 1, 4, 1), F32)],
        lambda x: x.squeeze((1, 3)),
    ),
    OpCase(
        "unsqueeze",
        lambda b, x: ops.unsqueeze(b, x[0], [0, -1]),
        [((2, 3), F32)],
        lambda x: x[None, :, :, None],
    ),
    OpCase(
        "transpose",
        lambda b, x: ops.transpose(b, x[0], (2, 0, 1)),
        [((2, 3, 4), F32)],
        lambda x: x.transpose(2, 0, 1),
    ),
    OpCase(
        "concat",
        lambda b, x: ops.concat(b, x, 1),
        [((2, 3), F32), ((2, 1), F32), ((2, 4), F32)],
        lambda *xs: np.concatenate(xs, 1),
    ),
    OpCase(
        "concat_same_input",
        lambda b, x: ops.concat(b, [x[0], x[0]], 0),
        [((2, 3), F32)],
        lambda x: np.concatenate([x, x], 0),
    ),
    OpCase(
        "slice",
        lambda b, x: ops.slice_(b, x[0], [1, -1], [3, -6], [1, 2], [1, -2]),
        [((2, 4, 7), F32)],
        lambda x: x[:, 1:3, -1:-6:-2],
    ),
    OpCase(
        "slice_clamp",
        lambda b, x: ops.slice_(b, x[0], [0], [1000], [0], [2]),
        [((5, 3), F32)],
        lambda x: x[0:1000:2],
    ),
    OpCase(
        "split",
        lambda b, x: ops.split(b, x[0], 1, [1, 3, 2]),
        [((2, 6), F32)],
        lambda x: np.split(x, [1, 4], axis=1),
    ),
    OpCase(
        "expand",
        lambda b, x: ops.expand(b, x[0], (2, 3, 4)),
        [((3, 1), F32)],
        lambda x: np.broadcast_to(x, (2, 3, 4)),
    ),
    OpCase(
        "gather_scalar",
        lambda b, x: ops.gather(b, x[0], b.constant(np.array(-1)), 1),
        [((2, 4, 3), F32)],
        lambda x: x[:, -1],
    ),
    OpCase(
        "gather_range",
        lambda b, x: ops.gather(b, x[0], b.constant(np.array([0, 2, 4])), 1),
        [((2, 5), F32)],
        lambda x: x[:, [0, 2, 4]],
    ),
    OpCase(
        "gather_const_indices",
        lambda b, x: ops.gather(b, x[0], b.constant(np.array([[3, 0], [1, 1]])), 0),
        [((4, 3), F32)],
        lambda x: x[np.array([[3, 0], [1, 1]])],
    ),
    OpCase(
        "gather_runtime",
        lambda b, x: ops.gather(b, *x, axis=0),
        [((5, 3), F32), ((2, 2), "int64")],
        lambda x, i: np.take(x, np.where(i < 0, i + 5, i), 0),
        gen=(None, lambda rng, s, d: rng.integers(-5, 5, s).astype(d)),
    ),
    OpCase(
        "pad",
        lambda b, x: ops.pad(b, x[0], [1, 0, -1, 2], 1.5),
        [((3, 4), F32)],
        lambda x: np.pad(x, ((1, 0), (0, 2)), constant_values=1.5)[:-1],
    ),
    # attention
    OpCase(
        "sdpa",
        lambda b, x: ops.scaled_dot_product_attention(b, *x),
        [((2, 3, 4, 8), F32), ((2, 3, 5, 8), F32), ((2, 3, 5, 6), F32)],
        _sdpa,
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "sdpa_causal",
        lambda b, x: ops.scaled_dot_product_attention(b, *x, is_causal=True),
        [((2, 4, 8), F32), ((2, 4, 8), F32), ((2, 4, 8), F32)],
        lambda q, k, v: _sdpa(q, k, v, causal=True),
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "sdpa_bool_mask",
        lambda b, x: ops.scaled_dot_product_attention(b, *x),
        [((1, 3, 4), F32), ((1, 5, 4), F32), ((1, 5, 4), F32), ((3, 5), "bool")],
        lambda q, k, v, m: _sdpa(q, k, v, m),
        rtol=1e-4,
        atol=1e-5,
        gen=(None, None, None, lambda rng, s, d: np.eye(*s, dtype=bool) | (rng.random(s) < 0.5)),
    ),
    OpCase(
        "sdpa_float_mask",
        lambda b, x: ops.scaled_dot_product_attention(b, *x),
        [((1, 3, 4), F32), ((1, 5, 4), F32), ((1, 5, 4), F32), ((3, 5), F32)],
        lambda q, k, v, m: _sdpa(q, k, v, m),
        rtol=1e-4,
        atol=1e-5,
    ),
]

BY_NAME = {c.name: c for c in CASES}
