"""Confirm tuned schedules inside the whole graph: a kernel's gain timed alone need not survive there.

Timed alone, a kernel runs again and again on the same operands, so its constants stay in the core's caches;
inside a model each kernel finds its weights wherever the 50 kernels before it left them, and its inputs
just written by its producer. On resnet50 (Intel Xeon, 2 cores) the tuner's picks ran 1.05x their
defaults alone and 1.02x inside the model, some faster alone and slower in the graph.

So after the kernel search, the graph is built twice, once with the database's best schedule for every
kernel (the picks) and once with the default heuristic's, and both run on the per-node path in alternation,
``rounds`` times, each node timed where it runs. For every workload whose pick differs from its default, each
round gives its nodes' summed time under both; the database receives them as ``in_graph`` records (per node
instance), the pick's paired with the default's of the same round, and from then on
:meth:`TuningDatabase.best` decides among the in-graph measurements alone: the pick stays where the median of
its in-graph ratios to the default is below 1, the default comes back where it is not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from search.database import TuningDatabase, TuningRecord, schedules_from_database
from superopt.api import random_inputs
from superopt.ir.canonical import workload_key
from superopt.ir.graph import Graph
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.target import Target
from superopt.schedule.graph import constant_inputs, default_schedules


@dataclass(frozen=True)
class InGraphConfig:
    rounds: int = 21  # runs of the graph per schedule set, in alternation
    warmup: int = 2  # untimed runs of each before the first round
    seed: int = 0  # the graph's random inputs


@dataclass
class InGraphKernel:
    workload_key: str
    nodes: list[str]
    default_s: float  # median over the rounds of the nodes' summed time under the default schedule
    pick_s: float  # the same under the tuned pick
    ratio: float  # median over the rounds of pick / default (below 1: the pick is faster in the graph)

    @property
    def kept(self) -> bool:
        return self.ratio < 1.0

    def to_dict(self) -> dict:
        return {"workload_key": self.workload_key, "nodes": self.nodes, "default_ms": self.default_s * 1e3,
                "pick_ms": self.pick_s * 1e3, "ratio": self.ratio, "kept": self.kept}


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
        return sum(k.kept for k in self.kernels)

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
    with_picks = GraphExecutor(graph, defaults | picks, ecfg)
    with_defaults = GraphExecutor(graph, defaults, ecfg)
    feed = random_inputs(graph, config.seed)
    for _ in range(config.warmup):
        with_picks.node_seconds(feed)
        with_defaults.node_seconds(feed)
    runs: dict[str, list[dict[str, float]]] = {"picks": [], "defaults": []}
    for r in range(config.rounds):  # alternating order: neither side always runs after the other
        order = (("picks", with_picks), ("defaults", with_defaults))
        for side, ex in order if r % 2 == 0 else order[::-1]:
            runs[side].append(ex.node_seconds(feed))
    report = InGraphReport(rounds=config.rounds,
                           picks_s=float(np.median([sum(t.values()) for t in runs["picks"]])),
                           defaults_s=float(np.median([sum(t.values()) for t in runs["defaults"]])))
    records: list[TuningRecord] = []
    for key, names in groups.items():
        node = nodes[names[0]]
        consts = constant_inputs(graph, node)
        d = np.array([sum(run[n] for n in names) for run in runs["defaults"]])
        p = np.array([sum(run[n] for n in names) for run in runs["picks"]])
        for default_s, pick_s in zip(d, p):
            per_d, per_p = float(default_s) / len(names), float(pick_s) / len(names)
            records.append(TuningRecord.of(node.op, defaults[names[0]], target, "OK", per_d, consts,
                                           paired_default_s=per_d, in_graph=True))
            records.append(TuningRecord.of(node.op, picks[names[0]], target, "OK", per_p, consts,
                                           paired_default_s=per_d, in_graph=True))
        report.kernels.append(InGraphKernel(key, names, float(np.median(d)), float(np.median(p)),
                                            float(np.median(p / d))))
    database.add(records)
    report.elapsed_s = time.perf_counter() - started
    report.stop_reason = (f"{report.kept} of {len(report.kernels)} tuned kernels faster than their default "
                          f"inside the graph ({config.rounds} rounds)")
    return report


__all__ = ["InGraphConfig", "InGraphKernel", "InGraphReport", "confirm_in_graph"]
