"""Offline dataset collection (costmodel.workloads, costmodel.collect, superopt.measure.runner,
superopt.cli_dataset), measured for real on this machine: generated workloads are deterministic,
distinct and schedulable; a collection writes the records MeasureService writes; a rerun measures
nothing; a collection killed with SIGKILL resumes to exactly the planned records; Ray actors produce
the same records as the local runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from costmodel.collect import CollectConfig, collect, plan_workload, repair_tail, trace_key
from costmodel.workloads import DEFAULT_MIX, fits_size, generate_workloads, has_legal_default, model_workloads
from search.schedule.database import TuningDatabase
from search.schedule.tune import TuneConfig, tune_graph
from superopt.api import define_op
from superopt.cli_dataset import main as dataset_main
from superopt.codegen.c_emit import KernelSource
from superopt.ir.canonical import canonicalize, canonicalize_kernels
from superopt.lang import compile_op
from superopt.measure import ErrorCode, MeasureConfig, MeasureInput, MeasureService, load_records, records_path
from superopt.measure.records import append_records
from superopt.measure.runner import RAY_MISSING, make_runner
from superopt.measure.service import build_records
from superopt.runtime.compiler import CompilerConfig
from superopt.schedule.default import default_schedule
from superopt.target import host_target

ROOT = Path(__file__).resolve().parents[1]
TARGET = host_target(1)  # one thread: timings on a shared 2-core machine stay apart
PER = 3
SOFTMAX = "M[i] max= X[i,j]\nS[i] += exp(X[i,j] - M[i])\nO[i,j] = exp(X[i,j] - M[i]) / S[i]"
# the tiny workloads, as source for the killed subprocess too
WORKLOADS_SRC = textwrap.dedent(f"""
    from costmodel.workloads import make_workload
    from superopt.lang import compile_op

    def tiny_workloads():
        return (
            make_workload("mm", compile_op("C[i,j] += A[i,k] * B[k,j]", {{"A": (16, 24), "B": (24, 32)}}), ["B"]),
            make_workload("softmax", compile_op({SOFTMAX!r}, {{"X": (8, 64)}}, outputs=["O"])),
            make_workload("rowsum", compile_op("O[i] += X[i,j]", {{"X": (24, 40)}})),
        )
""")
_ns: dict = {}
exec(WORKLOADS_SRC, _ns)  # our own constant source, shared with the killed subprocess below
tiny_workloads = _ns["tiny_workloads"]


def fast_measure(cache: Path) -> MeasureConfig:
    return MeasureConfig(repeats=2, min_repeat_s=0.002, run_timeout_s=20.0, compiler=CompilerConfig(cache_dir=cache))


def config(out: Path, cache: Path, **kw) -> CollectConfig:
    base = dict(workloads=tiny_workloads(), per_workload=PER, seed=7, out=out, target=TARGET, progress=False,
                batch_size=4, measure=fast_measure(cache))
    base.update(kw)
    return CollectConfig(**base)


def records(out: Path) -> list:
    return load_records(records_path(out))


def json_shape(d: object) -> object:
    """The keys of a JSON document, nested (values dropped)."""
    if isinstance(d, dict):
        return {k: json_shape(v) for k, v in d.items()}
    return type(d).__name__ if not isinstance(d, (int, float, type(None))) else "number"


def line_shapes(out: Path) -> set[str]:
    return {json.dumps({k: json_shape(v) if k != "timings" else sorted(v) for k, v in json.loads(line).items()
                        if k not in ("error_msg",)}, sort_keys=True)
            for line in records_path(out).read_text().splitlines()}


@pytest.fixture(scope="module")
def kcache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory, kcache) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("local")
    return out, collect(config(out, kcache))


# -- workloads ------------------------------------------------------------------------------------


def test_generated_workloads_are_deterministic_distinct_sized_and_schedulable():
    a = generate_workloads(12, seed=3, target=TARGET, models=("squeezenet",))
    b = generate_workloads(12, seed=3, target=TARGET, models=("squeezenet",))
    assert [(w.name, w.key) for w in a] == [(w.name, w.key) for w in b]
    assert len(a) == 12 and len({w.key for w in a}) == 12
    assert {w.source for w in a} == {s for s, wt in DEFAULT_MIX if wt > 0}  # (the conv source is opt-in)
    assert [w.key for w in generate_workloads(12, seed=4, target=TARGET, models=("squeezenet",))] != [w.key for w in a]
    for w in a:
        assert canonicalize(w.compute) == w.compute and w.constant_inputs <= set(w.compute.inputs)
        assert fits_size(w.compute) and has_legal_default(w, TARGET), w.name
    models = model_workloads(["squeezenet"], target=TARGET)
    assert models and all(w.source == "model" for w in models) and len({w.key for w in models}) == len(models)
    assert {w.key for w in a if w.source == "model"} <= {w.key for w in models}
    assert any(w.constant_inputs for w in models)  # conv weights are graph constants
    assert generate_workloads(4, seed=3, target=TARGET, models=()) and all(
        w.source != "model" for w in generate_workloads(4, seed=3, target=TARGET, models=()))


def test_transformer_workloads_are_wide_projections_of_constant_weights():
    ws = generate_workloads(16, seed=5, target=TARGET, mix=(("transformer", 1.0),))
    assert len(ws) == 16 and {w.source for w in ws} == {"transformer"}
    kinds, orientations = set(), set()
    for w in ws:
        st = next(s for s in w.compute.statements if s.reduce == "+=")
        reads = [a.tensor for a in st.expr.accesses()]
        weight = next(t for t in reads if t in w.constant_inputs)  # the weight is a graph constant
        rows, k, n = (st.extent[d] for d in (*st.out_dims, *st.reduce_dims))
        assert 16 <= rows <= 512 and 256 <= max(k, n) and 2 * rows * k * n <= 300_000_000, w.name
        orientations.add(w.compute.type_of[weight].shape == (n, k))
        kinds.add(w.name.split("/")[1].rsplit("_", 1)[-1])
        assert fits_size(w.compute) and has_legal_default(w, TARGET), w.name
    assert orientations == {True, False} and len(kinds) >= 3, (orientations, kinds)


def test_plan_starts_with_the_default_schedule_and_skips_what_is_done():
    w = tiny_workloads()[0]
    plan = plan_workload(w, TARGET, 5, seed=1, done=set())
    assert plan.todo[0] == tuple(default_schedule(w.compute, TARGET, w.constant_inputs))
    assert len({trace_key(t) for t in plan.todo}) == 5 and not plan.short
    again = plan_workload(w, TARGET, 5, seed=1, done={trace_key(t) for t in plan.todo[:2]})
    assert again.todo == plan.todo[2:] and again.skipped == 2


# -- local collection -----------------------------------------------------------------------------


def test_local_collection_writes_measure_service_records(local_dataset, kcache, tmp_path):
    out, report = local_dataset
    ws = tiny_workloads()
    recs = records(out)
    assert report.records_written == len(recs) == len(ws) * PER and report.stop_reason == "complete"
    assert report.ok == len(recs) and report.failures == {}
    assert all(r.error_code == "OK" and r.median_s > 0 and r.times_s for r in recs)
    per_key = Counter(r.workload_key for r in recs)
    assert per_key == {w.key: PER for w in ws}
    assert len({(r.workload_key, trace_key(r.trace)) for r in recs}) == len(recs)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == TARGET.to_dict() and manifest["config"]["per_workload"] == PER
    assert manifest["created"] and manifest["updated"] and manifest["runs"][-1]["report"]["records_written"] == 9
    # the same candidate through a MeasureService with dataset_dir: the same record, field for field
    first = next(r for r in recs if r.workload_key == ws[0].key)
    inp = MeasureInput(ws[0].compute, first.trace, constant_inputs=ws[0].constant_inputs)
    svc_dir = tmp_path / "svc"
    with MeasureService(MeasureConfig(target=TARGET, dataset_dir=svc_dir, repeats=2, min_repeat_s=0.002,
                                      compiler=CompilerConfig(cache_dir=kcache))) as service:
        (result,) = service.measure([inp])
    (svc,) = records(svc_dir)
    assert line_shapes(svc_dir) == line_shapes(out)
    same = ("workload_text", "workload_digest", "workload_key", "trace", "target", "constant_inputs", "error_code",
            "version")
    assert {f: getattr(svc, f) for f in same} == {f: getattr(first, f) for f in same}
    (built,) = build_records([inp], [result], TARGET, svc.timestamp)
    assert built.to_json() == svc.to_json()


def test_rerun_measures_nothing_and_a_larger_target_measures_only_the_rest(local_dataset, kcache, tmp_path):
    src, _ = local_dataset
    out = tmp_path / "ds"
    out.mkdir()
    (out / "measurements.jsonl").write_bytes(records_path(src).read_bytes())
    again = collect(config(out, kcache))
    assert again.records_written == 0 and again.workloads_done == 3
    assert again.stop_reason.startswith("nothing to measure")
    more = collect(config(out, kcache, per_workload=PER + 1))  # the row sum has only 3 distinct schedules
    assert more.records_written == 2 and more.skipped == 3 * PER and more.short == 1
    assert "1 workload(s) have fewer than 4 distinct legal schedules" in more.stop_reason
    recs = records(out)
    mm, softmax, rowsum = tiny_workloads()
    assert Counter(r.workload_key for r in recs) == {mm.key: PER + 1, softmax.key: PER + 1, rowsum.key: PER}
    assert len({(r.workload_key, trace_key(r.trace)) for r in recs}) == len(recs)
    assert len(json.loads((out / "manifest.json").read_text())["runs"]) == 2


def test_a_truncated_last_line_is_dropped_before_the_next_append(local_dataset, tmp_path):
    src, _ = local_dataset
    lines = records_path(src).read_text().splitlines(keepends=True)
    path = tmp_path / "measurements.jsonl"
    path.write_text(lines[0] + lines[1] + lines[2][:40])  # a writer killed mid-append
    recs = load_records(path)
    assert len(recs) == 2
    assert repair_tail(path) == 40
    append_records(path, [load_records(records_path(src))[3]])
    assert len(load_records(path)) == 3
    path.write_text(lines[0] + lines[1].rstrip("\n"))  # a whole record without its newline is kept
    assert repair_tail(path) == 0 and path.read_text().endswith("\n") and len(load_records(path)) == 2


KILLED_SCRIPT = WORKLOADS_SRC + textwrap.dedent("""
    import sys
    from pathlib import Path
    from costmodel.collect import CollectConfig, collect
    from superopt.measure import MeasureConfig
    from superopt.runtime.compiler import CompilerConfig
    from superopt.target import host_target

    out, cache = Path(sys.argv[1]), Path(sys.argv[2])
    collect(CollectConfig(tiny_workloads(), per_workload=3, seed=7, out=out, target=host_target(1), progress=False,
                          batch_size=2, measure=MeasureConfig(repeats=2, min_repeat_s=0.002, run_timeout_s=20.0,
                                                              compiler=CompilerConfig(cache_dir=cache))))
""")


def test_a_killed_collection_resumes_to_exactly_the_planned_records(tmp_path):
    out, cache = tmp_path / "ds", tmp_path / "kernels"  # a cold kernel cache: every batch compiles
    script = tmp_path / "collect_script.py"
    script.write_text(KILLED_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script), str(out), str(cache)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    path = records_path(out)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists() and path.read_text().count("\n") >= 2:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the collection ended before it could be killed: {proc.stderr.read()!r}"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    before = len(load_records(path))
    assert 2 <= before < 3 * PER
    with open(path, "a") as f:
        f.write('{"version": 2, "workload": {"te')  # and, as if killed mid-append, half a line
    report = collect(config(out, cache, batch_size=2))
    recs = records(out)
    assert report.records_written == 3 * PER - before and report.stop_reason == "complete"
    assert len(recs) == 3 * PER and len({(r.workload_key, trace_key(r.trace)) for r in recs}) == 3 * PER
    assert Counter(r.workload_key for r in recs) == {w.key: PER for w in tiny_workloads()}
    first = collect(config(tmp_path / "fresh", cache))  # the same seed uninterrupted: the same schedules
    assert {(r.workload_key, trace_key(r.trace)) for r in records(tmp_path / "fresh")} == \
        {(r.workload_key, trace_key(r.trace)) for r in recs} and first.records_written == 3 * PER


# -- runners --------------------------------------------------------------------------------------

N = 16
WRONG = KernelSource(name="wrong_mm", code=f"void wrong_mm(void **args) {{ float *C = args[2]; for (int i = 0; "
                                           f"i < {N * N}; i++) C[i] = 1.0f; }}\n",
                     inputs=("A", "B"), outputs=("C",), packs={})


def order_inputs() -> list[MeasureInput]:
    mm = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (N, N), "B": (N, N)})
    good = MeasureInput(mm, tuple(default_schedule(mm, TARGET, frozenset(mm.inputs))))
    bad = MeasureInput(mm, source=WRONG)
    return [good, bad, good, good, bad, good]


def check_order(results) -> None:
    codes = [r.error_code for r in results]
    assert codes == [ErrorCode.OK, ErrorCode.WRONG_ANSWER, ErrorCode.OK, ErrorCode.OK, ErrorCode.WRONG_ANSWER,
                     ErrorCode.OK], codes


def test_local_runner_keeps_input_order_and_rejects_bad_specs(kcache):
    cfg = fast_measure(kcache)
    with make_runner("local", cfg) as runner:
        check_order(runner.measure(order_inputs()))
    with pytest.raises(ValueError, match="one worker"):
        make_runner("local", cfg, 2)
    with pytest.raises(ValueError, match="empty"):
        make_runner("", cfg)


def test_missing_ray_is_one_clear_error(kcache, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    with pytest.raises(RuntimeError) as err:
        make_runner("auto", fast_measure(kcache), 2)
    assert str(err.value) == RAY_MISSING


def test_ray_collection_matches_the_local_one(local_dataset, kcache, tmp_path):
    ray = pytest.importorskip("ray")
    local_out, _ = local_dataset
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with make_runner("auto", fast_measure(kcache), 2) as runner:
            assert len(runner.actors) == 2
            check_order(runner.measure(order_inputs()))
        out = tmp_path / "ray"
        report = collect(config(out, kcache, runner="auto", ray_workers=2))
        assert ray.is_initialized()  # a cluster the caller started stays up
        # tuning measures on the cluster too (superopt tune --ray): every trial verified and recorded
        graph = canonicalize_kernels(define_op("C[i,j] += A[i,k] * B[k,j]", {"A": (16, 24), "B": (24, 8)}))
        db = TuningDatabase(tmp_path / "tune.jsonl")
        with make_runner("auto", replace(fast_measure(kcache), target=TARGET), 2) as runner:
            tuned = tune_graph(graph, TARGET, TuneConfig(trials=8, batch_size=4, progress=False), db, runner=runner)
        assert tuned.measured == 8 and len(db.records()) == 8 and tuned.kernels[0].best_s is not None
    finally:
        ray.shutdown()
    assert report.records_written == 3 * PER and report.ok == 3 * PER
    assert line_shapes(out) == line_shapes(local_out)
    ray_recs, local_recs = records(out), records(local_out)
    assert {(r.workload_key, trace_key(r.trace)) for r in ray_recs} == \
        {(r.workload_key, trace_key(r.trace)) for r in local_recs}
    assert all(r.target == TARGET.to_dict() for r in ray_recs)


# -- command line ---------------------------------------------------------------------------------


def one_line_error(capsys, argv: list[str]) -> str:
    assert dataset_main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and cap.out == "", cap.err
    return lines[0]


def test_cli_bad_arguments_are_one_line_errors(capsys, tmp_path):
    base = ["dataset", "collect", "--target", "cpu", "--workloads", "2", "--per-workload", "1", "--out",
            str(tmp_path / "ds")]
    assert "only cpu" in one_line_error(capsys, [*base[:3], "gpu", *base[4:]])
    assert "bad --workloads 'x'" in one_line_error(capsys, [*base[:5], "x", *base[6:]])
    assert "bad --per-workload 0" in one_line_error(capsys, [*base[:7], "0", *base[8:]])
    assert "--ray-workers goes with --ray" in one_line_error(capsys, [*base, "--ray-workers", "2"])
    assert "unknown model(s) nope" in one_line_error(capsys, [*base, "--models", "nope"])
    assert "unknown source 'bert'" in one_line_error(capsys, [*base, "--mix", "bert=1"])
    assert "weight of 'op' is not a number" in one_line_error(capsys, [*base, "--mix", "op=x"])
    assert "at least one source a positive weight" in one_line_error(capsys, [*base, "--mix", "op=0"])
    assert "--out" in one_line_error(capsys, base[:-2])
    assert not (tmp_path / "ds").exists()


def test_cli_collects_and_prints_one_json_report(capsys, tmp_path):
    argv = ["dataset", "collect", "--target", "cpu", "--workloads", "2", "--per-workload", "1", "--out",
            str(tmp_path / "ds"), "--threads", "1", "--models", "", "--json", "--no-progress"]
    assert dataset_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records_written"] == 2 and report["workloads"] == 2 and report["target"]["threads"] == 1
    assert len(records(tmp_path / "ds")) == 2
    assert dataset_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["stop_reason"].startswith("nothing to measure")


def test_the_conv_source_draws_convs_of_every_kind_with_constant_weights():
    ws = generate_workloads(12, seed=2, target=TARGET, mix=(("conv", 1.0),))
    assert len(ws) == 12 and {w.source for w in ws} == {"conv"}
    kinds = {w.name.split("/")[1].split("_")[1] for w in ws}
    assert kinds <= {"dense", "depthwise", "pointwise", "strided"} and len(kinds) >= 3, kinds
    for w in ws:
        st = next(s for s in w.compute.statements if s.reduce == "+=")
        assert any(a.tensor in w.constant_inputs for a in st.expr.accesses()), w.name  # the weight
