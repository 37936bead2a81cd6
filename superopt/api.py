"""The Python API: ``optimize`` a model or an index-notation op into verified compiled code.

The pipeline is one function of named passes: load -> rewrite (prune dead code, rewrite rules) ->
canonicalize kernels (rename-invariant workloads) -> schedule (the tuning database's best where it
has one for this target; else the learned cost model's pick with no measurement, when a model is
configured (the shipped one by default); else the default heuristic) -> build (compile into a
GraphExecutor) -> verify. Every program is checked against the numpy reference interpreter (float64) on seeded random inputs
before it is returned; a mismatch raises :class:`VerificationError` (fast and wrong is worthless).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rewrite_rules import RULES, rewrite_greedy
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.ir.canonical import canonicalize_kernels
from superopt.ir.graph import Graph
from superopt.ir.prune import prune_graph
from superopt.lang import compile_op
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.target import Target, host_target
from superopt.schedule.graph import default_schedules


@dataclass(frozen=True)
class OptimizeConfig:
    threads: int = 2
    verify: bool = True
    rtol: float = 1e-3  # relative to the largest reference magnitude of each output
    seed: int = 0
    fuse: bool = True  # apply the graph rewrite rules (operator fusion, layout) before scheduling
    rules: tuple[str, ...] | None = None  # names of the rewrite rules to apply; None: every registered rule
    compiler: CompilerConfig = field(default_factory=CompilerConfig)
    target: Target | None = None  # None: this machine with ``threads`` threads
    database: str | Path | None = None  # a tuning database (search.database) consulted before the default
    # the cost model that picks schedules with no measurement for kernels the database lacks: "pretrained"
    # (the model shipped in the package, when there is one), a model file, or None (the default heuristic)
    cost_model: str | Path | None = "pretrained"

    def resolved_target(self) -> Target:
        return self.target if self.target is not None else host_target(self.threads, self.compiler.cc)


@dataclass
class OptimizeReport:
    nodes: int
    kernels: int
    import_s: float
    compile_s: float
    verify_s: float
    max_error: float | None  # max |compiled - reference| / max |reference| over outputs
    stop_reason: str
    rewrites: int = 0  # graph rewrite rules applied
    compute_nodes: int = 0  # nodes that run a compiled kernel (equal ones share one)
    from_database: int = 0  # compute nodes scheduled from the tuning database
    from_model: int = 0  # compute nodes whose schedule the cost model picked over the default (no measurement)

    def __str__(self) -> str:
        err = "not verified" if self.max_error is None else f"max rel. error {self.max_error:.2e}"
        return (f"{self.nodes} nodes ({self.rewrites} rewrites), {self.kernels} kernels; import {self.import_s:.2f}s, compile "
                f"{self.compile_s:.2f}s, verify {self.verify_s:.2f}s; {err}; {self.stop_reason}")


class VerificationError(RuntimeError):
    """Compiled code disagrees with the reference interpreter."""


class OptimizedProgram:
    def __init__(self, graph: Graph, executor: GraphExecutor, report: OptimizeReport) -> None:
        self.graph = graph
        self.executor = executor
        self.report = report

    def __call__(self, *inputs: np.ndarray, **named: np.ndarray) -> list[np.ndarray]:
        feed = dict(zip(self.graph.inputs, inputs)) | named
        out = self.executor(feed)
        return [out[o] for o in self.graph.outputs]


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    for name in graph.inputs:
        t = graph.type_of[name]
        if t.dtype.startswith("float"):
            feed[name] = rng.standard_normal(t.shape).astype(t.np_dtype)
        elif t.dtype == "bool":
            feed[name] = rng.random(t.shape) < 0.5
        else:
            feed[name] = rng.integers(0, 2, t.shape).astype(t.np_dtype)
    return feed


def _is_torch_program(model) -> bool:
    """A ``torch.nn.Module`` or ``torch.export.ExportedProgram`` (without importing torch when it is not loaded)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(model, torch.nn.Module) or isinstance(model, torch.export.ExportedProgram)


def load_graph(model, example_inputs: Sequence | None = None) -> Graph:
    """A Graph, an ONNX path/bytes/ModelProto, or a torch ``nn.Module``/``ExportedProgram`` (imported through
    ``torch.export`` with ``example_inputs``), as a Graph."""
    if isinstance(model, Graph):
        return model
    if _is_torch_program(model):
        from superopt.frontends.torch_export import import_torch_program

        return import_torch_program(model, example_inputs)
    from superopt.frontends.onnx_frontend import import_onnx

    return import_onnx(model)


def verify(graph: Graph, executor: GraphExecutor, seed: int = 0) -> float:
    feed = random_inputs(graph, seed)
    got = executor(feed)
    ref = evaluate(graph, feed, np.float64)
    worst = 0.0
    for o in graph.outputs:
        r, g = np.asarray(ref[o], np.float64), np.asarray(got[o], np.float64)
        if r.shape != g.shape:
            raise VerificationError(f"output {o!r}: compiled shape {g.shape} != reference {r.shape}")
        scale = max(float(np.abs(r).max(initial=0.0)), 1e-30)
        if np.isnan(r).any() or np.isnan(g).any():
            if not np.array_equal(np.isnan(r), np.isnan(g)):
                raise VerificationError(f"output {o!r}: NaNs differ from the reference")
            r, g = np.nan_to_num(r), np.nan_to_num(g)
        worst = max(worst, float(np.abs(r - g).max(initial=0.0)) / scale)
    return worst


def rewrite_graph(graph: Graph, config: OptimizeConfig | None = None) -> tuple[Graph, tuple[str, ...]]:
    """The graph passes before scheduling: prune dead code, then the rewrite rules (fusion, layout,
    algebraic) to a fixed point. Returns the new graph (same inputs and outputs) and the rules applied."""
    config = config or OptimizeConfig()
    graph = prune_graph(graph)
    if not config.fuse:
        return graph, ()
    rules = [r for r in RULES if config.rules is None or r.name in config.rules]
    graph, report = rewrite_greedy(graph, rules)
    return graph, report.applied


def compile_graph(graph: Graph, config: OptimizeConfig | None = None) -> GraphExecutor:
    """Graph passes, then default schedules compiled into an executor (no verification: see optimize)."""
    config = config or OptimizeConfig()
    target = config.resolved_target()
    graph = rewrite_graph(graph, config)[0]
    return GraphExecutor(graph, default_schedules(graph, target), ExecutorConfig(target.threads, config.compiler, target))


def load_cost_model(spec: str | Path | None):
    """``"pretrained"`` (the shipped model; None when the package has none), a model file, or None."""
    if spec is None:
        return None
    from costmodel.xgb import XGBModel, load_pretrained

    return load_pretrained("cpu") if str(spec) == "pretrained" else XGBModel.load(spec)


def schedule_graph(graph: Graph, target: Target, database: str | Path | None = None, cost_model=None
                   ) -> tuple[dict[str, list], list[str], list[str]]:
    """The schedule pass over a graph with canonical kernels (``canonicalize_kernels``): node name ->
    trace for every compute node. From the tuning database where it has a verified best for
    ``target``; else the cost model's pick, measuring nothing, when a model is given (it keeps the
    default unless it expects another schedule to be faster); else the default heuristic. Returns the
    schedules, the nodes the database served and the nodes whose schedule the model changed."""
    schedules, hits, picked = {}, [], []
    if database is not None:
        from search.database import TuningDatabase, schedules_from_database

        schedules, hits = schedules_from_database(graph, target, TuningDatabase(database))
    if cost_model is not None:
        from search.model_guided import schedules_from_model

        chosen, picks = schedules_from_model(graph, target, cost_model, skip=hits)
        schedules = chosen | schedules
        picked = [name for name, p in picks.items() if not p.is_default]
    if any(not n.is_extern and n.name not in schedules for n in graph.nodes):
        schedules = default_schedules(graph, target) | schedules
    return schedules, hits, picked


def optimize(model, example_inputs: Sequence | OptimizeConfig | None = None,
             config: OptimizeConfig | None = None) -> OptimizedProgram:
    """The whole pipeline: load -> rewrite -> canonicalize kernels -> schedule -> build -> verify.

    ``model`` is anything :func:`load_graph` takes; ``example_inputs`` (a torch module's call arguments) may be
    left out, so ``optimize(model, config)`` also works.
    """
    if isinstance(example_inputs, OptimizeConfig):
        if config is not None:
            raise TypeError("optimize() got two configs")
        example_inputs, config = None, example_inputs
    config = config or OptimizeConfig()
    t0 = time.perf_counter()
    imported = load_graph(model, example_inputs)  # load
    graph, rewrites = rewrite_graph(imported, config)  # rewrite
    graph = canonicalize_kernels(graph)  # canonicalize: database keys and traces use canonical names
    t1 = time.perf_counter()
    target = config.resolved_target()
    model = load_cost_model(config.cost_model)
    schedules, hits, picked = schedule_graph(graph, target, config.database, model)  # schedule
    executor = GraphExecutor(graph, schedules, ExecutorConfig(target.threads, config.compiler, target))  # build
    t2 = time.perf_counter()
    err = None
    if config.verify:
        err = verify(imported, executor, config.seed)  # against the graph as imported, before any pass
        if not err <= config.rtol:
            raise VerificationError(f"compiled program differs from the reference: relative error {err:.3g} "
                                    f"> {config.rtol}")
    t3 = time.perf_counter()
    n_compute = sum(not n.is_extern for n in graph.nodes)
    how = []
    if config.database is not None:
        how.append(f"{len(hits)} of {n_compute} kernels from the tuning database")
    if model is not None:
        how.append(f"{len(picked)} picked by the cost model with no measurement")
    how.append("the rest default schedules" if how else "default schedules (no tuning database, no cost model)")
    report = OptimizeReport(len(graph.nodes), len(executor.kernels), t1 - t0, t2 - t1, t3 - t2, err, ", ".join(how),
                            len(rewrites), n_compute, len(hits), len(picked))
    return OptimizedProgram(graph, executor, report)


def define_op(src: str, inputs: Mapping[str, Sequence[int]], *, extents: Mapping[str, int] | None = None,
              padding: Mapping[str, float] | None = None, name: str = "op") -> Graph:
    """A one-node Graph from index notation (inputs become graph inputs of the same names)."""
    c = compile_op(src, inputs, extents=extents, padding=padding)
    b = GraphBuilder(name)
    ins = [b.input(n, c.type_of[n].shape, c.type_of[n].dtype) for n in c.inputs]
    outs = b.add_compute(c, ins, name, out_names=list(c.outputs))
    return b.build(outs)


def optimize_op(src: str, inputs: Mapping[str, Sequence[int]], config: OptimizeConfig | None = None,
                **kw) -> OptimizedProgram:
    return optimize(define_op(src, inputs, **kw), config)


__all__ = ["OptimizeConfig", "OptimizeReport", "OptimizedProgram", "VerificationError", "optimize",
           "optimize_op", "define_op", "load_graph", "schedule_graph", "load_cost_model"]
