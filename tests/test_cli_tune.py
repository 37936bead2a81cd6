"""``superopt tune`` / ``superopt optimize --db``: argument errors are one line, budgets parse, a second
tune of the same model measures nothing and says so, the JSON report has its shape, and optimize
takes its schedules from the database."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from superopt.cli import main, parse_shape, parse_time, tune_summary

MM = "C[i,j] += A[i,k] * B[k,j]"
MM_RENAMED = "Out[r,c] += X[r,q] * Y[q,c]"


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("10m", 600), ("1h", 3600), ("1.5h", 5400), ("1h30m", 5400),
                                          ("45", 45), (" 2 m ", 120), ("0.5s", 0.5), ("10M", 600)])
def test_time_parsing(text, seconds):
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10x", "m", "-5s", "0s", "1 2", "1e3", "10 minutes", "1h 30"])
def test_bad_time(text):
    with pytest.raises(ValueError, match="bad --time"):
        parse_time(text)


def test_shape_parsing():
    assert parse_shape("A=64x128") == ("A", (64, 128))
    assert parse_shape("x_1=3") == ("x_1", (3,))
    assert parse_shape("s=") == ("s", ())
    for bad in ("A64", "=3", "A=3xq", "A=0x3", "A=3x", "1A=3", "A=-2"):
        with pytest.raises(ValueError, match="bad --shape"):
            parse_shape(bad)


def _err(capsys, argv, code):
    assert main(argv) == code
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"superopt {argv[0]}: error: "), cap.err
    assert cap.out == ""
    return lines[0]


def test_argument_errors_are_one_line(capsys, tmp_path):
    db = ["--db", str(tmp_path / "db.jsonl")]
    op = ["--op", MM, "--shape", "A=4x8", "--shape", "B=8x4"]
    assert "bad --time '10x'" in _err(capsys, ["tune", *op, "--time", "10x", *db], 2)
    assert "bad --shape 'A=4xq'" in _err(capsys, ["tune", "--op", MM, "--shape", "A=4xq", *db], 2)
    assert "no such model file" in _err(capsys, ["tune", str(tmp_path / "missing.onnx"), *db], 1)
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf" * 10)
    msg = _err(capsys, ["tune", str(bad), *db], 1)
    assert "ONNX" in msg or "onnx" in msg
    assert "one of them" in _err(capsys, ["tune", *db], 2)
    assert "one of them" in _err(capsys, ["tune", str(bad), *op, *db], 2)
    assert "--shape goes with --op" in _err(capsys, ["tune", str(bad), "--shape", "A=1", *db], 2)
    assert "--op needs the shape" in _err(capsys, ["tune", "--op", MM, *db], 2)
    assert "unknown tensor" in _err(capsys, ["tune", "--op", MM, "--shape", "A=4x8", *db], 1)  # op errors: line 1
    assert "bad --trials" in _err(capsys, ["tune", *op, "--trials", "-1", *db], 2)
    assert "no such model file" in _err(capsys, ["optimize", str(tmp_path / "missing.onnx")], 1)
    assert "no such tuning database" in _err(capsys, ["optimize", str(bad), "--db", str(tmp_path / "no.jsonl")], 1)
    assert not (tmp_path / "db.jsonl").exists()  # nothing was measured or written


def _kernel(nodes, default_s, best_s, flops=2_000_000, measured=4, from_db=False):
    return SimpleNamespace(nodes=nodes, workload_key="k", flops=flops, default_s=default_s, best_s=best_s,
                           best_trace=(), measured=measured, from_database=from_db, stop_reason="budget")


def test_summary_weights_kernels_by_their_nodes():
    report = SimpleNamespace(kernels=[_kernel(["a", "b"], 2e-3, 1e-3), _kernel(["c"], 4e-3, 4e-3, measured=0)],
                             measured=4, elapsed_s=1.0, stop_reason="trial budget spent", in_graph=None)
    s = tune_summary(report, peak_gflops=100.0)
    assert s["total_default_ms"] == pytest.approx(8.0) and s["total_best_ms"] == pytest.approx(6.0)
    a, c = s["kernels"]
    assert a["speedup"] == pytest.approx(2.0) and a["gflops"] == pytest.approx(2.0)
    assert a["fma_fraction"] == pytest.approx(0.02) and c["measured"] == 0
    assert not s["all_from_database"]
    assert tune_summary(report, None)["kernels"][0]["fma_fraction"] is None


def _onnx_model(path):
    """A matmul with a constant weight, then a relu: small enough to tune in a few trials."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 24)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 24])], initializer=[w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_second_tune_measures_nothing_and_optimize_uses_the_database(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _onnx_model(tmp_path / "mlp.onnx")
    argv = ["tune", model, "--trials", "4", "--threads", "1", "--no-progress"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "nothing to measure" not in first and "trial budget spent" in first
    assert (tmp_path / "superopt_tuning.jsonl").exists()  # the default database, in the current directory
    n_records = len((tmp_path / "superopt_tuning.jsonl").read_text().splitlines())
    assert n_records == 4
    assert main(argv + ["--time", "1h"]) == 0
    second = capsys.readouterr().out
    assert "nothing to measure: all 1 kernels already tuned for this target" in second
    assert len((tmp_path / "superopt_tuning.jsonl").read_text().splitlines()) == n_records
    # optimize finds the default database by itself, --no-db ignores it
    assert main(["optimize", model, "--threads", "1", "--repeat", "2"]) == 0
    assert "1 of 1 kernels from the tuning database" in capsys.readouterr().out
    assert main(["optimize", model, "--threads", "1", "--repeat", "2", "--no-db"]) == 0
    assert "default schedules" in capsys.readouterr().out


def test_json_report_and_rename_invariance(capsys, tmp_path):
    db = str(tmp_path / "t.jsonl")
    common = ["--trials", "4", "--threads", "1", "--no-progress", "--db", db, "--json"]
    assert main(["tune", "--op", MM, "--shape", "A=16x32", "--shape", "B=32x8", *common]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"] == 4 and out["target"]["threads"] == 1 and out["database"] == db
    (k,) = out["kernels"]
    assert set(k) >= {"nodes", "default_ms", "best_ms", "gflops", "fma_fraction", "measured", "speedup", "flops"}
    assert k["measured"] == 4 and k["flops"] == 2 * 16 * 32 * 8 and not k["from_database"]
    assert k["best_ms"] > 0 and k["gflops"] == pytest.approx(k["flops"] / k["best_ms"] / 1e6)
    peak = out["fma_peak_gflops"]
    assert peak is None or (peak > 0 and k["fma_fraction"] == pytest.approx(k["gflops"] / peak))
    # the same op in other names is the same workload: nothing to measure
    assert main(["tune", "--op", MM_RENAMED, "--shape", "X=16x32", "--shape", "Y=32x8", *common]) == 0
    cap = capsys.readouterr()
    again = json.loads(cap.out)
    assert again["measured"] == 0 and again["all_from_database"] and again["kernels"][0]["measured"] == 0
    assert again["kernels"][0]["best_ms"] == k["best_ms"] and "nothing to measure" in cap.err


def _tiny_cost_model(path):
    """A cost model trained on a few sampled schedules of a small matmul, times made up (a real file)."""
    import random

    from costmodel.base import Candidate
    from costmodel.xgb import XGBConfig, XGBModel
    from superopt.lang import compile_op
    from superopt.schedule.space import ScheduleSpace
    from superopt.target import host_target

    target = host_target(1)
    cands = []
    for m in (16, 24):
        c = compile_op(MM, {"A": (m, 32), "B": (32, 8)})
        space = ScheduleSpace(c, target, frozenset({"B"}))
        rng = random.Random(m)
        for _ in range(12):
            cands.append(Candidate(c, space.trace(space.sample(rng)), target, frozenset({"B"})))
    model = XGBModel(XGBConfig(rounds=5))
    model.fit(cands, [1e-3 * (1 + i % 5) for i in range(len(cands))])
    model.save(path)
    return str(path)


def test_zero_measurement_tune_and_cost_model_flags(capsys, tmp_path):
    model = _tiny_cost_model(tmp_path / "cm.json")
    db = tmp_path / "db.jsonl"
    op = ["--op", MM, "--shape", "A=16x32", "--shape", "B=32x8", "--threads", "1", "--db", str(db)]
    assert main(["tune", *op, "--trials", "0", "--cost-model", model, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"] == 0 and len(out["kernels"]) == 1
    (k,) = out["kernels"]
    assert k["candidates"] > 0 and (k["default"] or k["predicted_gain"] > 0)
    assert not db.exists()  # nothing measured, nothing recorded
    msg = _err(capsys, ["tune", *op, "--trials", "0", "--no-cost-model"], 2)
    assert "--trials 0 picks schedules with a trained cost model" in msg
    assert "no such cost model file" in _err(capsys, ["tune", *op, "--cost-model", str(tmp_path / "no.json")], 1)
    (tmp_path / "junk.json").write_text("{}")
    assert "is not a superopt cost model" in _err(capsys, ["tune", *op, "--trials", "0", "--cost-model",
                                                          str(tmp_path / "junk.json")], 1)
    onnx_model = _onnx_model(tmp_path / "mlp.onnx")
    assert main(["optimize", onnx_model, "--threads", "1", "--repeat", "2", "--no-db", "--cost-model", model]) == 0
    assert "picked by the cost model with no measurement" in capsys.readouterr().out
    assert main(["optimize", onnx_model, "--threads", "1", "--repeat", "2", "--no-db", "--no-cost-model"]) == 0
    assert "default schedules (no tuning database, no cost model)" in capsys.readouterr().out


def test_the_tuned_schedule_of_an_exported_model_is_the_one_optimize_runs(capsys, tmp_path, monkeypatch):
    """The capsule votes with the weight as an input (reshapes and transposes around a strided conv): tune and
    optimize rewrite the graph alike, so optimize's conv kernel runs the database's best record, and matches
    onnxruntime."""
    import onnxruntime as ort
    import torch

    from benchmarks.workloads import _conv_weight, capsule_weight_input_onnx
    from search.schedule.database import TuningDatabase, node_workload_key
    from superopt.api import OptimizeConfig, optimize

    monkeypatch.chdir(tmp_path)
    g = torch.Generator().manual_seed(0)
    P, W = torch.randn(2, 9, 9, 8, 4, 4, generator=g), torch.randn(3, 3, 8, 8, 4, 4, generator=g) * 0.1
    model = tmp_path / "caps.onnx"
    model.write_bytes(capsule_weight_input_onnx(P, W))
    assert main(["tune", str(model), "--trials", "4", "--threads", "1", "--no-progress"]) == 0
    capsys.readouterr()
    db = tmp_path / "superopt_tuning.jsonl"
    prog = optimize(str(model), OptimizeConfig(threads=1, database=db, program_cache=False))
    (conv,) = [n for n in prog.graph.nodes if not n.is_extern]
    best = TuningDatabase(db).best(node_workload_key(prog.graph, conv.name), prog.executor.target)
    assert best is not None and prog.report.schedule_source[conv.name] == "database"
    assert list(prog.executor.traces[conv.name]) == list(best.trace)
    Wo = _conv_weight(W).permute(0, 2, 3, 1).contiguous().numpy()
    sess = ort.InferenceSession(model.read_bytes(), providers=["CPUExecutionProvider"])
    want = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], [P.numpy(), Wo])))[0]
    np.testing.assert_allclose(prog(P.numpy(), Wo)[0], want, rtol=1e-4, atol=1e-4)
