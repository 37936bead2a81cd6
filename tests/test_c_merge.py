"""Kernels that differ only in constants compile as one body, and each member still computes its own result."""

import ctypes

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.phases import PhaseTimer
from superopt.runtime.c_merge import merge_sources
from superopt.runtime.compiler import CompilerConfig, compile_library, load_library
from superopt.runtime.kernel import build_library
from superopt.schedule.default import default_schedule
from superopt.schedule.plan import lower
from superopt.target import host_target

# rows of x summed in blocks: y[r, t] = sum_k x[stride*r + tile*k + t]
ROW_SUMS = """void NAME(void **args) {
    const float *restrict x = (const float *)args[0];
    float *restrict y = (float *)args[1];
    for (int r = 0; r < ROWS; ++r) {
        float acc[TILE];
        #pragma GCC unroll TILE
        for (int t = 0; t < TILE; ++t) acc[t] = 0.0f;
        for (int k = 0; k < DEPTH; ++k) {
            #pragma GCC unroll TILE
            for (int t = 0; t < USED; ++t) acc[t] += x[STRIDE*r + TILE*k + t] * SO_MAX(1.0f, SCALE);
        }
        #pragma GCC unroll TILE
        for (int t = 0; t < TILE; ++t) y[TILE*r + t] = acc[t] + (float)(r % MOD);
    }
}
"""
BASE = {"ROWS": 5, "TILE": 4, "DEPTH": 6, "USED": 4, "STRIDE": 24, "MOD": 1000, "SCALE": 1}


def _row_sums(name: str, **change: int) -> str:
    text = ROW_SUMS.replace("NAME", name)
    for key, value in {**BASE, **change}.items():
        text = text.replace(key, str(value))
    return text


def _expected(x: np.ndarray, rows: int, depth: int, stride: int, tile: int = 4, mod: int = 1000) -> np.ndarray:
    return np.array([[sum(x[stride * r + tile * k + t] for k in range(depth)) + r % mod for t in range(tile)]
                     for r in range(rows)], np.float32)


def test_trip_counts_and_strides_are_lifted_and_each_member_computes_its_own(tmp_path):
    """Three kernels that differ in an outer trip count, a reduction's trip count and an address stride:
    one merged body that reads exactly those three; each member, called by its own name, sums its own
    rows. The library counts three sources compiled: the wrappers, not the body."""
    shapes = [(5, 6, 24), (7, 6, 30), (3, 9, 36)]  # (rows, depth, stride)
    sources = [_row_sums(f"rows{i}", ROWS=r, DEPTH=d, STRIDE=s) for i, (r, d, s) in enumerate(shapes)]
    bodies, wrapped = merge_sources(sources)
    assert len(bodies) == 1 and bodies[0].count("so_lifted[") == 3
    assert all("static const long long lifted[]" in w for w in wrapped)
    assert "{5, 6, 24}" in wrapped[0] and "{3, 9, 36}" in wrapped[2]
    phases = PhaseTimer()
    lib = load_library(compile_library(sources, CompilerConfig(cache_dir=tmp_path, merge_min_chars=0),
                                       phases=phases))
    assert phases.counts["sources_compiled"] == 3
    x = np.random.default_rng(0).standard_normal(400).astype(np.float32)
    for i, (rows, depth, stride) in enumerate(shapes):
        y = np.zeros((rows, 4), np.float32)
        getattr(lib, f"rows{i}")((ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data))
        np.testing.assert_allclose(y, _expected(x, rows, depth, stride), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", [
    {"TILE": 8},  # a register tile's size: the declaration, the unroll pragmas
    {"USED": 3},  # the bound of a loop whose variable indexes a local array (a register)
    {"MOD": 7},  # a divisor: by a constant, a multiply
    {"SCALE": 2},  # a call's direct argument (an intrinsic's immediate)
])
def test_constants_that_decide_registers_or_instructions_keep_kernels_apart(change):
    sources = [_row_sums("a"), _row_sums("b", **change)]
    assert merge_sources(sources) == ([], sources)


def test_sources_that_are_not_one_kernel_function_are_left_as_they_are():
    pack = "void p(const void *src, void *dst) { (void)src; (void)dst; }\n"
    sources = [_row_sums("a") + pack, _row_sums("b", ROWS=9) + pack, "void f(void) {}", "void f(void) {}"]
    assert merge_sources(sources) == ([], sources)
    # (one kernel given twice is one kernel, not a group; beside another, both copies get its wrapper)
    twice = [_row_sums("a"), _row_sums("a")]
    assert merge_sources(twice) == ([], twice)
    bodies, wrapped = merge_sources(twice + [_row_sums("b", ROWS=9)])
    assert len(bodies) == 1 and wrapped[0] == wrapped[1] and "{5}" in wrapped[0] and "{9}" in wrapped[2]


def test_short_kernels_stay_apart_below_the_configured_length():
    sources = [_row_sums("a"), _row_sums("b", ROWS=9)]
    assert merge_sources(sources, min_chars=len(sources[0]) + 1) == ([], sources)
    assert len(merge_sources(sources, min_chars=len(sources[0]) - 1)[0]) == 1


def test_convolutions_over_different_channel_counts_share_one_body_and_match_the_reference(tmp_path):
    """The printer's own kernels: a 3x3 convolution over 6, 8 and 10 blocks of 16 input channels prints
    three kernels that merge, and each matches the float64 reference."""
    target = host_target(2)
    computes = [compile_op("C[n,o,y,x,p] += A[n,i,y+a,x+b,q] * W[o,i,a,b,q,p]",
                           {"A": (1, k, 12, 12, 16), "W": (2, k, 3, 3, 16, 16)}) for k in (6, 8, 10)]
    items = [(c, default_schedule(c)) for c in computes]
    printed = [emit_c(lower(c, tr, target), f"k{i}").code for i, (c, tr) in enumerate(items)]
    bodies, _ = merge_sources(printed)
    assert len(bodies) == 1, "the three convolutions no longer print as one shape"
    lib, kernels = build_library(items, CompilerConfig(cache_dir=tmp_path, merge_min_chars=0), 2, target)
    assert any(hasattr(lib, name) for name in [bodies[0][5:bodies[0].index("(")]])
    rng = np.random.default_rng(3)
    for c, kernel in zip(computes, kernels):
        args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
        for got, want in zip(kernel(*args), evaluate_compute(c, args, np.float64)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
