"""Weights are held as few times as the pipeline needs: an initializer becomes a constant with one copy, the
float64 reference converts a float32 weight a slice at a time, and a saved program's weights are read-only maps
of its files (a warm optimize neither copies nor packs them again)."""

import mmap
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from superopt.api import OptimizeConfig, optimize
from superopt.builder import GraphBuilder
from superopt.interp import reference
from superopt.interp.magnitude import reference_with_magnitudes
from superopt.ir.graph import Constant
from superopt.lang import compile_op
from superopt.runtime.array_file import map_arrays, write_arrays
from superopt.runtime.compiler import CompilerConfig

K, N = 512, 1024  # a 2 MB float32 weight


def _gemm_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_an_initializer_becomes_a_constant_with_one_copy():
    from superopt.frontends.onnx_frontend import import_onnx_model

    model = _gemm_model()
    tracemalloc.start()
    try:
        im = import_onnx_model(model)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    weight = K * N * 4
    # the raw bytes read from the protobuf and the aligned constant; not also astype copies and a tobytes digest
    assert peak < 2.5 * weight, peak / weight
    w = im.graph.constant["w"].array
    np.testing.assert_array_equal(w, numpy_helper.to_array(model.graph.initializer[0]))
    assert not w.flags.writeable and w.ctypes.data % 64 == 0


def test_the_float64_reference_converts_a_float32_weight_a_slice_at_a_time(monkeypatch):
    c = compile_op("y[i, n] += x[i, k] * w[k, n]", {"x": (4, K), "w": (K, N)})
    b = GraphBuilder("fc")
    x = b.input("x", (4, K))
    rng = np.random.default_rng(1)
    w_arr = rng.standard_normal((K, N)).astype(np.float32)
    w = b.constant(w_arr, "w")
    (y,) = b.add_compute(c, [x, w], "fc")
    g = b.build([y])
    feed = {"x": rng.standard_normal((4, K))}
    monkeypatch.setattr(reference, "CAST_CHUNK_BYTES", 64 << 10)
    tracemalloc.start()
    try:
        ref, mags = reference_with_magnitudes(g, feed)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * w_arr.nbytes, peak / w_arr.nbytes  # not the weight in float64 (2x), nor its |.| (2x more)
    want = feed["x"] @ w_arr.astype(np.float64)
    np.testing.assert_allclose(ref[y], want, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(reference, "CAST_CHUNK_BYTES", 1 << 40)  # whole: the same magnitudes
    ref_whole, mags_whole = reference_with_magnitudes(g, feed)
    np.testing.assert_allclose(mags[y], mags_whole[y], rtol=1e-12)
    np.testing.assert_allclose(ref[y], ref_whole[y], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("expr", ["ik,kn->in", "kn,ik->in", "ik,nk->in", "ki,kn->in"])
def test_a_sliced_einsum_equals_the_whole_one(expr, monkeypatch):
    rng = np.random.default_rng(2)
    subs, out = expr.split("->")
    a_sub, b_sub = subs.split(",")
    ext = {"i": 3, "k": 300, "n": 200}
    a = rng.standard_normal([ext[c] for c in a_sub])
    w = rng.standard_normal([ext[c] for c in b_sub]).astype(np.float32)  # the operand to convert, sliced on its axis 0
    monkeypatch.setattr(reference, "CAST_CHUNK_BYTES", 4096)
    for absolute in (False, True):
        got = reference._chunked_einsum(expr, [a, w], [a_sub, b_sub], out, np.dtype(np.float64), True, absolute)
        f = np.abs if absolute else (lambda v: v)
        want = np.einsum(expr, f(a), f(w.astype(np.float64)))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


def test_a_read_only_map_is_a_constant_without_a_copy(tmp_path):
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(2.5), np.arange(5, dtype=np.int64)]
    index, sha = write_arrays(tmp_path / "a.bin", arrays)
    assert all(e["offset"] % 64 == 0 for e in index)
    import hashlib

    assert sha == hashlib.sha256((tmp_path / "a.bin").read_bytes()).hexdigest()
    for a, v in zip(arrays, map_arrays(tmp_path / "a.bin", index), strict=True):
        np.testing.assert_array_equal(a, v)
        c = Constant(v)
        assert c.array is v or np.shares_memory(c.array, v)  # taken as it is
        with pytest.raises(ValueError):
            c.array[...] = 0
    with open(tmp_path / "a.bin", "r+b") as f:  # a writable (copy-on-write) map is copied: it could change
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        v = np.frombuffer(mm, np.float32, 12).reshape(3, 4)
        assert not np.shares_memory(Constant(v).array, v)
    with pytest.raises(ValueError, match="shorter"):
        map_arrays(tmp_path / "a.bin", [{"offset": 1 << 20, "dtype": "<f4", "shape": [4]}])


def test_a_warm_optimize_maps_the_weights_and_packs_nothing(tmp_path, monkeypatch):
    import superopt.artifact as artifact
    import superopt.runtime.kernel as kernel
    from superopt import program_cache

    path = tmp_path / "fc.onnx"
    onnx.save(_gemm_model(), str(path))
    cfg = OptimizeConfig(threads=1, cost_model=None, compiler=CompilerConfig(cache_dir=tmp_path / "cache"))
    x = np.random.default_rng(3).standard_normal((4, K)).astype(np.float32)
    cold = optimize(str(path), cfg)
    want = cold(x)[0]
    monkeypatch.setattr(program_cache, "RACY_NS", 0)  # (the file was written just now)
    program_cache.program_key(str(path), None, cfg)  # its digest remembered
    monkeypatch.setattr(kernel.CompiledKernel, "pack", lambda *a: pytest.fail("a saved packed weight was packed again"))
    monkeypatch.setattr(artifact, "_sha", lambda p: pytest.fail(f"{p.name} was checksummed again"))
    monkeypatch.setattr(program_cache, "file_digest", lambda p: pytest.fail("the model file was hashed again"))
    warm = optimize(str(path), cfg)
    assert "loaded from the program cache" in warm.report.stop_reason
    np.testing.assert_array_equal(warm(x)[0], want)
    base = next(c for _, c in warm.graph.constants if c.array.size == K * N).array
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)  # a view of the saved file
    packed = warm.executor.packed_constants()
    assert all(not a.flags.writeable for a in packed.values())  # the saved packed copies, mapped


def test_an_edited_entry_or_model_is_checked_in_full_again(tmp_path, monkeypatch):
    from superopt import program_cache

    path = tmp_path / "fc.onnx"
    onnx.save(_gemm_model(), str(path))
    cfg = OptimizeConfig(threads=1, cost_model=None, compiler=CompilerConfig(cache_dir=tmp_path / "cache"))
    monkeypatch.setattr(program_cache, "RACY_NS", 0)
    key = program_cache.program_key(str(path), None, cfg)
    optimize(str(path), cfg)
    entry = program_cache.entry_dir(cfg.compiler.cache_dir, key)
    packed = entry / "packed.bin"
    data = bytearray(packed.read_bytes())
    data[100] ^= 0xFF  # a flipped bit in a packed weight, the size unchanged
    packed.write_bytes(bytes(data))
    with pytest.raises(program_cache.ArtifactError, match="packed.bin"):
        program_cache.check_entry(entry)
    again = optimize(str(path), cfg)  # a miss: compiled and verified again
    assert "program cache" not in again.report.stop_reason and again.report.max_error is not None
    m = _gemm_model()
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones(N, np.float32), "b"))
    onnx.save(m, str(path))  # the model edited in place: another digest, not the remembered one
    assert program_cache.program_key(str(path), None, cfg) != key


def test_the_shipped_cost_model_scores_as_xgboost_does_without_importing_it():
    import subprocess
    import sys

    import xgboost as xgb

    from costmodel.features import FEATURE_NAMES
    from costmodel.tree_ensemble import TreeEnsemble
    from costmodel.xgb import load_pretrained

    model = load_pretrained("cpu")
    if model is None:
        pytest.skip("no shipped model")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, len(FEATURE_NAMES))) * rng.choice([0.1, 1.0, 10.0, 1e3], size=(1, len(FEATURE_NAMES)))
    x[rng.random(x.shape) < 0.05] = np.nan  # missing features take each node's default branch
    booster = xgb.Booster()
    booster.load_model(bytearray(model.base))
    want = booster.predict(xgb.DMatrix(x, missing=np.nan, feature_names=list(FEATURE_NAMES)))
    got = TreeEnsemble.from_ubjson(model.base).predict(x)
    np.testing.assert_array_equal(got, want)  # the same float32 sums, in the same order
    code = ("import sys; from costmodel.xgb import load_pretrained; m = load_pretrained('cpu'); "
            "import numpy as np; from costmodel.features import FEATURE_NAMES; "
            "m._ensemble.predict(np.zeros((2, len(FEATURE_NAMES)))); print('xgboost' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_file_digest_is_remembered_by_identity_and_not_while_the_file_may_still_change(tmp_path, monkeypatch):
    import hashlib
    import json
    import time

    from superopt import program_cache

    f, memo = tmp_path / "m.onnx", tmp_path / "memo.json"
    f.write_bytes(b"weights" * 1000)
    monkeypatch.setattr(program_cache, "RACY_NS", 1 << 62)  # written just now: not remembered
    assert program_cache.remembered_digest(f, memo) == hashlib.sha256(f.read_bytes()).hexdigest()
    assert not memo.exists()
    monkeypatch.setattr(program_cache, "RACY_NS", 0)
    first = program_cache.remembered_digest(f, memo)
    assert json.loads(memo.read_text())[str(f.resolve())][1] == first
    time.sleep(0.05)  # (past a tick of the kernel's coarse file clock: RACY_NS is off here)
    f.write_bytes(b"Weights" * 1000)  # same size, new content: a new change time, so hashed again
    assert program_cache.remembered_digest(f, memo) == hashlib.sha256(f.read_bytes()).hexdigest() != first


def test_a_convolutions_window_view_is_laid_out_a_slice_at_a_time(monkeypatch):
    from superopt.interp.reference import evaluate_compute

    c = compile_op("y[o, h, w] += x[c, h + kh, w + kw] * k[o, c, kh, kw]", {"x": (16, 66, 66), "k": (16, 16, 3, 3)})
    rng = np.random.default_rng(5)
    x, k = rng.standard_normal((16, 66, 66)), rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    window = 16 * 9 * 64 * 64 * 8  # the window view laid out contiguously in float64: nine times the input
    monkeypatch.setattr(reference, "CAST_CHUNK_BYTES", window // 16)
    tracemalloc.start()
    try:
        (got,) = evaluate_compute(c, [x, k], np.float64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < window / 2, peak / window
    monkeypatch.setattr(reference, "CAST_CHUNK_BYTES", 1 << 40)
    (whole,) = evaluate_compute(c, [x, k], np.float64)
    np.testing.assert_array_equal(got, whole)  # split on an output axis: every element sums the same terms


def test_optimize_keeps_no_graph_of_the_rewrite_alive_after_it_returns(tmp_path):
    """The graphs the rewrite search made (each with its constants: the weights in every layout it tried) are
    garbage once the program is built; only the program's own graph stays (a cache that held the last graphs
    strongly kept a model's weights alive several times over)."""
    import gc

    from superopt.ir.graph import Graph

    gc.collect()
    before = {id(o) for o in gc.get_objects() if type(o) is Graph}
    path = tmp_path / "fc.onnx"
    onnx.save(_gemm_model(), str(path))
    prog = optimize(str(path), OptimizeConfig(threads=1, compiler=CompilerConfig(cache_dir=tmp_path / "cache")))
    gc.collect()
    new = [o for o in gc.get_objects() if type(o) is Graph and id(o) not in before]
    assert new and all(g is prog.graph for g in new), f"{len(new)} new graphs alive, where the program's own is the one expected"


def test_written_arrays_map_back_equal_and_the_returned_hash_is_the_files(tmp_path):
    """write_arrays hashes on another thread while it writes: the hash it returns is the sha256 of the file's
    bytes (padding included), and every array maps back equal, on its aligned offset."""
    import hashlib

    from superopt.runtime.buffers import ALIGN

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((300, 301)).astype(np.float32), np.arange(7, dtype=np.int64),
              np.empty((0, 3), np.float32), rng.standard_normal((5, 64, 64)).astype(np.float64)]
    index, sha = write_arrays(tmp_path / "w.bin", arrays)
    assert sha == hashlib.sha256((tmp_path / "w.bin").read_bytes()).hexdigest()
    for a, b, e in zip(arrays, map_arrays(tmp_path / "w.bin", index), index, strict=True):
        assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
        assert e["offset"] % ALIGN == 0
