"""The native ops of the new-ops contract (trig/hyperbolic/isnan/isinf unary functions, activations, mod,
bitwise ops, trilu, einsum, conv_transpose, group/instance norm): each case of the table below is built into a
Graph and checked against an independent numpy/torch reference, on the reference interpreter and as compiled C
(graph rewrite rules and default schedules, as superopt.api.compile_graph runs them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from superopt import ops
from superopt.api import OptimizeConfig, compile_graph
from superopt.builder import GraphBuilder
from superopt.interp import evaluate, evaluate_compute
from superopt.ir.types import TensorType
from superopt.lang import compile_op
from superopt.runtime.kernel import build_kernel
from superopt.schedule.default import default_schedule
from superopt.testing.op_table import OpCase, case_graph, case_reference

F32, F64, I64, I32 = "float32", "float64", "int64", "int32"


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _n(t):
    return t.detach().numpy()


def _uniform(lo: float, hi: float):
    return lambda rng, shape, dtype: rng.uniform(lo, hi, shape).astype(dtype)


def _wide(rng, shape, dtype):
    return (rng.standard_normal(shape) * 8).astype(dtype)


def _specials(rng, shape, dtype):
    """Finite values with NaN, +inf and -inf mixed in."""
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::4] = np.nan
    flat[1::5] = np.inf
    flat[2::7] = -np.inf
    return x


def _nonzero_floats(rng, shape, dtype):
    """Divisors of both signs, away from 0."""
    return (rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 3.0, shape)).astype(dtype)


def _ints(lo: int, hi: int, nonzero: bool = False):
    def gen(rng, shape, dtype):
        v = rng.integers(lo, hi, shape)
        if nonzero:
            v[v == 0] = 1
        return v.astype(dtype)

    return gen


def _quiet(fn, *xs):
    with np.errstate(all="ignore"):
        return fn(*xs)


def _shifts(rng, shape, dtype):
    """Shift counts inside [0, bit width)."""
    return rng.integers(0, 6, shape).astype(dtype)


def _conv_t_ref(x, w, bias=None, strides=1, pads=None, dilations=1, groups=1, output_padding=0):
    """torch conv_transpose with no padding, then ONNX's begin/end pads and output_padding as a crop (or a zero
    extension) of that full output; torch's own symmetric padding where the pads are symmetric."""
    nd = x.ndim - 2
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    s = (strides,) * nd if isinstance(strides, int) else tuple(strides)
    d = (dilations,) * nd if isinstance(dilations, int) else tuple(dilations)
    op = (output_padding,) * nd if isinstance(output_padding, int) else tuple(output_padding)
    p = (0,) * (2 * nd) if pads is None else tuple(pads)
    bt = None if bias is None else _t(bias)
    if p[:nd] == p[nd:] and all(o < max(si, di) for o, si, di in zip(op, s, d)):
        return _n(fn(_t(x), _t(w), bt, s, p[:nd], op, groups, d))
    full = _n(fn(_t(x), _t(w), None, s, 0, 0, groups, d))
    sizes = [(x.shape[2 + k] - 1) * s[k] - p[k] - p[nd + k] + d[k] * (w.shape[2 + k] - 1) + op[k] + 1 for k in range(nd)]
    big = np.pad(full, [(0, 0), (0, 0)] + [(0, n) for n in sizes])
    out = big[(slice(None), slice(None), *(slice(p[k], p[k] + sizes[k]) for k in range(nd)))]
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * nd)
    return np.ascontiguousarray(out)


def _group_norm(x, g, bb, groups, eps=1e-5):
    return _n(F.group_norm(_t(x), groups, _t(g), _t(bb), eps))


def _unary(fn: str, shape=(3, 5), dtype=F32, gen=None, reference=None, **kw) -> OpCase:
    return OpCase(f"unary_{fn}_{dtype}", lambda b, x: ops.unary(b, fn, x[0]), [(shape, dtype)],
                  reference or getattr(np, {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
                                            "acosh": "arccosh", "atanh": "arctanh"}.get(fn, fn)),
                  gen=(gen,), **kw)


def _einsum(name: str, eq: str, *shapes, **kw) -> OpCase:
    return OpCase(f"einsum_{name}", lambda b, x: ops.einsum(b, eq, *x), [(s, F32) for s in shapes],
                  lambda *xs: np.einsum(eq, *xs), rtol=1e-4, atol=1e-5, **kw)


def _mod_case(name, dtype, fmod, gens, ref, shapes=((3, 4), (4,)), **kw) -> OpCase:
    return OpCase(f"mod_{name}", lambda b, x: ops.mod(b, *x, fmod=fmod), [(s, dtype) for s in shapes], ref, gen=gens,
                  **kw)


CASES: list[OpCase] = [
    # unary functions
    _unary("tan", gen=_uniform(-1.4, 1.4), rtol=1e-4),
    _unary("asin", gen=_uniform(-0.99, 0.99)),
    _unary("acos", gen=_uniform(-0.99, 0.99)),
    _unary("atan", gen=_wide),
    _unary("sinh", gen=_uniform(-5, 5)),
    _unary("cosh", gen=_uniform(-5, 5)),
    _unary("asinh", gen=_wide),
    _unary("acosh", gen=_uniform(1.0, 20.0)),
    _unary("atanh", gen=_uniform(-0.95, 0.95), rtol=1e-4),
    _unary("tan", dtype=F64, gen=_uniform(-1.4, 1.4)),
    _unary("isnan", shape=(4, 7), gen=_specials),
    _unary("isinf", shape=(4, 7), gen=_specials),
    _unary("isnan", shape=(4, 7), dtype=F64, gen=_specials),
    _unary("isinf", shape=(4, 7), dtype=F64, gen=_specials),
    _unary("isnan", shape=(3, 4), dtype=I64),
    _unary("isinf", shape=(3, 4), dtype=I32),
    _unary("softsign", gen=_wide, reference=lambda x: _n(F.softsign(_t(x)))),
    _unary("mish", shape=(4, 25), gen=_wide, reference=lambda x: _n(F.mish(_t(x))), rtol=1e-5, atol=1e-5),
    # activations
    OpCase("selu", lambda b, x: ops.selu(b, x[0]), [((3, 7), F32)], lambda x: _n(F.selu(_t(x))), rtol=1e-5,
           atol=1e-5, gen=(_uniform(-6, 6),)),
    OpCase("celu", lambda b, x: ops.celu(b, x[0]), [((3, 7), F32)], lambda x: _n(F.celu(_t(x))), atol=1e-5),
    OpCase("celu_alpha2", lambda b, x: ops.celu(b, x[0], alpha=2.0), [((3, 7), F32)],
           lambda x: _n(F.celu(_t(x), alpha=2.0)), atol=1e-5, gen=(_wide,)),
    OpCase("hardswish", lambda b, x: ops.hardswish(b, x[0]), [((3, 9), F32)], lambda x: _n(F.hardswish(_t(x))),
           gen=(_uniform(-5, 5),)),
    OpCase("hardsigmoid_onnx", lambda b, x: ops.hardsigmoid(b, x[0]), [((3, 9), F32)],
           lambda x: np.clip(0.2 * x + 0.5, 0, 1).astype(np.float32), gen=(_uniform(-5, 5),)),
    OpCase("hardsigmoid_torch", lambda b, x: ops.hardsigmoid(b, x[0], alpha=1 / 6, beta=0.5), [((3, 9), F32)],
           lambda x: _n(F.hardsigmoid(_t(x))), gen=(_uniform(-5, 5),)),
    OpCase("shrink_hard", lambda b, x: ops.shrink(b, x[0], lambd=0.5), [((4, 6), F32)],
           lambda x: _n(F.hardshrink(_t(x), 0.5))),
    OpCase("shrink_soft", lambda b, x: ops.shrink(b, x[0], bias=0.7, lambd=0.7), [((4, 6), F32)],
           lambda x: _n(F.softshrink(_t(x), 0.7))),
    OpCase("shrink_int", lambda b, x: ops.shrink(b, x[0], bias=1, lambd=2), [((4, 6), I64)],
           lambda x: np.where(x < -2, x + 1, np.where(x > 2, x - 1, 0))),
    OpCase("thresholded_relu", lambda b, x: ops.thresholded_relu(b, x[0], alpha=0.3), [((4, 6), F32)],
           lambda x: np.where(x > 0.3, x, 0).astype(np.float32)),
    OpCase("softsign_op", lambda b, x: ops.softsign(b, x[0]), [((5,), F32)], lambda x: x / (1 + np.abs(x))),
    OpCase("mish_op", lambda b, x: ops.mish(b, x[0]), [((2, 3), F64)], lambda x: _n(F.mish(_t(x))), gen=(_wide,)),
    # mod: the sign of the divisor (numpy) or of the dividend (C fmod), negative operands on both sides
    _mod_case("float", F32, False, (_wide, _nonzero_floats), np.mod),
    _mod_case("float_fmod", F32, True, (_wide, _nonzero_floats), np.fmod),
    _mod_case("double_fmod", F64, True, (_wide, _nonzero_floats), np.fmod),
    _mod_case("int64", I64, False, (_ints(-20, 21), _ints(-7, 8, True)), np.mod),
    _mod_case("int64_fmod", I64, True, (_ints(-20, 21), _ints(-7, 8, True)), np.fmod),
    _mod_case("int32", I32, False, (_ints(-20, 21), _ints(-7, 8, True)), np.mod),
    _mod_case("int32_fmod", I32, True, (_ints(-20, 21), _ints(-7, 8, True)), np.fmod),
    _mod_case("int64_by_zero", I64, False, (_ints(-20, 21), _ints(-2, 3)), lambda x, y: _quiet(np.mod, x, y)),
    _mod_case("int64_fmod_by_zero", I64, True, (_ints(-20, 21), _ints(-2, 3)), lambda x, y: _quiet(np.fmod, x, y)),
    _mod_case("float_scalar_divisor", F32, False, (_wide, lambda rng, s, d: np.array(-2.5, d)), np.mod,
              shapes=((3, 4), ()), const_inputs=(1,)),
    # bitwise
    OpCase("bitwise_and", lambda b, x: ops.bitwise(b, "and", *x), [((3, 4), I64), ((4,), I64)], np.bitwise_and,
           gen=(_ints(-100, 100), _ints(-100, 100))),
    OpCase("bitwise_or", lambda b, x: ops.bitwise(b, "or", *x), [((3, 4), I32), ((3, 4), I32)], np.bitwise_or,
           gen=(_ints(-100, 100), _ints(-100, 100))),
    OpCase("bitwise_xor", lambda b, x: ops.bitwise(b, "xor", *x), [((3, 4), I64), ((3, 1), I64)], np.bitwise_xor,
           gen=(_ints(-100, 100), _ints(-100, 100))),
    OpCase("bitwise_and_bool", lambda b, x: ops.bitwise(b, "and", *x), [((3, 4), "bool"), ((3, 4), "bool")],
           np.bitwise_and),
    OpCase("bitwise_not", lambda b, x: ops.bitwise_not(b, x[0]), [((3, 4), I64)], np.invert,
           gen=(_ints(-100, 100),)),
    OpCase("bitwise_not_int32", lambda b, x: ops.bitwise_not(b, x[0]), [((3, 4), I32)], np.invert),
    OpCase("bitwise_not_bool", lambda b, x: ops.bitwise_not(b, x[0]), [((3, 4), "bool")], np.invert),
    OpCase("bit_shift_left", lambda b, x: ops.bit_shift(b, *x, "left"), [((3, 4), I64), ((3, 4), I64)],
           np.left_shift, gen=(_ints(-50, 50), _shifts)),
    OpCase("bit_shift_right", lambda b, x: ops.bit_shift(b, *x, "right"), [((3, 4), I32), ((4,), I32)],
           np.right_shift, gen=(_ints(-500, 500), _shifts)),
    OpCase("bit_shift_left_out_of_range", lambda b, x: ops.bit_shift(b, *x, "left"), [((4, 6), I32), ((4, 6), I32)],
           np.left_shift, gen=(_ints(-50, 50), _ints(-40, 40))),
    OpCase("bit_shift_right_out_of_range", lambda b, x: ops.bit_shift(b, *x, "right"), [((4, 6), I64), ((4, 6), I64)],
           np.right_shift, gen=(_ints(-50, 50), _ints(-70, 70))),
    # trilu on non-square inputs, k of both signs
    OpCase("triu", lambda b, x: ops.trilu(b, x[0]), [((2, 3, 5), F32)], np.triu),
    OpCase("triu_k2", lambda b, x: ops.trilu(b, x[0], 2), [((2, 3, 5), F32)], lambda x: np.triu(x, 2)),
    OpCase("triu_kneg", lambda b, x: ops.trilu(b, x[0], -1), [((5, 3), F32)], lambda x: np.triu(x, -1)),
    OpCase("tril", lambda b, x: ops.trilu(b, x[0], upper=False), [((4, 3), F32)], np.tril),
    OpCase("tril_kneg", lambda b, x: ops.trilu(b, x[0], -2, upper=False), [((2, 4, 6), I64)],
           lambda x: np.tril(x, -2)),
    OpCase("tril_kpos", lambda b, x: ops.trilu(b, x[0], 1, upper=False), [((3, 6), F32)], lambda x: np.tril(x, 1)),
    OpCase("triu_all_zero", lambda b, x: ops.trilu(b, x[0], 7), [((3, 6), F32)], lambda x: np.triu(x, 7)),
    OpCase("triu_empty", lambda b, x: ops.trilu(b, x[0], 1), [((0, 5), F32)], lambda x: np.triu(x, 1)),
    OpCase("tril_bool", lambda b, x: ops.trilu(b, x[0], 0, upper=False), [((4, 4), "bool")], np.tril),
    # einsum
    _einsum("matmul", "ij,jk->ik", (3, 4), (4, 5)),
    _einsum("batch", "bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
    _einsum("transpose", "ij->ji", (3, 4)),
    _einsum("trace", "ii->", (4, 4)),
    _einsum("trace_implicit", "ii", (4, 4)),
    _einsum("diagonal", "ii->i", (4, 4)),
    _einsum("diagonal_batch", "bii->bi", (2, 3, 3)),
    _einsum("implicit_matmul", "ij,jk", (3, 4), (4, 5)),
    _einsum("implicit_order", "ba,ac", (3, 4), (4, 2)),
    _einsum("mixed_case", "Ab,bC->CA", (3, 4), (4, 2)),
    _einsum("ellipsis_bcast", "...ij,...jk->...ik", (2, 1, 3, 4), (5, 4, 2)),
    _einsum("ellipsis_implicit", "...ij", (2, 3, 4)),
    _einsum("ellipsis_middle", "i...j->j...i", (2, 3, 4, 5)),
    _einsum("ellipsis_sum", "i...->...", (4, 2, 3)),
    _einsum("outer", "i,j->ij", (3,), (4,)),
    _einsum("sum_all", "ij->", (3, 4)),
    _einsum("three", "ij,jk,kl->il", (2, 3), (3, 4), (4, 5)),
    _einsum("bilinear", "bn,anm,bm->ba", (2, 3), (4, 3, 5), (2, 5)),
    _einsum("label_bcast", "ij,ij->ij", (1, 3), (2, 3)),
    _einsum("scalar_operand", ",ij->ji", (), (2, 3)),
    _einsum("attention_scores", "bhqd,bhkd->bhqk", (1, 2, 3, 4), (1, 2, 5, 4)),
    OpCase("einsum_same_operand", lambda b, x: ops.einsum(b, "ij,ij->i", x[0], x[0]), [((3, 4), F32)],
           lambda x: np.einsum("ij,ij->i", x, x), rtol=1e-5),
    # conv_transpose: torch, or torch's unpadded output cropped/extended for asymmetric pads
    OpCase("conv_transpose1d_s2_pad_outpad_bias",
           lambda b, x: ops.conv_transpose(b, *x, strides=(2,), pads=(1, 1), output_padding=(1,)),
           [((2, 3, 5), F32), ((3, 4, 3), F32), ((4,), F32)],
           lambda x, w, bb: _conv_t_ref(x, w, bb, 2, (1, 1), output_padding=1), rtol=1e-4, atol=1e-5),
    OpCase("conv_transpose1d_dilated_grouped_asym",
           lambda b, x: ops.conv_transpose(b, *x, strides=(3,), pads=(0, 2), dilations=(2,), groups=2),
           [((1, 4, 4), F32), ((4, 3, 3), F32)],
           lambda x, w: _conv_t_ref(x, w, None, 3, (0, 2), 2, 2), rtol=1e-4, atol=1e-5, const_inputs=(1,)),
    OpCase("conv_transpose2d_s2_pad_outpad",
           lambda b, x: ops.conv_transpose(b, *x, strides=(2, 2), pads=(1, 1, 1, 1), output_padding=(1, 1)),
           [((1, 3, 4, 5), F32), ((3, 2, 3, 3), F32), ((2,), F32)],
           lambda x, w, bb: _conv_t_ref(x, w, bb, 2, (1, 1, 1, 1), output_padding=1), rtol=1e-4, atol=1e-5),
    OpCase("conv_transpose2d_const_w_groups_dilation_asym",
           lambda b, x: ops.conv_transpose(b, *x, strides=(2, 1), pads=(1, 0, 0, 2), dilations=(1, 2), groups=2,
                                           output_padding=(1, 0)),
           [((2, 4, 3, 4), F32), ((4, 3, 2, 3), F32), ((6,), F32)],
           lambda x, w, bb: _conv_t_ref(x, w, bb, (2, 1), (1, 0, 0, 2), (1, 2), 2, (1, 0)),
           rtol=1e-4, atol=1e-5, const_inputs=(1,)),
    OpCase("conv_transpose2d_runtime_w_groups_dilation",
           lambda b, x: ops.conv_transpose(b, *x, strides=(1, 2), pads=(0, 1, 2, 0), dilations=(2, 1), groups=2),
           [((1, 4, 3, 3), F32), ((4, 1, 3, 2), F32)],
           lambda x, w: _conv_t_ref(x, w, None, (1, 2), (0, 1, 2, 0), (2, 1), 2), rtol=1e-4, atol=1e-5),
    OpCase("conv_transpose2d_stride1",
           lambda b, x: ops.conv_transpose(b, *x),
           [((1, 2, 4, 4), F32), ((2, 3, 3, 3), F32)],
           lambda x, w: _conv_t_ref(x, w), rtol=1e-4, atol=1e-5, const_inputs=(1,)),
    OpCase("conv_transpose2d_pads_beyond_kernel",
           lambda b, x: ops.conv_transpose(b, *x, strides=(3, 3), pads=(2, 3, 2, 1)),
           [((1, 2, 3, 3), F32), ((2, 2, 2, 2), F32)],
           lambda x, w: _conv_t_ref(x, w, None, 3, (2, 3, 2, 1)), rtol=1e-4, atol=1e-5),
    OpCase("conv_transpose2d_k4s2p1_const_w_bias",
           lambda b, x: ops.conv_transpose(b, *x, strides=(2, 2), pads=(1, 1, 1, 1)),
           [((1, 4, 3, 3), F32), ((4, 3, 4, 4), F32), ((3,), F32)],
           lambda x, w, bb: _conv_t_ref(x, w, bb, 2, (1, 1, 1, 1)), rtol=1e-4, atol=1e-5, const_inputs=(1,)),
    OpCase("conv_transpose2d_k2s2_uncropped_groups_bias",
           lambda b, x: ops.conv_transpose(b, *x, strides=(2, 2), groups=2),
           [((1, 4, 3, 2), F32), ((4, 2, 2, 2), F32), ((4,), F32)],
           lambda x, w, bb: _conv_t_ref(x, w, bb, 2, groups=2), rtol=1e-4, atol=1e-5),
    OpCase("conv_transpose1d_const_w_groups_asym_outpad",
           lambda b, x: ops.conv_transpose(b, *x, strides=(2,), pads=(0, 1), groups=2, output_padding=(1,)),
           [((2, 4, 5), F32), ((4, 3, 3), F32), ((6,), F32)],
           lambda x, w, bb: _conv_t_ref(x, w, bb, 2, (0, 1), 1, 2, 1), rtol=1e-4, atol=1e-5, const_inputs=(1, 2)),
    OpCase("conv_transpose3d_s2",
           lambda b, x: ops.conv_transpose(b, *x, strides=(2, 2, 2), pads=(1, 0, 1, 1, 0, 1)),
           [((1, 2, 2, 3, 2), F32), ((2, 2, 2, 2, 3), F32)],
           lambda x, w: _conv_t_ref(x, w, None, 2, (1, 0, 1, 1, 0, 1)), rtol=1e-4, atol=1e-5),
    # group / instance norm
    OpCase("group_norm", lambda b, x: ops.group_norm(b, *x, num_groups=3),
           [((2, 6, 3, 4), F32), ((6,), F32), ((6,), F32)], lambda x, g, bb: _group_norm(x, g, bb, 3),
           rtol=1e-4, atol=1e-5),
    OpCase("group_norm_1d_const_params", lambda b, x: ops.group_norm(b, *x, num_groups=2, eps=1e-3),
           [((2, 4, 5), F32), ((4,), F32), ((4,), F32)], lambda x, g, bb: _group_norm(x, g, bb, 2, 1e-3),
           rtol=1e-4, atol=1e-5, const_inputs=(1, 2)),
    OpCase("group_norm_rank2", lambda b, x: ops.group_norm(b, *x, num_groups=2),
           [((3, 8), F32), ((8,), F32), ((8,), F32)], lambda x, g, bb: _group_norm(x, g, bb, 2),
           rtol=1e-4, atol=1e-5),
    OpCase("group_norm_one_group", lambda b, x: ops.group_norm(b, *x, num_groups=1),
           [((2, 3, 5), F32), ((3,), F32), ((3,), F32)], lambda x, g, bb: _group_norm(x, g, bb, 1),
           rtol=1e-4, atol=1e-5),
    OpCase("instance_norm", lambda b, x: ops.instance_norm(b, *x),
           [((2, 3, 4, 5), F32), ((3,), F32), ((3,), F32)],
           lambda x, g, bb: _n(F.instance_norm(_t(x), weight=_t(g), bias=_t(bb), eps=1e-5)), rtol=1e-4, atol=1e-5),
    OpCase("instance_norm_1d", lambda b, x: ops.instance_norm(b, *x, eps=1e-3),
           [((2, 3, 7), F32), ((3,), F32), ((3,), F32)],
           lambda x, g, bb: _n(F.instance_norm(_t(x), weight=_t(g), bias=_t(bb), eps=1e-3)), rtol=1e-4, atol=1e-5),
]


def _check(case: OpCase, got: dict, graph, rtol: float, atol: float) -> None:
    want = case_reference(case)
    assert len(graph.outputs) == len(want)
    for name, w in zip(graph.outputs, want):
        g = got[name]
        assert g.shape == w.shape, f"{case.name}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype or g.dtype.kind == w.dtype.kind == "f", f"{case.name}: {g.dtype} vs {w.dtype}"
        if g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=case.name)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=case.name)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_interpreter_matches(case):
    graph, feed = case_graph(case)
    _check(case, evaluate(graph, feed), graph, case.rtol, case.atol)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_compiled_c_matches(case, kernel_cache):
    """Through the pipeline's graph passes (rewrite rules) and default schedules into C."""
    graph, feed = case_graph(case)
    ex = compile_graph(graph, OptimizeConfig(threads=2, compiler=kernel_cache))
    _check(case, ex(feed), graph, max(case.rtol, 1e-4), max(case.atol, 1e-5))


@pytest.mark.parametrize("name", ["einsum_bilinear", "conv_transpose2d_s2_pad_outpad", "group_norm", "triu_kneg",
                                  "mod_int64", "unary_mish_float32"])
def test_ops_are_index_notation(name):
    """No data-dependent fallback: every node is index notation or a free reshape."""
    graph, _ = case_graph(next(c for c in CASES if c.name == name))
    assert graph.nodes
    assert all(not n.is_extern or n.op.kind == "reshape" for n in graph.nodes), [n.op for n in graph.nodes]


@pytest.mark.parametrize("const_w", [False, True])
def test_strided_conv_transpose_multiplies_no_input_zeros(const_w):
    """Stride 2, kernel 4, no dilation: the contraction runs over N*C_out*(Q*s)^2 outputs times C_in*(k/s)^2 taps,
    a quarter of what convolving the zero-spread input would cost."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 5, 5))
    w = b.constant(np.ones((3, 2, 4, 4), np.float32)) if const_w else b.input("w", (3, 2, 4, 4))
    b.build([ops.conv_transpose(b, x, w, strides=(2, 2), pads=(1, 1, 1, 1))])
    computes = [n.op for n in b.nodes if not n.is_extern]
    (contraction,) = [c for c in computes if any(st.reduce == "+=" for st in c.statements)]
    (st,) = [st for st in contraction.statements if st.reduce == "+="]
    assert int(np.prod([e for _, e in st.extents])) == 1 * 2 * (6 * 2) ** 2 * 3 * 2 * 2


def test_einsum_is_one_contraction_statement():
    b = GraphBuilder()
    x, y = b.input("x", (2, 3, 4)), b.input("y", (2, 4, 5))
    b.build([ops.einsum(b, "bij,bjk->bik", x, y)])
    (node,) = b.nodes
    (st,) = node.op.statements
    assert st.reduce == "+=" and len(st.reduce_dims) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_and_inf_tests_inside_expressions_compile(dtype, kernel_cache):
    """isnan/isinf of computed values and literals, used as conditions, in both float widths."""
    src = ("O[i] = where(isnan(X[i]), 0.0, where(isinf(X[i]), 1.0, X[i]))\n"
           "P[i] = isnan(X[i] * 0.0)\nQ[i] = isinf(X[i] + inf) == isnan(nan)")
    c = compile_op(src, {"X": TensorType((13,), np.dtype(dtype).name)})
    x = _specials(np.random.default_rng(1), (13,), dtype)
    with np.errstate(invalid="ignore"):
        want = [np.where(np.isnan(x), 0, np.where(np.isinf(x), 1, x)), np.isnan(x * 0), np.isinf(x + np.inf)]
    assert want[2].any() and not want[2].all()
    for got in (evaluate_compute(c, [x], dtype), build_kernel(c, default_schedule(c), kernel_cache, threads=2)(x)):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w.astype(g.dtype))


def test_new_functions_parse_and_type():
    c = compile_op("O[i] = isnan(X[i])\nP[i] = isinf(X[i])\nQ[i] = atanh(X[i])", {"X": (4,)})
    assert [c.type_of[o].dtype for o in c.outputs] == ["bool", "bool", "float32"]
    c = compile_op("O[i] = bitxor(shl(X[i], Y[i]), bitnot(fmod(X[i], Y[i])))",
                   {"X": TensorType((4,), "int64"), "Y": TensorType((4,), "int64")})
    assert c.type_of["O"].dtype == "int64"
    assert str(c.statements[0].expr) == "bitxor(shl(X[i], Y[i]), bitnot(fmod(X[i], Y[i])))"


@pytest.mark.parametrize("build, match", [
    (lambda b, f, i: ops.einsum(b, "ij,jk->ik", b.input("p", (2, 3)), b.input("q", (4, 5))), "extent 3 and 4"),
    (lambda b, f, i: ops.einsum(b, "ij->i", f, f), "2 were given"),
    (lambda b, f, i: ops.einsum(b, "ijk->i", f), "does not fit an operand of rank 2"),
    (lambda b, f, i: ops.einsum(b, "ij->iz", f), "in no operand"),
    (lambda b, f, i: ops.einsum(b, "i1->i", f), "only letters"),
    (lambda b, f, i: ops.einsum(b, "...ij->ij", b.input("r", (2, 3, 4))), "needs '...' in its output"),
    (lambda b, f, i: ops.mod(b, f, i), "differ in type"),
    (lambda b, f, i: ops.bitwise(b, "and", f, f), "needs int32 or int64 or bool"),
    (lambda b, f, i: ops.bitwise(b, "nand", i, i), "op must be one of"),
    (lambda b, f, i: ops.bit_shift(b, i, i, "up"), "direction must be"),
    (lambda b, f, i: ops.trilu(b, b.input("v", (4,))), "rank >= 2"),
    (lambda b, f, i: ops.unary(b, "tanhh", f), "unknown unary function 'tanhh'"),
    (lambda b, f, i: ops.selu(b, i), "needs a float tensor"),
    (lambda b, f, i: ops.shrink(b, i, lambd=0.5), "integer bias and lambd"),
    (lambda b, f, i: ops.conv_transpose(b, b.input("x4", (1, 3, 4, 4)), b.input("w4", (4, 2, 3, 3))),
     "do not fit 1 group"),
    (lambda b, f, i: ops.conv_transpose(b, b.input("x5", (1, 2, 4)), b.input("w5", (2, 2, 3)), pads=(4, 4)),
     "output size"),
    (lambda b, f, i: ops.group_norm(b, b.input("g", (1, 6, 2)), b.input("gs", (6,)), b.input("gb", (6,)), 4),
     "do not split into 4 groups"),
])
def test_bad_input_is_refused_with_the_cause(build, match):
    b = GraphBuilder()
    f, i = b.input("f", (2, 3)), b.input("i", (2, 3), "int64")
    with pytest.raises(ValueError, match=match):
        build(b, f, i)
