"""The measurement service: good kernels time OK; bad ones (crash, hang, wrong, broken C, illegal
schedule, slow compiler) are recorded with the right error code while the rest of the batch carries on."""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import pytest

from superopt.codegen.c_emit import KernelSource
from superopt.ir.canonical import workload_key
from superopt.lang import compile_op
from superopt.measure import (
    FORMAT_VERSION,
    ErrorCode,
    MeasureConfig,
    MeasureInput,
    MeasureService,
    load_records,
    measure,
    records_path,
)
from superopt.measure.records import append_records
from superopt.runtime.compiler import CompilerConfig
from superopt.schedule import CacheWrite, Pack, Parallel, Reorder, Split, Unroll, Vectorize
from superopt.target import host_target

N = 64


@pytest.fixture(scope="module")
def mm():
    return compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (N, N), "B": (N, N)})


TILED = (Split("C", "i", 4), Split("C", "j", 16), Reorder("C", ("i_o", "j_o", "k", "i_i", "j_i")),
         CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i"), Parallel("C", "i_o"))


def _cfg(tmp_path: Path, **kw) -> MeasureConfig:
    base = dict(threads=1, run_timeout_s=3.0, build_timeout_s=60.0, min_repeat_s=0.005, repeats=3,
                compiler=CompilerConfig(cache_dir=tmp_path / "kcache"))
    base.update(kw)
    return MeasureConfig(**base)


def _src(name: str, body: str) -> KernelSource:
    return KernelSource(name=name, code=f"void {name}(void **args) {{\n{body}\n}}\n", inputs=("A", "B"),
                        outputs=("C",), packs={})


# a correct naive matmul by hand, and deliberately bad kernels with the same ABI
GOOD_C = _src("hand_mm", f"""
  const float *A = args[0], *B = args[1]; float *C = args[2];
  for (int i = 0; i < {N}; i++) for (int j = 0; j < {N}; j++) {{
    float s = 0; for (int k = 0; k < {N}; k++) s += A[i*{N}+k] * B[k*{N}+j]; C[i*{N}+j] = s; }}""")
SEGV_C = _src("bad_segv", "  *(volatile int *)0 = 1;")
HANG_C = _src("bad_hang", "  volatile int x = 0; for (;;) x++;")
WRONG_C = _src("bad_wrong", f"  float *C = args[2]; for (int i = 0; i < {N * N}; i++) C[i] = 1.0f;")
# correct except that it never writes the last element (the output buffer is poisoned, so this is caught)
PARTIAL_C = _src("bad_partial", f"""
  const float *A = args[0], *B = args[1]; float *C = args[2];
  for (int i = 0; i < {N}; i++) for (int j = 0; j < {N}; j++) {{
    float s = 0; for (int k = 0; k < {N}; k++) s += A[i*{N}+k] * B[k*{N}+j];
    if (i * {N} + j != {N * N - 1}) C[i*{N}+j] = s; }}""")
SYNTAX_C = _src("bad_syntax", "  this is not C;")


def test_good_kernel_measures_ok(mm, tmp_path):
    (r,) = measure([MeasureInput(mm, TILED)], _cfg(tmp_path))
    assert r.error_code is ErrorCode.OK, r.error_msg
    assert r.median_s is not None and r.median_s > 0 and len(r.times_s) == 3
    assert r.build_s > 0 and r.cost == r.median_s


def test_bad_kernels_recorded_batch_carries_on(mm, tmp_path):
    inputs = [
        MeasureInput(mm, TILED),
        MeasureInput(mm, (), source=SEGV_C),
        MeasureInput(mm, ()),
        MeasureInput(mm, (), source=HANG_C),
        MeasureInput(mm, (), source=GOOD_C),
        MeasureInput(mm, (), source=WRONG_C),
        MeasureInput(mm, (), source=SYNTAX_C),  # sinks the batch library: fall back to one by one
        MeasureInput(mm, (Split("C", "nope", 4),)),
        MeasureInput(mm, (), source=PARTIAL_C),
        MeasureInput(mm, TILED[:2]),
    ]
    res = measure(inputs, _cfg(tmp_path, dataset_dir=tmp_path / "ds"))
    codes = [r.error_code for r in res]
    assert codes == [ErrorCode.OK, ErrorCode.RUNTIME_ERROR, ErrorCode.OK, ErrorCode.TIMEOUT, ErrorCode.OK,
                     ErrorCode.WRONG_ANSWER, ErrorCode.COMPILE_ERROR, ErrorCode.ILLEGAL_SCHEDULE,
                     ErrorCode.WRONG_ANSWER, ErrorCode.OK], [(r.error_code, r.error_msg[:200]) for r in res]
    assert "SIGSEGV" in res[1].error_msg or "signal" in res[1].error_msg
    assert "differ" in res[5].error_msg
    for r in res:
        assert (r.median_s is not None and r.median_s > 0) == (r.error_code is ErrorCode.OK)
    recs = load_records(records_path(tmp_path / "ds"))
    assert [r.error_code for r in recs] == [c.name for c in codes]


def test_service_reuses_worker_across_calls_and_after_crash(mm, tmp_path):
    with MeasureService(_cfg(tmp_path)) as svc:
        a = svc.measure([MeasureInput(mm, (), source=SEGV_C)])
        b = svc.measure([MeasureInput(mm, TILED), MeasureInput(mm, ())])
        pid = svc._workers[0].proc.pid
        c = svc.measure([MeasureInput(mm, ())])
        assert svc._workers[0].proc.pid == pid  # a healthy worker stays alive between calls
    with MeasureService(_cfg(tmp_path, max_tasks_per_worker=1)) as svc:
        d = svc.measure([MeasureInput(mm, ()), MeasureInput(mm, TILED)])  # recycled after each task
        assert svc._workers[0] is None
    assert [r.error_code for r in d] == [ErrorCode.OK] * 2
    assert a[0].error_code is ErrorCode.RUNTIME_ERROR
    assert [r.error_code for r in b + c] == [ErrorCode.OK] * 3


def test_build_timeout(mm, tmp_path):
    cc = tmp_path / "slowcc"
    cc.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo slowcc 1.0; exit 0; fi\nexec sleep 30\n')
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    cfg = _cfg(tmp_path, build_timeout_s=0.5, compiler=CompilerConfig(cc=str(cc), cache_dir=tmp_path / "kc"))
    (r,) = measure([MeasureInput(mm, TILED)], cfg)
    assert r.error_code is ErrorCode.TIMEOUT, r.error_msg


def test_records_round_trip(mm, tmp_path):
    ds = tmp_path / "ds"
    inputs = [MeasureInput(mm, TILED), MeasureInput(mm, (), source=WRONG_C)]
    res = measure(inputs, _cfg(tmp_path, dataset_dir=ds, threads=2))
    path = records_path(ds)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    raw = json.loads(lines[0])
    assert raw["version"] == FORMAT_VERSION
    assert raw["target"]["threads"] == 2 and raw["target"]["cpu_model"] and raw["target"]["compiler"] == "gcc"
    assert raw["workload"] == {"text": mm.text(), "digest": mm.digest(), "key": workload_key(mm, {"A", "B"})}
    assert raw["constant_inputs"] == ["A", "B"]  # None given: every input constant, said explicitly
    assert raw["error_code"] == "OK" and raw["timings"]["median_s"] == res[0].median_s
    assert raw["timestamp"] > 0 and raw["source_sha256"] is None

    recs = load_records(path)
    assert recs[0].trace == TILED
    assert recs[0].times_s == tuple(res[0].times_s) and recs[0].median_s == res[0].median_s
    assert recs[1].error_code == "WRONG_ANSWER" and recs[1].source_sha256 and recs[1].median_s is None
    assert [r.to_json() for r in recs] == lines

    # a writer killed mid-append leaves a truncated last line: skipped
    with open(path, "a") as f:
        f.write(lines[0][: len(lines[0]) // 2])
    assert len(load_records(path)) == 2
    # the next append starts a line of its own: the cut line costs only itself, with a warning
    append_records(path, recs[:1])
    with pytest.warns(UserWarning, match=r":3: skipped 1 corrupt measurement record"):
        again = load_records(path)
    assert [r.to_json() for r in again] == lines + [lines[0]]


def test_inputs_are_seeded(mm):
    from superopt.interp.inputs import random_kernel_inputs as random_inputs

    a, b = random_inputs(mm, 0), random_inputs(mm, 0)
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert not (random_inputs(mm, 1)[0] == a[0]).all()


def test_two_workers_hang_does_not_block_the_other(mm, tmp_path):
    inputs = [MeasureInput(mm, (), source=HANG_C), MeasureInput(mm, TILED), MeasureInput(mm, ()),
              MeasureInput(mm, (), source=SEGV_C), MeasureInput(mm, (), source=GOOD_C)]
    res = measure(inputs, _cfg(tmp_path, workers=2, run_timeout_s=2.0))
    E = ErrorCode
    want = [E.TIMEOUT, E.OK, E.OK, E.RUNTIME_ERROR, E.OK]
    assert [r.error_code for r in res] == want, [r.error_msg[:200] for r in res]


# a matmul with few rows: packing the 512x512 weight costs about as much as the product itself
PACKED = (Split("C", "j", 16), Reorder("C", ("j_o", "k", "i", "j_i")), CacheWrite("C", "k"), Unroll("C", "i"),
          Vectorize("C", "j_i"), Pack("B", (0, 1), 1, 16))


def test_runtime_packed_input_is_packed_inside_the_timing(tmp_path):
    c = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (4, 512), "B": (512, 512)})
    ds = tmp_path / "ds"
    inputs = [MeasureInput(c, PACKED, constant_inputs=frozenset({"B"})),  # B a weight: packed once
              MeasureInput(c, PACKED, constant_inputs=frozenset()),  # B computed at run time: packed per call
              MeasureInput(c, PACKED[:-1], constant_inputs=frozenset())]  # nothing to pack
    const, runtime, unpacked = measure(inputs, _cfg(tmp_path, dataset_dir=ds, repeats=5, min_repeat_s=0.01))
    assert [r.error_code for r in (const, runtime, unpacked)] == [ErrorCode.OK] * 3, runtime.error_msg
    # the per-call pack reads and writes 2 MiB: clearly more than the 4-row product
    assert runtime.median_s > 1.3 * const.median_s, (const.median_s, runtime.median_s)
    recs = load_records(records_path(ds))
    assert [r.constant_inputs for r in recs] == [("B",), (), ()]
    assert recs[0].workload_key == workload_key(c, {"B"}) != recs[1].workload_key == workload_key(c, set())


def test_target_reaches_lower_and_the_records(mm, tmp_path):
    # a made-up target with one narrow vector register: TILED's 4x16 register tile is too large for it
    tiny = dataclasses.replace(host_target(1), cpu_model="tiny test cpu", vector_bits=128, vector_registers=1)
    ds = tmp_path / "ds"
    res = measure([MeasureInput(mm, TILED), MeasureInput(mm, TILED[:2])], _cfg(tmp_path, target=tiny, dataset_dir=ds))
    assert res[0].error_code is ErrorCode.ILLEGAL_SCHEDULE and "tile" in res[0].error_msg
    assert res[1].error_code is ErrorCode.OK, res[1].error_msg
    (r0, r1) = load_records(records_path(ds))
    assert r0.target == r1.target == tiny.to_dict() and r0.target_key() == tiny.key()
    # without a target: this machine with ``threads``
    svc = MeasureService(_cfg(tmp_path, threads=2))
    assert svc.target == host_target(2)


def test_any_lower_failure_is_an_illegal_schedule(mm, tmp_path, monkeypatch):
    import superopt.measure.service as service

    def broken_lower(compute, trace, target=None):
        raise KeyError("j_q")

    monkeypatch.setattr(service, "lower", broken_lower)
    (r,) = measure([MeasureInput(mm, TILED)], _cfg(tmp_path))
    assert r.error_code is ErrorCode.ILLEGAL_SCHEDULE and "KeyError" in r.error_msg


def test_misnamed_constant_input_is_an_error(mm, tmp_path):
    with pytest.raises(ValueError, match="not inputs"):
        measure([MeasureInput(mm, TILED, constant_inputs=frozenset({"W"}))], _cfg(tmp_path))


def test_version_1_records_still_load(mm, tmp_path):
    path = tmp_path / "old.jsonl"
    v1 = {"version": 1, "workload": {"text": mm.text(), "digest": mm.digest()}, "trace": [],
          "target": host_target(1).to_dict(), "timings": {"times_s": [0.5], "median_s": 0.5, "build_s": 0.1},
          "error_code": "OK", "error_msg": "", "timestamp": 1.0, "source_sha256": None}
    path.write_text(json.dumps(v1) + "\n")
    (r,) = load_records(path)
    assert r.version == 1 and r.constant_inputs is None and r.workload_key is None and r.median_s == 0.5
    path.write_text(json.dumps(dict(v1, version=99)) + "\n" + json.dumps(v1) + "\n")
    with pytest.raises(ValueError, match="version 99"):
        load_records(path)


def test_a_slow_candidate_is_verified_and_timed_once(tmp_path, mm):
    """slow_call_s: a candidate whose first call exceeds it is checked, then reported with that one call."""
    cfg = _cfg(tmp_path)
    with MeasureService(cfg) as service:
        slow, full = service.measure([MeasureInput(mm, TILED, slow_call_s=0.0), MeasureInput(mm, TILED)])
    assert slow.ok and len(slow.times_s) == 1 and "slow" in slow.error_msg
    assert full.ok and len(full.times_s) == cfg.repeats


# correct only where both inputs start on a cache line: the worker passes them as the executor does
ALIGNED_ONLY_C = _src("hand_mm_aligned", f"""
  const float *A = args[0], *B = args[1]; float *C = args[2];
  int aligned = (unsigned long)A % 64 == 0 && (unsigned long)B % 64 == 0;
  for (int i = 0; i < {N}; i++) for (int j = 0; j < {N}; j++) {{
    float s = 0; for (int k = 0; k < {N}; k++) s += A[i*{N}+k] * B[k*{N}+j]; C[i*{N}+j] = s; }}
  if (!aligned) C[0] = -12345.0f;""")


def test_kernels_are_measured_on_inputs_on_a_cache_line(mm, tmp_path):
    """The graph executor's buffers and constants start on a cache line; a kernel timed alone must see the
    same (numpy's 16-byte alignment split a blocked conv's weight loads over two lines)."""
    import numpy as np

    from superopt.runtime.kernel import build_kernel

    (r,) = measure([MeasureInput(mm, source=ALIGNED_ONLY_C)], _cfg(tmp_path))
    assert r.error_code == ErrorCode.OK, r.error_msg
    k = build_kernel(mm, list(TILED), threads=1)
    raw = np.random.default_rng(0).standard_normal(2 * N * N + 16).astype(np.float32)
    start = next(o for o in range(1, 16) if (raw.ctypes.data + 4 * o) % 64)  # a misaligned view
    a, b = raw[start:start + N * N].reshape(N, N), raw[start + N * N:start + 2 * N * N].reshape(N, N)
    prepared = k.prepare_inputs([a, b])
    assert all(p.ctypes.data % 64 == 0 for p, name in zip(prepared, mm.inputs) if name not in k.pack_fns)
    np.testing.assert_allclose(k(a, b)[0], a @ b, rtol=1e-4, atol=1e-4)


def test_a_candidate_measured_again_is_loaded_not_compiled_again(mm, tmp_path, monkeypatch):
    import superopt.measure.service as service_mod

    compiles: list[int] = []
    real = service_mod.compile_library
    monkeypatch.setattr(service_mod, "compile_library", lambda srcs, *a, **k: compiles.append(len(srcs)) or real(srcs, *a, **k))
    with MeasureService(_cfg(tmp_path)) as svc:
        first = svc.measure([MeasureInput(mm, ()), MeasureInput(mm, TILED)])
        # the same two in another order (other kernel names: a name carries the index in the batch), and a new one
        again = svc.measure([MeasureInput(mm, TILED), MeasureInput(mm, ()), MeasureInput(mm, TILED[:-1])])
    assert compiles == [2, 1]  # only the new candidate went to the compiler
    assert [r.error_code for r in first + again] == [ErrorCode.OK] * 5
    assert again[0].build_s == again[1].build_s == 0.0 and again[2].build_s > 0


def test_cold_measurement_cycles_through_copies_of_the_constants(mm, tmp_path):
    """cold_bytes: each call reads the constants from the next of enough copies to span that many bytes (a
    graph's kernel finds its weights out of cache); run-time inputs and outputs stay the same buffers. The
    candidate is still verified first (a wrong kernel stays WRONG_ANSWER)."""
    import numpy as np

    from superopt.measure.worker import MAX_COLD_COPIES, _cold_runner, cold_copies

    assert cold_copies(4 << 20, 128 << 20) == 32 and cold_copies(1 << 30, 128 << 20) == 1
    assert cold_copies(1 << 10, 128 << 20) == MAX_COLD_COPIES and cold_copies(0, 1 << 20) == 1

    class Recorder:
        pack_fns: dict = {}

        def __init__(self) -> None:
            self.calls: list[tuple[int, ...]] = []

        def run_raw(self, args) -> None:
            self.calls.append(tuple(a.ctypes.data for a in args))

    a, b, c = (np.ones((N, N), np.float32) for _ in range(3))
    k = Recorder()
    run = _cold_runner(k, [a, b], [c], [], {"B"}, ["A", "B"], 3 * b.nbytes)
    for _ in range(7):
        run()
    assert len({call[1] for call in k.calls}) == 3  # B: three copies, in turn
    assert [call[1] for call in k.calls[:3]] == [call[1] for call in k.calls[3:6]]
    assert {call[0] for call in k.calls} == {a.ctypes.data} and {call[2] for call in k.calls} == {c.ctypes.data}
    cold = [MeasureInput(mm, TILED, constant_inputs=frozenset({"B"}), cold_bytes=1 << 20),
            MeasureInput(mm, source=WRONG_C, cold_bytes=1 << 20)]
    ok, wrong = measure(cold, _cfg(tmp_path))
    assert ok.error_code is ErrorCode.OK and len(ok.times_s) == 3, ok.error_msg
    assert wrong.error_code is ErrorCode.WRONG_ANSWER


def test_a_run_time_input_is_packed_every_call_into_the_same_buffer_the_kernel_reads():
    """As the executor packs into its planned buffers: a fresh buffer per call would time its page faults too."""
    import numpy as np

    from superopt.measure.worker import _runner

    class Recorder:
        def __init__(self) -> None:
            self.packed: list[int] = []
            self.calls: list[tuple[int, ...]] = []

        def pack_into(self, name, src, dst) -> None:
            assert name == "B" and src is b
            self.packed.append(dst.ctypes.data)

        def run_raw(self, args) -> None:
            self.calls.append(tuple(a.ctypes.data for a in args))

    a, b, packed, c = (np.ones((N, N), np.float32) for _ in range(4))
    k = Recorder()
    run = _runner(k, [a, packed, c], [(1, "B", b)])
    for _ in range(3):
        run()
    assert k.packed == [packed.ctypes.data] * 3
    assert k.calls == [(a.ctypes.data, packed.ctypes.data, c.ctypes.data)] * 3


def test_the_callers_time_cuts_a_slow_build_without_retrying_each_candidate(mm, tmp_path):
    """A batch whose compiler run the caller's time ends is NOT_MEASURED as a whole, at that time: not a
    TIMEOUT of each candidate retried one by one with the full build limit."""
    import time

    cc = tmp_path / "slowcc"
    cc.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo slowcc 1.0; exit 0; fi\nexec sleep 30\n')
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    cfg = _cfg(tmp_path, build_timeout_s=20.0, dataset_dir=tmp_path / "ds",
               compiler=CompilerConfig(cc=str(cc), cache_dir=tmp_path / "kc"))
    started = time.perf_counter()
    with MeasureService(cfg) as svc:
        res = svc.measure([MeasureInput(mm, TILED), MeasureInput(mm, ())], time_left_s=0.5)
    assert time.perf_counter() - started < 5.0
    assert [r.error_code for r in res] == [ErrorCode.NOT_MEASURED] * 2, res
    assert "time budget" in res[0].error_msg
    assert not records_path(tmp_path / "ds").exists() or load_records(records_path(tmp_path / "ds")) == []


def test_the_callers_time_stops_a_run_and_skips_the_rest(mm, tmp_path):
    import time

    with MeasureService(_cfg(tmp_path, run_timeout_s=20.0)) as svc:
        started = time.perf_counter()
        res = svc.measure([MeasureInput(mm, (), source=HANG_C), MeasureInput(mm, ())], time_left_s=1.5)
        assert time.perf_counter() - started < 6.0
        assert [r.error_code for r in res] == [ErrorCode.NOT_MEASURED] * 2, res
        (ok,) = svc.measure([MeasureInput(mm, ())], time_left_s=30.0)  # a fresh worker replaces the killed one
    assert ok.error_code is ErrorCode.OK
