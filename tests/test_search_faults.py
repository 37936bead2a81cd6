"""A search in which planted candidates segfault, hang, compute wrong answers and exceed the workers' memory cap
still returns a verified program: each failure is recorded by kind, the batch carries on, and the
best schedule found is one that measured correct."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from search.schedule.search import SearchConfig, search_compute
from superopt.codegen.c_emit import KernelSource
from superopt.interp.reference import evaluate_compute
from superopt.lang import compile_op
from superopt.measure import MeasureConfig, MeasureService
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.target import host_target

N = 48


def _src(name: str, body: str) -> KernelSource:
    return KernelSource(name=name, code=f"void {name}(void **args) {{\n{body}\n}}\n", inputs=("A", "B"),
                        outputs=("C",), packs={})


PLANTS = {
    1: ("RUNTIME_ERROR", _src("planted_segv", "  *(volatile int *)0 = 1;")),
    2: ("TIMEOUT", _src("planted_hang", "  volatile int x = 0; for (;;) x++;")),
    3: ("WRONG_ANSWER", _src("planted_wrong", f"  float *C = args[2]; for (int i = 0; i < {N * N}; i++) C[i] = 1.0f;")),
    # a 3 GiB scratch buffer against the workers' 2 GiB cap (without the cap it would just be reserved)
    4: ("OUT_OF_MEMORY", dataclasses.replace(_src("planted_oom", "  (void)args;"), workspace=(3 << 30,))),
}


class PlantingMeasurer:
    """Measures through a real service, but swaps in the planted C for the n-th candidates it is given."""

    def __init__(self, service: MeasureService) -> None:
        self.service = service
        self.seen = 0

    def measure(self, inputs, time_left_s=None):
        swapped = []
        for inp in inputs:
            plant = PLANTS.get(self.seen)
            swapped.append(dataclasses.replace(inp, source=plant[1]) if plant else inp)
            self.seen += 1
        return self.service.measure(swapped, time_left_s)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    mm = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (N, N), "B": (N, N)})
    target = host_target(1)
    cfg = MeasureConfig(threads=1, target=target, run_timeout_s=2.0, min_repeat_s=0.002, repeats=3,
                        compiler=CompilerConfig(cache_dir=tmp_path_factory.mktemp("kcache")), memory_limit_bytes=2 << 30)
    with MeasureService(cfg) as service:
        r = search_compute(mm, target, SearchConfig(trials=10, batch_size=5, seed=0), service=PlantingMeasurer(service))
    return mm, target, r


def test_each_planted_failure_is_counted_by_kind(report):
    _, _, r = report
    assert r.failures.get("RUNTIME_ERROR", 0) >= 1
    assert r.failures.get("TIMEOUT", 0) >= 1
    assert r.failures.get("WRONG_ANSWER", 0) >= 1
    assert r.failures.get("OUT_OF_MEMORY", 0) >= 1
    assert r.trials == 10 and r.best_s is not None and r.stop_reason


def test_the_search_still_returns_a_verified_program(report):
    mm, target, r = report
    from superopt.builder import GraphBuilder

    b = GraphBuilder("mm")
    ins = [b.input(n, mm.type_of[n].shape, mm.type_of[n].dtype) for n in mm.inputs]
    g = b.build(b.add_compute(mm, ins, "mm", out_names=["C"]))
    ex = GraphExecutor(g, {g.nodes[0].name: list(r.best_trace)}, ExecutorConfig(1, target=target))
    rng = np.random.default_rng(0)
    a, bb = (rng.standard_normal((N, N)).astype(np.float32) for _ in range(2))
    want = evaluate_compute(mm, [a, bb], np.float64)[0]
    np.testing.assert_allclose(ex([a, bb])["C"], want, rtol=1e-4, atol=1e-4)
