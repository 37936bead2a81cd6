"""Compiled artifacts: save, reload in a fresh process without compiling, refuse corrupt directories."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from superopt.api import OptimizeConfig, optimize_op
from superopt.artifact import ArtifactError, load_executor, read_manifest, save_executor

SRC = "H[i,j] += A[i,k] * B[k,j]; C[i,j] = max(H[i,j], 0.0)"
SHAPES = {"A": (16, 8), "B": (8, 12)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    prog = optimize_op(SRC, SHAPES, OptimizeConfig(threads=1, cost_model=None))
    out = tmp_path_factory.mktemp("art") / "out"
    save_executor(prog.executor, out, report={"max_error": prog.report.max_error})
    rng = np.random.default_rng(0)
    feed = {"A": rng.standard_normal((16, 8)).astype(np.float32), "B": rng.standard_normal((8, 12)).astype(np.float32)}
    return prog, out, feed


def test_reload_gives_the_same_outputs(saved):
    prog, out, feed = saved
    ex, report = load_executor(out)
    want = prog(**feed)[0]
    np.testing.assert_array_equal(ex(feed)[prog.graph.outputs[0]], want)
    np.testing.assert_allclose(want, np.maximum(feed["A"] @ feed["B"], 0), rtol=1e-5, atol=1e-5)
    assert report["max_error"] == prog.report.max_error
    m = read_manifest(out)
    assert [i[0] for i in m["inputs"]] == ["A", "B"] and m["outputs"][0][1] == [16, 12]


def test_reload_in_a_fresh_process_does_not_compile(saved, tmp_path):
    prog, out, feed = saved
    np.savez(tmp_path / "in.npz", **feed)
    script = textwrap.dedent(f"""
        import subprocess, numpy as np
        import superopt.runtime.compiler as c
        real = subprocess.run
        def no_compiler(cmd, *a, **k):
            if "--version" in cmd:  # the compiler's version is part of the cache key
                return real(cmd, *a, **k)
            raise AssertionError("recompiled: " + " ".join(cmd))
        c.subprocess.run = no_compiler
        from superopt.artifact import load_executor
        ex, _ = load_executor({str(out)!r})
        feed = dict(np.load({str(tmp_path / 'in.npz')!r}))
        np.save({str(tmp_path / 'out.npy')!r}, ex(feed)[ex.graph.outputs[0]])
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), prog(**feed)[0])


def test_corrupt_artifacts_fail_with_one_line_naming_the_file(saved, tmp_path):
    import shutil

    _, out, _ = saved
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    so = next((bad / "kernels").glob("*.so"))
    os.chmod(so, 0o644)
    so.write_bytes(so.read_bytes()[:100])  # truncated
    with pytest.raises(ArtifactError, match=r"kernels/.*\.so does not match its checksum") as e:
        load_executor(bad)
    assert "\n" not in str(e.value)
    (bad / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        load_executor(bad)
    with pytest.raises(ArtifactError, match="no such directory"):
        load_executor(tmp_path / "nowhere")
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="manifest.json is unreadable"):
        load_executor(bad)


def test_save_is_atomic_and_leaves_nothing_on_failure(saved, tmp_path, monkeypatch):
    prog, _, _ = saved
    import superopt.artifact as art

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(art.json, "dumps", boom)
    with pytest.raises(OSError, match="disk full"):
        save_executor(prog.executor, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # neither OUT nor a partial directory


def test_unwritable_parent_is_a_clear_error(saved, tmp_path):
    prog, _, _ = saved
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")  # fails for root too (chmod would not stop root)
    with pytest.raises(ArtifactError, match="cannot write to"):
        save_executor(prog.executor, blocker / "out")


def _conv_gemm_model() -> tuple[bytes, dict[str, np.ndarray]]:
    """A conv and a Gemm over constant weights (the default schedules read both packed)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((20, 32 * 14 * 14)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["y"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "w2"], ["z"], transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 20])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), {"w": w, "w2": w2}


def test_weights_read_only_packed_are_saved_once_and_unpacked_where_read(tmp_path):
    from superopt.api import optimize
    from superopt.interp.reference import evaluate
    from superopt.ir.graph import DeferredConstant

    model, weights = _conv_gemm_model()
    # (NCHW: in a blocked layout the conv may read its weight transformed or re-laid by the graph, as on an 8-lane
    # host, where no kernel packs it)
    prog = optimize(model, OptimizeConfig(threads=1, cost_model=None, layout="nchw"))
    ex = prog.executor
    assert set(ex.packed_only) == {"w", "w2"}
    for name, (node, local) in ex.packed_only.items():  # the layout's numpy form is what the kernel's pack wrote
        layout = ex.kernels[ex.node_kernel[node]].source.packs[local]
        packed = ex.packed_constants()[(node, local)]
        np.testing.assert_array_equal(packed, layout.pack_array(weights[name]))
        np.testing.assert_array_equal(layout.unpack_array(packed), weights[name])
    out = save_executor(ex, tmp_path / "art")
    # the weights are on disk once: in packed.bin, not again in constants.bin
    assert (out / "constants.bin").stat().st_size < 1024
    assert (out / "packed.bin").stat().st_size >= sum(w.nbytes for w in weights.values())

    feed = {"x": np.random.default_rng(1).standard_normal((1, 16, 14, 14)).astype(np.float32)}
    loaded, _ = load_executor(out)
    held = dict(loaded.graph.constants)
    assert all(isinstance(held[n], DeferredConstant) for n in weights)
    z = loaded.graph.outputs[0]
    np.testing.assert_array_equal(loaded(feed)[z], prog(**feed)[0])
    assert not any(held[n].computed for n in weights)  # a run reads the packed copies only
    for name, w in weights.items():  # read, each is the weight it was packed from
        np.testing.assert_array_equal(held[name].array, w)
    np.testing.assert_allclose(evaluate(loaded.graph, feed)[z], prog(**feed)[0], rtol=1e-4, atol=1e-4)
