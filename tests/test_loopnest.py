"""The loop-nest IR: tree structure of lowered kernels, strides of accesses, the walk API, the one
linear-expression class, and lower() raising only ScheduleError for any trace."""

import random
import re
from collections import Counter
from dataclasses import replace

import pytest

from superopt.codegen.c_emit import c_linear, emit_c
from superopt.ir.expr import Affine, DivMod
from superopt.lang import compile_op
from superopt.loopnest import (
    Accumulate,
    Alloc,
    CombineLanes,
    Epilogue,
    Fill,
    Guard,
    Loop,
    PeeledLoop,
    RegisterRef,
    RestoreNan,
    Scope,
    SplitIndex,
    StageNest,
    WriteBack,
    accesses,
    allocations,
    build_loopnest,
    outline,
    statement_ops,
    walk,
)
from superopt.loopnest.values import loads
from superopt.schedule.default import default_schedule
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import (
    CacheWrite,
    ComputeAt,
    Fuse,
    Inline,
    Pack,
    Parallel,
    Reorder,
    Split,
    Unroll,
    Vectorize,
)
from superopt.schedule.primitives import (
    Epilogue as EpiloguePrim,
)
from superopt.target import avx512_target, host_target
from superopt.testing.op_table import CASES, case_graph

MATMUL = "C[i,j] += A[i,k] * B[k,j]"
TILED = [Split("C", "i", 4), Split("C", "j", 32), Reorder("C", ("i_o", "j_o", "k", "i_i", "j_i")),
         CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i"), Parallel("C", "i_o"), Pack("B", (0, 1), 1, 32)]
SOFTMAX = "m[i] max= X[i,j]\ne[i,j] = exp(X[i,j] - m[i])\ns[i] += e[i,j]\nY[i,j] = e[i,j] / s[i]"


def tiled_matmul():
    c = compile_op(MATMUL, {"A": (64, 48), "B": (48, 64)})
    return build_loopnest(lower(c, TILED, avx512_target(2)))


def test_tiled_matmul_tree():
    nest = tiled_matmul()
    assert [p.name for p in nest.params] == ["A", "B", "C"] and nest.workspace == ()
    (stage,) = nest.body
    assert isinstance(stage, StageNest) and stage.stage == "C"
    (i_o,) = stage.body
    assert (i_o.var, i_o.extent, i_o.kind) == ("i_o", 16, "parallel")
    (j_o,) = i_o.body
    (scope,) = j_o.body
    assert isinstance(scope, Scope)
    tile, fill, k, wb_i = scope.body
    assert tile == Alloc("register_tile", "acc", "float32", 128, lanes=16)  # 4 rows x 32 columns, 16-lane vectors
    assert isinstance(fill, Fill) and fill.buffer == "acc" and fill.size == 128 and fill.value.value == 0.0
    assert (k.var, k.extent, k.kind, k.reduce) == ("k", 48, "serial", True)
    (i_i,) = k.body
    (j_i,) = i_i.body
    assert (i_i.kind, j_i.kind, j_i.extent) == ("unrolled", "vectorized", 32)
    (acc,) = j_i.body
    assert isinstance(acc, Accumulate) and acc.op == "+=" and acc.target == RegisterRef("acc", Affine.of({"i_i": 32,
                                                                                                          "j_i": 1}))
    # write-back: the tile loops again, around one store of the accumulator
    assert (wb_i.var, wb_i.kind) == ("i_i", "unrolled")
    (wb,) = wb_i.body[0].body
    assert isinstance(wb, WriteBack) and wb.target.buffer == "C" and wb.source == acc.target and wb.op is None
    (pack,) = nest.packs
    assert pack.tensor == "B" and pack.loops == (("a0", 2), ("a1", 48), ("a2", 32))


def test_outline_of_tiled_matmul():
    assert outline(tiled_matmul()) == """\
stage C
  loop i_o 16 parallel
    loop j_o 2 serial
      scope
        alloc register_tile acc float32[128]
        fill acc[128] = 0.0
        loop k 48 serial reduce
          loop i_i 4 unrolled
            loop j_i 32 vectorized
              accumulate acc[32*i_i + j_i] += (* A B)
        loop i_i 4 unrolled
          loop j_i 32 vectorized
            write-back C = acc[32*i_i + j_i]
pack B -> [2, 48, 32]"""


def test_access_strides_of_tiled_matmul():
    nest = tiled_matmul()
    reads = {a.access.buffer: a for a in accesses(nest) if not a.is_write}
    assert reads["A"].strides == {"i_o": 192, "j_o": 0, "k": 1, "i_i": 48, "j_i": 0}
    # B is packed as [j/32, k, j%32]: unit stride along the vector loop, a 32-float row per k
    assert reads["B"].strides == {"i_o": 0, "j_o": 1536, "k": 32, "i_i": 0, "j_i": 1}
    assert reads["B"].access.layout is not None
    (write,) = [a for a in accesses(nest) if a.is_write]
    assert write.access.buffer == "C" and write.strides == {"i_o": 256, "j_o": 32, "i_i": 64, "j_i": 1}
    assert [lp.var for lp in write.loops] == ["i_o", "j_o", "i_i", "j_i"]  # the write-back loops, not k


def test_fused_loops_keep_unit_stride_or_report_none():
    copy = compile_op("O[i,j] = X[i,j]", {"X": (6, 10)})
    nest = build_loopnest(lower(copy, [Fuse("O", "i", "j")], avx512_target(2)))
    (read,) = [a for a in accesses(nest) if not a.is_write]
    assert read.strides == {"i_j": 1}  # 10*(f/10) + f%10 folds back into f
    transpose = compile_op("O[j,i] = X[i,j]", {"X": (6, 10)})
    nest = build_loopnest(lower(transpose, [Fuse("O", "j", "i")], avx512_target(2)))
    (read,) = [a for a in accesses(nest) if not a.is_write]
    assert read.strides == {"j_i": None}  # X[(f % 6), (f / 6)]: no constant stride


def test_walk_api_counts_ops_allocations_and_loops():
    nest = tiled_matmul()
    visits = list(walk(nest))
    assert isinstance(visits[0].node, StageNest)
    loops = [v.node for v in visits if isinstance(v.node, Loop)]
    assert [lp.var for lp in loops] == ["i_o", "j_o", "k", "i_i", "j_i", "i_i", "j_i"]
    assert [(a.kind, a.size) for a in allocations(nest)] == [("register_tile", 128)]
    ops = {type(n).__name__: (tuple(lp.var for lp in lps), c) for n, lps, c in statement_ops(nest)}
    assert ops["Accumulate"] == (("i_o", "j_o", "k", "i_i", "j_i"), Counter({"*": 1, "+": 1}))
    assert ops["WriteBack"] == (("i_o", "j_o", "i_i", "j_i"), Counter())
    assert all(v.stage == "C" for v in visits)


def test_split_sum_nan_flag_and_epilogue_nodes():
    t = host_target(2)
    lanes = t.split_sum_lanes
    c = compile_op("S[i] += X[i,j] * X[i,j]\nM[i] = S[i] / 7.0", {"X": (5, 4 * lanes)}, outputs=["M"])
    nest = build_loopnest(lower(c, default_schedule(c, t), t))
    nodes = [v.node for v in walk(nest)]
    (split,) = [n for n in nodes if isinstance(n, SplitIndex)]
    assert (split.outer, split.factor, split.inner) == ("so_o", lanes, "so_l")
    (combine,) = [n for n in nodes if isinstance(n, CombineLanes)]
    assert combine.lanes == lanes and combine.target == RegisterRef("acc")
    assert Alloc("register_tile", "acc_v", "float32", lanes) in nodes

    c = compile_op("S[i] max= X[i,j]", {"X": (5, 40)})
    nest = build_loopnest(lower(c, [Vectorize("S", "j")], t))
    nodes = [v.node for v in walk(nest)]
    assert any(isinstance(n, Alloc) and n.kind == "flag" for n in nodes)
    (acc,) = [n for n in nodes if isinstance(n, Accumulate)]
    assert acc.nan_flag == "acc_nan" and any(isinstance(n, RestoreNan) for n in nodes)
    (j,) = [n for n in nodes if isinstance(n, Loop) and n.kind == "vectorized"]
    assert j.var == "j" and [(r.op, r.var) for r in j.reductions] == [("max", "acc"), ("or", "acc_nan")]

    c = compile_op("P[i,j] += A[i,k] * B[k,j]\nO[i,j] = relu(P[i,j] + C[j])", {"A": (37, 50), "B": (50, 70),
                                                                               "C": (70,)}, outputs=["O"])
    trace = default_schedule(c, t)
    assert EpiloguePrim("O", "P") in trace
    nest = build_loopnest(lower(c, trace, t))
    nodes = [v.node for v in walk(nest)]
    (epi,) = [n for n in nodes if isinstance(n, Epilogue)]
    store = epi.body.body if isinstance(epi.body, Guard) else epi.body
    assert store.target.buffer == "O" and not any(isinstance(n, WriteBack) for n in nodes)  # P never stored
    assert any(isinstance(ld.source, RegisterRef) for ld in loads(store.value))  # relu(acc + C[j])
    assert nest.workspace == ()


def test_tails_become_loop_bounds_or_guards():
    c = compile_op(MATMUL, {"A": (10, 8), "B": (8, 12)})
    nest = build_loopnest(lower(c, [Split("C", "i", 4)], avx512_target(2)))
    (i_i,) = [v.node for v in walk(nest) if isinstance(v.node, Loop) and v.node.var == "i_i"]
    (tail,) = i_i.tail
    assert tail.limit == 10 and tail.offset == Affine.of({"i_o": 4})  # i_i < 10 - 4*i_o
    code = emit_c(nest, "k").code
    assert "SO_MIN(4, 10 - (4*i_o))" in code
    # a tail whose innermost loop has a coefficient other than 1 needs a guard
    nest = build_loopnest(lower(c, [Split("C", "i", 4), Reorder("C", ("i_i", "i_o", "j", "k"))], avx512_target(2)))
    assert any(isinstance(v.node, Guard) for v in walk(nest))


def test_attached_stages_get_local_buffers_and_prefixed_loop_variables():
    c = compile_op(SOFTMAX, {"X": (16, 40)})
    trace = default_schedule(c, avx512_target(2))
    assert any(isinstance(p, ComputeAt) for p in trace)
    nest = build_loopnest(lower(c, trace, avx512_target(2)))
    locals_ = [a for a in allocations(nest) if a.kind == "local"]
    assert {(a.name, a.size) for a in locals_} == {("m", 1), ("s", 1)}  # e is written into Y's rows (InPlace)
    inner = {v.stage: v.node.var for v in walk(nest) if isinstance(v.node, Loop) and v.node.kind == "vectorized"}
    assert inner == {"m": "m_j", "e": "e_j", "Y": "j"}  # s sums e's row in e's loop (a folded reduction)
    # e's loop (peeled: the last row of each block has no next row) also takes the next row's max (NextRow)
    e_loops = [v.node for v in walk(nest) if isinstance(v.node, Loop) and v.node.var == "e_j"]
    assert e_loops and all([(r.op, r.var) for r in lp.reductions] == [("+", "s_acc"), ("max", "m_next"),
                                                                      ("or", "m_next_nan")] for lp in e_loops)


def test_emit_c_prints_a_plan_and_its_nest_identically():
    c = compile_op(MATMUL, {"A": (64, 48), "B": (48, 64)})
    plan = lower(c, TILED, avx512_target(2))
    a, b = emit_c(plan, "k"), emit_c(build_loopnest(plan), "k")
    assert a == b and "k_pack_B" in a.code and set(a.packs) == {"B"}


def test_one_linear_expression_class_with_div_mod_atoms():
    f = "f"
    e = Affine.of({DivMod("%", f, 4): 1, DivMod("/", f, 4): 4, "a": 3}, 2)
    assert [a for a, _ in e.terms] == ["a", DivMod("%", f, 4), DivMod("/", f, 4)]  # names, then % before /
    assert e.vars() == {"a", "f"}
    assert e.simplify() == Affine.of({"a": 3, "f": 1}, 2)
    assert c_linear(e) == "3*a + f + 2"
    # f = 8*g + h: (f / 4) = 2*g + (h / 4) and (f % 4) = (h % 4)
    assert Affine.var(DivMod("/", f, 4)).substitute({f: Affine.of({"g": 8, "h": 1})}) == \
        Affine.of({"g": 2, DivMod("/", "h", 4): 1})
    with pytest.raises(ValueError, match="cannot substitute"):
        Affine.var(DivMod("/", f, 4)).substitute({f: Affine.of({"g": 3, "h": 1})})
    assert Affine.of({"kh": 1, "y": 2}, -1).bounds({"kh": 3, "y": 5}) == (-1, 9)
    assert str(Affine.of({"y": 2, "kh": 1}, -1)) == "kh+2*y-1"


# ---- only ScheduleError escapes lower(), and every legal plan builds and prints ----------------

def _computes():
    out = []
    for case in CASES[::3]:
        g, _ = case_graph(case)
        out += [n.op for n in g.nodes if not n.is_extern]
    out.append(compile_op(SOFTMAX, {"X": (6, 40)}))
    out.append(compile_op("P[i,j] += A[i,k] * B[k,j]\nO[i,j] = relu(P[i,j] + C[j]) + R[i,j]",
                          {"A": (8, 4), "B": (4, 16), "C": (16,), "R": (8, 16)}, outputs=["O"]))
    return out


def _random_primitive(rng, c, plan):
    stages = list(plan.stages.values())
    names = [s.out for s in c.statements] + list(c.inputs) + ["zz"]
    s = rng.choice(stages) if stages and rng.random() < 0.9 else None
    sname = s.name if s else rng.choice(names)
    loops = [lp.name for lp in s.loops] if s else []

    def loop():
        return rng.choice(loops + ["q"]) if loops and rng.random() < 0.95 else rng.choice(["q", "i", "j", ""])

    kind = rng.choice("split split fuse fuse reorder cache cache vector parallel unroll at epi inline pack bad".split())
    if kind == "split":
        return Split(sname, loop(), rng.choice([0, -1, 1, 2, 3, 4, 5, 8, 16, 100]))
    if kind == "fuse":
        if len(loops) > 1 and rng.random() < 0.8:
            i = rng.randrange(len(loops) - 1)
            return Fuse(sname, loops[i], loops[i + 1])
        return Fuse(sname, loop(), loop())
    if kind == "reorder":
        order = list(loops)
        rng.shuffle(order)
        if rng.random() < 0.2:
            order = order[:-1] + ["q"]
        return Reorder(sname, tuple(order))
    if kind == "cache":
        return CacheWrite(sname, loop())
    if kind in ("vector", "parallel", "unroll"):
        return {"vector": Vectorize, "parallel": Parallel, "unroll": Unroll}[kind](sname, loop())
    if kind == "at":
        cons = rng.choice(stages)
        return ComputeAt(sname, cons.name, rng.choice([lp.name for lp in cons.loops] + ["q"]))
    if kind == "epi":
        return EpiloguePrim(sname, rng.choice(names))
    if kind == "inline":
        return Inline(rng.choice(names))
    if kind == "bad":  # ill-typed fields, as a broken JSON trace could carry
        return rng.choice([Split(sname, loop(), "4"), Reorder(sname, "ij"), Split(None, "i", 2), Pack("A", (0, 1), 0, 2.5),
                           Unroll(sname, 3), "not a primitive"])
    t = rng.choice(list(c.inputs) + ["zz"])
    rank = c.type_of[t].rank if t in c.type_of else 2
    perm = list(range(rank))
    rng.shuffle(perm)
    if rng.random() < 0.1:
        perm.append(0)
    return Pack(t, tuple(perm), rng.choice([-2, -1, 0, rank - 1, rank]), rng.choice([0, 1, 2, 4, 8]))


def test_lower_raises_only_schedule_error_and_legal_plans_print():
    rng = random.Random(0)
    computes = _computes()
    target = avx512_target(2)
    legal = illegal = 0
    for _ in range(1500):
        c = rng.choice(computes)
        trace, plan = [], lower(c, [], target)
        for _ in range(rng.randint(1, 10)):
            cand = trace + [_random_primitive(rng, c, plan)]
            try:
                plan = lower(c, cand, target)
            except ScheduleError:
                illegal += 1
                if rng.random() < 0.3:
                    trace = cand  # keep an illegal primitive: later ones build on a broken trace
                continue
            legal += 1
            trace = cand
            emit_c(plan, "k")  # every legal plan builds into a loop nest and prints
    assert legal > 1000 and illegal > 1000


@pytest.mark.parametrize("trace, reason", [
    ([CacheWrite("C", "k"), Split("C", "k", 4)], "no longer exists"),
    ([CacheWrite("C", "i"), Fuse("C", "i", "j")], "no longer exists"),
    ([Fuse("C", "i", "j"), Fuse("C", "i_j", "k")], "cannot fuse a reduction"),
    ([Fuse("C", "i", "j"), Split("C", "i_j", 32), Fuse("C", "i_j_o", "i_j_i")], "cannot rewrite"),
    ([Split("C", "i", "4")], "must be int"),
    ([Reorder("C", "ij")], "must be tuple"),
])
def test_former_crashes_are_schedule_errors(trace, reason):
    c = compile_op(MATMUL, {"A": (12, 8), "B": (8, 16)})
    with pytest.raises(ScheduleError, match=reason):
        lower(c, trace)


def _peeled(nest):
    return [v.node for v in walk(nest) if isinstance(v.node, PeeledLoop)]


@pytest.mark.parametrize("m,n", [(13, 1000), (7, 40), (12, 64), (5, 17)])
def test_register_tiles_with_tails_are_peeled_into_full_tiles_and_match_the_reference(m, n, kernel_cache):
    """A row tile of 4 and a column tile of 32: the full tiles run with constant trip counts (no tail
    bound left inside them), the last row tile and the last column block keep theirs, and the result
    is exact for every remainder (including none: 12 x 64 needs no peeling)."""
    import numpy as np

    from superopt.runtime.kernel import build_kernel

    c = compile_op(MATMUL, {"A": (m, 24), "B": (24, n)})
    trace = [Split("C", "i", 4), Split("C", "j", 32), Reorder("C", ("j_o", "i_o", "k", "i_i", "j_i")),
             CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i"), Pack("B", (0, 1), 1, 32)]
    nest = build_loopnest(lower(c, trace, avx512_target(1)))
    peeled = _peeled(nest)
    if m % 4 == 0 and n % 32 == 0:
        assert peeled == []
    else:
        (p,) = peeled
        assert p.loop.var == "i_o" and p.split == m // 4
        assert bool(p.outer_full) == (n > 32 and n % 32 != 0)  # the column tail is decided per column block
        fast_tails = [v.node.tail for v in walk(replace_body(nest, p.loop)) if isinstance(v.node, Loop)]
        assert all(t == () for t in fast_tails[1:]), "a full tile kept a tail bound"
        assert "i_o_full" in emit_c(nest).code or not p.outer_full
    rng = np.random.default_rng(m * n)
    A, B = rng.standard_normal((m, 24), np.float32), rng.standard_normal((24, n), np.float32)
    (got,) = build_kernel(c, trace, kernel_cache)(A, B)
    np.testing.assert_allclose(got, A @ B, rtol=1e-5, atol=1e-5)


def replace_body(nest, loop):
    """A nest whose body is just ``loop`` (to walk one loop of it)."""
    from dataclasses import replace

    return replace(nest, body=(StageNest("C", "", (loop,)),))


def test_a_batch_of_one_is_never_the_parallel_loop_and_its_tiles_are_still_peeled(kernel_cache):
    """Y[n,i,j] with n = 1 and 50 rows (tiles of 6: a tail): the unit loop goes inside the outer loops, so
    the parallel loop walks the rows, and the full tiles under the unit loop are still peeled."""
    import numpy as np

    from superopt.runtime.kernel import build_kernel

    c = compile_op("Y[n,i,j] += X[n,i,k] * W[k,j]", {"X": (1, 50, 64), "W": (64, 96)})
    target = avx512_target(2)
    trace = default_schedule(c, target, frozenset({"W"}))
    (par,) = [p for p in trace if isinstance(p, Parallel)]
    assert par.loop != "n" and not par.loop.startswith("n_")
    nest = build_loopnest(lower(c, trace, target))
    assert _peeled(nest), outline(nest)
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((1, 50, 64), np.float32), rng.standard_normal((64, 96), np.float32)
    (got,) = build_kernel(c, trace, kernel_cache)(X, W)
    np.testing.assert_allclose(got, X @ W, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,n", [(13, 64), (5, 96), (13, 1000)])
def test_the_last_register_tile_gets_constant_trip_counts_when_it_is_the_only_rest(m, n, kernel_cache):
    """Rows in tiles of 4: the rest of the peeled row loop is one tile (``i_o == m // 4``), so its row loop
    runs the constant ``m % 4`` rows, with no run-time bound left in the printed C; where a column tail of an
    outer loop decides how many full tiles there are (``n`` not a multiple of 32), the rest keeps that tail, on its
    stores only, and its rows are still the constant ``m % 4``.
    Exact against numpy either way."""
    import numpy as np

    from superopt.runtime.kernel import build_kernel

    c = compile_op(MATMUL, {"A": (m, 24), "B": (24, n)})
    trace = [Split("C", "i", 4), Split("C", "j", 32), Reorder("C", ("j_o", "i_o", "k", "i_i", "j_i")),
             CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i"), Pack("B", (0, 1), 1, 32)]
    nest = build_loopnest(lower(c, trace, avx512_target(1)))
    (p,) = _peeled(nest)
    rest_loops = [v.node for v in walk(replace_body(nest, replace(p.loop, body=p.general)))
                  if isinstance(v.node, Loop)]
    if p.outer_full:
        assert any(lp.tail for lp in rest_loops), "the rest lost a tail that depends on the column block"
        # the last rows of the last (zero-filled) panel: constant rows, the column tail bounding only the stores,
        # so a vector register tile and no accumulator array in memory
        assert {lp.extent for lp in rest_loops if lp.var == "i_i"} == {m % 4}
        assert all(t.offset.vars() == {"j_o"} for lp in rest_loops for t in lp.tail), outline(nest)
        assert "float acc[" not in emit_c(nest).code
    else:
        assert all(lp.tail == () for lp in rest_loops), outline(nest)
        assert {lp.extent for lp in rest_loops if lp.var == "i_i"} == {m % 4}
        assert "SO_MIN" not in emit_c(nest).code
    rng = np.random.default_rng(m + n)
    A, B = rng.standard_normal((m, 24), np.float32), rng.standard_normal((24, n), np.float32)
    (got,) = build_kernel(c, trace, kernel_cache)(A, B)
    np.testing.assert_allclose(got, A @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,n", [(13, 1000), (34, 200)])
def test_an_unpacked_column_tail_is_peeled_from_the_column_blocks_loop(m, n, kernel_cache):
    """An unpacked column operand (the column tail bounds the accumulation too, as a grouped 1x1 conv's
    pixels), its blocks walked by a serial loop outside the rows: that loop is peeled from the outside, so every
    column block but the last runs whole tiles, and the last one tiles of its constant columns; inside each,
    the row loop is peeled as usual. No bound is left to compute at run time. Exact against numpy."""
    import numpy as np

    from superopt.runtime.kernel import build_kernel

    c = compile_op(MATMUL, {"A": (m, 24), "B": (24, n)})
    trace = [Split("C", "i", 6), Split("C", "j", 64), Reorder("C", ("j_o", "i_o", "k", "i_i", "j_i")),
             CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i")]
    nest = build_loopnest(lower(c, trace, avx512_target(1)))
    (blocks,) = [p for p in _peeled(nest) if p.loop.var == "j_o"]
    assert blocks.split == n // 64 and not blocks.outer_full
    assert not [t for lp in _accumulating_loops(nest.body) for t in lp.tail], outline(nest)
    code = emit_c(nest).code
    # (the last block's 40 columns, or 8, as whole vectors, the last overlapping from a constant column: a
    # SO_MIN of constants; no loop bound is computed at run time)
    bounds = re.sub(r"SO_MIN\(16 \* j_i_vec, \d+\)", "", code)
    assert "SO_MIN" not in bounds and "so_v16 acc_vec[" in code.split(f"for (int j_o = {n // 64};")[0]
    rng = np.random.default_rng(m + n)
    A, B = rng.standard_normal((m, 24), np.float32), rng.standard_normal((24, n), np.float32)
    (got,) = build_kernel(c, trace, kernel_cache)(A, B)
    np.testing.assert_allclose(got, A @ B, rtol=1e-5, atol=1e-5)


def _accumulating_loops(body) -> list[Loop]:
    """The loops around an accumulation, in every copy of a peeled loop but the last tile's."""
    out = []
    for n in body:
        if isinstance(n, PeeledLoop):
            out += _accumulating_loops((n.loop,)) + _accumulating_loops(n.general) + _accumulating_loops(n.middle or ())
        elif isinstance(n, Loop):
            inner = _accumulating_loops(n.body)
            if inner or any(isinstance(c, Accumulate) for c in n.body):
                out += [n] + inner
        elif isinstance(n, (StageNest, Scope)):
            out += _accumulating_loops(n.body)
    return out


@pytest.mark.parametrize("k,m,n", [(100, 13, 40), (96, 12, 64), (70, 6, 32)])
def test_a_tiled_reduction_keeps_register_tiles_in_its_last_block(k, m, n, kernel_cache):
    """The reduction in blocks of 32 (``k_i < k - 32*k_o`` in the last block): the block loop is peeled, its
    full blocks take 32 steps each and its last block the constant ``k % 32``, so every block's full tiles are vector
    register tiles; the column tail of a zero-filled panel bounds only the stores. Where 32 divides ``k`` there
    is nothing to peel. Exact against numpy."""
    import numpy as np

    from superopt.runtime.kernel import build_kernel

    c = compile_op(MATMUL, {"A": (m, k), "B": (k, n)})
    trace = [Split("C", "k", 32), Split("C", "i", 6), Split("C", "j", 32),
             Reorder("C", ("j_o", "k_o", "i_o", "k_i", "i_i", "j_i")), CacheWrite("C", "k_i"), Unroll("C", "i_i"),
             Vectorize("C", "j_i"), Pack("B", (0, 1), 1, 32)]
    nest = build_loopnest(lower(c, trace, avx512_target(1)))
    blocks = [p for p in _peeled(nest) if p.loop.var == "k_o"]
    if k % 32 == 0:
        assert blocks == []
    else:
        (p,) = blocks
        assert p.split == k // 32 and not p.outer_full
        steps = [{lp.extent for lp in (v.node for v in walk(replace_body(nest, replace(p.loop, body=body))))
                  if isinstance(lp, Loop) and lp.var == "k_i" and not lp.tail} for body in (p.loop.body, p.general)]
        assert steps == [{32}, {k % 32}], outline(nest)
        bounded = [t for lp in _accumulating_loops(nest.body) for t in lp.tail if t.offset.vars() & {"k_o", "j_o"}]
        assert not bounded, outline(nest)
    code = emit_c(nest).code
    assert "float acc[" not in code.split("the last tile")[0], "a full tile of some block is not in registers"
    rng = np.random.default_rng(k + m + n)
    A, B = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    (got,) = build_kernel(c, trace, kernel_cache)(A, B)
    np.testing.assert_allclose(got, A @ B, rtol=1e-4, atol=1e-4)
