"""The C compiler driver: a library of many kernels compiled one unit a source, in parallel, and linked; each
source's object cached on its own (a changed library recompiles only its new sources); a failure in one unit
reported (and the other compilers stopped)."""

import ctypes
import stat
import time

import numpy as np
import pytest

from superopt.builder import GraphBuilder
from superopt.codegen.c_prelude import THREAD_CONTROL
from superopt.interp import evaluate
from superopt.lang import compile_op
from superopt.phases import PhaseTimer
from superopt.runtime.compiler import (
    SMALL_SOURCE,
    CompileDeadline,
    CompileError,
    CompilerConfig,
    compile_library,
    load_library,
    object_units,
)
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.kernel import build_kernels
from superopt.schedule.default import default_schedule
from superopt.schedule.graph_defaults import default_schedules
from superopt.target import host_target

OPS = [("C[i,j] += A[i,k] * B[k,j]", {"A": (33, 20), "B": (20, 45)}),
       ("m[i] max= X[i,j]\ne[i,j] = exp(X[i,j] - m[i])\ns[i] += e[i,j]\nY[i,j] = e[i,j] / s[i]", {"X": (9, 70)}),
       ("Y[i,j] = relu(X[i,j]) * 2.0", {"X": (17, 31)})]


def test_each_long_source_is_a_unit_of_its_own_and_thread_control_is_defined_once():
    """Short sources (under SMALL_SOURCE characters) share the first unit with the thread control."""
    sources = [f"void f{i}(void **args) {{ /* {'x' * (1000 * i)} */ }}" for i in range(7)]
    units = object_units(sources + sources[:3])  # (a source given twice is compiled once)
    assert [n for _, n in units] == [2, 1, 1, 1, 1, 1] and sum(THREAD_CONTROL in u for u, _ in units) == 1
    assert [sum(s in u for u, _ in units) for s in sources] == [1] * 7
    assert all(s in units[0][0] for s in sources[:2])


def _kernels(n: int, scale: str) -> list[str]:
    """``n`` small kernels ``y[i] = x[i] * scale + k``, each its own function."""
    return [f"void k{k}(void **args) {{ const float *x = args[0]; float *y = args[1];\n"
            f"    for (int i = 0; i < 64; ++i) y[i] = x[i] * {scale}f + {k}.0f; }}\n/* {'.' * SMALL_SOURCE} */"
            for k in range(n)]  # (long enough to be units of their own)


def _run_all(path, n: int, x: np.ndarray) -> list[np.ndarray]:
    lib = load_library(path)
    outs = []
    for k in range(n):
        y = np.zeros(64, np.float32)
        getattr(lib, f"k{k}")((ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data))
        outs.append(y)
    return outs


def test_a_changed_library_recompiles_only_its_new_sources(tmp_path):
    """Four kernels compiled cold; then the same four with one changed (a model edited in one layer): one
    source compiled, three objects from the cache, and every kernel of both libraries computes its own
    formula. The same library again is a library cache hit: nothing compiled."""
    config = CompilerConfig(cache_dir=tmp_path, jobs=2)
    x = np.arange(64, dtype=np.float32)
    first = _kernels(4, "2.0")
    p1 = PhaseTimer()
    lib1 = compile_library(first, config, phases=p1)
    assert p1.counts["sources_compiled"] == 4 and p1.counts["libraries_compiled"] == 1
    changed = first[:3] + [first[3].replace("2.0f", "3.0f")]
    p2 = PhaseTimer()
    lib2 = compile_library(changed, config, phases=p2)
    assert lib2 != lib1 and p2.counts["sources_compiled"] == 1
    for k, (a, b) in enumerate(zip(_run_all(lib1, 4, x), _run_all(lib2, 4, x))):
        np.testing.assert_array_equal(a, x * 2 + k)
        np.testing.assert_array_equal(b, x * (3 if k == 3 else 2) + k)
    p3 = PhaseTimer()
    assert compile_library(changed, config, phases=p3) == lib2 and "sources_compiled" not in p3.counts


def test_a_corrupt_cached_object_is_rebuilt(tmp_path):
    """An object truncated in the cache fails its hash: it is compiled again and the library still runs."""
    config = CompilerConfig(cache_dir=tmp_path, jobs=2)
    compile_library(_kernels(2, "2.0"), config)
    for o in (tmp_path / "objects").glob("*.o"):
        o.write_bytes(o.read_bytes()[:100])
    p = PhaseTimer()
    lib = compile_library(_kernels(2, "2.0") + ["void extra(void) {}"], config, phases=p)
    assert p.counts["sources_compiled"] == 3  # (the short one with the thread control, a new unit)
    x = np.arange(64, dtype=np.float32)
    for k, y in enumerate(_run_all(lib, 2, x)):
        np.testing.assert_array_equal(y, x * 2 + k)


@pytest.mark.parametrize("jobs", [1, 3])
def test_kernels_in_parallel_units_match_the_reference(tmp_path, jobs):
    computes = [compile_op(src, shapes) for src, shapes in OPS]
    kernels = build_kernels([(c, default_schedule(c)) for c in computes],
                            CompilerConfig(cache_dir=tmp_path / "kc", jobs=jobs), threads=2)
    from superopt.interp import evaluate_compute

    rng = np.random.default_rng(jobs)
    for c, k in zip(computes, kernels):
        args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
        for got, want in zip(k(*args), evaluate_compute(c, args, np.float64)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_graph_with_packed_inputs_links_its_pack_callers_across_units(tmp_path):
    """The executor's library holds kernels, their pack routines and the chain's pack callers (one per
    run-time input packed before its kernel): dealt into units, a caller may sit in another unit than
    the routine it calls."""
    b = GraphBuilder("two_matmuls")
    x, w1, w2 = b.input("x", (48, 64)), b.input("w1", (96, 64)), b.input("w2", (80, 96))
    h = b.compute1("C[i,j] += A[i,k] * B[j,k]", {"A": x, "B": w1}, "mm1")  # B read across k: packed per call
    y = b.compute1("C[i,j] += A[i,k] * B[j,k]", {"A": h, "B": w2}, "mm2")
    graph = b.build([y])
    ex = GraphExecutor(graph, default_schedules(graph, host_target(2)),
                       ExecutorConfig(threads=2, compiler=CompilerConfig(cache_dir=tmp_path / "kc", jobs=4)))
    assert ex.chains and any(call.packs for call in ex._calls.values()), "no run-time input is packed"
    feed = {n: np.random.default_rng(1).standard_normal(graph.type_of[n].shape).astype(np.float32)
            for n in graph.inputs}
    np.testing.assert_allclose(ex(feed)[y], evaluate(graph, feed, np.float64)[y], rtol=1e-4, atol=1e-4)


def test_a_unit_that_fails_names_the_error_and_stops_the_other_compilers(tmp_path):
    good = "void ok(void **args) { (void)args; }\n/* " + "." * SMALL_SOURCE + " */"  # (a unit of its own)
    with pytest.raises(CompileError, match="(?s)C compilation failed: .*undeclared"):
        compile_library([good, "void bad(void **args) { nope = 1; }"], CompilerConfig(cache_dir=tmp_path, jobs=2))
    slow = tmp_path / "slowcc"  # one unit compiles at once, the other never ends: the timeout names it
    slow.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo slowcc 1.0; exit 0; fi\n'
                    'case "$*" in *kernels1.c*) exec sleep 30;; esac\nexit 0\n')
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    t0 = time.monotonic()
    with pytest.raises(CompileError, match="timed out after 0.5s"):
        compile_library([good, good.replace("ok", "ok2")],
                        CompilerConfig(cc=str(slow), cache_dir=tmp_path / "s", jobs=2, timeout_s=0.5))
    assert time.monotonic() - t0 < 10  # the sleeping compiler was killed, not waited for


def test_a_library_keeps_its_thread_count_to_itself():
    """Kernels run with their library's own thread count (``num_threads`` on every parallel region), not the
    process's OpenMP setting, which torch shares: building a one-thread program used to make torch
    single-threaded (and a torch.compile backend build failed dynamo's global-state check)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        c = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (192, 192), "B": (192, 192)})
        (k,) = build_kernels([(c, default_schedule(c, host_target(1)))], threads=1)
        assert torch.get_num_threads() == 2
        k.lib.so_get_threads.restype = ctypes.c_int
        assert k.lib.so_get_threads() == 1
        k.lib.so_set_threads(2)
        assert k.lib.so_get_threads() == 2 and torch.get_num_threads() == 2
        a = np.random.default_rng(0).standard_normal((192, 192)).astype(np.float32)
        b = np.random.default_rng(1).standard_normal((192, 192)).astype(np.float32)
        (out,) = k(a, b)
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(before)


def test_a_deadline_ends_the_build_and_keeps_the_objects_finished_by_then(tmp_path):
    """The caller's deadline stops every compiler (CompileDeadline, not a compile error of the code), and the
    units finished before it are cached: the next build compiles only the rest."""
    good = "void ok(void **args) { (void)args; }\n/* " + "." * SMALL_SOURCE + " */"
    slow = tmp_path / "slowcc"  # compiles one unit at once, the other only without the marker file
    marker = tmp_path / "hang"
    marker.write_text("")
    slow.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo slowcc 1.0; exit 0; fi\n'
                    f'case "$*" in *kernels0.c*) [ -e {marker} ] && exec sleep 30;; esac\n'
                    'exec gcc "$@"\n')
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    config = CompilerConfig(cc=str(slow), cache_dir=tmp_path / "s", jobs=2, timeout_s=60)
    sources = [good, good.replace("ok", "ok2") + "/* longer, so compiled first */" + " " * SMALL_SOURCE]
    t0 = time.monotonic()
    with pytest.raises(CompileDeadline):
        compile_library(sources, config, deadline=time.monotonic() + 1.0)
    assert time.monotonic() - t0 < 10
    marker.unlink()
    p = PhaseTimer()
    lib = compile_library(sources, config, phases=p)
    assert p.counts["sources_compiled"] == 1  # the unit finished before the deadline was not compiled again
    assert ctypes.CDLL(str(lib)).ok2 is not None
