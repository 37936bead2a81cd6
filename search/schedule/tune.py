"""Tune every kernel of a graph within one budget, shared by expected gain (Ansor's task scheduler).

Kernels with the same rename-invariant workload key are one task (weight = how many nodes use it).
A task already tuned for the target in the database is not searched again. The others first get one
batch each (their default schedule is measured first), then each next batch goes to the task whose
expected saving is largest: weight x its best time x its recent relative improvement (plus a small
optimism bonus that shrinks with the batches it had). Every measurement is appended to the database
as it is made, so an interrupted run loses nothing. Each kernel's leaders are then re-measured next to
its default (confirmation rounds), and in a graph of several kernels the picks are last timed against
the defaults inside the graph itself (search/graph/confirm.py): a pick stays only where it is faster there.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm import tqdm

from costmodel.base import CostModel
from search.budget import DEFAULT_TRIALS, Budget, StopReason
from search.graph.confirm import InGraphConfig, InGraphReport, confirm_in_graph
from search.schedule.database import TuningDatabase, TuningRecord
from search.schedule.search import Measurer, ScheduleSearch, SearchConfig
from superopt.ir.canonical import workload_key
from superopt.ir.compute import Compute
from superopt.ir.flops import flop_count
from superopt.ir.graph import Graph
from superopt.measure import MeasureConfig, MeasureService
from superopt.runtime.compiler import CompileError
from superopt.schedule.default import default_schedule
from superopt.schedule.graph_defaults import constant_inputs
from superopt.schedule.primitives import Primitive
from superopt.target import Target

# the share of a time budget the search leaves to the confirmation rounds
CONFIRM_TIME_SHARE = 0.15
# the share it leaves to the in-graph confirmation (search/graph/confirm.py) of a graph of several kernels
IN_GRAPH_TIME_SHARE = 0.08


@dataclass(frozen=True)
class TuneConfig:
    trials: int | None = DEFAULT_TRIALS  # measurements over all kernels of the graph (None: no limit)
    time_s: float | None = None  # wall-clock budget
    seed: int = 0
    batch_size: int = 16
    # a kernel's first batch (the default's measurement included): small, so that a budget reaches every
    # kernel before it goes where the search gains (a 15-minute resnet50 tune with first batches of 16
    # reached 13 of its 29 kernels, in graph order)
    first_batch: int = 8
    strategy: str = "evolutionary"  # or "random"
    progress: bool = True  # a tqdm bar on stderr
    confirm_top: int = 3  # leaders per kernel re-measured with the default at the end
    confirm_rounds: int = 2
    # then, in a graph of several kernels, every pick is timed against its default inside the graph
    # (search/graph/confirm.py), and the database keeps it only where it is faster there
    in_graph_rounds: int = 21  # 0: no in-graph confirmation
    # the share of a time budget kept for it: it compiles the whole graph twice (resnet50's two programs took
    # 71 s with a cold compiler cache, and were timed in 2 s); where that does not fit, it is left out
    in_graph_share: float = IN_GRAPH_TIME_SHARE
    # a graph's kernels are timed with their constants out of cache (MeasureInput.cold_bytes): copies spanning
    # this many bytes, used in turn. Inside a model a kernel's weights come from L3 or memory, not from the
    # caches a kernel timed alone keeps them in, so a large layer runs slower in the graph than hot; a schedule
    # that hides that (schedule.Prefetch) gains only where the search sees it. 0: hot
    cold_bytes: int = 128 << 20

    @property
    def budget(self) -> Budget:
        return Budget(self.trials, self.time_s)


@dataclass
class KernelTuneResult:
    nodes: list[str]
    workload_key: str
    flops: int
    default_s: float | None
    best_s: float | None
    best_trace: tuple[Primitive, ...]
    measured: int  # measurements made in this run
    from_database: bool  # already tuned for this target: nothing measured
    stop_reason: str
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        return self.default_s / self.best_s if self.default_s and self.best_s else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["best_trace"] = [repr(p) for p in self.best_trace]
        d["speedup"] = self.speedup
        return d


@dataclass
class GraphTuneReport:
    kernels: list[KernelTuneResult]
    measured: int
    elapsed_s: float
    stop_reason: str
    in_graph: InGraphReport | None = None  # the in-graph confirmation, where one ran

    def to_dict(self) -> dict:
        return {"kernels": [k.to_dict() for k in self.kernels], "measured": self.measured,
                "elapsed_s": self.elapsed_s, "stop_reason": self.stop_reason,
                "in_graph": None if self.in_graph is None else self.in_graph.to_dict()}


@dataclass
class _Task:
    key: str
    compute: Compute
    consts: frozenset[str]
    nodes: list[str]
    search: ScheduleSearch | None = None
    result: KernelTuneResult | None = None
    batches: int = 0
    bests: list[float] = field(default_factory=list)  # best seconds after each batch
    confirmed: set[tuple] = field(default_factory=set)  # leader traces re-measured with the default

    def weight(self) -> float:
        """How much this kernel's time counts before any is measured: its flops times its instances."""
        return len(self.nodes) * float(flop_count(self.compute))

    def priority(self) -> float:
        """Expected seconds saved per batch: weight x best time x recent relative improvement."""
        if not self.bests or not math.isfinite(self.bests[-1]):
            return math.inf if not self.bests else 0.0
        best = self.bests[-1]
        prev = self.bests[-3] if len(self.bests) >= 3 else self.bests[0]
        gain = max(0.0, (prev - best) / prev) if math.isfinite(prev) else 0.0
        return len(self.nodes) * best * (gain + 0.2 / math.sqrt(self.batches))


def _unconfirmed_gain(task: _Task) -> bool:
    """The task's search measured some schedule faster than the default (a reading to confirm) that no
    confirmation has re-measured yet."""
    best, default = task.search.best, task.search.default_s
    leaders = _leaders(task, 1)
    return (best is not None and default is not None and math.isfinite(best.seconds) and best.seconds < default
            and len(leaders) > 1 and leaders[1] not in task.confirmed)


def _leaders(task: _Task, k: int) -> list[tuple]:
    """The default trace and the ``k`` fastest distinct other traces this task's search measured."""
    log = task.search.log
    if not log:
        return []
    default = tuple(log[0].trace)
    out = [default]
    for tr in sorted((t for t in log[1:] if math.isfinite(t.seconds)), key=lambda t: t.seconds):
        if tuple(tr.trace) not in out:
            out.append(tuple(tr.trace))
        if len(out) > k:
            break
    return out


def measured_time_per_trial(started: float, measured: int) -> float:
    """Seconds per measurement so far (search trials and re-measurements together)."""
    return (time.perf_counter() - started) / max(measured, 1)


def graph_tasks(graph: Graph) -> list[_Task]:
    """One task per distinct workload key among the compute nodes (in graph order)."""
    tasks: dict[str, _Task] = {}
    for n in graph.nodes:
        if n.is_extern:
            continue
        consts = constant_inputs(graph, n)
        key = workload_key(n.op, consts)
        if key in tasks:
            tasks[key].nodes.append(n.name)
        else:
            tasks[key] = _Task(key, n.op, consts, [n.name])
    return list(tasks.values())


def _default_seconds(task: _Task, target: Target, db: TuningDatabase) -> float | None:
    """The default schedule's time, scored like the best: the median of its in-graph measurements where
    there are any, else of its confirmation-round measurements (the rounds the best's ratios were taken in),
    else of all of them."""
    default = tuple(default_schedule(task.compute, target, task.consts))
    mine = [r for r in db.records(task.key, target) if r.ok and r.trace == default]
    times = ([r.median_s for r in mine if r.in_graph] or [r.median_s for r in mine if r.paired_default_s is not None]
             or [r.median_s for r in mine])
    return float(np.median(times)) if times else None


def _from_database(task: _Task, target: Target, db: TuningDatabase) -> KernelTuneResult | None:
    best = db.best(task.key, target)
    if best is None:
        return None
    return KernelTuneResult(task.nodes, task.key, flop_count(task.compute), _default_seconds(task, target, db),
                            best.median_s, best.trace, 0, True, "already tuned for this target (database)")


def tune_graph(graph: Graph, target: Target, config: TuneConfig, database: TuningDatabase,
               measure: MeasureConfig | None = None, *, model: CostModel | None = None,
               runner: Measurer | None = None) -> GraphTuneReport:
    """Search schedules for every kernel of ``graph`` (kernels canonicalized) within one budget.

    ``model``: the cost model every kernel's search shares (learning online from all of them); None:
    random ranking. ``runner``: where candidates are measured (a local ``MeasureService`` by default,
    or a Ray runner from ``superopt.measure.runner``); the caller closes a runner it passes. In a graph
    of several kernels every candidate splits the work among threads as the default does
    (``SearchConfig.keep_partition``): kernels are timed alone, where no neighbour's threads wrote
    their inputs (a kernel that splits the work differently reads its inputs from other cores' caches)."""
    started = time.perf_counter()
    tasks = graph_tasks(graph)
    todo = []
    for t in tasks:
        t.result = _from_database(t, target, database)
        if t.result is None:
            todo.append(t)
    if not todo:
        return GraphTuneReport([t.result for t in tasks], 0, time.perf_counter() - started,
                               StopReason("nothing", f"nothing to measure: all {len(tasks)} kernels already tuned "
                                                     "for this target"))
    mcfg = measure or MeasureConfig(threads=target.threads, target=target)
    # kernels of a graph keep the default's thread partition (a lone op has no neighbour to agree with)
    in_graph = sum(not n.is_extern for n in graph.nodes) > 1
    graph_share = config.in_graph_share if in_graph and config.in_graph_rounds > 0 else 0.0
    # the time the search and its confirmation rounds share (the rest is the in-graph confirmation's)
    kernels_s = None if config.time_s is None else config.time_s * (1 - graph_share)
    measured = 0
    stop, stop_kind = "", "caller"
    with (nullcontext(runner) if runner is not None else MeasureService(mcfg)) as service, \
            tqdm(total=config.trials, disable=not config.progress, desc="tune",
                 unit="trial") as bar:
        for i, t in enumerate(todo):
            t.search = ScheduleSearch(t.compute, target, SearchConfig(
                trials=None if config.trials is None else max(config.trials, 1), seed=config.seed + i,
                batch_size=config.batch_size,
                strategy=config.strategy, keep_partition=in_graph, cold_bytes=config.cold_bytes if in_graph else 0),
                service, constant_inputs=t.consts, model=model)
        def record(task: _Task, trials, paired: float | None = None) -> None:
            database.add([TuningRecord.of(task.compute, tr.trace, target, tr.error,
                                          tr.seconds if tr.error == "OK" else None, task.consts,
                                          paired_default_s=paired) for tr in trials])

        # the confirmation rounds need (leaders + default) x rounds measurements per kernel: under a trial budget
        # they are reserved; under a time budget the search leaves them CONFIRM_TIME_SHARE of the time (they
        # measure compiled kernels again: no compiler run, a fraction of a search trial's time)
        reserve_n = (config.confirm_top + 1) * config.confirm_rounds * len(todo)
        rounds = config.confirm_rounds
        if config.trials is not None and reserve_n > config.trials // 4:  # too few trials to confirm: all to the search
            reserve_n, rounds = 0, 0
        confirmed: set[str] = set()
        need_any: set[str] = set()
        per_confirm: float | None = None  # seconds one kernel's confirmation took (None: none made yet)

        def search_deadline(per_trial: float) -> float | None:
            """Seconds into the budget at which the search stops: first at the fixed share; once a confirmation
            has run, early enough to confirm every kernel with an unconfirmed gain (at the measured cost per
            kernel) and to finish a batch."""
            if config.time_s is None:
                return None
            pending = sum(1 for t in todo if rounds and _unconfirmed_gain(t))
            if per_confirm is None:
                # the fixed share, or more where the kernels with a gain to confirm need more: a gain left
                # unconfirmed is one lucky reading against another, and the database would take it
                need = pending * (config.confirm_top + 1) * rounds * per_trial
                return kernels_s - max(config.time_s * (CONFIRM_TIME_SHARE if rounds else 0), need)
            return kernels_s - per_confirm * pending - config.batch_size * per_trial

        while True:  # phases: search, then confirm; time the confirmation did not need goes back to the search
            steps = 0
            while True:
                elapsed = time.perf_counter() - started
                per_trial = elapsed / measured if measured else 0.0
                search_s = search_deadline(per_trial)
                if config.budget.trials_spent(measured + reserve_n):
                    stop, stop_kind = f"trial budget spent ({config.trials} measurements)", "trials"
                    break
                if search_s is not None and elapsed >= search_s:
                    stop, stop_kind = f"time budget spent ({config.time_s:.0f}s)", "time"
                    break
                live = [t for t in todo if not t.search.done()]
                if not live:
                    stop, stop_kind = "every kernel's search stopped by itself", "exhausted"
                    break
                # unstarted kernels first (infinite priority), the heaviest of them first
                task = max(live, key=lambda t: (t.priority(), t.weight() if not t.batches else 0.0, -todo.index(t)))
                batch = min(min(config.first_batch, config.batch_size) if not task.batches else config.batch_size,
                            config.budget.trials_left(reserve_n + measured))
                if search_s is not None and per_trial > 0:  # a batch must not run far past the search's time
                    batch = max(1, min(batch, int((search_s - elapsed) / per_trial)))
                elif search_s is not None:  # a trial's time is not known yet: learn it from a small batch
                    batch = min(batch, 2)
                # no compiler run or candidate's run goes past the search's time (what it cuts short is dropped)
                trials = task.search.step(batch, None if search_s is None else search_s - elapsed)
                steps += 1
                task.batches += 1
                task.bests.append(task.search.best.seconds if task.search.best else math.inf)
                measured += len(trials)
                bar.update(len(trials))
                bar.set_postfix(kernel=task.nodes[0][:20])
                record(task, trials)
            # confirmation: each kernel whose search found something faster than the default has the default
            # and its leaders re-measured side by side, in alternating order, a few rounds: one lucky reading
            # on a noisy machine does not make a best (the database then picks among the confirmed schedules
            # by their time ratios to the default within a round). Heaviest kernels first, while the time
            # budget lasts; a leader confirmed in an earlier phase is not measured again.
            need = [t for t in todo if rounds and _unconfirmed_gain(t)]
            need.sort(key=lambda t: -len(t.nodes) * (t.search.default_s or 0.0))
            need_any.update(t.key for t in need)
            confirm_started = time.perf_counter()
            done_now = 0
            for t in need:
                if kernels_s is not None and time.perf_counter() - started >= kernels_s:
                    break
                leaders = _leaders(t, config.confirm_top)
                complete = True
                for r in range(rounds):
                    batch = leaders if r % 2 == 0 else leaders[::-1]
                    left = None if kernels_s is None else kernels_s - (time.perf_counter() - started)
                    trials = t.search.remeasure(batch, left)
                    measured += len(trials)
                    bar.update(len(trials))
                    if len(trials) < len(batch):  # the time ran out within the round: an unpaired round says nothing
                        complete = False
                        break
                    # each leader paired with the default measured in the same round (none when the default failed)
                    default = next(tr for tr in trials if tuple(tr.trace) == leaders[0])
                    pair = default.seconds if default.error == "OK" and math.isfinite(default.seconds) else None
                    record(t, trials, pair)
                if not complete:
                    break
                t.confirmed.update(leaders[1:])
                confirmed.add(t.key)
                done_now += 1
            confirm_s = time.perf_counter() - confirm_started
            if done_now:
                per_confirm = max(per_confirm or 0.0, confirm_s / done_now)
            elif per_confirm is None:  # nothing to confirm yet: a search trial's time bounds a re-measurement's
                per_confirm = (config.confirm_top + 1) * rounds * measured_time_per_trial(started, measured)
            if config.time_s is None or not stop.startswith("time budget") or not steps and not need:
                break
            # time left: the search goes on (search_deadline keeps back what the next confirmation will take)
            left = kernels_s - (time.perf_counter() - started)
            if left < config.batch_size * measured_time_per_trial(started, measured):
                break
        if need_any:
            stop += f"; {len(confirmed)} of {len(need_any)} kernels whose search beat the default confirmed"
    graph_report = None
    if in_graph and config.in_graph_rounds > 0:
        try:
            left_s = None if config.time_s is None else max(0.0, config.time_s - (time.perf_counter() - started))
            graph_report = confirm_in_graph(graph, target, database, mcfg.compiler,
                                            InGraphConfig(rounds=config.in_graph_rounds, seed=config.seed,
                                                          time_s=left_s))
            stop += f"; in the graph: {graph_report.stop_reason}"
        except CompileError as e:  # what was measured is in the database already
            stop += f"; no in-graph confirmation (the graph did not compile: {str(e).splitlines()[0]})"
    stop = StopReason(stop_kind, stop)
    for t in todo:
        rep = t.search.report()
        best = database.best(t.key, target)
        default_s = _default_seconds(t, target, database) or rep.default_s
        t.result = KernelTuneResult(t.nodes, t.key, flop_count(t.compute), default_s,
                                    best.median_s if best else None, best.trace if best else (),
                                    t.search.trials, False, rep.stop_reason if t.search.stop_reason else stop,
                                    rep.failures)
    return GraphTuneReport([t.result for t in tasks], measured, time.perf_counter() - started, stop, graph_report)


__all__ = ["TuneConfig", "KernelTuneResult", "GraphTuneReport", "tune_graph", "graph_tasks"]
