"""The output-layout move: a contraction computed into a temporary whose dims are the output's in another order,
then copied into the output, where the register tile's best columns are one contiguous run of an operand but
not of the output. Checked against the reference (the default's pick and random points of its knobs), and the
record's own checks give a reason."""

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.runtime.kernel import build_kernels
from superopt.schedule.default import build_sketch, default_schedule
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.output_layout import choose_output_layout, laid_name
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import OutputLayout, Split, trace_from_json, trace_to_json
from superopt.target import host_target

# the pair (m, l) is one run of B, but C keeps k between them: fused, it splits only by multiples of l's 17
STRIDED_OUT = "C[j,i,m,k,l] += A[k,o,i,n,j] * B[o,n,m,l]"
SHAPES = {"A": (19, 5, 3, 20, 5), "B": (5, 20, 9, 17)}
# the same contraction with the output already laid out (m, l) innermost
RUN_OUT = "C[j,i,k,m,l] += A[k,o,i,n,j] * B[o,n,m,l]"


def _check(c, traces, kernel_cache):
    args = [np.random.default_rng(1).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    target = host_target(2)
    for trace, kernel in zip(traces, build_kernels([(c, t) for t in traces], kernel_cache, 2, target)):
        np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def test_the_default_lays_out_a_strided_output_and_matches_the_reference(kernel_cache):
    c = compile_op(STRIDED_OUT, SHAPES)
    target = host_target(2)
    trace = default_schedule(c, target, frozenset())
    layouts = [p for p in trace if isinstance(p, OutputLayout)]
    assert layouts == [OutputLayout("C", (0, 1, 3, 2, 4))], trace
    # the tile's columns: the fused (m, l) run of the laid-out temporary, split by whole vectors
    splits = [p for p in trace if isinstance(p, Split) and p.stage == laid_name("C")]
    assert any(p.loop == "m_l" and p.factor % target.lanes("float32") == 0 for p in splits), trace
    off = build_sketch(c, target, frozenset(), "stages+epilogue", KnobRecorder({"C.out_layout": False}))
    assert not any(isinstance(p, OutputLayout) for p in off)
    _check(c, [trace, off], kernel_cache)
    assert trace_from_json(trace_to_json(trace)) == tuple(trace)


def test_no_layout_move_where_the_output_already_holds_the_run_or_the_weight_is_constant():
    c = compile_op(RUN_OUT, SHAPES)
    target = host_target(2)
    assert choose_output_layout(c.statements[0], target.lanes("float32"), target.vector_registers) is None
    strided = compile_op(STRIDED_OUT, SHAPES)
    assert not any(isinstance(p, OutputLayout) for p in default_schedule(strided, target, frozenset({"B"})))


@pytest.mark.parametrize("record, reason", [
    (OutputLayout("C", (0, 1, 2, 3, 4)), "permutation"),
    (OutputLayout("C", (0, 1, 2)), "permutation"),
    (OutputLayout("X", (1, 0)), "no stage"),
])
def test_a_bad_output_layout_is_rejected_with_a_reason(record, reason):
    c = compile_op(STRIDED_OUT, SHAPES)
    with pytest.raises(ScheduleError, match=reason):
        lower(c, [record], host_target(2))


def test_a_temporary_cannot_be_laid_out():
    c = compile_op("T[i,j] += A[i,k] * B[k,j]\nO[j,i] = T[i,j]", {"A": (8, 4), "B": (4, 6)})
    with pytest.raises(ScheduleError, match="not a kernel output"):
        lower(c, [OutputLayout("T", (1, 0))], host_target(2))
