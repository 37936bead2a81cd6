"""The benchmark's peers and checks: OpenVINO against onnxruntime, and the flag on outputs that prove nothing."""

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from superopt.measure.peers import OPENVINO_MISSING, openvino_available, output_flag


def test_output_flag_names_all_zeros_constant_and_saturated_outputs():
    rng = np.random.default_rng(0)
    assert output_flag(np.zeros((2, 10), np.float32)) == "all zeros"
    assert output_flag(np.full((1, 1000), 1e-3, np.float32)) == "constant"
    assert output_flag(np.float32(0.25) + np.zeros(7, np.float32) + 1e-9) == "constant"  # within float noise
    one_hot = np.zeros((1, 1000), np.float32)
    one_hot[0, 17] = 1.0  # a saturated softmax
    assert output_flag(one_hot) == "constant but for 1 of 1000 elements"
    assert output_flag(np.array([1.0, np.nan])) == "not finite"
    assert output_flag(rng.standard_normal((4, 1000)).astype(np.float32)) is None
    relu = np.maximum(rng.standard_normal((1, 64, 8, 8)), 0)  # half zeros: an ordinary activation
    assert output_flag(relu) is None


def test_missing_openvino_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    ok, why = openvino_available()
    assert not ok and why == OPENVINO_MISSING and "\n" not in why and "pip install" in why


def _tiny_cnn(batch: int) -> bytes:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")
    fc = numpy_helper.from_array((rng.standard_normal((8 * 6 * 6, 10)) * 0.1).astype(np.float32), "fc")
    shape = numpy_helper.from_array(np.array([-1, 8 * 6 * 6], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], [w, b, fc, shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


@pytest.mark.parametrize("batch", [1, 4])
def test_openvino_matches_onnxruntime_with_latency_and_throughput_hints(batch):
    pytest.importorskip("openvino", reason="openvino is not installed (the optional 'bench' extra)")
    from superopt.cli_artifact import _ort_session
    from superopt.measure.peers import openvino_runner

    data = _tiny_cnn(batch)
    x = np.random.default_rng(1).standard_normal((batch, 3, 12, 12)).astype(np.float32)
    (want,) = _ort_session(data, 2).run(None, {"x": x})
    runner = openvino_runner(data, [x], threads=2, batched=batch > 1)
    assert runner.hint == ("THROUGHPUT" if batch > 1 else "LATENCY")
    for _ in range(2):  # the second call reuses the requests and the output buffer
        got = np.array(runner.run())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert output_flag(got) is None


class _Fixed:
    """A benchmarked system whose output is given."""

    def __init__(self, name: str, out: np.ndarray):
        self.name, self.out, self.last_note = name, out, ""

    def supports(self, instance):
        return True

    def skip_in_quick(self, instance):
        return False

    def prepare(self, instance, quick=False):
        return (lambda: self.out), 0.0


@pytest.mark.parametrize("constant", [True, False])
def test_the_benchmark_flags_a_row_whose_output_is_constant(constant, tmp_path):
    import torch

    from benchmarks import run
    from benchmarks.goals import evaluate_goals
    from benchmarks.workloads import Workload, WorkloadInstance
    from superopt.measure.timing import TimingConfig

    rng = np.random.default_rng(0)
    y = np.zeros((1, 10), np.float32) if constant else rng.standard_normal((1, 10)).astype(np.float32)

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.from_numpy(y.copy())

    x = torch.ones(1, 3)
    inst = WorkloadInstance("row", Model(), (x,), lambda: b"", y.astype(np.float64))
    systems = [_Fixed("onnxruntime", y), _Fixed("openvino", y + np.float32(1e-3)), _Fixed("superopt", y)]
    cfg = TimingConfig(warmup_calls=1, rounds=2, min_sample_s=0.001)
    res = run.run_workload(Workload("row", lambda: inst), systems, True, cfg, lambda s: None)
    assert res["systems"]["openvino"]["err_vs_onnxruntime"] == pytest.approx(1e-3, rel=1e-2)
    report = {"workloads": [res], "machine": {"sgemm": {"median_gflops": 1.0}}}
    goals = [g for g in evaluate_goals(report) if g["workload"] == "row"]
    if constant:
        assert res["output_flag"] == "all zeros" and res["systems"]["superopt"]["output_flag"] == "all zeros"
        assert not any(g["met"] for g in goals)  # however fast superopt is here, it is no win
    else:
        assert res["output_flag"] is None and res["systems"]["superopt"]["output_flag"] is None
    assert res["superopt_vs_openvino"] > 0 and res["superopt_vs_onnxruntime"] > 0
    report.update(date="2026-01-01T00:00:00", quick=True, timing={}, versions={}, skipped_systems={},
                  main_systems=["eager", "onnxruntime", "openvino", "superopt"])
    report["machine"].update(cpu_model="Test CPU", logical_cpus=2, threads=2, sgemm={"n": 8, "median_gflops": 1.0,
                             "best_gflops": 1.0}, sgemm_end={"median_gflops": 1.0}, loadavg_start=[0], loadavg_end=[0])
    run.write_markdown(str(tmp_path / "r.md"), report)
    text = (tmp_path / "r.md").read_text()
    assert ("| row **FLAGGED: all zeros** |" in text) == constant
    assert "superopt / openvino" in text
    if constant:  # two runs' rows merge into one report, flags kept
        import json

        for k in (1, 2):
            (tmp_path / f"r{k}.json").write_text(json.dumps(report))
        assert run.merge_reports([str(tmp_path / "r1.json"), str(tmp_path / "r2.json")], str(tmp_path), "merged") == 0
        merged = (tmp_path / "merged.md").read_text()
        assert merged.count("| row **FLAGGED: all zeros** |") == 2 and "rows merged from 2 runs" in merged
