"""Property: every legal schedule computes what the unscheduled kernel computes.

Hypothesis drives the random-trace sampler (search/schedule/random_schedule.py) for every compute node of
every op-table case and for the capsule votes op; the compiled result must match the reference.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search.schedule.random_schedule import random_trace
from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.kernel import build_kernels
from superopt.testing.op_table import CASES, case_graph, case_reference

SETTINGS = settings(max_examples=2, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _chooser(data):
    return lambda options: data.draw(st.sampled_from(list(options)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@SETTINGS
@given(data=st.data())
def test_random_schedules_of_op_table_cases(case, data, kernel_cache):
    graph, feed = case_graph(case)
    choose = _chooser(data)
    schedules = {n.name: random_trace(n.op, choose, steps=6) for n in graph.nodes if not n.is_extern}
    ex = GraphExecutor(graph, schedules, ExecutorConfig(threads=2, compiler=kernel_cache))
    out = ex(feed)
    for o, ref in zip(graph.outputs, case_reference(case)):
        np.testing.assert_allclose(out[o], ref, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5),
                                   err_msg=f"schedules {schedules}")


CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_schedules_of_capsule_votes(data, kernel_cache):
    c = compile_op(CAPSULE, {"P": (2, 7, 7, 4, 4, 4), "W": (3, 3, 4, 6, 4, 4)})
    _check_random_traces(c, _chooser(data), kernel_cache, seed=0)


def _check_random_traces(c, choose, kernel_cache, seed: int, n: int = 4) -> None:
    """``n`` random legal traces of ``c``, compiled into one library, each against the reference."""
    traces = [random_trace(c, choose, steps=10) for _ in range(n)]
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    for trace, kernel in zip(traces, build_kernels([(c, t) for t in traces], kernel_cache, threads=2)):
        (got,) = kernel(*args)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


CONV_BIAS_RELU_ADD = ("P[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]\nT[n,co,y,x] = P[n,co,y,x] + B[co]\n"
                      "O[n,co,y,x] = relu(T[n,co,y,x]) + R[n,co,y,x]")


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_schedules_of_a_fused_conv_with_epilogue(data, kernel_cache):
    """The graph fusion rules produce ops like this one; the sampler also draws Epilogue primitives."""
    c = compile_op(CONV_BIAS_RELU_ADD, {"X": (1, 3, 6, 7), "W": (5, 3, 3, 3), "B": (5,), "R": (1, 5, 6, 7)},
                   extents={"y": 6, "x": 7}, padding={"X": 0.0}, outputs=["O"])
    _check_random_traces(c, _chooser(data), kernel_cache, seed=1)
