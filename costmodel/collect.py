"""Offline dataset collection for the learned cost model: measure many schedules of many workloads.

``collect(CollectConfig(...))`` takes workloads (:mod:`costmodel.workloads`), and for each one draws
its schedules: the default schedule first, then random points of its schedule space
(``ScheduleSpace.sample`` with an rng seeded from the seed and the workload key, so a rerun draws the
same sequence), deduplicated by trace, up to ``per_workload`` legal traces. They are measured in
batches through a runner (:mod:`superopt.measure.runner`: this machine, or Ray actors) and appended
after every batch to ``<out>/measurements.jsonl`` as the same :class:`~superopt.measure.MeasureRecord`
lines a ``MeasureService`` with ``dataset_dir`` writes, so a trainer reads both alike.
``<out>/manifest.json`` (config, target, times, one report per run) is replaced atomically.

On a GPU (``target.kind == "cuda"``: the device's target, ``require_gpu(binding).target``) the same
plan is measured by :class:`~superopt.measure.gpu.GpuRunner`: GPU sketches and knobs from the same
``ScheduleSpace``, nvcc-compiled batches run in isolated worker processes through the GPU runtime
interface (``gpu_binding``: automatic, a named binding, or the CPU ``emulator``), verified against the
reference interpreter and timed with CUDA events; the records are the same lines with the GPU target.

Collection resumes: records already in the file (for the same target) count, so a workload that has
``per_workload`` of them is skipped and a partly done one measures only the rest. A run killed mid-batch
loses that batch; a line it left half-written is dropped before the next append.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from costmodel.workloads import DEFAULT_MIX, DEFAULT_MODELS, Workload, WorkloadSizes, generate_workloads
from superopt.measure.records import append_records, load_records, records_path
from superopt.measure.runner import make_runner
from superopt.measure.service import MeasureConfig, MeasureInput, build_records
from superopt.schedule.plan import ScheduleError
from superopt.schedule.primitives import Primitive, trace_to_json
from superopt.schedule.space import ScheduleSpace
from superopt.target import Target, host_target

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class CollectConfig:
    """What to collect. ``workloads``: a count (``generate_workloads(n, seed)`` over ``models``) or the
    workloads themselves. ``runner``: ``"local"``, ``"auto"`` or a Ray address. ``measure``: timing and
    compiler settings (its target, threads, workers and dataset dir are set from here)."""

    workloads: int | tuple[Workload, ...]
    per_workload: int = 8
    seed: int = 0
    out: Path | str = Path("datasets/default")
    target: Target = field(default_factory=host_target)
    runner: str = "local"
    ray_workers: int | None = None
    progress: bool = True
    batch_size: int = 16  # candidates measured (and saved) at a time
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    slow_call_s: float | None = 1.0  # a candidate slower than this per call is timed once (MeasureInput)
    models: tuple[str, ...] = DEFAULT_MODELS  # light models that generate_workloads draws kernels from
    mix: tuple[tuple[str, float], ...] = DEFAULT_MIX  # generate_workloads' sources and their weights
    gpu_binding: str | None = None  # a cuda target: the GPU binding (None: automatic; "emulator": the CPU stand-in)
    sizes: WorkloadSizes | None = None  # generated workloads' sizes (None: the target's, workloads.sizes_for)
    max_seconds: float | None = None  # stop after the first batch that ends past this much time (resume later)

    def validate(self) -> None:
        if isinstance(self.workloads, int) and self.workloads < 1:
            raise ValueError(f"workloads must be at least 1, got {self.workloads}")
        if self.per_workload < 1:
            raise ValueError(f"per_workload must be at least 1, got {self.per_workload}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.ray_workers is not None and self.ray_workers < 1:
            raise ValueError(f"ray_workers must be at least 1, got {self.ray_workers}")
        if self.target.kind == "cuda" and self.runner != "local":
            raise ValueError("GPU collection runs on this machine's GPU: Ray runners measure CPU targets only")
        if self.target.kind != "cuda" and self.gpu_binding is not None:
            raise ValueError(f"a GPU binding ({self.gpu_binding!r}) needs a cuda target, not {self.target.kind!r}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be positive, got {self.max_seconds}")

    def to_dict(self) -> dict:
        m = self.measure
        return {
            "workloads": self.workloads if isinstance(self.workloads, int) else "given",
            "per_workload": self.per_workload, "seed": self.seed, "out": str(self.out), "runner": self.runner,
            "ray_workers": self.ray_workers, "batch_size": self.batch_size, "slow_call_s": self.slow_call_s,
            "models": list(self.models), "mix": [list(m) for m in self.mix], "gpu_binding": self.gpu_binding,
            "max_seconds": self.max_seconds,
            "sizes": None if self.sizes is None else asdict(self.sizes),
            "measure": {"warmup": m.warmup, "repeats": m.repeats, "min_repeat_s": m.min_repeat_s, "rtol": m.rtol,
                        "atol": m.atol, "run_timeout_s": m.run_timeout_s, "build_timeout_s": m.build_timeout_s,
                        "seed": m.seed, "compiler": m.compiler.cc, "flags": list(m.compiler.flags)},
        }


@dataclass
class CollectReport:
    workloads: int
    workloads_done: int = 0  # already had per_workload records: skipped
    records_written: int = 0
    skipped: int = 0  # schedules already recorded (not measured again)
    ok: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # error code -> count, for records not OK
    short: int = 0  # workloads whose space has fewer distinct legal schedules than per_workload
    elapsed_s: float = 0.0
    stop_reason: str = ""
    out: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# -- the records file ---------------------------------------------------------------------------


def repair_tail(path: Path) -> int:
    """Make the next append start a line of its own: a last line without its newline (a writer killed
    mid-append) is dropped, or, if it is a whole JSON object, ended. Returns the bytes dropped."""
    if not path.exists():
        return 0
    with open(path, "rb+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return 0
            start = _last_line_start(f, size)
            f.seek(start)
            tail = f.read()
            try:
                json.loads(tail)
            except ValueError:
                f.truncate(start)
                return size - start
            f.write(b"\n")
            return 0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _last_line_start(f, size: int, chunk: int = 1 << 16) -> int:
    """Offset just past the last newline of the open file (0 if it has none)."""
    end = size
    while end > 0:
        begin = max(0, end - chunk)
        f.seek(begin)
        i = f.read(end - begin).rfind(b"\n")
        if i >= 0:
            return begin + i + 1
        end = begin
    return 0


def trace_key(trace: Sequence[Primitive]) -> str:
    return trace_to_json(tuple(trace))


def recorded_traces(path: Path, target: Target) -> dict[str, set[str]]:
    """Workload key -> the traces (:func:`trace_key`) already recorded for ``target``."""
    if not path.exists():
        return {}
    want = target.key()
    done: dict[str, set[str]] = {}
    for rec in load_records(path):
        if rec.workload_key is not None and rec.target_key() == want:
            done.setdefault(rec.workload_key, set()).add(trace_key(rec.trace))
    return done


# -- schedules of one workload ------------------------------------------------------------------


@dataclass
class Plan:
    """The schedules still to measure for one workload."""

    workload: Workload
    todo: list[tuple[Primitive, ...]]
    skipped: int  # drawn traces already recorded
    short: bool  # the space ran out before per_workload distinct legal traces


def plan_workload(workload: Workload, target: Target, per_workload: int, seed: int, done: set[str]) -> Plan:
    """The default trace, then random samples, distinct and legal, skipping those in ``done``, until
    ``done`` plus the new ones make ``per_workload`` (or ``20 * per_workload + 20`` draws ran out)."""
    space = ScheduleSpace(workload.compute, target, workload.constant_inputs)
    rng = random.Random(f"{seed}:{workload.key}")
    seen: set[str] = set()
    todo: list[tuple[Primitive, ...]] = []
    skipped = 0
    points = [space.default_point()] + [None] * (20 * per_workload + 20)
    for point in points:
        if len(done) + len(todo) >= per_workload:
            break
        try:
            trace = space.trace(point if point is not None else space.sample(rng))
        except ScheduleError:
            continue
        key = trace_key(trace)
        if key in seen:
            continue
        seen.add(key)
        if key in done:
            skipped += 1
        else:
            todo.append(trace)
    return Plan(workload, todo, skipped, len(done) + len(todo) < per_workload)


# -- manifest -----------------------------------------------------------------------------------


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace`` (never half-written)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_manifest(config: CollectConfig, workloads: Sequence[Workload], report: CollectReport | None,
                    started: float) -> None:
    path = Path(config.out) / MANIFEST_FILE
    old: dict = {}
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
    runs = [r for r in old.get("runs", []) if r.get("started_ts") != started]
    runs.append({"started": _utc(started), "started_ts": started, "config": config.to_dict(),
                 "report": report.to_dict() if report is not None else None})
    write_json_atomic(path, {
        "format": MANIFEST_FORMAT, "created": old.get("created", _utc(started)), "updated": _utc(time.time()),
        "records": records_path(config.out).name, "config": config.to_dict(), "target": config.target.to_dict(),
        "target_key": config.target.key(),
        "workloads": [{"name": w.name, "source": w.source, "key": w.key} for w in workloads], "runs": runs,
    })


# -- collection ---------------------------------------------------------------------------------


def _batches(plans: Iterator[Plan], config: CollectConfig) -> Iterator[list[MeasureInput]]:
    """Every planned schedule as a MeasureInput, ``batch_size`` at a time."""
    batch: list[MeasureInput] = []
    for plan in plans:
        w = plan.workload
        for trace in plan.todo:
            batch.append(MeasureInput(w.compute, trace, constant_inputs=w.constant_inputs,
                                      slow_call_s=config.slow_call_s))
            if len(batch) >= config.batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def _plans(workloads: Sequence[Workload], done: dict[str, set[str]], config: CollectConfig,
           report: CollectReport) -> Iterator[Plan]:
    for w in workloads:
        have = done.get(w.key, set())
        if len(have) >= config.per_workload:
            report.workloads_done += 1
            continue
        plan = plan_workload(w, config.target, config.per_workload, config.seed, have)
        report.skipped += plan.skipped
        report.short += plan.short
        yield plan


def resolve_workloads(config: CollectConfig) -> list[Workload]:
    if isinstance(config.workloads, int):
        return generate_workloads(config.workloads, config.seed, target=config.target, models=config.models,
                                  mix=config.mix, sizes=config.sizes)
    return list(config.workloads)


def gpu_measure_config(config: CollectConfig):
    """The GPU measurement settings of a cuda collection, from its ``measure`` settings."""
    from superopt.measure.gpu import GpuMeasureConfig

    m = config.measure
    return GpuMeasureConfig(binding=config.gpu_binding, repeats=m.repeats, warmup=m.warmup, rtol=m.rtol, atol=m.atol,
                            seed=m.seed, build_timeout_s=max(m.build_timeout_s, 120.0), run_timeout_s=m.run_timeout_s,
                            min_repeat_s=m.min_repeat_s)


def make_collect_runner(config: CollectConfig):
    """The runner a collection measures with: the GPU's for a cuda target, else local or Ray."""
    if config.target.kind == "cuda":
        from superopt.measure.gpu import GpuRunner

        return GpuRunner(gpu_measure_config(config), config.target)
    mcfg = replace(config.measure, target=config.target, threads=config.target.threads, dataset_dir=None, workers=1)
    return make_runner(config.runner, mcfg, config.ray_workers)


def _progress(config: CollectConfig, total: int):
    """A tqdm bar on stderr (a no-op bar where tqdm is not installed, e.g. a bare GPU machine)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, disable=not config.progress, desc="collect", unit="schedule", file=sys.stderr)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def collect(config: CollectConfig) -> CollectReport:
    """Measure the configured workloads' schedules into ``config.out`` (resuming what is there)."""
    config.validate()
    started = time.time()
    t0 = time.perf_counter()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    path = records_path(out)
    repair_tail(path)
    done = recorded_traces(path, config.target)
    workloads = resolve_workloads(config)
    report = CollectReport(len(workloads), out=str(out))
    _write_manifest(config, workloads, None, started)
    remaining = sum(max(0, config.per_workload - len(done.get(w.key, ()))) for w in workloads)
    failures: Counter[str] = Counter()
    stop = "complete"
    try:
        with make_collect_runner(config) as runner, _progress(config, remaining) as bar:
            for batch in _batches(_plans(workloads, done, config, report), config):
                if (config.max_seconds is not None and report.records_written
                        and time.perf_counter() - t0 >= config.max_seconds):
                    stop = f"time limit ({config.max_seconds:g} s): rerun to resume"
                    break
                results = runner.measure(batch)
                append_records(path, build_records(batch, results, config.target))
                report.records_written += len(batch)
                for r in results:
                    if r.ok:
                        report.ok += 1
                    else:
                        failures[r.error_code.name] += 1
                bar.update(len(batch))
    except KeyboardInterrupt:
        stop = "interrupted"
    except BaseException as e:
        stop = f"error: {type(e).__name__}: {e}"
        raise
    finally:
        report.failures = dict(sorted(failures.items()))
        report.elapsed_s = time.perf_counter() - t0
        report.stop_reason = _stop_reason(stop, report, config.per_workload)
        _write_manifest(config, workloads, report, started)
    return report


def _stop_reason(stop: str, report: CollectReport, per_workload: int) -> str:
    if stop != "complete":
        return stop
    short = f" ({report.short} workload(s) have fewer than {per_workload} distinct legal schedules)" if report.short else ""
    if report.records_written == 0:
        return f"nothing to measure: all {report.workloads} workloads already recorded{short}"
    return "complete" + short


__all__ = ["CollectConfig", "CollectReport", "MANIFEST_FILE", "Plan", "collect", "gpu_measure_config",
           "make_collect_runner", "plan_workload", "recorded_traces", "repair_tail", "resolve_workloads", "trace_key",
           "write_json_atomic"]
