"""CUDA code generation without a GPU: the generated CUDA for every op-table case and capsule votes
compiles with nvcc for sm_90 (one nvcc start for all), and the same CUDA text, run by the g++ emulation
of its launches (blocks and threads as loops), matches the independent references. GPU schedules'
legality (device limits, bound loops) is checked with reasons."""

from __future__ import annotations

import numpy as np
import pytest

from superopt.codegen.cuda_emit import emit_cuda
from superopt.interp import evaluate_compute
from superopt.ir.externs import evaluate_extern
from superopt.lang import compile_op
from superopt.runtime.gpu.emulate import EmulatedKernel, compile_emulation
from superopt.runtime.gpu.nvcc import NvccConfig, compile_cuda, find_nvcc, translation_unit
from superopt.schedule import Pack, Split, trace_from_json, trace_to_json
from superopt.schedule.gpu_default import GPU_SIMPLE, GPU_TILED, build_gpu_sketch, gpu_default_schedule
from superopt.schedule.graph_defaults import constant_inputs
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Bind, CacheRead, CacheWrite, ComputeAt, Parallel, Reorder, Unroll
from superopt.target import H200, Target, avx512_target, cuda_target, h200_target
from superopt.testing.op_table import CASES, case_graph, case_reference

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
MATMUL = "C[i,j] += A[i,k] * B[k,j]"
SOFTMAX = "m[i] max= X[i,j]\ne[i,j] = exp(X[i,j] - m[i])\ns[i] += e[i,j]\nY[i,j] = e[i,j] / s[i]"
LAYERNORM = ("mu[b,t] += X[b,t,c] / 40\nd[b,t,c] = X[b,t,c] - mu[b,t]\nv[b,t] += d[b,t,c] * d[b,t,c] / 40\n"
             "Y[b,t,c] = d[b,t,c] / sqrt(v[b,t] + 0.00001) * G[c]")
TARGET = h200_target()


def _case_kernels():
    """(case, graph, feed, {node: (compute, trace)}) for every op-table case, with GPU default schedules."""
    out = []
    for case in CASES:
        graph, feed = case_graph(case)
        nodes = {n.name: (n.op, gpu_default_schedule(n.op, TARGET, constant_inputs(graph, n)))
                 for n in graph.nodes if not n.is_extern}
        out.append((case, graph, feed, nodes))
    return out


@pytest.fixture(scope="module")
def case_kernels():
    return _case_kernels()


def _capsule(p_shape=(2, 9, 9, 8, 4, 4), w_shape=(3, 3, 8, 8, 4, 4)):
    return compile_op(CAPSULE, {"P": p_shape, "W": w_shape})


def _capsule_traces(c):
    """The default GPU schedule and a few other points of the GPU space (register tiles, thread shapes)."""
    consts = frozenset(c.inputs)
    from superopt.schedule.knobs import KnobRecorder

    out = [gpu_default_schedule(c, TARGET)]
    for kn in ({"V.tn": 8, "V.rm": 2}, {"V.tm": 4, "V.rm": 8, "V.n_min": 8}, {"V.tn": 32, "V.rn": 2},
               {"V.blocked": True, "V.tm": 2, "V.rm": 4, "V.k_unroll": 2}):
        out.append(build_gpu_sketch(c, TARGET, consts, GPU_TILED, KnobRecorder(kn)))
    out.append(build_gpu_sketch(c, TARGET, consts, GPU_SIMPLE))
    return out


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found: the CUDA compile check needs the CUDA toolkit")
def test_every_op_table_case_and_capsule_compile_with_nvcc(case_kernels, tmp_path):
    """One translation unit with every kernel: nvcc -cubin -arch=sm_90 (ptxas checks registers too); sgemm
    4096^3 in shared-memory and float4 variants too."""
    from superopt.schedule.knobs import KnobRecorder

    sources = []
    for case, _, _, nodes in case_kernels:
        for j, (c, trace) in enumerate(nodes.values()):
            sources.append(emit_cuda(lower(c, trace, TARGET), f"{case.name}_{j}"))
    sgemm = compile_op(MATMUL, {"A": (4096, 4096), "B": (4096, 4096)})
    for j, knobs in enumerate(({"C.shared": True}, {"C.shared": True, "C.blocked": True, "C.rm": 8, "C.rn": 8,
                                                    "C.tm": 16, "C.tn": 16},
                               {"C.blocked": True, "C.rm": 8, "C.rn": 8, "C.tm": 16, "C.tn": 16, "C.k_unroll": 4})):
        trace = build_gpu_sketch(sgemm, TARGET, frozenset(), GPU_TILED, KnobRecorder(knobs))
        sources.append(emit_cuda(lower(sgemm, trace, TARGET), f"sgemm_{j}"))
    caps = _capsule((8, 15, 15, 32, 4, 4), (3, 3, 32, 32, 4, 4))  # the paper's size
    for j, trace in enumerate(_capsule_traces(caps)):
        sources.append(emit_cuda(lower(caps, trace, TARGET), f"capsule_{j}"))
    assert len(sources) > len(CASES)
    cubin = compile_cuda(translation_unit(sources), "cubin", NvccConfig(arch=H200.arch, cache_dir=tmp_path))
    data = cubin.read_bytes()
    assert data[:4] == b"\x7fELF"
    for s in sources:  # every launched kernel is in the cubin
        for ln in s.launches:
            assert ln.kernel.encode() in data, ln.kernel


def _run_graph_emulated(graph, feed, nodes, kernels):
    env = dict(feed)
    env.update({n: c.array for n, c in graph.constant.items()})
    for n in graph.nodes:
        if n.is_extern:
            if n.op.kind == "reshape":
                env[n.outputs[0]] = env[n.inputs[0]].reshape(graph.type_of[n.outputs[0]].shape)
            else:
                for o, v in zip(n.outputs, evaluate_extern(n.op.kind, [env[i] for i in n.inputs], n.op.attr)):
                    env[o] = v
            continue
        for o, v in zip(n.outputs, kernels[n.name](*[env[i] for i in n.inputs])):
            env[o] = v
    return [env[o] for o in graph.outputs]


def test_every_op_table_case_emulated_matches_reference(case_kernels, tmp_path):
    """The CUDA text of every case's kernels (GPU default schedules), run by the g++ emulation of its
    launches, against the case's independent reference (numpy / torch)."""
    sources, owners = [], []
    for k, (_, _, _, nodes) in enumerate(case_kernels):
        for j, (name, (c, trace)) in enumerate(nodes.items()):
            sources.append(emit_cuda(lower(c, trace, TARGET), f"c{k}_{j}"))
            owners.append((k, name, c))
    lib = compile_emulation(sources, tmp_path)
    kernels: dict[int, dict] = {}
    for src, (k, name, c) in zip(sources, owners):
        kernels.setdefault(k, {})[name] = EmulatedKernel(lib, src, c)
    failures = []
    for k, (case, graph, feed, nodes) in enumerate(case_kernels):
        got = _run_graph_emulated(graph, feed, nodes, kernels.get(k, {}))
        for g, r in zip(got, case_reference(case)):
            if g.shape != r.shape or not np.allclose(g, r, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5),
                                                     equal_nan=True):
                failures.append(case.name)
    assert not failures, f"emulated CUDA differs from the reference for {failures}"


def test_capsule_and_softmax_schedules_emulated_match_interpreter(tmp_path):
    """Several points of the GPU space (tiled with register tiles and tails, simple) for capsule votes,
    a matmul with tails on every tiled loop, and softmax."""
    caps = _capsule()
    mm = compile_op(MATMUL, {"A": (67, 45), "B": (45, 83)})
    sm = compile_op(SOFTMAX, {"X": (33, 70)})
    items = [(caps, tr) for tr in _capsule_traces(caps)]
    ln = compile_op(LAYERNORM, {"X": (5, 3, 40), "G": (40,)})
    items += [(mm, gpu_default_schedule(mm, TARGET)), (sm, gpu_default_schedule(sm, TARGET)),
              (sm, build_gpu_sketch(sm, TARGET, frozenset(), GPU_SIMPLE)), (ln, gpu_default_schedule(ln, TARGET))]
    assert isinstance(items[-1][1][0], ComputeAt)  # layer norm: a row per block as well
    from superopt.schedule.knobs import KnobRecorder

    items.append((mm, build_gpu_sketch(mm, TARGET, frozenset(), GPU_TILED, KnobRecorder({"C.rm": 8, "C.rn": 8}))))
    blocked = build_gpu_sketch(mm, TARGET, frozenset(), GPU_TILED, KnobRecorder({"C.blocked": True, "C.tm": 4, "C.k_unroll": 4}))
    assert any(isinstance(p, Pack) for p in blocked)  # A packed with its rows innermost, on the device
    items.append((mm, blocked))
    mm2 = compile_op(MATMUL, {"A": (64, 45), "B": (45, 96)})  # thread loops without tails, k with one
    for knobs in ({"C.shared": True}, {"C.shared": True, "C.blocked": True, "C.tm": 4, "C.rm": 4, "C.k_unroll": 4}):
        trace = build_gpu_sketch(mm2, TARGET, frozenset(), GPU_TILED, KnobRecorder(knobs))
        assert sum(isinstance(p, CacheRead) for p in trace) == 2  # both operands through shared memory
        assert trace_from_json(trace_to_json(trace)) == tuple(trace)
        items.append((mm2, trace))
    sources = [emit_cuda(lower(c, tr, TARGET), f"k{i}") for i, (c, tr) in enumerate(items)]
    assert sources[-1].launches[0].shared_bytes > 0 and sources[-1].launches[0].barriers
    lib = compile_emulation(sources, tmp_path)
    rng = np.random.default_rng(1)
    for src, (c, tr) in zip(sources, items):
        args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
        got = EmulatedKernel(lib, src, c)(*args)
        for g, r in zip(got, evaluate_compute(c, args, np.float64)):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=trace_to_json(tr))


def test_tiled_sketch_binds_blocks_threads_and_a_register_tile():
    mm = compile_op(MATMUL, {"A": (512, 256), "B": (256, 1024)})
    trace = gpu_default_schedule(mm, TARGET)
    axes = {p.axis for p in trace if isinstance(p, Bind)}
    assert axes == {"block_x", "block_y", "thread_x", "thread_y"}
    src = emit_cuda(lower(mm, trace, TARGET), "mm")
    (launch,) = src.launches
    rm, rn = 4, 4  # the default register tile
    assert launch.grid[0] * launch.block[0] * rn == 1024 and launch.grid[1] * launch.block[1] * rm == 512
    assert "blockIdx.x" in src.code and "threadIdx.y" in src.code and "#pragma unroll" in src.code
    assert f"float acc[{rm * rn}];" in src.code
    assert trace_from_json(trace_to_json(trace)) == tuple(trace)


def test_softmax_rows_per_block_with_an_all_reduce_or_one_launch_per_stage():
    sm = compile_op(SOFTMAX, {"X": (64, 100)})
    trace = gpu_default_schedule(sm, TARGET)  # gpu-rowwise: a row per block, m and s all-reduced over its threads
    src = emit_cuda(lower(sm, trace, TARGET), "sm")
    (launch,) = src.launches
    assert launch.grid == (64, 1, 1) and launch.block == (128, 1, 1) and launch.barriers
    assert src.code.count("__shfl_xor_sync") == 2 and "__syncthreads" in src.code
    simple = emit_cuda(lower(sm, build_gpu_sketch(sm, TARGET, frozenset(), GPU_SIMPLE), TARGET), "sm")
    assert [ln.kernel for ln in simple.launches] == ["sm_0", "sm_1", "sm_2"]  # m, s (e inlined), Y
    assert all(ln.threads > 1 and not ln.barriers for ln in simple.launches)


@pytest.mark.parametrize("trace, reason", [
    ([Bind("C", "k", "block_x")], "binds only to thread_x"),
    ([Bind("C", "k", "thread_x"), Bind("C", "i", "thread_y")], "bound to threads as well"),
    ([Bind("C", "i", "thread_x"), Bind("C", "j", "thread_x")], "already bound"),
    ([Bind("C", "i", "warp")], "unknown axis"),
    ([Bind("C", "i", "thread_x"), Bind("C", "j", "thread_y")], "threads per block exceed"),
    ([Bind("C", "j", "thread_z")], "exceeds the device's limit of 64"),
    ([Parallel("C", "i")], "not on a CUDA target"),
    ([Split("C", "i", 48), Bind("C", "i_i", "thread_y"), Split("C", "k", 8), CacheRead("C", "A", "k_o")],
     "a thread loop has a tail"),
    ([Split("C", "k", 8), Reorder("C", ("i", "k_o", "j", "k_i")), Bind("C", "j", "thread_x"), CacheRead("C", "A", "k_o")],
     "must be a spatial loop enclosing"),
    ([Split("C", "k", 8), CacheRead("C", "C", "k_o")], "must be an unpacked, unpadded kernel input"),
    ([Split("C", "k", 64), Reorder("C", ("k_o", "i", "j", "k_i")), CacheRead("C", "A", "k_o"), CacheRead("C", "B", "k_o")],
     "exceed the block's"),
    ([Split("C", "i", 16), Split("C", "j", 16), Reorder("C", ("i_o", "j_o", "k", "i_i", "j_i")),
      CacheWrite("C", "k"), Unroll("C", "i_i")], "registers"),
])
def test_illegal_gpu_schedules_are_rejected_with_reason(trace, reason):
    c = compile_op(MATMUL, {"A": (128, 64), "B": (64, 96)})
    small = cuda_target(H200.__class__(**{**H200.__dict__, "max_registers_per_thread": 255}))
    with pytest.raises(ScheduleError, match=reason):
        lower(c, trace, small)


def test_bind_needs_a_cuda_target_and_cpu_target_keys_are_unchanged():
    c = compile_op(MATMUL, {"A": (16, 8), "B": (8, 16)})
    with pytest.raises(ScheduleError, match="only on a CUDA target"):
        lower(c, [Bind("C", "i", "block_x")], avx512_target())
    cpu = avx512_target()
    assert "gpu" not in cpu.to_dict()
    assert cpu.key() == "bcbec0977083b080"  # the key this target had before GPU fields existed
    again = Target.from_dict(TARGET.to_dict())
    assert again == TARGET and again.key() == TARGET.key() and TARGET.key() != cpu.key()
    assert TARGET.gpu.arch == "sm_90"


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found: the PTX check needs the CUDA toolkit")
def test_blocked_tile_loads_and_stores_merge_into_float4(tmp_path):
    """sgemm with a blocked 8x8 register tile and A packed transposed: the k loop's loads are four
    ld.global.v4.f32 (two of A, two of B) for 64 FMAs, as nvcc compiles it (checked in the PTX)."""
    import re

    from superopt.schedule.knobs import KnobRecorder

    mm = compile_op(MATMUL, {"A": (1024, 512), "B": (512, 1024)})
    knobs = {"C.blocked": True, "C.rm": 8, "C.rn": 8, "C.tm": 16, "C.tn": 16}
    trace = build_gpu_sketch(mm, TARGET, frozenset(), GPU_TILED, KnobRecorder(knobs))
    src = emit_cuda(lower(mm, trace, TARGET), "mm")
    ptx = compile_cuda(translation_unit([src]), "ptx", NvccConfig(arch=H200.arch, cache_dir=tmp_path)).read_text()
    body = ptx[ptx.index(".entry mm_0"):ptx.index(".entry mm_pack_A")] if ".entry mm_pack_A" in ptx else ptx
    assert len(re.findall(r"ld\.global(\.nc)?\.v4\.f32", body)) == 4
    assert len(re.findall(r"ld\.global(\.nc)?\.f32", body)) == 0
    assert body.count("fma.rn.f32") == 64 and "st.global.v4.f32" in body


def test_schedule_space_on_a_cuda_target_explores_gpu_sketches():
    """The search's ScheduleSpace and the default heuristic dispatch on the target: a cuda target gets the
    GPU sketches, its default point is the GPU default, and random points are legal GPU schedules."""
    import random

    from superopt.schedule.default import default_schedule
    from superopt.schedule.space import ScheduleSpace

    c = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (256, 128), "B": (128, 96)})
    space = ScheduleSpace(c, h200_target(), frozenset())
    assert space.sketches[0] == GPU_TILED
    default = space.trace(space.default_point())
    assert tuple(default) == tuple(gpu_default_schedule(c, h200_target()))
    assert tuple(default_schedule(c, h200_target())) == tuple(default)
    assert any(isinstance(p, Bind) for p in default)
    rng = random.Random(0)
    legal = 0
    for _ in range(12):
        try:
            trace = space.trace(space.sample(rng))
        except ScheduleError:
            continue
        legal += 1
        assert any(isinstance(p, Bind) for p in trace)
    assert legal >= 6
