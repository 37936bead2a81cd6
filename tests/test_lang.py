"""The op language: parsing, inference, errors, round trips, and the capsule votes op."""

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.lang import OpLangError, compile_op, parse_compute

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"


def naive_capsule(P, W):
    n_, h, w_, i_, p_, r_ = P.shape
    kh_, kw_, _, o_, _, q_ = W.shape
    ho, wo = (h - kh_) // 2 + 1, (w_ - kw_) // 2 + 1
    V = np.zeros((n_, ho, wo, o_, p_, q_))
    for y in range(ho):
        for x in range(wo):
            for kh in range(kh_):
                for kw in range(kw_):
                    patch = P[:, 2 * y + kh, 2 * x + kw]  # [n, i, p, r]
                    # loops over i, o as matrix products of the 4x4 pose matrices
                    for i in range(i_):
                        for o in range(o_):
                            V[:, y, x, o] += patch[:, i] @ W[kh, kw, i, o]
    return V


def test_capsule_votes_matches_naive_loops():
    rng = np.random.default_rng(0)
    P = rng.standard_normal((2, 7, 7, 3, 4, 4))
    W = rng.standard_normal((3, 3, 3, 5, 4, 4))
    c = compile_op(CAPSULE, {"P": P.shape, "W": W.shape})
    assert c.type_of["V"].shape == (2, 3, 3, 5, 4, 4)
    (V,) = evaluate_compute(c, [P, W], np.float64)
    np.testing.assert_allclose(V, naive_capsule(P, W), rtol=1e-10, atol=1e-10)


def test_capsule_full_size_shapes_inferred():
    c = compile_op(CAPSULE, {"P": (8, 15, 15, 32, 4, 4), "W": (3, 3, 32, 32, 4, 4)})
    st = c.statements[0]
    assert c.type_of["V"].shape == (8, 7, 7, 32, 4, 4)
    assert st.reduce_dims == ("kh", "kw", "i", "r")


def test_softmax_and_layernorm_as_statement_sequences():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((5, 9)).astype(np.float32)
    sm = compile_op("""
        m[i] max= X[i,j]
        e[i,j] = exp(X[i,j] - m[i])
        s[i] += e[i,j]
        Y[i,j] = e[i,j] / s[i]
    """, {"X": X.shape})
    (Y,) = evaluate_compute(sm, [X])
    ref = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(Y, ref / ref.sum(1, keepdims=True), rtol=1e-6)
    ln = compile_op("""
        mu[i] += X[i,j] / 9
        d[i,j] = X[i,j] - mu[i]
        var[i] += d[i,j] * d[i,j] / 9
        Y[i,j] = d[i,j] * rsqrt(var[i] + 1e-5)
    """, {"X": X.shape})
    (Y,) = evaluate_compute(ln, [X], np.float64)
    ref = (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(Y, ref, rtol=1e-6, atol=1e-6)
    assert sm.outputs == ("Y",) and sm.temporaries == ("m", "e", "s")


def test_padding_where_comparisons_and_functions():
    X = np.arange(6, dtype=np.float32)
    c = compile_op("Y[i] = where(i >= 1, max(X[i-1], X[i]), -1) + abs(neg(X[i]))", {"X": (6,)}, padding={"X": 0.0})
    (Y,) = evaluate_compute(c, [X])
    ref = np.where(np.arange(6) >= 1, np.maximum(np.concatenate([[0], X[:-1]]), X), -1) + X
    np.testing.assert_allclose(Y, ref)
    mp = compile_op("O[y] max= X[2*y+k-1]", {"X": (6,)}, padding={"X": float("-inf")}, extents={"y": 3, "k": 3})
    (O,) = evaluate_compute(mp, [X])
    np.testing.assert_allclose(O, [1, 3, 5])


@pytest.mark.parametrize("src", [
    CAPSULE,
    "m[i] max= X[i,j]\ne[i,j] = exp(X[i,j] - m[i])\ns[i] += e[i,j]\nY[i,j] = e[i,j] / s[i]",
    "Y[i,j] = where(i < j, X[i,j], 0.5 * sigmoid(X[j,i])) + cast_float32(cast_int64(X[i,j]))",
])
def test_canonical_text_round_trips(src):
    shapes = {"P": (2, 7, 7, 3, 4, 4), "W": (3, 3, 3, 5, 4, 4)} if "P[" in src else {"X": (4, 4)}
    c = compile_op(src, shapes)
    again = parse_compute(c.text())
    assert again == c
    assert again.digest() == c.digest()


def test_strided_window_extent_is_inferred():
    c = compile_op("Y[i] = X[i+1]", {"X": (4,)})
    assert c.type_of["Y"].shape == (3,)


@pytest.mark.parametrize("src, shapes, message, column", [
    ("Y[i] = X[i] + X[i+1]", {"X": (4,)}, "out-of-range access X[i+1]", 15),
    ("Y[i] = X[i] +* 2", {"X": (4,)}, "expected a value", 14),
    ("Y[i] = X[i*i]", {"X": (4,)}, "must be affine", 10),
    ("Y[i] = Z[i]", {"X": (4,)}, "unknown tensor 'Z'", 8),
    ("Y[i] = foo(X[i])", {"X": (4,)}, "unknown function 'foo'", 8),
    ("Y[i] = X[i] + q", {"X": (4,)}, "unknown name 'q'", 15),
    ("Y[i] = X[i,j] * X[j,i]", {"X": (4, 5)}, "has extent 5 elsewhere but 4", 17),
    ("Y[i] = X[i,j]", {"X": (4, 5)}, "'=' cannot reduce", 1),
    ("Y[i] += X[i] * W[i]", {"X": (4,), "W": (5,)}, "dimension 'i' has extent 4", 16),
])
def test_errors_point_at_the_offending_token(src, shapes, message, column):
    with pytest.raises(OpLangError) as info:
        compile_op(src, shapes)
    text = str(info.value)
    assert message in text
    assert f"column {column})" in text
    caret_line = text.splitlines()[-1]
    assert caret_line.index("^") - 2 == column - 1


def test_a_repeated_compile_is_parsed_once_and_an_error_is_raised_every_time():
    """The rewrite rules build the same ops again and again: an equal call returns the same (immutable) Compute
    without parsing it again; a call that fails fails each time, naming the cause."""
    from superopt.lang import parser

    src = "C[i,j] += A[i,k] * B[k,j]"
    first = compile_op(src, {"A": (3, 4), "B": [4, 5]})
    hits = parser._compile_op.cache_info().hits
    again = compile_op(src, {"A": (3, 4), "B": (4, 5)})
    assert again is first and parser._compile_op.cache_info().hits == hits + 1
    assert compile_op(src, {"A": (3, 4), "B": (4, 6)}).type_of["C"].shape == (3, 6)  # (another shape: another op)
    for _ in range(2):
        with pytest.raises(OpLangError, match="unknown tensor 'B'"):
            compile_op(src, {"A": (3, 4)})
