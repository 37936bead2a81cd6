"""The GPU runtime interface: without a GPU, the clear one-line error and the whole runtime path (buffers,
packing on the device, launch order, timing) through the CPU emulator binding; with a GPU (skipped here
with the reason), every op-table case and capsule votes on the device, through every installed binding."""

from __future__ import annotations

import ctypes
import importlib.util

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.ir.externs import evaluate_extern
from superopt.lang import compile_op
from superopt.runtime.gpu import BINDINGS, GpuUnavailable, gpu_status, require_gpu
from superopt.runtime.gpu.kernel import build_gpu_kernels
from superopt.schedule import Pack
from superopt.schedule.gpu_default import GPU_SIMPLE, GPU_TILED, build_gpu_sketch, gpu_default_schedule
from superopt.schedule.graph_defaults import constant_inputs
from superopt.schedule.knobs import KnobRecorder
from superopt.testing.op_table import CASES, case_graph, case_reference

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
MATMUL = "C[i,j] += A[i,k] * B[k,j]"
SOFTMAX = "m[i] max= X[i,j]\ne[i,j] = exp(X[i,j] - m[i])\ns[i] += e[i,j]\nY[i,j] = e[i,j] / s[i]"


def _driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _check_computes(device, items, rtol=1e-4, atol=1e-4):
    kernels = build_gpu_kernels(items, device)
    rng = np.random.default_rng(3)
    for k, (c, _) in zip(kernels, items):
        args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
        for got, ref in zip(k(*args), evaluate_compute(c, args, np.float64)):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    return kernels


def _small_items(target):
    mm = compile_op(MATMUL, {"A": (67, 45), "B": (45, 83)})
    caps = compile_op(CAPSULE, {"P": (2, 9, 9, 8, 4, 4), "W": (3, 3, 8, 8, 4, 4)})
    sm = compile_op(SOFTMAX, {"X": (33, 70)})
    mm_trace = gpu_default_schedule(mm, target)
    return [(mm, mm_trace), (mm, [*mm_trace, Pack("B", (1, 0))]), (caps, gpu_default_schedule(caps, target)),
            (caps, build_gpu_sketch(caps, target, frozenset(), GPU_TILED, KnobRecorder({"V.tn": 8, "V.rm": 2}))),
            (sm, gpu_default_schedule(sm, target)), (sm, build_gpu_sketch(sm, target, frozenset(), GPU_SIMPLE))]


@pytest.mark.skipif(_driver_loads(), reason="a CUDA driver is present: the no-driver error cannot be observed here")
def test_require_gpu_without_a_driver_names_the_missing_piece():
    with pytest.raises(GpuUnavailable, match=r"^no CUDA driver \(libcuda\.so\.1\)") as err:
        require_gpu()
    assert "\n" not in str(err.value)
    assert gpu_status().startswith("GpuUnavailable: no CUDA driver (libcuda.so.1)")


def test_unknown_binding_is_a_clear_error():
    if not _driver_loads():
        pytest.skip("no CUDA driver: the driver check answers before the binding name is read")
    with pytest.raises(GpuUnavailable, match="unknown GPU binding 'nope'"):
        require_gpu("nope")


def test_runtime_path_through_the_emulator_binding():
    """Device buffers, on-device packing, block all-reduces, multi-launch kernels and timing,
    through the same GpuDevice / GpuKernel code a GPU runs, with the CPU emulator as the binding."""
    dev = require_gpu("emulator")
    assert dev.binding == "emulator" and dev.target.kind == "cuda"
    kernels = _check_computes(dev, _small_items(dev.target))
    assert [ln.barriers for ln in kernels[-2].source.launches] == [True]  # a row per block, all-reduced
    assert len(kernels[-1].source.launches) == 3  # one launch per stage
    assert kernels[1].source.pack_launches  # B was packed on the device
    t = kernels[0].time(repeat=2, warmup=0)
    assert t["median_ms"] > 0 and t["repeat"] == 2


# ---- on a GPU ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu():
    try:
        return require_gpu()
    except GpuUnavailable as e:
        pytest.skip(f"no GPU: {e}")


def test_device_target_is_read_from_the_device(gpu):
    spec = gpu.spec
    assert gpu.binding in BINDINGS
    assert gpu.target.kind == "cuda" and gpu.target.gpu == spec
    assert spec.sm_count > 0 and spec.max_threads_per_block >= 256 and spec.shared_memory_per_block >= 16 << 10
    assert spec.arch == f"sm_{spec.compute_capability[0]}{spec.compute_capability[1]}"


@pytest.mark.parametrize("binding", BINDINGS)
def test_each_installed_binding_runs_kernels(binding):
    module = {"pycuda": "pycuda", "cuda-bindings": "cuda.bindings", "cupy": "cupy"}[binding]
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{binding} is not installed")
    try:
        dev = require_gpu(binding)
    except GpuUnavailable as e:
        pytest.skip(f"no GPU: {e}")
    assert dev.binding == binding
    _check_computes(dev, _small_items(dev.target))


def _run_graph(graph, feed, kernels):
    """The graph's nodes in order: compute nodes by the next of ``kernels``, externs by the reference."""
    env = dict(feed)
    env.update({n: c.array for n, c in graph.constant.items()})
    it = iter(kernels)
    for n in graph.nodes:
        if not n.is_extern:
            env.update(zip(n.outputs, next(it)(*[env[i] for i in n.inputs])))
        elif n.op.kind == "reshape":
            env[n.outputs[0]] = env[n.inputs[0]].reshape(graph.type_of[n.outputs[0]].shape)
        else:
            env.update(zip(n.outputs, evaluate_extern(n.op.kind, [env[i] for i in n.inputs], n.op.attr)))
    return [env[o] for o in graph.outputs]


def test_every_op_table_case_on_the_gpu_matches_reference(gpu):
    """All cases' kernels in one nvcc start and one module, each case's graph run against its reference."""
    items, spans = [], []
    for case in CASES:
        graph, feed = case_graph(case)
        start = len(items)
        items += [(n.op, gpu_default_schedule(n.op, gpu.target, constant_inputs(graph, n)))
                  for n in graph.nodes if not n.is_extern]
        spans.append((case, graph, feed, start, len(items)))
    kernels = build_gpu_kernels(items, gpu)
    failures = []
    for case, graph, feed, a, b in spans:
        for g, r in zip(_run_graph(graph, feed, kernels[a:b]), case_reference(case)):
            if g.shape != r.shape or not np.allclose(g, r, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5),
                                                     equal_nan=True):
                failures.append(case.name)
    assert not failures, f"GPU output differs from the reference for {failures}"


def test_capsule_votes_on_the_gpu_at_full_size(gpu):
    caps = compile_op(CAPSULE, {"P": (8, 15, 15, 32, 4, 4), "W": (3, 3, 32, 32, 4, 4)})
    (k,) = _check_computes(gpu, [(caps, gpu_default_schedule(caps, gpu.target))], rtol=1e-3, atol=1e-3)
    assert k.time(repeat=5)["median_ms"] > 0


def test_measure_gpu_gives_the_cpu_error_codes_from_worker_processes():
    """Through the emulator binding in worker processes: OK with times, ILLEGAL_SCHEDULE for a reduction bound to
    blocks, every candidate RUNTIME_ERROR naming GpuUnavailable when the worker cannot open the GPU, and
    TIMEOUT (a fresh worker per candidate) when a worker outlives its limit."""
    from superopt.measure.gpu import GpuMeasureConfig, measure_gpu
    from superopt.schedule.primitives import Bind
    from superopt.target import h200_target

    mm = compile_op(MATMUL, {"A": (33, 20), "B": (20, 40)})
    items = [(mm, gpu_default_schedule(mm, h200_target())), (mm, [Bind("C", "k", "block_x")])]
    ok, illegal = measure_gpu(items, GpuMeasureConfig(binding="emulator", repeats=2))
    assert ok.error_code == "OK" and len(ok.times_s) == 2 and ok.median_s > 0 and ok.target["kind"] == "cuda"
    assert illegal.error_code == "ILLEGAL_SCHEDULE" and "binds only to thread_x" in illegal.error_msg
    assert ok.workload_key == illegal.workload_key and ok.trace == tuple(items[0][1])
    nogpu = measure_gpu(items, GpuMeasureConfig(binding="no-such-binding"))
    assert [r.error_code for r in nogpu] == ["RUNTIME_ERROR"] * 2 and all("GpuUnavailable" in r.error_msg for r in nogpu)
    # a limit of 40 ms, shorter than a worker's start (Python and numpy's import): with 0.2 s, a fast host's
    # worker got as far as the legality check and reported the Bind candidate ILLEGAL_SCHEDULE in time
    slow = measure_gpu(items, GpuMeasureConfig(binding="emulator", build_timeout_s=0.02, run_timeout_s=0.01))
    assert [r.error_code for r in slow] == ["TIMEOUT"] * 2
