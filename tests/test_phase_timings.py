"""Phase timings of optimize: the report and ``superopt optimize --json`` give seconds per phase that sum to
the total, and the number of distinct kernels the C compiler built."""

import json
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from superopt.api import OptimizeConfig, optimize
from superopt.cli import main
from superopt.phases import PhaseTimer
from superopt.runtime.compiler import CompilerConfig

PIPELINE = ("load", "rewrite", "schedule", "codegen", "compile", "build", "verify")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((0.3 * rng.standard_normal((8, 3, 3, 3))).astype(np.float32), "w")
    w2 = numpy_helper.from_array((0.3 * rng.standard_normal((8, 8, 3, 3))).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("Conv", ["r2", "w2"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c3", "r"], ["y"])]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])], [w, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    p = tmp_path_factory.mktemp("model") / "convs.onnx"
    onnx.save(m, str(p))
    return p


def test_nested_phases_are_charged_exclusively():
    timer = PhaseTimer()
    with timer.phase("build"):
        time.sleep(0.02)
        with timer.phase("compile"):
            time.sleep(0.3)
        time.sleep(0.02)
    timer.ordered()  # charges the time since the last phase ended to "other"
    assert set(timer.seconds) == {"build", "compile", "other"}
    assert timer.seconds["compile"] >= 0.3
    # the sleep inside compile is not counted twice (a loaded machine may oversleep, but not by 0.26 s)
    assert 0.04 <= timer.seconds["build"] < 0.3
    assert timer.seconds["other"] < 0.3
    assert timer.total_s == pytest.approx(sum(timer.seconds.values()))


def _check_phases(report: dict) -> None:
    phases = report["phases"]
    assert set(PIPELINE) <= set(phases), phases
    assert all(t >= 0 for t in phases.values())
    assert report["total_s"] > 0
    # the bookkeeping between phases is charged to "other", so the phases account for every second
    assert sum(phases.values()) == pytest.approx(report["total_s"], rel=1e-9), (phases, report["total_s"])


def test_report_phases_sum_to_the_total_and_count_the_kernels_compiled(model_path, tmp_path):
    cfg = OptimizeConfig(threads=1, cost_model=None, compiler=CompilerConfig(cache_dir=tmp_path / "cache"))
    cold = optimize(str(model_path), cfg)
    _check_phases(vars(cold.report))
    assert cold.report.kernels_compiled == cold.report.kernels > 0  # an empty cache: every kernel compiled
    text = str(cold.report)
    assert "kernels compiled" in text and "verify" in text
    x = np.random.default_rng(3).standard_normal((1, 3, 12, 12)).astype(np.float32)
    import onnxruntime as ort

    (want,) = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(cold(x)[0], want, rtol=1e-4, atol=1e-4)


def test_cli_json_carries_the_phase_timings(model_path, capsys):
    args = ["optimize", str(model_path), "--threads", "1", "--no-cost-model", "--no-db", "--json", "--repeat", "1"]
    assert main([*args, "--no-program-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _check_phases(doc["report"])
    assert isinstance(doc["report"]["kernels_compiled"], int)
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0  # loads the program the run before kept
    warm = json.loads(capsys.readouterr().out)["report"]
    assert "program cache" in warm["stop_reason"] and warm["kernels_compiled"] == 0
    assert abs(sum(warm["phases"].values()) - warm["total_s"]) <= 0.1 * warm["total_s"]
