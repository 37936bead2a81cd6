"""Confirm tuned schedules inside the whole graph: a kernel's gain timed alone need not survive there.

Timed alone, a kernel runs again and again on the same operands, so its constants stay in the core's caches;
inside a model each kernel finds its weights wherever the 50 kernels before it left them, and its inputs
just written by its producer. A pick can be faster alone and slower in the graph, and the gains of the
rest shrink there.

So after the kernel search, the graph is built twice, once with the database's best schedule for every
kernel (the picks) and once with the default heuristic's, and both run on the per-node path in alternation,
``rounds`` times, each node timed where it runs. For every workload whose pick differs from its default, each
round gives its nodes' summed time under both; the database receives them as ``in_graph`` records (per node
instance), the pick's paired with the default's of the same round, and from then on
:meth:`TuningDatabase.best` decides among the in-graph measurements alone: the pick stays where the median of
its in-graph ratios to the default is below 1, the default comes back where it is not.

Where a pick lost inside the graph, its runner-up gets a second chance: the fastest other schedule the tuner
confirmed faster than the default alone (``TuningDatabase.confirmed_alone``) is timed the same way in a second
pass, with the kept picks in place, and its in-graph records join the others (so ``best`` chooses among the
default, the pick and the runner-up by their in-graph ratios).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from search.schedule.database import MIN_GAIN, TuningDatabase, TuningRecord, schedules_from_database
from superopt.interp.inputs import random_inputs
from superopt.ir.canonical import workload_key
from superopt.ir.graph import Graph
from superopt.runtime.compiler import CompileDeadline, CompilerConfig
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.graph_defaults import constant_inputs, default_schedules
from superopt.target import Target

# the fewest rounds whose medians judge a pick (fewer, where the time ran out: nothing is recorded)
MIN_ROUNDS = 5


@dataclass(frozen=True)
class InGraphConfig:
    rounds: int = 21  # runs of the graph per schedule set, in alternation
    warmup: int = 2  # untimed runs of each before the first round
    seed: int = 0  # the graph's random inputs
    runner_ups: bool = True  # a second pass with the runner-up of every pick that lost inside the graph
    time_s: float | None = None  # the phase's budget: the second pass runs where the first took at most half


@dataclass
class InGraphKernel:
    workload_key: str
    nodes: list[str]
    default_s: float  # median over the rounds of the nodes' summed time under the default schedule
    pick_s: float  # the same under the tuned pick
    ratio: float  # median over the rounds of pick / default (below 1: the pick is faster in the graph)
    runner_up: bool = False  # timed in the second pass, in place of a pick that lost

    @property
    def kept(self) -> bool:
        return self.ratio < 1.0 - MIN_GAIN  # (the database's rule: search.schedule.database.MIN_GAIN)

    def to_dict(self) -> dict:
        return {"workload_key": self.workload_key, "nodes": self.nodes, "default_ms": self.default_s * 1e3,
                "pick_ms": self.pick_s * 1e3, "ratio": self.ratio, "kept": self.kept, "runner_up": self.runner_up}


@dataclass
class InGraphReport:
    kernels: list[InGraphKernel] = field(default_factory=list)
    rounds: int = 0
    elapsed_s: float = 0.0
    picks_s: float | None = None  # median per-node-path time of the whole graph with every pick
    defaults_s: float | None = None  # the same with every default
    stop_reason: str = ""

    @property
    def kept(self) -> int:
        """Workloads whose pick or runner-up ran faster than the default inside the graph."""
        return len({k.workload_key for k in self.kernels if k.kept})

    def to_dict(self) -> dict:
        return {"kernels": [k.to_dict() for k in self.kernels], "rounds": self.rounds, "elapsed_s": self.elapsed_s,
                "picks_ms": None if self.picks_s is None else self.picks_s * 1e3,
                "defaults_ms": None if self.defaults_s is None else self.defaults_s * 1e3,
                "kept": self.kept, "stop_reason": self.stop_reason}


def confirm_in_graph(graph: Graph, target: Target, database: TuningDatabase, compiler: CompilerConfig | None = None,
                     config: InGraphConfig | None = None) -> InGraphReport:
    """Time every kernel whose database pick differs from its default inside ``graph`` (canonical kernels),
    under both, and append the in-graph records to ``database`` (see the module docstring)."""
    config = config or InGraphConfig()
    started = time.perf_counter()
    picks, hits = schedules_from_database(graph, target, database)
    defaults = default_schedules(graph, target)
    nodes = {n.name: n for n in graph.nodes}
    groups: dict[str, list[str]] = {}  # workload key -> its nodes whose pick differs from the default
    for name in hits:
        if list(picks[name]) != list(defaults[name]):
            groups.setdefault(workload_key(nodes[name].op, constant_inputs(graph, nodes[name])), []).append(name)
    if not groups:
        return InGraphReport(elapsed_s=time.perf_counter() - started,
                             stop_reason="no kernel's database pick differs from its default")
    ecfg = ExecutorConfig(target.threads, compiler or CompilerConfig(), target)
    # the phase's time bounds the two programs' compilation and the rounds (a cold compile of a whole model can
    # take longer than a tuning budget's share)
    deadline = None if config.time_s is None else time.monotonic() + config.time_s
    try:
        with_defaults = GraphExecutor(graph, defaults, ecfg, deadline=deadline)
        with_picks = GraphExecutor(graph, defaults | picks, ecfg, deadline=deadline)
    except CompileDeadline:
        return InGraphReport(elapsed_s=time.perf_counter() - started,
                             stop_reason=f"the time budget ({config.time_s:.0f}s) ended while the graph compiled")
    feed = random_inputs(graph, config.seed)
    runs_p, runs_d = _alternate(with_picks, with_defaults, feed, config, deadline)
    least = min(MIN_ROUNDS, config.rounds)
    if len(runs_p) < least:
        return InGraphReport(rounds=len(runs_p), elapsed_s=time.perf_counter() - started,
                             stop_reason=f"the time budget ({config.time_s:.0f}s) ended after {len(runs_p)} rounds "
                                         f"(at least {least} judge)")
    report = InGraphReport(rounds=len(runs_p), picks_s=float(np.median([sum(t.values()) for t in runs_p])),
                           defaults_s=float(np.median([sum(t.values()) for t in runs_d])))
    records, report.kernels = _judge(graph, target, groups, picks, defaults, runs_p, runs_d)
    database.add(records)
    lost = [k for k in report.kernels if not k.kept]
    first_s = time.perf_counter() - started
    room = config.time_s is None or 2 * first_s <= config.time_s
    runner = _runner_ups(graph, target, database, lost, picks, defaults) if config.runner_ups and room else {}
    if runner:
        kept = {n: picks[n] for k in report.kernels if k.kept for n in k.nodes}
        second = {n: list(runner[k.workload_key]) for k in lost if k.workload_key in runner for n in k.nodes}
        try:
            runs_p, runs_d = _alternate(GraphExecutor(graph, defaults | kept | second, ecfg, deadline=deadline),
                                        with_defaults, feed, config, deadline)
        except CompileDeadline:
            runs_p = []
        if len(runs_p) < least:
            runner = {}
    if runner:
        records, tried = _judge(graph, target, {k.workload_key: k.nodes for k in lost if k.workload_key in runner},
                                second, defaults, runs_p, runs_d, runner_up=True)
        database.add(records)
        report.kernels += tried
    report.elapsed_s = time.perf_counter() - started
    picked = [k for k in report.kernels if not k.runner_up]
    report.stop_reason = (f"{sum(k.kept for k in picked)} of {len(picked)} tuned kernels faster than their default "
                          f"inside the graph ({report.rounds} rounds)")
    if runner:
        tried = [k for k in report.kernels if k.runner_up]
        report.stop_reason += f"; {sum(k.kept for k in tried)} of {len(tried)} runner-ups of the others"
    return report


def _alternate(with_picks: GraphExecutor, with_defaults: GraphExecutor, feed: dict, config: InGraphConfig,
               deadline: float | None = None) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Per-node times of both executors, ``config.rounds`` runs each in alternation (neither side always
    runs after the other); fewer where the next round would end past ``deadline`` (``time.monotonic()``)."""
    for _ in range(config.warmup):
        with_picks.node_seconds(feed)
        with_defaults.node_seconds(feed)
    runs: dict[str, list[dict[str, float]]] = {"picks": [], "defaults": []}
    started = time.monotonic()
    for r in range(config.rounds):
        if deadline is not None and r and time.monotonic() + (time.monotonic() - started) / r > deadline:
            break
        order = (("picks", with_picks), ("defaults", with_defaults))
        for side, ex in order if r % 2 == 0 else order[::-1]:
            runs[side].append(ex.node_seconds(feed))
    return runs["picks"], runs["defaults"]


def _judge(graph: Graph, target: Target, groups: dict[str, list[str]], picks: dict[str, list],
           defaults: dict[str, list], runs_p: list[dict[str, float]], runs_d: list[dict[str, float]],
           runner_up: bool = False) -> tuple[list[TuningRecord], list[InGraphKernel]]:
    """The in-graph records of every group (workload key -> its nodes; per node instance, each pick paired
    with the default of the same round) and each group's verdict."""
    nodes = {n.name: n for n in graph.nodes}
    records: list[TuningRecord] = []
    kernels: list[InGraphKernel] = []
    for key, names in groups.items():
        node = nodes[names[0]]
        consts = constant_inputs(graph, node)
        d = np.array([sum(run[n] for n in names) for run in runs_d])
        p = np.array([sum(run[n] for n in names) for run in runs_p])
        for default_s, pick_s in zip(d, p):
            per_d, per_p = float(default_s) / len(names), float(pick_s) / len(names)
            records.append(TuningRecord.of(node.op, defaults[names[0]], target, "OK", per_d, consts,
                                           paired_default_s=per_d, in_graph=True))
            records.append(TuningRecord.of(node.op, picks[names[0]], target, "OK", per_p, consts,
                                           paired_default_s=per_d, in_graph=True))
        kernels.append(InGraphKernel(key, names, float(np.median(d)), float(np.median(p)), float(np.median(p / d)),
                                     runner_up))
    return records, kernels


def _runner_ups(graph: Graph, target: Target, database: TuningDatabase, lost: list[InGraphKernel],
                picks: dict[str, list], defaults: dict[str, list]) -> dict[str, tuple]:
    """Workload key -> the fastest schedule, other than the default and the pick that lost, that the tuner
    confirmed faster than the default alone (and that still lowers); none where there is no such one."""
    from superopt.schedule.plan import ScheduleError, lower

    nodes = {n.name: n for n in graph.nodes}
    out: dict[str, tuple] = {}
    for k in lost:
        name = k.nodes[0]
        tried = {tuple(defaults[name]), tuple(picks[name])}
        for ratio, rec in database.confirmed_alone(k.workload_key, target):
            if ratio >= 1.0 - MIN_GAIN:
                break
            if rec.trace in tried:
                continue
            try:
                lower(nodes[name].op, rec.trace, target)
            except ScheduleError:
                continue
            out[k.workload_key] = rec.trace
            break
    return out


__all__ = ["InGraphConfig", "InGraphKernel", "InGraphReport", "confirm_in_graph"]
