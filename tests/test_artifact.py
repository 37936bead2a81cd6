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
