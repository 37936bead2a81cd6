"""The Python API: ``optimize`` a model or an index-notation op into verified compiled code.

The pipeline is one function of named passes: load -> rewrite (prune dead code, rewrite rules) ->
canonicalize kernels (rename-invariant workloads) -> schedule (the tuning database's best where it
has one for this target; else the learned cost model's pick with no measurement, when a model is
configured (the shipped one by default); else the default heuristic) -> build (compile into a
GraphExecutor) -> verify. Every program is checked against the numpy reference interpreter (float64) on seeded random inputs
before it is returned; a mismatch raises :class:`VerificationError` (fast and wrong is worthless).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from superopt.builder import GraphBuilder
from superopt.collector import fewer_collections
from superopt.heap import return_free_memory
from superopt.interp.inputs import random_inputs
from superopt.interp.sampling import REFERENCE_POINTS
from superopt.ir.canonical import canonicalize_kernels
from superopt.ir.graph import Graph
from superopt.lang import compile_op
from superopt.phases import PhaseTimer
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.graph_defaults import default_schedules
from superopt.target import Target, host_target
from superopt.verification import VerificationError, check_program, start_reference, verify

if TYPE_CHECKING:
    from search.graph.rewrite import RewriteConfig


@dataclass(frozen=True)
class OptimizeConfig:
    threads: int = 2
    verify: bool = True
    rtol: float = 1e-3  # of the magnitude of the terms each output element is computed from (interp.tolerance)
    # a reference larger than this many iteration points runs on a sample of the graph's independent axes, the
    # program's outputs at those indices checked (superopt.interp.sampling); None: always the whole reference
    reference_points: int | None = REFERENCE_POINTS
    # the reference computed in a forked child at the lowest priority (Linux; superopt.verification's
    # ForkedReference), where it takes no core from the C compiler; False: on a thread of this process
    reference_process: bool = True
    seed: int = 0
    fuse: bool = True  # apply the graph rewrite rules (operator fusion, layout) before scheduling
    rules: tuple[str, ...] | None = None  # names of the rewrite rules to apply; None: every registered rule
    # the graph rewrite pass (search.graph.search): "backtracking" (TASO-style cost-based search over every rule,
    # fusion included, graphs costed by search.graph.cost's roofline), "mcts" (Monte-Carlo tree search) or
    # "greedy" (first site of the first rule to a fixed point, exploration families excluded); the search
    # stops after graph_budget_s seconds, graph_expansions expanded graphs, or graph_patience expansions
    # without a 0.1% gain; graph_alpha: queue rewrites costing up to alpha x the best graph (TASO's relaxation)
    graph_search: str = "backtracking"
    graph_budget_s: float = 1.0
    graph_expansions: int | None = 20  # None: no limit
    graph_alpha: float = 1.05
    graph_patience: int = 4
    compiler: CompilerConfig = field(default_factory=CompilerConfig)
    target: Target | None = None  # None: this machine with ``threads`` threads
    database: str | Path | None = None  # a tuning database (search.schedule.database) consulted before the default
    # the cost model that picks schedules with no measurement for kernels the database lacks: "pretrained"
    # (the model shipped in the package, when there is one), a model file, or None (the default heuristic)
    cost_model: str | Path | None = "pretrained"
    # ONNX nodes with no native lowering: False runs them through the ONNX fallback (onnxruntime or
    # onnx.reference, one opaque node each, named in the report); True makes any such node an error
    strict: bool = False
    # the global activation layout (search/graph/layout.py, after the rewrites): "nchw" (as imported), "auto" (the
    # cheapest of NCHW / NCHW8c / NCHW16c under the layout pass's cost, then the pointwise convs left on NCHW over one
    # pixel axis: rewrite_rules/pixel_merge.py), or a forced "nchw8c" / "nchw16c"
    layout: str = "auto"
    # blocked 3x3 stride-1 convs as Winograd F(4x4,3x3) or F(2x2,3x3) where the rule fits them (rewrite_rules/winograd.py;
    # after the layout choice, CPU targets)
    winograd: bool = True
    # wall-clock budget of the whole pipeline (``superopt optimize --budget``) and the schedule search's
    # measurements (``--trials``). With either, the kernels the database lacks are tuned (records go to
    # ``database``, a temporary one when None) within half the budget; the cost model's picks stop at 80%
    # of it (the other kernels keep the default heuristic); the rest is for building and verifying.
    # Neither: no search (database, cost model and default heuristic only).
    budget_s: float | None = None
    tune_trials: int | None = None
    # seconds the cost model's zero-measurement picks may take (kernels of most work first; the others keep
    # the default heuristic); None: MODEL_PICK_S per distinct kernel left to pick that carries at least 1% of
    # the graph's work, at least MODEL_PICK_MIN_S (each pick lowers and featurizes about a hundred candidate
    # schedules); with budget_s, 80% of the budget instead
    model_pick_s: float | None = None
    progress: bool = False  # progress bars on stderr for the long passes
    # keep each verified program of an ONNX model under the compiler cache (superopt.program_cache): a second
    # optimize of the same model, inputs, config, compiler and code only loads it
    program_cache: bool = True

    def resolved_target(self) -> Target:
        return self.target if self.target is not None else host_target(self.threads, self.compiler.cc)

    def rewrite_config(self) -> RewriteConfig:
        """The rewrite pass's settings, from these."""
        from search.graph.rewrite import RewriteConfig

        return RewriteConfig(self.resolved_target(), self.compiler, self.fuse, self.rules, self.graph_search,
                             self.graph_budget_s, self.graph_expansions, self.graph_alpha, self.graph_patience,
                             self.seed, self.layout, self.winograd)


# (the picking time a distinct kernel adds to the allowance, when it carries at least 1% of the graph's work and
# the database does not serve it: search.schedule.model_guided.PickAllowance; picks run largest work first)
MODEL_PICK_S = 0.2
MODEL_PICK_MIN_S = 1.6


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
    fallbacks: list = field(default_factory=list)  # superopt.frontends.onnx_fallback.FallbackNode per ONNX fallback node
    shapes: list[str] = field(default_factory=list)  # the input shapes compiled ("x=1x3x8x8"), one entry per shape
    tune: dict | None = None  # the schedule search's summary (measured, elapsed_s, stop_reason) when one ran
    graph_search: dict | None = None  # search.graph.search.GraphSearchReport.to_dict() of the rewrite pass (None: no rewrites)
    schedule_source: dict = field(default_factory=dict)  # compute node -> "database" | "cost model" | "default"
    # wall seconds per phase (superopt.phases.PHASES: load, rewrite, machine ceilings, schedule, codegen, C
    # compile, build, verify, and ``other``: the bookkeeping between them), disjoint, summing to total_s
    phases: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0
    kernels_compiled: int = 0  # distinct kernels the C compiler built (0: every library came from the cache)

    def __str__(self) -> str:
        err = "not verified" if self.max_error is None else f"max rel. error {self.max_error:.2e}"
        text = (f"{self.nodes} nodes ({self.rewrites} rewrites), {self.kernels} kernels; import {self.import_s:.2f}s, "
                f"compile {self.compile_s:.2f}s, verify {self.verify_s:.2f}s; {err}; {self.stop_reason}")
        if self.graph_search:
            g = self.graph_search
            if str(g.get("cost_method", "")).startswith("not costed"):  # nothing to search: no cost was computed
                text += f"; graph search ({g['strategy']}): {g['stop_reason']}"
            else:
                text += (f"; graph search ({g['strategy']}): predicted {g['cost_before'] * 1e3:.3g} -> "
                         f"{g['cost_after'] * 1e3:.3g} ms, {g['expansions']} expansions, {g['stop_reason']}")
        if self.phases:
            text += (f"; {self.total_s:.2f}s in all: " + ", ".join(f"{p} {t:.2f}s" for p, t in self.phases.items())
                     + f"; {self.kernels_compiled} kernels compiled")
        if self.fallbacks:
            from superopt.frontends.onnx_fallback import summarize

            text += "; " + summarize(self.fallbacks)
        if self.shapes:
            text += f"; compiled for {len(self.shapes)} shape{'s' if len(self.shapes) > 1 else ''}: " + \
                " | ".join(self.shapes)
        return text

    def fallback_lines(self) -> list[str]:
        """One line per fallback node: its op, name and reason."""
        return [f"fallback: {f}" for f in self.fallbacks]


class OptimizedProgram:
    """A verified compiled program: call it with the inputs (positionally, or by graph or ONNX name)."""

    def __init__(self, graph: Graph, executor: GraphExecutor, report: OptimizeReport,
                 input_names: Sequence[str] | None = None, output_dtypes: Sequence[np.dtype] | None = None) -> None:
        self.graph = graph
        self.executor = executor
        self.report = report
        self.input_names = list(input_names) if input_names is not None else list(graph.inputs)  # the model's names
        self.output_dtypes = list(output_dtypes) if output_dtypes is not None else None  # e.g. float16 outputs

    def feed(self, inputs: Sequence[np.ndarray], named: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        alias = self.__dict__.get("_alias")
        if alias is None or alias[0] is not self.input_names:  # (computed once per input_names list)
            alias = self.__dict__["_alias"] = (self.input_names, dict(zip(self.input_names, self.graph.inputs)))
        alias = alias[1]
        feed = dict(zip(self.graph.inputs, inputs))
        for k, v in named.items():
            feed[alias.get(k, k)] = v
        return feed

    def __call__(self, *inputs: np.ndarray, **named: np.ndarray) -> list[np.ndarray]:
        # the executor checks the inputs (shapes, element types) and hands out fresh output arrays
        out = self.executor(self.feed(inputs, named) if named else inputs)
        res = [out[o] for o in self.graph.outputs]
        if self.output_dtypes is not None:
            res = [r if r.dtype == dt else r.astype(dt) for r, dt in zip(res, self.output_dtypes)]
        return res

    def save(self, directory: str | Path) -> Path:
        """Write the compiled program (kernels, traces, graph, report) as an artifact directory, atomically;
        :func:`load` reloads it in a fresh process without compiling (see :mod:`superopt.artifact`)."""
        import dataclasses
        import json

        from superopt.artifact import save_executor

        meta = {"input_names": self.input_names,
                "output_dtypes": None if self.output_dtypes is None else [np.dtype(d).str for d in self.output_dtypes]}
        report = {"optimize": dataclasses.asdict(self.report) if dataclasses.is_dataclass(self.report) else {}}
        return save_executor(self.executor, directory, report=report,
                             extra_files={"program.json": json.dumps(meta).encode()})


def shape_label(shapes: Mapping[str, Sequence[int]]) -> str:
    """``x=1x3x8x8, mask=1x8`` (a scalar: ``s=()``)."""
    return ", ".join(f"{n}={'x'.join(str(d) for d in s) if len(s) else '()'}" for n, s in shapes.items())


class OptimizedModel:
    """An ONNX model with symbolic dimensions, optimized per input shape: a new shape is imported,
    compiled and verified once on first use and cached; ``compiled_shapes`` lists them in order.
    ``graph``, ``executor`` and ``report`` are those of the first shape (the report lists every shape)."""

    def __init__(self, model, config: OptimizeConfig, first: OptimizedProgram, shapes: Mapping[str, Sequence[int]]) -> None:
        from superopt.frontends.onnx_shapes import declared_inputs

        self.model = model
        self.config = config
        self.input_names = list(declared_inputs(model))
        self.programs: dict[tuple, OptimizedProgram] = {}
        self.compiled_shapes: list[dict[str, tuple[int, ...]]] = []
        self._add(shapes, first)

    def _key(self, shapes: Mapping[str, Sequence[int]]) -> tuple:
        return tuple(tuple(int(d) for d in shapes[n]) for n in self.input_names)

    def _add(self, shapes: Mapping[str, Sequence[int]], prog: OptimizedProgram) -> None:
        full = {n: tuple(int(d) for d in shapes[n]) for n in self.input_names}
        self.programs[self._key(full)] = prog
        self.compiled_shapes.append(full)

    @property
    def compiles(self) -> int:
        return len(self.programs)

    @property
    def first(self) -> OptimizedProgram:
        return next(iter(self.programs.values()))

    @property
    def graph(self) -> Graph:
        return self.first.graph

    @property
    def executor(self) -> GraphExecutor:
        return self.first.executor

    @property
    def report(self) -> OptimizeReport:
        from dataclasses import replace

        return replace(self.first.report, shapes=[shape_label(s) for s in self.compiled_shapes])

    def program_for(self, feed: Mapping[str, np.ndarray]) -> OptimizedProgram:
        """The program compiled for these inputs' shapes (compiling and verifying it if new)."""
        shapes = {n: tuple(np.shape(feed[n])) for n in self.input_names}
        prog = self.programs.get(self._key(shapes))
        if prog is None:
            with fewer_collections():
                prog = _optimize_onnx_static(self.model, shapes, dict(feed), self.config)
            self._add(shapes, prog)
        return prog

    def __call__(self, *inputs: np.ndarray, **named: np.ndarray) -> list[np.ndarray]:
        feed = dict(zip(self.input_names, inputs)) | named
        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise ValueError(f"missing model input(s) {missing}; the model takes {self.input_names}")
        return self.program_for(feed)(**{n: feed[n] for n in self.input_names})


def load(directory: str | Path, threads: int | None = None) -> OptimizedProgram:
    """An artifact written by ``OptimizedProgram.save`` or ``superopt optimize -o``, ready to call; nothing is
    recompiled on the machine that wrote it. A corrupt directory fails with one line naming the file."""
    import json

    from superopt.artifact import load_executor

    executor, report = load_executor(directory, threads)
    meta_path = Path(directory) / "program.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    fields = {f for f in OptimizeReport.__dataclass_fields__}
    saved = {k: v for k, v in report.get("optimize", {}).items() if k in fields}
    try:
        rep = OptimizeReport(**saved)
    except TypeError:
        rep = OptimizeReport(len(executor.graph.nodes), len(executor.kernels), 0.0, 0.0, 0.0, None, "loaded")
    dtypes = meta.get("output_dtypes")
    return OptimizedProgram(executor.graph, executor, rep, meta.get("input_names"),
                            None if dtypes is None else [np.dtype(d) for d in dtypes])


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


def rewrite_graph(graph: Graph, config: OptimizeConfig | None = None) -> tuple[Graph, tuple[str, ...]]:
    """The graph passes before scheduling: prune dead code, then the rewrite rules (fusion, layout,
    algebraic), chosen by the graph search (``config.graph_search``; see :func:`search_rewrites`).
    Returns the new graph (same inputs and outputs) and the rules applied, in order."""
    graph, report = search_rewrites(graph, config)
    return graph, (report.applied if report is not None else ())


def search_rewrites(graph: Graph, config: OptimizeConfig | None = None, phases: PhaseTimer | None = None):
    """``rewrite_graph`` with the graph search's report (``search.graph.search.GraphSearchReport``; None when
    ``config.fuse`` is off): :func:`search.graph.rewrite.search_rewrites` with ``config``'s settings."""
    from search.graph.rewrite import search_rewrites as run

    return run(graph, (config or OptimizeConfig()).rewrite_config(), phases)


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


def model_knows(cost_model, target: Target) -> bool:
    """Whether ``cost_model`` was trained on a machine of ``target``'s class (a model that cannot tell is
    trusted); the zero-measurement picks of one that was not are not used."""
    knows = getattr(cost_model, "knows", None)
    return knows is None or bool(knows(target))


def schedule_graph(graph: Graph, target: Target, database: str | Path | None = None, cost_model=None,
                   deadline: float | None = None, pick_allowance: tuple[float, float] | None = None
                   ) -> tuple[dict[str, list], list[str], list[str]]:
    """The schedule pass over a graph with canonical kernels (``canonicalize_kernels``): node name ->
    trace for every compute node. From the tuning database where it has a verified best for
    ``target``; else the cost model's pick, measuring nothing, when a model is given (it keeps the
    default unless it expects another schedule to be faster; no more picks after ``deadline``, a
    ``time.perf_counter()`` value; with no deadline and ``pick_allowance`` = (seconds per kernel, at least),
    :class:`search.schedule.model_guided.PickAllowance` of the kernels left to pick); else the default
    heuristic. Returns the schedules, the nodes the database served and the nodes whose schedule the model
    changed."""
    schedules, hits, picked = {}, [], []
    if database is not None:
        from search.schedule.database import TuningDatabase, schedules_from_database

        schedules, hits = schedules_from_database(graph, target, TuningDatabase(database))
    if cost_model is not None and model_knows(cost_model, target):
        from search.graph.layout import blocked_kernels  # NCHWc kernels keep the default (the model knows NCHW only)
        from search.schedule.model_guided import PickAllowance, schedules_from_model

        skip = [*hits, *blocked_kernels(graph)]
        if deadline is None and pick_allowance is not None:
            per_kernel_s, min_s = pick_allowance
            deadline = time.perf_counter() + PickAllowance(per_kernel_s, min_s).seconds(graph, skip)
        chosen, picks = schedules_from_model(graph, target, cost_model, skip=skip, deadline=deadline)
        schedules = chosen | schedules
        picked = [name for name, p in picks.items() if not p.is_default]
    if any(not n.is_extern and n.name not in schedules for n in graph.nodes):
        schedules = default_schedules(graph, target) | schedules
    return schedules, hits, picked


def tune_schedules(graph: Graph, target: Target, config: OptimizeConfig, database: str | Path, model=None,
                   time_s: float | None = None) -> dict:
    """The schedule search over every kernel of ``graph`` (canonical kernels) that ``database`` lacks for
    ``target``, within ``time_s`` seconds and the config's trials; its records are appended to ``database``.
    Returns a summary."""
    from costmodel.xgb import XGBModel
    from search.schedule.database import TuningDatabase
    from search.schedule.tune import TuneConfig, tune_graph
    from superopt.measure import MeasureConfig

    tc = TuneConfig(trials=config.tune_trials, time_s=time_s, seed=config.seed, progress=config.progress)
    mcfg = MeasureConfig(threads=target.threads, target=target, compiler=config.compiler)
    report = tune_graph(graph, target, tc, TuningDatabase(database), mcfg, model=model or XGBModel())
    return {"measured": report.measured, "elapsed_s": report.elapsed_s, "stop_reason": report.stop_reason,
            "kernels": len(report.kernels)}


def optimize(model, example_inputs: Sequence | Mapping | OptimizeConfig | None = None,
             config: OptimizeConfig | None = None) -> OptimizedProgram | OptimizedModel:
    """The whole pipeline: load -> rewrite -> canonicalize kernels -> schedule -> build -> verify.

    ``model`` is anything :func:`load_graph` takes; ``example_inputs`` (a torch module's call arguments; for
    an ONNX model, arrays or shapes by input name or in input order) may be left out, so
    ``optimize(model, config)`` also works. ONNX nodes with no native lowering run through the ONNX
    fallback and are named in the report (``config.strict``: an error instead). An ONNX model with
    symbolic dimensions needs example inputs or shapes for them and returns an :class:`OptimizedModel`,
    which compiles each new input shape once on first use.
    """
    if isinstance(example_inputs, OptimizeConfig):
        if config is not None:
            raise TypeError("optimize() got two configs")
        example_inputs, config = None, example_inputs
    with fewer_collections():  # (the passes allocate much and make few cycles: superopt.collector)
        return _optimize(model, example_inputs, config or OptimizeConfig())


def _optimize(model, example_inputs, config: OptimizeConfig) -> OptimizedProgram | OptimizedModel:
    phases = PhaseTimer()
    if not isinstance(model, Graph) and not _is_torch_program(model):
        return _optimize_onnx_cached(model, example_inputs, config, phases)
    t0 = time.perf_counter()
    with phases.phase("load"):
        imported = load_graph(model, example_inputs)
    feed = _positional_feed(imported, example_inputs)
    box = [imported]
    del imported  # (handed over: see _optimize_onnx_static; a Graph the caller passed, the caller holds anyway)
    return _optimize_graph(box.pop(), config, t0, verify_inputs=feed, phases=phases)


def _positional_feed(graph: Graph, example_inputs) -> dict[str, np.ndarray] | None:
    """A torch program's example arguments as a feed for the graph's inputs, where they line up one to one
    (same count and shapes); None otherwise."""
    if example_inputs is None or isinstance(example_inputs, Mapping):
        return None
    arrays = [np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x) for x in example_inputs]
    if len(arrays) != len(graph.inputs) or any(a.shape != graph.type_of[n].shape
                                               for a, n in zip(arrays, graph.inputs, strict=True)):
        return None
    return dict(zip(graph.inputs, arrays, strict=True))


def _optimize_graph(imported: Graph, config: OptimizeConfig, t0: float, fallbacks: Sequence = (),
                    input_names: Sequence[str] | None = None, output_dtypes: Sequence[np.dtype] | None = None,
                    shapes: Sequence[str] = (), verify_inputs: Mapping[str, np.ndarray] | None = None,
                    phases: PhaseTimer | None = None,
                    on_built: Callable[[GraphExecutor], None] | None = None) -> OptimizedProgram:
    """The passes after load: rewrite -> canonicalize -> schedule -> build -> verify (on seeded random inputs
    and on ``verify_inputs``, the user's own, where given). ``t0``: when the pipeline started
    (``time.perf_counter()``); ``phases``: the timer the load was charged to; ``on_built``: called with the
    executor once built, before the verification (the program cache starts writing its entry there)."""
    phases = phases if phases is not None else PhaseTimer()
    return_free_memory()  # (what the load freed: the protobuf, the initializers' raw bytes)
    # the reference of the graph as imported, computed from here on beside the pipeline: the rewrite search
    # holds one core (pure Python) and leaves the other free, where later the reference would take a core from
    # the C compiler
    reference = start_reference(imported, config.seed, verify_inputs, config.reference_points,
                                config.reference_process) if config.verify else None
    with phases.phase("rewrite"):
        graph, graph_report = search_rewrites(imported, config, phases)
        rewrites = graph_report.applied if graph_report is not None else ()
        graph = canonicalize_kernels(graph)  # canonicalize: database keys and traces use canonical names
    # from here the imported graph's weights are held only where still needed: by the reference's thread until
    # it is done (a forked reference has its own copy-on-write view of them), and by the rewritten weights
    # (DeferredConstant) until the build computes them, so a caller that hands the graph over (the ONNX import)
    # does not hold the model's weights twice at the build
    del imported
    return_free_memory()  # (the candidate graphs the search dropped)
    t1 = time.perf_counter()
    target = config.resolved_target()
    database, tune = config.database, None
    with phases.phase("schedule"), tempfile.TemporaryDirectory(prefix="superopt-tune-") as scratch:
        model = load_cost_model(config.cost_model)
        deadline = None  # (None: the allowance of the kernels left to pick, once the database has served its own)
        if config.budget_s is not None:
            deadline = t0 + 0.8 * config.budget_s
        elif config.model_pick_s is not None:
            deadline = time.perf_counter() + config.model_pick_s
        if config.budget_s is not None or config.tune_trials is not None:  # schedule search
            database = database or Path(scratch) / "tuning.jsonl"
            time_s = None if config.budget_s is None else max(1.0, t0 + 0.5 * config.budget_s - time.perf_counter())
            tune = tune_schedules(graph, target, config, database, model, time_s)
        schedules, hits, picked = schedule_graph(graph, target, database, model, deadline,
                                                 pick_allowance=(MODEL_PICK_S, MODEL_PICK_MIN_S))
    return_free_memory()  # (the schedule search's and the reference's garbage, before the weights are computed)
    with phases.phase("build"):  # (code generation and the C compiler are charged to their own phases)
        executor = GraphExecutor(graph, schedules, ExecutorConfig(target.threads, config.compiler, target), phases)
    if on_built is not None:
        on_built(executor)
    t2 = time.perf_counter()
    err = None
    if config.verify:
        with phases.phase("verify"):  # against the graph as imported, before any pass
            err = check_program(executor, reference.result(), config.rtol)
        if not err <= config.rtol:
            raise VerificationError(f"compiled program differs from the reference: relative error {err:.3g} "
                                    f"> {config.rtol}")
        reference = None
        return_free_memory()  # (the reference's float64 tensors)
    t3 = time.perf_counter()
    n_compute = sum(not n.is_extern for n in graph.nodes)
    how = []
    if tune is not None:
        how.append(f"schedule search: {tune['measured']} measurements in {tune['elapsed_s']:.1f}s "
                   f"({tune['stop_reason']})")
    if database is not None:
        how.append(f"{len(hits)} of {n_compute} kernels from the tuning database")
    if model is not None and not model_knows(model, target):
        trained = ", ".join(sorted({f"{t.get('vector_bits')}-bit x {t.get('vector_registers')} registers"
                                    for t in getattr(model, "targets", [])}))
        how.append(f"no cost-model picks (the model was trained on {trained} machines, not this "
                   f"{target.vector_bits}-bit x {target.vector_registers} one)")
    elif model is not None:
        how.append(f"{len(picked)} picked by the cost model with no measurement")
    how.append("the rest default schedules" if how else "default schedules (no tuning database, no cost model)")
    report = OptimizeReport(len(graph.nodes), len(executor.kernels), t1 - t0, t2 - t1, t3 - t2, err, ", ".join(how),
                            len(rewrites), n_compute, len(hits), len(picked), list(fallbacks), list(shapes), tune,
                            graph_report.to_dict() if graph_report is not None else None,
                            {n.name: "database" if n.name in hits else "cost model" if n.name in picked else "default"
                             for n in graph.nodes if not n.is_extern},
                            phases.ordered(), phases.total_s, phases.counts.get("kernels_compiled", 0))
    return OptimizedProgram(graph, executor, report, input_names, output_dtypes)


def _optimize_onnx_cached(model, example_inputs, config: OptimizeConfig,
                          phases: PhaseTimer) -> OptimizedProgram | OptimizedModel:
    """``_optimize_onnx`` through the program cache (``config.program_cache``): a verified program of the
    same model, inputs, config, compiler and code is loaded; a new one is stored once verified."""
    from superopt import program_cache

    where = None
    if config.program_cache:
        with phases.phase("cache"):
            key = program_cache.program_key(model, example_inputs, config)
            where = program_cache.entry_dir(config.compiler.cache_dir, key) if key is not None else None
            hit = program_cache.fetch(where, phases) if where is not None else None
        if hit is not None:
            executor, saved, meta = hit
            fields = {k: v for k, v in saved.get("optimize", {}).items() if k in OptimizeReport.__dataclass_fields__}
            report = OptimizeReport(**fields)
            report.phases = phases.ordered()
            report.total_s = phases.total_s
            report.import_s, report.compile_s, report.verify_s = 0.0, report.total_s, 0.0
            report.kernels_compiled = phases.counts.get("kernels_compiled", 0)
            report.stop_reason = f"loaded from the program cache (verified when compiled; {report.stop_reason})"
            dtypes = meta.get("output_dtypes")
            return OptimizedProgram(executor.graph, executor, report, meta.get("input_names"),
                                    None if dtypes is None else [np.dtype(d) for d in dtypes])
    # the entry's large files are written while the verification waits for the reference (a large model's
    # weights take seconds to write), and put in place only once the program passed it
    staged: list[program_cache.Staged] = []
    try:
        prog = _optimize_onnx(model, example_inputs, config, phases,
                              None if where is None else lambda ex: staged.append(program_cache.stage(where, ex)))
    except BaseException:
        for entry in staged:
            entry.discard()
        raise
    # (verified: a failure raised); a program with ONNX fallback nodes is not kept (its report names them)
    if staged and isinstance(prog, OptimizedProgram) and not prog.report.fallbacks:
        import dataclasses

        with phases.phase("cache"):
            meta = {"input_names": prog.input_names,
                    "output_dtypes": None if prog.output_dtypes is None else [np.dtype(d).str for d in prog.output_dtypes]}
            program_cache.commit(staged[0], {"optimize": dataclasses.asdict(prog.report)}, meta)
        prog.report.phases = phases.ordered()
        prog.report.total_s = phases.total_s
    else:
        for entry in staged:
            entry.discard()
    return prog


def onnx_examples(model, example_inputs) -> tuple[dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """``example_inputs`` for an ONNX model as (shapes, arrays) by input name: a dict name -> array or
    name -> shape, or a list of arrays or shapes in input order (a bare shape: the first input's)."""
    from superopt.frontends.onnx_frontend import OnnxImportError
    from superopt.frontends.onnx_shapes import declared_inputs

    if example_inputs is None:
        return {}, {}
    names = list(declared_inputs(model))

    def is_shape(v) -> bool:
        return isinstance(v, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in v)

    if isinstance(example_inputs, Mapping):
        items = dict(example_inputs)
    elif is_shape(example_inputs) and example_inputs and len(names) == 1:
        items = {names[0]: example_inputs}
    else:
        seq = list(example_inputs)
        if len(seq) > len(names):
            raise OnnxImportError(f"{len(seq)} example inputs given but the model takes {len(names)} ({names})")
        items = dict(zip(names, seq))
    shapes, arrays = {}, {}
    for n, v in items.items():
        if is_shape(v):
            shapes[n] = tuple(int(d) for d in v)
        else:
            a = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
            arrays[n], shapes[n] = a, tuple(a.shape)
    return shapes, arrays


def _optimize_onnx_static(model, shapes: Mapping[str, Sequence[int]], arrays: Mapping[str, np.ndarray],
                          config: OptimizeConfig, phases: PhaseTimer | None = None, t0: float | None = None,
                          on_built: Callable[[GraphExecutor], None] | None = None) -> OptimizedProgram:
    """Import an ONNX model at the given input shapes (fallback nodes unless ``config.strict``) and optimize it."""
    from superopt.frontends.onnx_fallback import set_threads
    from superopt.frontends.onnx_frontend import import_onnx_model
    from superopt.frontends.onnx_shapes import symbolic_inputs

    set_threads(config.threads)  # fallback nodes run by onnxruntime use the kernels' thread count
    t0 = time.perf_counter() if t0 is None else t0
    phases = phases if phases is not None else PhaseTimer()
    with phases.phase("load"):
        im = import_onnx_model(model, shapes=shapes, strict=config.strict, example=arrays)
    compiled = [shape_label(im.input_shapes)] if symbolic_inputs(model) else []
    names = im.input_names or im.graph.inputs
    feed = {g: arrays[o] for o, g in zip(names, im.graph.inputs) if o in arrays}
    fallbacks, input_names, output_dtypes = im.fallbacks, im.input_names, im.output_np_dtypes
    box = [im.graph]
    # the protobuf is freed here when no caller holds it (its weights are the graph's now); the graph is handed
    # over with no reference left here (popped from the box), so _optimize_graph can let go of its weights
    del model, im
    return _optimize_graph(box.pop(), config, t0, fallbacks, input_names, output_dtypes, compiled, feed or None, phases,
                           on_built)


def _optimize_onnx(model, example_inputs, config: OptimizeConfig, phases: PhaseTimer | None = None,
                   on_built: Callable[[GraphExecutor], None] | None = None) -> OptimizedProgram | OptimizedModel:
    """An ONNX model: static -> one OptimizedProgram; symbolic dims -> an OptimizedModel that starts with
    the example shapes and specializes new ones on first use. ``on_built``: see :func:`_optimize_graph` (static
    models only)."""
    t0 = time.perf_counter()
    phases = phases if phases is not None else PhaseTimer()
    with phases.phase("load"):  # (the first import of the onnx package is charged here)
        from superopt.frontends.onnx_frontend import _load
        from superopt.frontends.onnx_shapes import resolve_shapes, symbolic_inputs

        m = _load(model)
        shapes, arrays = onnx_examples(m, example_inputs)
    if not symbolic_inputs(m):
        box = [m]
        del m  # handed over without a reference left here, so the import can free the protobuf
        return _optimize_onnx_static(box.pop(), shapes, arrays, config, phases, t0, on_built)
    full = resolve_shapes(m, shapes)  # a clear error when the shapes are missing
    prog = _optimize_onnx_static(m, full, arrays, config, phases, t0)
    from superopt.frontends.onnx_shapes import declared_inputs

    all_shapes = {n: full.get(n, s) for n, s in declared_inputs(m).items()}
    return OptimizedModel(m, config, prog, all_shapes)


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


__all__ = ["load", "OptimizeConfig", "OptimizeReport", "OptimizedProgram", "OptimizedModel", "VerificationError", "optimize",
           "optimize_op", "define_op", "load_graph", "schedule_graph", "load_cost_model", "model_knows", "verify",
           "random_inputs"]
