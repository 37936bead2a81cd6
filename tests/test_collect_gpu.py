"""GPU datasets for the cost model (``superopt dataset collect --target cuda``) on a machine without a GPU.

The whole path runs through the CPU emulator binding of the GPU runtime (g++-emulated CUDA, host memory,
wall-clock "events"): GPU workloads, schedules from the GPU space, isolated measurement workers,
verification against the reference interpreter, the records' format, resuming, the time limit, GPU
features and a GPU model trained on the records. The collected schedules' CUDA compiles with
``nvcc -arch=sm_90`` (skipped without nvcc). Without a GPU the CLI fails in one line naming the cause.
What needs a real GPU (timings that mean something, the automatic bindings) is not tested here:
``benchmarks/gpu_check.sh`` collects a small GPU dataset on a GPU machine."""

from __future__ import annotations

import ctypes
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from costmodel.base import Candidate
from costmodel.collect import CollectConfig, collect, plan_workload, trace_key
from costmodel.dataset import load_dataset
from costmodel.gpu_features import GPU_FEATURE_NAMES, GpuFeatureExtractor
from costmodel.workloads import GPU_SIZES, fits_size, generate_workloads, has_legal_default, make_workload
from superopt.cli_dataset import main as dataset_main
from superopt.lang import compile_op
from superopt.measure import MeasureConfig, load_records, records_path
from superopt.measure.service import ErrorCode, MeasureInput, MeasureResult, build_records
from superopt.runtime.gpu import require_gpu
from superopt.schedule.gpu_default import gpu_default_schedule
from superopt.target import h200_target, host_target

SOFTMAX = "M[i] max= X[i,j]\nS[i] += exp(X[i,j] - M[i])\nO[i,j] = exp(X[i,j] - M[i]) / S[i]"
PER = 3


def tiny_workloads():
    return (
        make_workload("mm", compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (16, 24), "B": (24, 32)}), ["B"]),
        make_workload("softmax", compile_op(SOFTMAX, {"X": (8, 64)}, outputs=["O"])),
        make_workload("transpose", compile_op("O[j,i] = X[i,j] * 2.0", {"X": (24, 40)})),
    )


def emulated():
    return require_gpu("emulator").target


def config(out: Path, **kw) -> CollectConfig:
    base = dict(workloads=tiny_workloads(), per_workload=PER, seed=3, out=out, target=emulated(),
                gpu_binding="emulator", progress=False, batch_size=4,
                measure=MeasureConfig(repeats=2, min_repeat_s=0.0, run_timeout_s=60.0))
    base.update(kw)
    return CollectConfig(**base)


def keys(out: Path) -> set[tuple[str, str]]:
    return {(r.workload_key, trace_key(r.trace)) for r in load_records(records_path(out))}


def _driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def gpu_dataset(tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("gpu_ds")
    return out, collect(config(out))


def test_emulated_gpu_collection_writes_verified_records_of_the_gpu_target(gpu_dataset):
    out, report = gpu_dataset
    recs = load_records(records_path(out))
    target = emulated()
    assert report.records_written == len(recs) == 3 * PER and report.stop_reason == "complete"
    assert [r.error_code for r in recs] == ["OK"] * len(recs), [r.error_msg for r in recs if r.error_code != "OK"]
    assert all(r.target_key() == target.key() and r.target["kind"] == "cuda" for r in recs)
    assert all(len(r.times_s) == 2 and r.median_s > 0 for r in recs)
    assert Counter(r.workload_key for r in recs) == {w.key: PER for w in tiny_workloads()}
    for w in tiny_workloads():  # each workload's first schedule is the GPU default, the others from its space
        first = next(r for r in recs if r.workload_key == w.key)
        assert first.trace == tuple(gpu_default_schedule(w.compute, target, w.constant_inputs))
        assert first.constant_inputs == tuple(sorted(w.constant_inputs))
    # the same line format as a CPU collection: the same keys, the GPU target in the target field
    cpu_line = build_records([MeasureInput(tiny_workloads()[0].compute, ())], [MeasureResult(ErrorCode.OK, [1.0], 1.0)],
                             host_target(1))[0].to_json()
    lines = records_path(out).read_text().splitlines()
    assert {tuple(sorted(json.loads(line))) for line in lines} == {tuple(sorted(json.loads(cpu_line)))}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target_key"] == target.key() and manifest["config"]["gpu_binding"] == "emulator"


def test_gpu_records_are_verified_against_the_reference(tmp_path):
    """With zero tolerance the float32 GPU softmax cannot equal the float64 reference: WRONG_ANSWER, not OK."""
    strict = MeasureConfig(repeats=1, min_repeat_s=0.0, rtol=0.0, atol=0.0)
    report = collect(config(tmp_path / "strict", workloads=tiny_workloads()[1:2], per_workload=1, measure=strict))
    (rec,) = load_records(records_path(tmp_path / "strict"))
    assert report.failures == {"WRONG_ANSWER": 1} and rec.error_code == "WRONG_ANSWER" and rec.median_s is None
    assert "reference" in rec.error_msg


def test_gpu_collection_resumes_losing_nothing(gpu_dataset, tmp_path):
    full, _ = gpu_dataset
    out = tmp_path / "resumed"
    out.mkdir()
    lines = records_path(full).read_text().splitlines()
    records_path(out).write_text("\n".join(lines[:4]) + "\n" + lines[4][: len(lines[4]) // 2])  # killed mid-append
    report = collect(config(out))
    assert report.records_written == 3 * PER - 4 and report.stop_reason == "complete"
    assert report.workloads_done == 1 and report.skipped == 1  # 3 of the first workload, 1 of the second
    assert keys(out) == keys(full) and len(load_records(records_path(out))) == 3 * PER
    again = collect(config(out))
    assert again.records_written == 0 and again.stop_reason.startswith("nothing to measure")
    more = collect(config(out, per_workload=PER + 1))  # a larger target measures only the rest
    assert more.records_written <= 3 and len(keys(out)) == 3 * PER + more.records_written


def test_time_limit_stops_after_a_batch_and_a_rerun_finishes(tmp_path):
    out = tmp_path / "limited"
    first = collect(config(out, batch_size=2, max_seconds=1e-6))
    assert first.records_written == 2 and first.stop_reason.startswith("time limit")
    rest = collect(config(out, batch_size=2))
    assert rest.records_written == 3 * PER - 2 and len(keys(out)) == 3 * PER


def test_gpu_workloads_fit_gpu_sizes_and_have_a_gpu_default():
    target = h200_target()
    ws = generate_workloads(4, 11, target=target, models=())
    assert [w.key for w in ws] == [w.key for w in generate_workloads(4, 11, target=target, models=())]
    assert len(ws) == 4 and len({w.key for w in ws}) == 4
    for w in ws:
        assert fits_size(w.compute, sizes=GPU_SIZES) and has_legal_default(w, target), w.name
        plan = plan_workload(w, target, 3, 0, set())
        assert plan.todo[0] == tuple(gpu_default_schedule(w.compute, target, w.constant_inputs))


def test_gpu_features_see_launch_shape_and_coalescing():
    target = h200_target()
    fx = GpuFeatureExtractor()
    f = {n: i for i, n in enumerate(GPU_FEATURE_NAMES)}
    add = compile_op("O[i,j] = X[i,j] + Y[i,j]", {"X": (256, 512), "Y": (256, 512)})
    tr = compile_op("O[j,i] = X[i,j]", {"X": (256, 512)})
    rows = fx([Candidate(c, tuple(gpu_default_schedule(c, target)), target) for c in (add, tr)])
    assert rows.shape == (2, len(GPU_FEATURE_NAMES)) and np.isfinite(rows).all()
    assert rows[0, f["warp.coalesced_share"]] == 1.0 and rows[0, f["warp.scattered_share"]] == 0.0
    assert 0 < rows[1, f["warp.scattered_share"]] < 1  # the transpose reads or writes across rows
    assert rows[1, f["warp.sectors"]] > rows[0, f["warp.sectors"]]  # fewer arrays, but a scattered one costs sectors
    assert 0 < rows[0, f["gpu.occupancy"]] <= 1 and rows[0, f["gpu_target.sm_count"]] == target.gpu.sm_count
    assert rows[0, f["gpu.total_threads"]] == pytest.approx(np.log2(1 + 256 * 512))


def test_a_gpu_model_trains_on_gpu_records_and_reloads(gpu_dataset, tmp_path):
    from costmodel.gpu_model import GpuXGBModel
    from costmodel.train import TrainConfig, data_kind, train
    from costmodel.xgb import XGBConfig, XGBModel

    out, _ = gpu_dataset
    data = load_dataset(out)
    assert data_kind(data) == "cuda" and len(data) == 3 * PER
    model, report = train(data, TrainConfig(test_fraction=0.0, model=XGBConfig(rounds=20)))
    assert isinstance(model, GpuXGBModel) and report.train.records == 3 * PER
    path = tmp_path / "gpu.json"
    model.save(path)
    doc = json.loads(path.read_text())
    assert doc["kind"] == "cuda" and doc["feature_names"] == list(GPU_FEATURE_NAMES)
    loaded = XGBModel.load(path)
    assert type(loaded) is GpuXGBModel
    np.testing.assert_allclose(loaded.predict(list(data.candidates)), model.predict(list(data.candidates)))
    cpu = build_records([MeasureInput(tiny_workloads()[0].compute, ())], [MeasureResult(ErrorCode.OK, [1.0], 1.0)],
                        host_target(1))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(records_path(out).read_text() + cpu[0].to_json() + "\n")
    with pytest.raises(ValueError, match="mixes targets of kinds cpu, cuda"):
        train(load_dataset(mixed), TrainConfig(test_fraction=0.0))


def test_collected_gpu_schedules_compile_with_nvcc_for_sm_90(gpu_dataset, tmp_path):
    from superopt.codegen.cuda_emit import emit_cuda
    from superopt.runtime.gpu.nvcc import NvccConfig, compile_cuda, find_nvcc, translation_unit
    from superopt.schedule.plan import lower
    from superopt.target import Target

    if find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    out, _ = gpu_dataset
    data = load_dataset(out)
    sources = [emit_cuda(lower(c.compute, c.trace, Target.from_dict(c.target.to_dict())), f"k{i}")
               for i, c in enumerate(data.candidates)]
    cubin = compile_cuda(translation_unit(sources), "cubin", NvccConfig(arch="sm_90", cache_dir=tmp_path))
    assert cubin.stat().st_size > 0 and h200_target().gpu.arch == "sm_90"


# ---- the command line ------------------------------------------------------------------------------------

def one_line_error(capsys, argv: list[str], status: int = 2) -> str:
    assert dataset_main(argv) == status
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and cap.out == "", cap.err
    return lines[0]


def test_cli_gpu_argument_errors_are_one_line(capsys, tmp_path):
    base = ["dataset", "collect", "--target", "cuda", "--workloads", "2", "--per-workload", "1", "--out",
            str(tmp_path / "ds")]
    assert "--gpu-binding goes with --target cuda" in one_line_error(
        capsys, [*base[:3], "cpu", *base[4:], "--gpu-binding", "emulator"])
    assert "bad --gpu-binding 'opencl'" in one_line_error(capsys, [*base, "--gpu-binding", "opencl"])
    assert "--ray goes with --target cpu" in one_line_error(capsys, [*base, "--ray", "auto"])
    assert "bad --max-seconds" in one_line_error(capsys, [*base, "--max-seconds", "-1"])
    assert not (tmp_path / "ds").exists()


@pytest.mark.skipif(_driver_loads(), reason="a CUDA driver is present: the no-GPU error cannot be observed here")
def test_cli_cuda_without_a_gpu_names_the_missing_driver(capsys, tmp_path):
    argv = ["dataset", "collect", "--target", "cuda", "--workloads", "2", "--per-workload", "1", "--out",
            str(tmp_path / "ds")]
    line = one_line_error(capsys, argv, status=1)
    assert "--target cuda: no usable GPU: no CUDA driver (libcuda.so.1)" in line
    assert "no CUDA driver" in one_line_error(capsys, [*argv, "--gpu-binding", "cupy"], status=1)
    assert not (tmp_path / "ds").exists()


def test_cli_collects_on_the_emulator_and_resumes(capsys, tmp_path):
    argv = ["dataset", "collect", "--target", "cuda", "--gpu-binding", "emulator", "--workloads", "2",
            "--per-workload", "2", "--out", str(tmp_path / "ds"), "--models", "", "--json", "--no-progress"]
    assert dataset_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records_written"] == 4 and report["target"]["kind"] == "cuda"
    assert report["target_key"] == emulated().key() and report["ok"] + sum(report["failures"].values()) == 4
    assert dataset_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["stop_reason"].startswith("nothing to measure")


def test_cli_cuda_without_a_binding_names_the_missing_binding(capsys, tmp_path, monkeypatch):
    """A driver but no Python binding (the driver check passed by hand): the error names the binding."""
    import importlib.util

    import superopt.runtime.gpu.device as device

    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("pycuda is installed: its missing-binding error cannot be observed here")
    monkeypatch.setattr(device, "_driver_present", lambda: None)
    monkeypatch.setattr(device, "_DEVICES", {})
    argv = ["dataset", "collect", "--target", "cuda", "--gpu-binding", "pycuda", "--workloads", "2",
            "--per-workload", "1", "--out", str(tmp_path / "ds")]
    line = one_line_error(capsys, argv, status=1)
    assert "no usable GPU: no usable CUDA binding: pycuda: not installed" in line
    assert not (tmp_path / "ds").exists()
