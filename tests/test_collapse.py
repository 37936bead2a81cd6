"""Nested reduction loops that every access walks as one loop are printed as one (superopt.loopnest.collapse): where a
pack brings a contraction's reduction dims together, the register tile's reduction is one loop; the program's values
are those of the nested loops, bit for bit, and match the reference; a chain that does not collapse whole, or loops
an access walks in another order, stay as they are."""

import re
from dataclasses import replace

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c, print_c
from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.loopnest import Loop, build_loopnest, walk
from superopt.loopnest.collapse import collapse_reductions
from superopt.runtime.kernel import build_library, kernel_name
from superopt.schedule.default import default_schedule
from superopt.schedule.plan import lower
from superopt.schedule.primitives import CacheWrite, Reorder, Split, Unroll, Vectorize
from superopt.target import host_target

TARGET = host_target(2)


def _reduction_loops(nest) -> list[tuple[str, int]]:
    return sorted({(v.node.var, v.node.extent) for v in walk(nest)
                   if isinstance(v.node, Loop) and v.node.reduce and v.node.kind == "serial"})


@pytest.mark.parametrize("text, shapes, collapsed", [
    # A packed to (l, m, i, j): l and m run together in the pack and in B as read
    ("C[k,i,j] += A[l,j,m,i] * B[k,l,m]", {"A": (5, 7, 6, 45), "B": (30, 5, 6)}, [("l_m", 30)]),
    # B packed to (m, k, l, j): the three reduction dims run together in it and in A as read
    ("C[i,j] += A[i,m,k,l] * B[m,j,k,l]", {"A": (40, 6, 4, 5), "B": (6, 50, 4, 5)}, [("m_k_l", 120)]),
])
def test_the_default_reads_packed_reduction_dims_in_one_loop_with_the_nested_loops_values(text, shapes, collapsed,
                                                                                         kernel_cache):
    c = compile_op(text, shapes)
    trace = tuple(default_schedule(c, TARGET, frozenset()))
    nest = build_loopnest(lower(c, trace, TARGET))
    assert len(_reduction_loops(nest)) > 1
    assert _reduction_loops(collapse_reductions(nest)) == collapsed
    name = kernel_name(c, trace, 0)
    one = emit_c(lower(c, trace, TARGET), name)
    nested = replace(one, code=print_c(nest, name))
    assert f"for (int {collapsed[0][0]} = 0; {collapsed[0][0]} < {collapsed[0][1]};" in one.code
    assert collapsed[0][0] not in nested.code
    args = [np.random.default_rng(0).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    got = {}
    for which, src in (("one", one), ("nested", nested)):
        _, (kernel,) = build_library([(c, trace)], kernel_cache, 2, TARGET, sources=[src])
        got[which] = kernel(*args)[0]
    np.testing.assert_allclose(got["one"], ref, rtol=1e-4, atol=1e-4 + 1e-5 * np.abs(ref).max())
    np.testing.assert_array_equal(got["one"], got["nested"])  # the same sums in the same order


def _tiled(text: str, shapes: dict, reduce_order: tuple[str, ...]) -> list[tuple[str, int]]:
    """The reduction loops left once collapsed, of ``text`` tiled 4 rows x 16 columns with the reduction loops in
    ``reduce_order`` inside the tile's accumulator."""
    c = compile_op(text, shapes)
    trace = (Split("C", "j", 16), Split("C", "i", 4), Reorder("C", ("i_o", "j_o", *reduce_order, "i_i", "j_i")),
             CacheWrite("C", reduce_order[0]), Unroll("C", "i_i"), Vectorize("C", "j_i"))
    return _reduction_loops(collapse_reductions(build_loopnest(lower(c, trace, TARGET))))


def test_loops_collapse_only_where_every_access_walks_them_in_that_order():
    shapes = {"A": (8, 5, 6), "B": (5, 6, 32)}
    assert _tiled("C[i,j] += A[i,k,l] * B[k,l,j]", shapes, ("k", "l")) == [("k_l", 30)]
    # A walks l before k, B k before l: no one order serves both
    shapes = {"A": (8, 6, 5), "B": (5, 6, 32)}
    assert _tiled("C[i,j] += A[i,l,k] * B[k,l,j]", shapes, ("k", "l")) == [("k", 5), ("l", 6)]


def test_a_chain_that_does_not_collapse_whole_stays_nested():
    # k and l run together in both tensors, m does not (B's m is innermost): the loops stay three, not m and k_l
    shapes = {"A": (8, 3, 5, 6), "B": (5, 6, 32, 3)}
    got = _tiled("C[i,j] += A[i,m,k,l] * B[k,l,j,m]", shapes, ("m", "k", "l"))
    assert got == [("k", 5), ("l", 6), ("m", 3)]



def test_every_peeled_copy_of_a_chain_collapses_under_a_name_of_its_own(kernel_cache):
    # 10 rows in tiles of 4 and 40 columns in tiles of 16: the full tiles and the tails each hold the chain k, l
    c = compile_op("C[i,j] += A[i,k,l] * B[k,l,j]", {"A": (10, 5, 6), "B": (5, 6, 40)})
    trace = (Split("C", "j", 16), Split("C", "i", 4), Reorder("C", ("i_o", "j_o", "k", "l", "i_i", "j_i")),
             CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i"))
    plan, name = lower(c, trace, TARGET), kernel_name(c, trace, 0)
    nested, one = print_c(build_loopnest(plan), name), emit_c(plan, name)
    copies = nested.count("for (int k = 0; k < 5; ++k)")
    assert copies == 4 and "for (int k = 0;" not in one.code
    names = re.findall(r"for \(int (k_l\w*) = 0; \1 < 30;", one.code)
    assert len(names) == copies and len(set(names)) == copies
    args = [np.random.default_rng(1).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    _, (kernel,) = build_library([(c, trace)], kernel_cache, 2, TARGET, sources=[one])
    np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4 + 1e-5 * np.abs(ref).max())
