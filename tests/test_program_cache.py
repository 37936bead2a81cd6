"""The program cache: a second optimize of the same ONNX model only loads its verified program; anything that
decides the program (model bytes, config, a corrupt entry) makes a miss that compiles and verifies again."""

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from superopt.api import OptimizeConfig, optimize
from superopt.ir.graph import DeferredConstant
from superopt.program_cache import program_key
from superopt.runtime.compiler import CompilerConfig


def _model(scale: float = 1.0) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((scale * rng.standard_normal((8, 3, 3, 3))).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.fixture
def setup(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(_model(), str(path))
    cfg = OptimizeConfig(threads=1, cost_model=None, compiler=CompilerConfig(cache_dir=tmp_path / "cache"))
    x = np.random.default_rng(5).standard_normal((1, 3, 10, 10)).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return path, cfg, x, want


def test_a_second_optimize_only_loads_the_verified_program(setup, monkeypatch):
    path, cfg, x, want = setup
    # (NCHW, where the conv's kernel packs its weight: in a blocked layout it may read it re-laid by the graph, as on
    # an 8-lane host)
    from dataclasses import replace

    cfg = replace(cfg, layout="nchw")
    cold = optimize(str(path), cfg)
    assert cold.report.kernels_compiled > 0 and "program cache" not in cold.report.stop_reason
    import superopt.runtime.kernel as kernel

    monkeypatch.setattr(kernel, "lower", lambda *a: pytest.fail("a cached program was lowered again"))
    warm = optimize(str(path), cfg)
    rep = warm.report
    assert "loaded from the program cache" in rep.stop_reason
    assert rep.kernels_compiled == 0 and rep.max_error == cold.report.max_error
    assert not {"load", "rewrite", "schedule", "verify"} & set(rep.phases)  # not even parsed: only loaded
    assert abs(sum(rep.phases.values()) - rep.total_s) <= 0.1 * rep.total_s
    np.testing.assert_allclose(warm(x)[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(warm(x)[0], cold(x)[0])
    # the weight its kernel reads packed is stored once, packed, and a warm run never unpacks it
    held = [c for name, c in warm.graph.constants if name in warm.executor.packed_only]
    assert held and all(isinstance(c, DeferredConstant) and not c.computed for c in held)


def test_what_decides_the_program_is_in_the_key(setup, tmp_path):
    path, cfg, _, _ = setup
    from dataclasses import replace

    key = program_key(str(path), None, cfg)
    assert key == program_key(str(path), None, cfg) == program_key(_model(), None, cfg)
    other = tmp_path / "other.onnx"
    onnx.save(_model(scale=2.0), str(other))
    assert program_key(str(other), None, cfg) != key  # other weights
    assert program_key(str(path), None, replace(cfg, layout="nchw")) != key
    assert program_key(str(path), None, replace(cfg, threads=2)) != key
    assert program_key(str(path), None, replace(cfg, compiler=replace(cfg.compiler, flags=("-O2",)))) != key
    assert program_key(str(path), {"x": (1, 3, 10, 10)}, cfg) != key
    assert program_key(str(path), None, replace(cfg, tune_trials=5)) is None  # a search: never cached
    assert program_key(str(path), None, replace(cfg, verify=False)) is None  # only verified programs are kept


def test_a_corrupt_entry_is_compiled_and_verified_again(setup):
    path, cfg, x, want = setup
    optimize(str(path), cfg)
    entry = cfg.compiler.cache_dir / "programs" / program_key(str(path), None, cfg)
    lib = next((entry / "kernels").glob("*.so"))
    lib.write_bytes(lib.read_bytes()[: 100])  # a truncated library
    again = optimize(str(path), cfg)
    assert "program cache" not in again.report.stop_reason and again.report.max_error is not None
    np.testing.assert_allclose(again(x)[0], want, rtol=1e-4, atol=1e-5)
    assert "program cache" in optimize(str(path), cfg).report.stop_reason  # the entry was written anew


def test_a_program_that_fails_verification_leaves_no_entry(setup, monkeypatch):
    # the entry is written while the verification runs: a failed one leaves nothing behind, not even a part
    path, cfg, _, _ = setup
    import superopt.api as api
    from superopt.verification import VerificationError

    def fails(*a, **k):
        raise VerificationError("compiled program differs from the reference: relative error 1 > 0.001")

    monkeypatch.setattr(api, "check_program", fails)
    with pytest.raises(VerificationError):
        optimize(str(path), cfg)
    for t in threading.enumerate():  # (a writer still running would leave its part after the check below)
        if t.name.startswith("superopt-cache"):
            t.join()
    programs = cfg.compiler.cache_dir / "programs"
    assert not programs.exists() or not any(programs.iterdir())
    monkeypatch.undo()
    assert "program cache" not in optimize(str(path), cfg).report.stop_reason
    assert "program cache" in optimize(str(path), cfg).report.stop_reason


def test_no_program_cache_compiles_every_time(setup):
    path, cfg, _, _ = setup
    from dataclasses import replace

    off = replace(cfg, program_cache=False)
    optimize(str(path), off)
    assert "program cache" not in optimize(str(path), off).report.stop_reason
    assert not (cfg.compiler.cache_dir / "programs").exists()


def test_the_least_recently_used_entries_are_evicted_past_the_size_cap(tmp_path):
    import os

    from superopt.program_cache import evict

    for i, size in enumerate((300, 300, 300)):
        d = tmp_path / f"e{i}"
        d.mkdir()
        (d / "program.pkl").write_bytes(b"x" * size)
        os.utime(d, (1000 + i, 1000 + i))
    os.utime(tmp_path / "e0", (2000, 2000))  # e0 used last
    removed = evict(tmp_path, keep=tmp_path / "e2", max_bytes=700)
    assert removed == [tmp_path / "e1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e0", "e2"]
