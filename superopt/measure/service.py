"""The measurement service: build candidate kernels, check them against the reference, time them.

``measure(inputs, config)`` lowers and emits every candidate, compiles them in batches (one shared
library per batch; when a batch fails to compile, its candidates are compiled one by one so one bad
kernel does not sink the rest), then runs each in a worker process (``superopt.measure.worker``).
A kernel that crashes or hangs costs one recorded error: the worker is killed/reaped and replaced,
and the batch carries on. Each candidate's outputs are checked against the float64 reference
interpreter on seeded random inputs before its timing counts.

Timing matches how the graph executor runs a kernel: inputs named constant (graph constants) that
the kernel packs are packed once before timing; run-time inputs the kernel packs are packed on
every call inside the timed function. Everything is lowered, compiled and timed for one explicit
:class:`~superopt.target.Target` (``MeasureConfig.target``), which the records carry.

Use :class:`MeasureService` directly to keep workers (and the reference cache) alive across calls.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

import numpy as np

from superopt.codegen.c_emit import KernelSource, emit_c
from superopt.interp.inputs import random_kernel_inputs
from superopt.interp.magnitude import compute_magnitudes
from superopt.interp.reference import evaluate_compute
from superopt.ir.canonical import workload_key
from superopt.ir.compute import Compute
from superopt.measure.records import MeasureRecord, append_records, records_path
from superopt.measure.worker import recv_frame, send_frame
from superopt.runtime.compiler import CompileDeadline, CompileError, CompilerConfig, compile_library
from superopt.runtime.kernel import kernel_name
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Primitive
from superopt.target import Target, host_target


class ErrorCode(Enum):
    OK = 0
    ILLEGAL_SCHEDULE = 1  # lower() rejected the trace (ScheduleError, or any other error lowering it)
    COMPILE_ERROR = 2  # emitting C or the C compiler failed
    RUNTIME_ERROR = 3  # the kernel crashed its worker (or could not be loaded)
    TIMEOUT = 4  # build or run exceeded its limit
    WRONG_ANSWER = 5  # outputs differ from the reference interpreter
    OUT_OF_MEMORY = 6  # the candidate's buffers exceed the worker's memory cap (MeasureConfig.memory_limit_bytes)
    NOT_MEASURED = 7  # the caller's time ran out before it was built or its run finished: says nothing of it


@dataclass(frozen=True)
class MeasureConfig:
    threads: int = 1  # used only when ``target`` is None; otherwise the target's threads
    build_timeout_s: float = 60.0  # one compiler run (a batch, or one candidate)
    run_timeout_s: float = 10.0  # one candidate: load, correctness run, warm-up and all repeats
    warmup: int = 1
    min_repeat_s: float = 0.02  # calls per repeat are chosen so that one repeat lasts at least this
    repeats: int = 5  # the result is the median over repeats
    rtol: float = 1e-3
    atol: float = 1e-3
    workers: int = 1  # parallel run workers (more than 1 perturbs timings on a small machine)
    dataset_dir: Path | str | None = None
    compiler: CompilerConfig = field(default_factory=CompilerConfig)
    seed: int = 0
    batch_size: int = 32  # candidates per shared library
    worker_start_timeout_s: float = 60.0
    reference_cache: int = 8  # distinct workloads whose inputs/reference outputs are kept
    max_tasks_per_worker: int = 500  # a worker is recycled after this many (it keeps every library loaded)
    target: Target | None = None  # None: this machine (host_target) with ``threads`` threads
    # address-space cap of each measurement worker (RLIMIT_AS): a runaway candidate gets OUT_OF_MEMORY instead
    # of taking the machine down. None: half of this machine's physical memory; 0: no cap
    memory_limit_bytes: int | None = None

    def resolved_target(self) -> Target:
        return self.target if self.target is not None else host_target(self.threads, self.compiler.cc)

    def worker_memory_cap(self) -> int | None:
        if self.memory_limit_bytes == 0:
            return None
        if self.memory_limit_bytes is not None:
            return self.memory_limit_bytes
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
        except (ValueError, OSError):
            return None


@dataclass(frozen=True)
class MeasureInput:
    compute: Compute
    trace: tuple[Primitive, ...] | list[Primitive] = ()
    source: KernelSource | None = None  # hand-written kernel used instead of codegen (tests, baselines)
    # inputs bound to constants (packed once, before timing); None: every input is constant. A run-time
    # input the kernel packs is packed inside every timed call, as the graph executor does.
    constant_inputs: frozenset[str] | None = None
    # a candidate whose first (checked) call takes longer than this is verified and reported with that
    # one call's time instead of being timed in full: a search does not spend seconds on a hopeless one
    slow_call_s: float | None = None
    # > 0: the constants are timed out of cache, as inside a graph, where each kernel finds its weights wherever
    # the kernels before it left them: copies of the (packed) constants spanning this many bytes (at most
    # ``MAX_COLD_COPIES``) are used in turn, one per call. 0: every call reads the same, cached, constants
    cold_bytes: int = 0

    def constants(self) -> frozenset[str]:
        """The constant inputs, resolved (None means all of them)."""
        if self.constant_inputs is None:
            return frozenset(self.compute.inputs)
        unknown = sorted(set(self.constant_inputs) - set(self.compute.inputs))
        if unknown:
            raise ValueError(f"constant input(s) {unknown} are not inputs of the compute {list(self.compute.inputs)}")
        return frozenset(self.constant_inputs)


@dataclass
class MeasureResult:
    error_code: ErrorCode
    times_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    error_msg: str = ""
    build_s: float = 0.0  # compile time (a batch's time is shared equally among its candidates)

    @property
    def ok(self) -> bool:
        return self.error_code is ErrorCode.OK

    @property
    def cost(self) -> float:
        """Median seconds, or +inf for a failed candidate (convenient for ranking)."""
        return self.median_s if self.ok and self.median_s is not None else float("inf")


def _not_measured(why: str, build_s: float = 0.0) -> MeasureResult:
    return MeasureResult(ErrorCode.NOT_MEASURED, error_msg=why, build_s=build_s)


def _signal_name(rc: int | None) -> str:
    if rc is None:
        return "unknown status"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


def _cap_memory(limit: int) -> None:
    """In the worker child before exec: cap its address space (allocations beyond raise MemoryError)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class _WorkerProc:
    """One worker subprocess and the workloads whose data it already holds."""

    def __init__(self, config: MeasureConfig) -> None:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = [sys.executable, "-c", "from superopt.measure.worker import main; main()"]
        cap = config.worker_memory_cap()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env,
                                     preexec_fn=None if cap is None else functools.partial(_cap_memory, cap))
        self.known: OrderedDict[str, None] = OrderedDict()
        self.tasks = 0
        self.limit = config.reference_cache
        if not self.wait_readable(config.worker_start_timeout_s):
            self.kill()
            raise RuntimeError(f"measurement worker did not start within {config.worker_start_timeout_s}s")
        try:
            hello = recv_frame(self.proc.stdout)
        except EOFError:
            rc = self.kill()
            raise RuntimeError(f"measurement worker failed to start ({_signal_name(rc)})") from None
        if not hello.get("ready"):
            self.kill()
            raise RuntimeError(f"measurement worker sent {hello!r} instead of ready")

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def wait_readable(self, timeout: float) -> bool:
        r, _, _ = select.select([self.fileno()], [], [], max(timeout, 0.0))
        return bool(r)

    def send(self, task: dict, data) -> None:
        digest = task["digest"]
        if digest in self.known:
            self.known.move_to_end(digest)
        else:
            task["data"] = data
            self.known[digest] = None
            forget = []
            while len(self.known) > self.limit:
                forget.append(self.known.popitem(last=False)[0])
            task["forget"] = forget
        send_frame(self.proc.stdin, task)
        self.tasks += 1

    def kill(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                send_frame(self.proc.stdin, None)
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


COMPILED_KERNELS_KEPT = 4096  # compiled candidates a service remembers (a path and a source each)


def _unnamed_digest(source: KernelSource) -> str:
    """The kernel's code with its own name taken out (names carry the candidate's index in its batch)."""
    return hashlib.sha256(source.code.replace(source.name, "\0").encode()).hexdigest()


class MeasureService:
    """Measures candidates; keeps run workers, the per-workload reference cache and the compiled kernels'
    libraries between calls."""

    def __init__(self, config: MeasureConfig | None = None) -> None:
        self.config = config or MeasureConfig()
        if self.config.workers < 1 or self.config.repeats < 1:
            raise ValueError("MeasureConfig needs workers >= 1 and repeats >= 1")
        self._workers: list[_WorkerProc | None] = [None] * self.config.workers
        self._refs: OrderedDict[str, tuple[list, list, list] | str] = OrderedDict()  # (inputs, refs, magnitudes)
        self._target: Target = self.config.resolved_target()
        # kernels this service compiled (their code, named or not) -> the library holding them and their source:
        # a candidate measured again (a tuner's confirmation rounds) is loaded, not compiled again
        self._compiled: OrderedDict[str, tuple[str, KernelSource]] = OrderedDict()

    def __enter__(self) -> MeasureService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for i, w in enumerate(self._workers):
            if w is not None:
                w.close()
                self._workers[i] = None

    @property
    def target(self) -> Target:
        return self._target

    # -- build ---------------------------------------------------------------------------------

    def _sources(self, inputs: Sequence[MeasureInput], results: list) -> dict[int, KernelSource]:
        sources = {}
        for i, inp in enumerate(inputs):
            if inp.source is not None:
                sources[i] = inp.source
                continue
            try:
                plan = lower(inp.compute, inp.trace, self._target)
            except ScheduleError as e:
                results[i] = MeasureResult(ErrorCode.ILLEGAL_SCHEDULE, error_msg=str(e))
                continue
            except Exception as e:  # noqa: BLE001 - lower is meant to raise only ScheduleError; anything
                # else it raises is still caused by this trace on this compute: the trace is unusable
                results[i] = MeasureResult(ErrorCode.ILLEGAL_SCHEDULE,
                                           error_msg=f"lower raised {type(e).__name__} (not ScheduleError): {e}")
                continue
            try:
                sources[i] = emit_c(plan, kernel_name(inp.compute, inp.trace, i))
            except ScheduleError as e:  # a check made while building the loop nest
                results[i] = MeasureResult(ErrorCode.ILLEGAL_SCHEDULE, error_msg=str(e))
            except Exception as e:  # noqa: BLE001 - a codegen bug costs this candidate only
                results[i] = MeasureResult(ErrorCode.COMPILE_ERROR, error_msg=f"codegen failed: {e!r}")
        return sources

    def _compile(self, idx: list[int], sources: dict[int, KernelSource], results: list,
                 deadline: float | None = None) -> dict[int, tuple]:
        """Compile ``idx`` into one library; on failure fall back to one library per candidate. A compiler
        run is cut off at ``deadline`` (``time.monotonic()``): what it had not built is NOT_MEASURED."""
        left = math.inf if deadline is None else deadline - time.monotonic()
        if left <= 0:
            for i in idx:
                results[i] = _not_measured("the time budget ended before it was compiled")
            return {}
        cc = replace(self.config.compiler, timeout_s=self.config.build_timeout_s)
        t0 = time.perf_counter()
        try:
            path = compile_library([sources[i].code for i in idx], cc, self._target, deadline=deadline)
        except CompileDeadline:  # the caller's time, not the candidates' fault (finished objects stay cached)
            for i in idx:
                results[i] = _not_measured("the time budget ended while it was compiled")
            return {}
        except CompileError as e:
            dt = time.perf_counter() - t0
            timed_out = "timed out" in str(e) or dt >= self.config.build_timeout_s
            if len(idx) > 1:
                return {k: v for i in idx for k, v in self._compile([i], sources, results, deadline).items()}
            code = ErrorCode.TIMEOUT if timed_out else ErrorCode.COMPILE_ERROR
            results[idx[0]] = MeasureResult(code, error_msg=str(e)[:4000], build_s=dt)
            return {}
        share = (time.perf_counter() - t0) / len(idx)
        for i in idx:
            self._compiled[_unnamed_digest(sources[i])] = (str(path), sources[i])
        while len(self._compiled) > COMPILED_KERNELS_KEPT:
            self._compiled.popitem(last=False)
        return {i: (str(path), share) for i in idx}

    def _reuse(self, sources: dict[int, KernelSource]) -> dict[int, tuple]:
        """Candidates compiled before by this service (the same code under any kernel name), still on disk:
        their sources become the compiled ones (the symbol the library has) and they need no compiler run."""
        built = {}
        for i, src in list(sources.items()):
            key = _unnamed_digest(src)
            hit = self._compiled.get(key)
            if hit is not None and Path(hit[0]).exists():
                self._compiled.move_to_end(key)
                sources[i] = hit[1]
                built[i] = (hit[0], 0.0)
        return built

    # -- reference -----------------------------------------------------------------------------

    def _reference(self, compute: Compute):
        d = compute.digest()
        hit = self._refs.get(d)
        if hit is not None:
            self._refs.move_to_end(d)
            return hit
        try:
            ins = random_kernel_inputs(compute, self.config.seed)
            refs = [np.asarray(r, dtype=np.float64) if np.issubdtype(np.asarray(r).dtype, np.floating)
                    else np.asarray(r) for r in evaluate_compute(compute, ins, dtype=np.float64)]
            val = (ins, refs, compute_magnitudes(compute, ins))
        except Exception as e:  # noqa: BLE001
            val = f"reference interpreter failed: {e!r}"
        self._refs[d] = val
        while len(self._refs) > self.config.reference_cache:
            self._refs.popitem(last=False)
        return val

    # -- run -----------------------------------------------------------------------------------

    def _run(self, inputs: Sequence[MeasureInput], sources: dict, built: dict, results: list,
             until: float | None = None) -> None:
        """Run the built candidates on the workers; none starts, and a running one is stopped, at ``until``
        (``time.monotonic()``, the caller's deadline): those are NOT_MEASURED."""
        cfg = self.config
        pending = deque(sorted(built))
        busy: dict[int, tuple[int, float]] = {}  # slot -> (candidate, deadline)
        while pending or busy:
            for slot in range(len(self._workers)):
                if slot in busy or not pending:
                    continue
                i = pending.popleft()
                if until is not None and time.monotonic() >= until:
                    results[i] = _not_measured("the time budget ended before it ran", built[i][1])
                    continue
                ref = self._reference(inputs[i].compute)
                if isinstance(ref, str):
                    results[i] = MeasureResult(ErrorCode.RUNTIME_ERROR, error_msg=ref, build_s=built[i][1])
                    continue
                task = {"lib": built[i][0], "source": sources[i], "compute": inputs[i].compute,
                        "digest": inputs[i].compute.digest(), "threads": self._target.threads,
                        "constants": sorted(inputs[i].constants()), "rtol": cfg.rtol,
                        "atol": cfg.atol, "warmup": cfg.warmup, "min_repeat_s": cfg.min_repeat_s,
                        "repeats": cfg.repeats, "slow_call_s": inputs[i].slow_call_s,
                        "cold_bytes": inputs[i].cold_bytes}
                for attempt in (0, 1):
                    if self._workers[slot] is None:
                        self._workers[slot] = _WorkerProc(cfg)
                    try:
                        self._workers[slot].send(dict(task), ref)
                        break
                    except OSError:  # the idle worker had died: replace it and resend once
                        self._workers[slot].kill()
                        self._workers[slot] = None
                        if attempt:
                            raise
                busy[slot] = (i, min(time.monotonic() + cfg.run_timeout_s, until or math.inf))
            if not busy:
                continue
            now = time.monotonic()
            wait = min(d for _, d in busy.values()) - now
            fds = {self._workers[s].fileno(): s for s in busy}
            ready, _, _ = select.select(list(fds), [], [], max(wait, 0.0))
            for fd in ready:
                slot = fds[fd]
                i, _ = busy.pop(slot)
                w = self._workers[slot]
                try:
                    reply = recv_frame(w.proc.stdout)
                except (EOFError, OSError):
                    rc = w.kill()
                    self._workers[slot] = None
                    results[i] = MeasureResult(ErrorCode.RUNTIME_ERROR, build_s=built[i][1],
                                               error_msg=f"kernel crashed its worker ({_signal_name(rc)})")
                    continue
                if w.tasks >= cfg.max_tasks_per_worker:
                    w.close()
                    self._workers[slot] = None
                times = [float(t) for t in reply["times_s"]]
                results[i] = MeasureResult(ErrorCode[reply["code"]], times, float(np.median(times)) if times
                                           else None, reply["msg"], built[i][1])
            now = time.monotonic()
            for slot, (i, deadline) in list(busy.items()):
                if now >= deadline:
                    del busy[slot]
                    self._workers[slot].kill()
                    self._workers[slot] = None
                    if until is not None and now >= until:
                        results[i] = _not_measured("the time budget ended while it ran; worker killed",
                                                   built[i][1])
                    else:
                        results[i] = MeasureResult(ErrorCode.TIMEOUT, build_s=built[i][1],
                                                   error_msg=f"run exceeded {cfg.run_timeout_s}s; worker killed")

    # -- entry point ---------------------------------------------------------------------------

    def measure(self, inputs: Sequence[MeasureInput], time_left_s: float | None = None) -> list[MeasureResult]:
        """Build, verify and time ``inputs``. ``time_left_s``: the caller's budget; no compiler run or
        candidate's run goes past it, and what it cut short comes back NOT_MEASURED (not a failure)."""
        inputs = list(inputs)
        for inp in inputs:
            inp.constants()  # a misnamed constant input is the caller's error, raised before any work
        deadline = None if time_left_s is None else time.monotonic() + time_left_s
        results: list[MeasureResult | None] = [None] * len(inputs)
        sources = self._sources(inputs, results)
        built: dict[int, tuple] = self._reuse(sources)
        order = sorted(set(sources) - set(built))
        # under a deadline, candidates are built and run a few at a time, so that the time's end leaves the
        # first ones measured rather than a whole batch compiled and none run
        step = self.config.batch_size if deadline is None else 2 * max(self.config.compiler.jobs, 2)
        self._run(inputs, sources, built, results, deadline)
        for k in range(0, len(order), max(step, 1)):
            now = self._compile(order[k:k + step], sources, results, deadline)
            self._run(inputs, sources, now, results, deadline)
        assert all(r is not None for r in results)
        if self.config.dataset_dir is not None:
            self._record(inputs, results)
        return results

    def _record(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        append_records(records_path(self.config.dataset_dir), build_records(inputs, results, self._target))


def build_records(inputs: Sequence[MeasureInput], results: Sequence[MeasureResult], target: Target,
                  timestamp: float | None = None) -> list[MeasureRecord]:
    """The measurement records of these inputs and their results on ``target`` (what a service with a
    ``dataset_dir`` appends; Ray runners and dataset collection write the same). A NOT_MEASURED result says
    nothing of its candidate and makes no record."""
    now = time.time() if timestamp is None else timestamp
    target_dict = target.to_dict()
    recs = []
    for inp, r in zip(inputs, results, strict=True):
        if r.error_code is ErrorCode.NOT_MEASURED:
            continue
        sha = hashlib.sha256(inp.source.code.encode()).hexdigest() if inp.source is not None else None
        consts = inp.constants()
        recs.append(MeasureRecord(
            workload_text=inp.compute.text(), workload_digest=inp.compute.digest(),
            trace=tuple(inp.trace), target=target_dict, error_code=r.error_code.name,
            error_msg=r.error_msg, times_s=tuple(r.times_s), median_s=r.median_s,
            build_s=r.build_s, timestamp=now, source_sha256=sha,
            constant_inputs=tuple(sorted(consts)), workload_key=workload_key(inp.compute, consts)))
    return recs


def measure(inputs: Sequence[MeasureInput], config: MeasureConfig | None = None) -> list[MeasureResult]:
    """Measure a batch with fresh workers (see :class:`MeasureService` to reuse them across batches)."""
    with MeasureService(config) as service:
        return service.measure(inputs)
