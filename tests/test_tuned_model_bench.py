"""benchmarks/tuned_model.py's per-process mode: each system alone in a process of its own, in turn."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks import tuned_model


def _tiny_conv(path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 10, 10])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def test_per_process_rounds_time_every_system_alone_and_check_its_output(tmp_path, monkeypatch):
    path = tmp_path / "tiny.onnx"
    _tiny_conv(path)
    res = tuned_model.per_process(str(path), None, threads=1, rounds=2, runs=3)
    assert set(res["ms"]) == {"onnxruntime", "superopt_default"}  # no database: no tuned build
    assert all(len(v) == 2 and min(v) > 0 for v in res["ms_per_round"].values())
    assert res["ms"]["onnxruntime"] == float(np.median(res["ms_per_round"]["onnxruntime"]))
    # every child saved its output and it matches onnxruntime's
    assert res["max_abs_diff_vs_onnxruntime"]["superopt_default"] < 1e-4
    assert res["vs_onnxruntime"]["superopt_default"] == res["ms"]["onnxruntime"] / res["ms"]["superopt_default"]
    monkeypatch.setattr(tuned_model, "RESULTS", tmp_path / "results")
    from benchmarks.machine import describe_machine

    tuned_model.write({"model": "tiny", "when_utc": "now", "threads": 1, "kernels_from_database": "0 of 1",
                       "machine": describe_machine(1),
                       "tuned_vs_default": 1.0, "max_rel_error_vs_reference": 0.0, "max_abs_diff_vs_onnxruntime": 0.0,
                       "ms": {"superopt_tuned": 1.0, "superopt_default": 1.0, "onnxruntime": 1.0},
                       "per_process": res})
    md = (tmp_path / "results" / "tuned_tiny.md").read_text()
    assert "Machine: " in md and "1 thread(s)" in md  # the machine it ran on, in the header
    assert "alone in its own process" in md and "| superopt_default |" in md.split("own process")[1]
