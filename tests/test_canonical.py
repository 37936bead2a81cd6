"""Rename-invariant workloads: ops that differ only in names share a canonical form and a key."""

from __future__ import annotations

import numpy as np
import pytest

from superopt.api import rewrite_graph
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.interp.reference import evaluate_compute
from superopt.ir.canonical import (
    canonical_constants,
    canonical_form,
    canonicalize,
    canonicalize_kernels,
    workload_key,
)
from superopt.lang import compile_op

MM_A = "C[i,j] += A[i,k] * B[k,j]"
MM_B = "Out[row,col] += Lhs[row,red] * Rhs[red,col]"
# two statements with a temporary, a reduction, padding and an index value, in two namings
SOFT_A = ("M[n] max= X[n,c]\nE[n,c] = exp(X[n,c] - M[n])\nS[n] += E[n,c]\nY[n,c] = E[n,c] / S[n] + (c) * 0.0")
SOFT_B = ("mx[b] max= inp[b,q]\nex[b,q] = exp(inp[b,q] - mx[b])\nsm[b] += ex[b,q]\n"
          "res[b,q] = ex[b,q] / sm[b] + (q) * 0.0")
CONV_A = "Y[n,o,y,x] += X[n,i,y+kh-1,x+kw-1] * W[o,i,kh,kw]"
CONV_B = "out[b,f,r,s] += img[b,ch,r+u-1,s+v-1] * flt[f,ch,u,v]"


def test_renamed_ops_are_equal_after_canonicalization():
    a = compile_op(MM_A, {"A": (8, 16), "B": (16, 4)})
    b = compile_op(MM_B, {"Lhs": (8, 16), "Rhs": (16, 4)})
    assert a.digest() != b.digest()
    assert canonicalize(a) == canonicalize(b)
    assert canonicalize(a).digest() == canonicalize(b).digest()
    assert canonicalize(a).inputs == ("in0", "in1") and canonicalize(a).outputs == ("out0",)
    assert canonicalize(canonicalize(a)) == canonicalize(a)  # idempotent
    sa = compile_op(SOFT_A, {"X": (4, 6)})
    sb = compile_op(SOFT_B, {"inp": (4, 6)})
    ca, cb = canonicalize(sa), canonicalize(sb)
    assert ca == cb and ca.temporaries == ("t0", "t1", "t2")
    pa = compile_op(CONV_A, {"X": (1, 3, 5, 5), "W": (2, 3, 3, 3)}, padding={"X": 0.0}, extents={"y": 5, "x": 5})
    pb = compile_op(CONV_B, {"img": (1, 3, 5, 5), "flt": (2, 3, 3, 3)}, padding={"img": 0.0},
                    extents={"r": 5, "s": 5})
    assert canonicalize(pa) == canonicalize(pb)
    assert canonicalize(pa).statements[0].padding == (("in0", 0.0),)


@pytest.mark.parametrize("src,shapes,kw", [
    (MM_A, {"A": (8, 16), "B": (16, 4)}, {}),
    (SOFT_A, {"X": (4, 6)}, {}),
    (CONV_A, {"X": (1, 3, 5, 5), "W": (2, 3, 3, 3)}, {"padding": {"X": 0.0}, "extents": {"y": 5, "x": 5}}),
])
def test_canonical_op_computes_the_same(src, shapes, kw):
    c = compile_op(src, shapes, **kw)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(c.type_of[n].shape) for n in c.inputs]
    want = evaluate_compute(c, args, dtype=np.float64)
    got = evaluate_compute(canonicalize(c), args, dtype=np.float64)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w, g)


def test_workload_key_rename_invariant_and_sensitive_to_shape_and_constness():
    a = compile_op(MM_A, {"A": (8, 16), "B": (16, 4)})
    b = compile_op(MM_B, {"Lhs": (8, 16), "Rhs": (16, 4)})
    assert workload_key(a, frozenset({"B"})) == workload_key(b, frozenset({"Rhs"}))
    assert workload_key(a) == workload_key(b)
    # constness matters (a constant weight is packed once), and which input is constant
    assert workload_key(a, frozenset({"B"})) != workload_key(a)
    assert workload_key(a, frozenset({"B"})) != workload_key(a, frozenset({"A"}))
    # the shape matters
    other = compile_op(MM_B, {"Lhs": (8, 16), "Rhs": (16, 8)})
    assert workload_key(other) != workload_key(b)
    # the canonical compute gives the same key as the original (constants in canonical names)
    assert workload_key(canonicalize(a), canonical_constants(a, {"B"})) == workload_key(a, {"B"})
    with pytest.raises(ValueError, match="not inputs"):
        workload_key(a, {"Z"})


def test_input_order_is_kept():
    a = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (8, 16), "B": (16, 4)})
    b = compile_op("C[i,j] += A[i,k] * B[k,j]", {"B": (16, 4), "A": (8, 16)})  # inputs declared B, A
    assert a.inputs == ("A", "B")
    form = canonical_form(a)
    assert form.rename == {"A": "in0", "B": "in1", "C": "out0"}
    assert canonicalize(b).type_of["in0"].shape == b.type_of[b.inputs[0]].shape


def _graph():
    rng = np.random.default_rng(1)
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 6, 6))
    w = b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    y = b.compute1(CONV_A, {"X": x, "W": w}, "conv", padding={"X": 0.0}, extents={"y": 6, "x": 6})
    r = b.compute1("R[n,o,y,x] = max(Y[n,o,y,x], 0.0)", {"Y": y}, "relu")
    flat = b.extern("reshape", [r], shape=(2, 144))[0]
    s = b.compute1(SOFT_B, {"inp": flat}, "softmax")
    return b.build([s])


def test_canonicalized_graph_evaluates_identically():
    g = _graph()
    cg = canonicalize_kernels(g)
    assert cg.inputs == g.inputs and cg.outputs == g.outputs
    assert [n.name for n in cg.nodes] == [n.name for n in g.nodes]
    assert all(n.op.inputs[0] == "in0" for n in cg.nodes if not n.is_extern)
    x = np.random.default_rng(2).standard_normal((2, 3, 6, 6)).astype(np.float32)
    want, got = evaluate(g, [x], np.float64), evaluate(cg, [x], np.float64)
    np.testing.assert_array_equal(want[g.outputs[0]], got[g.outputs[0]])
    # after the rewrite passes too (fused kernels with more inputs)
    rg = rewrite_graph(g)[0]
    np.testing.assert_allclose(evaluate(canonicalize_kernels(rg), [x], np.float64)[g.outputs[0]],
                               want[g.outputs[0]], rtol=1e-12, atol=1e-12)
