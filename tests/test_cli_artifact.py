"""superopt optimize -o OUT, run, explain, bench, superopt.load: artifacts, JSON output and exit codes."""

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import superopt
from superopt.cli import EXIT_INTERNAL, EXIT_USAGE, EXIT_USER_ERROR, EXIT_VERIFICATION, main


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w, bias])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    p = tmp_path_factory.mktemp("model") / "mlp.onnx"
    onnx.save(m, str(p))
    return p


@pytest.fixture(scope="module")
def artifact(model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "OUT"
    assert main(["optimize", str(model_path), "-o", str(out), "--threads", "1", "--no-cost-model", "--no-db"]) == 0
    return out


def test_optimize_writes_a_complete_artifact(artifact, capsys):
    names = {p.name for p in artifact.iterdir()}
    assert {"manifest.json", "report.md", "report.json", "report.png", "optimized.onnx", "kernels"} <= names
    opt = onnx.load(str(artifact / "optimized.onnx"))
    onnx.checker.check_model(opt, full_check=True)
    assert any(n.domain == "ai.superopt" and n.op_type == "Kernel" for n in opt.graph.node)
    report = json.loads((artifact / "report.json").read_text())
    assert set(report["latency_ms"]) >= {"superopt", "onnxruntime"} and report["max_error"] < 1e-4
    assert "| superopt |" in (artifact / "report.md").read_text()
    assert not [p for p in artifact.parent.iterdir() if p.name.endswith(".partial")]


def test_run_matches_onnxruntime_on_given_inputs(artifact, model_path, tmp_path, capsys):
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["run", str(artifact), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npz"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = np.load(tmp_path / "o.npz")
    (want,) = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[list(doc["outputs"])[0]], want, rtol=1e-5, atol=1e-6)


def test_load_in_a_fresh_process_gives_the_same_outputs(artifact, tmp_path):
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = (f"import numpy as np, superopt; p = superopt.load({str(artifact)!r}); "
            f"np.save({str(tmp_path / 'y.npy')!r}, p(np.load({str(tmp_path / 'x.npy')!r}))[0])")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), superopt.load(artifact)(x)[0])


def test_save_and_load_through_the_api(model_path, tmp_path):
    prog = superopt.optimize(str(model_path), superopt.OptimizeConfig(threads=1, cost_model=None))
    prog.save(tmp_path / "saved")
    x = np.ones((4, 16), np.float32)
    again = superopt.load(tmp_path / "saved")
    np.testing.assert_array_equal(again(x)[0], prog(x)[0])
    assert again.report.max_error == prog.report.max_error and again.input_names == prog.input_names


def test_explain_and_bench_print_json(artifact, capsys):
    assert main(["explain", str(artifact), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kernels"] and all("trace" in k for k in doc["kernels"])
    assert "fuse_elementwise_into_producer" in doc["rewrites"]  # the graph search's rewrites, in order
    assert {k["schedule_source"] for k in doc["kernels"]} == {"default"}  # --no-db --no-cost-model
    assert main(["bench", str(artifact), "--rounds", "2", "--threads", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["latency_ms"]["superopt"] > 0 and "onnxruntime" in doc["speedup_vs"]


def test_exit_codes(artifact, model_path, tmp_path, capsys, monkeypatch):
    assert main(["run", str(tmp_path / "missing")]) == EXIT_USER_ERROR
    assert main(["optimize", str(tmp_path / "missing.onnx")]) == EXIT_USER_ERROR
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    assert main(["optimize", str(bad)]) == EXIT_USER_ERROR
    assert main(["optimize", str(model_path), "--dim", "batch"]) == EXIT_USAGE
    with pytest.raises(SystemExit) as e:
        main(["optimize"])  # argparse: a missing argument
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "error" in err

    import superopt.api as api

    monkeypatch.setattr(api, "check_program", lambda *a, **k: 1.0)
    assert main(["optimize", str(model_path), "--no-cost-model", "--no-db", "--threads", "1",
                 "--no-program-cache"]) == EXIT_VERIFICATION
    assert "verification failed" in capsys.readouterr().err
    monkeypatch.undo()

    import superopt.cli_artifact as ca

    monkeypatch.setattr(ca, "read_manifest", None, raising=False)
    monkeypatch.setattr("superopt.artifact.read_manifest", lambda p: (_ for _ in ()).throw(KeyError("boom")))
    assert main(["explain", str(artifact)]) == EXIT_INTERNAL
    line = capsys.readouterr().err.strip()
    assert line.startswith("superopt explain: internal error: KeyError") and "\n" not in line


def test_bad_budget_trials_and_target_are_clear_usage_errors(model_path, capsys):
    for argv, needle in ((["--budget", "soon"], "bad --budget 'soon'"), (["--budget", "0s"], "must be positive"),
                         (["--trials", "0"], "bad --trials 0"), (["--threads", "0"], "bad --threads 0")):
        assert main(["optimize", str(model_path), "--no-db", *argv]) == EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err
    with pytest.raises(SystemExit) as e:
        main(["optimize", str(model_path), "--target", "tpu"])
    assert e.value.code == EXIT_USAGE and "invalid choice: 'tpu'" in capsys.readouterr().err


def test_target_cuda_without_a_gpu_names_the_missing_piece(model_path, capsys):
    assert main(["optimize", str(model_path), "--target", "cuda", "--no-db"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert err.startswith("superopt optimize: error:") and "\n" not in err
    assert any(w in err.lower() for w in ("cuda", "gpu", "driver"))


def test_optimize_with_a_trial_budget_searches_schedules_and_records_them(model_path, tmp_path, capsys):
    from search.schedule.database import TuningDatabase

    db = tmp_path / "tuning.jsonl"
    assert main(["optimize", str(model_path), "--trials", "6", "--seed", "3", "--db", str(db), "--threads", "1",
                 "--no-cost-model", "--json", "--repeat", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tune = doc["report"]["tune"]
    assert tune["measured"] >= 1 and tune["stop_reason"]
    assert "schedule search" in doc["report"]["stop_reason"] and doc["report"]["max_error"] < 1e-4
    assert len(TuningDatabase(db).records()) >= tune["measured"]
    # a second optimize reads the database the search wrote; its artifact says where each schedule came from
    assert main(["optimize", str(model_path), "--db", str(db), "--threads", "1", "--no-cost-model",
                 "-o", str(tmp_path / "OUT")]) == 0
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "OUT"), "--json"]) == 0
    assert "database" in {k["schedule_source"] for k in json.loads(capsys.readouterr().out)["kernels"]}


def test_run_rejects_wrong_shape_dtype_and_names_and_propagates_nan(artifact, model_path, tmp_path, capsys):
    cases = {"shape": {"x": np.zeros((3, 16), np.float32)}, "dtype": {"x": np.zeros((4, 16), np.int64)},
             "name": {"y": np.zeros((4, 16), np.float32)}}
    needles = {"shape": "has shape (3, 16)", "dtype": "has dtype int64", "name": "lack x"}
    for what, arrays in cases.items():
        np.savez(tmp_path / f"{what}.npz", **arrays)
        assert main(["run", str(artifact), "--inputs", str(tmp_path / f"{what}.npz"),
                     "--output", str(tmp_path / f"{what}_out.npz")]) == EXIT_USER_ERROR
        err = capsys.readouterr().err.strip()
        assert needles[what] in err and "\n" not in err
        assert not (tmp_path / f"{what}_out.npz").exists()
    x = np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
    np.savez(tmp_path / "special.npz", x=x)
    assert main(["run", str(artifact), "--inputs", str(tmp_path / "special.npz"), "--output",
                 str(tmp_path / "special_out.npz")]) == 0
    got = np.load(tmp_path / "special_out.npz")
    (want,) = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[list(got.keys())[0]], want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_bench_times_openvino_beside_onnxruntime_and_checks_its_output(artifact, capsys):
    pytest.importorskip("openvino", reason="openvino is not installed (the optional 'bench' extra)")
    assert main(["bench", str(artifact), "--rounds", "2", "--threads", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["latency_ms"]["openvino"] > 0 and "openvino" in doc["speedup_vs"]
    errors = doc["err_vs_onnxruntime"]
    assert errors["onnxruntime"] == 0.0 and errors["openvino"] < 1e-5 and errors["superopt"] < 1e-5
    assert doc["output_flag"] is None and doc["not_run"] == {}


def test_bench_without_openvino_says_so_in_one_line_and_times_the_rest(artifact, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    assert main(["bench", str(artifact), "--rounds", "2", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == ["openvino is not installed (pip install 'superopt[bench]' or pip install openvino); "
                     "timing without it"]
    assert "openvino" not in captured.out and "onnxruntime" in captured.out
