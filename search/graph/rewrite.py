"""The rewrite pass: prune, then the rewrite rules chosen by the graph search, the global layout choice, the
Winograd convs and the untied attention keys; the graph the schedules are chosen for."""

from __future__ import annotations

from dataclasses import dataclass, field

from rewrite_rules import EXPLORATION_FAMILIES
from rewrite_rules.dim_merge import MERGE_DIMS, merge_dims_where
from rewrite_rules.pixel_merge import merge_pixels_where
from rewrite_rules.vertical_fusion import untie_all_keys
from rewrite_rules.winograd import winograd_all
from search.graph.cost import Ceilings, GraphCost
from search.graph.layout import choose_layouts
from search.graph.search import GraphSearchConfig, GraphSearchReport, default_rules, search_graph
from superopt.ir.graph import Graph
from superopt.ir.prune import prune_graph
from superopt.phases import PhaseTimer, phase
from superopt.runtime.compiler import CompilerConfig
from superopt.target import Target


@dataclass(frozen=True)
class RewriteConfig:
    """The rewrite pass's settings (``superopt.api.OptimizeConfig.rewrite_config`` gives the pipeline's; the
    fields mean what they mean there)."""

    target: Target
    compiler: CompilerConfig = field(default_factory=CompilerConfig)
    fuse: bool = True
    rules: tuple[str, ...] | None = None
    graph_search: str = "backtracking"
    graph_budget_s: float = 1.0
    graph_expansions: int | None = 20  # None: no limit
    graph_alpha: float = 1.05
    graph_patience: int = 4
    seed: int = 0
    layout: str = "auto"
    winograd: bool = True


def rewrite_graph(graph: Graph, config: RewriteConfig) -> tuple[Graph, tuple[str, ...]]:
    """:func:`search_rewrites` without the report: the new graph (same inputs and outputs) and the rules
    applied, in order."""
    graph, report = search_rewrites(graph, config)
    return graph, (report.applied if report is not None else ())


def search_rewrites(graph: Graph, config: RewriteConfig,
                    phases: PhaseTimer | None = None) -> tuple[Graph, GraphSearchReport | None]:
    """The graph passes before scheduling (prune dead code, then the rewrite rules: fusion, layout, algebraic,
    chosen by the graph search ``config.graph_search``), with the graph search's report (None when
    ``config.fuse`` is off). Rules: ``config.rules`` by name, else ``ALL_RULES`` for the search and the
    rules outside ``EXPLORATION_FAMILIES`` for greedy. The cost: ``search.graph.cost.GraphCost``, a
    roofline against this machine's measured ceilings (measured once per compiler cache; greedy when
    the target is not a CPU, which has no measured ceilings)."""
    graph = prune_graph(graph)
    if not config.fuse:
        return graph, None
    target = config.target
    strategy = config.graph_search if target.kind == "cpu" else "greedy"
    everything = default_rules()
    if config.rules is not None:
        rules = [r for r in everything if r.name in config.rules]
    else:
        rules = [r for r in everything if strategy != "greedy" or r.family not in EXPLORATION_FAMILIES]
    gconfig = GraphSearchConfig(strategy=strategy, budget_s=config.graph_budget_s, max_expansions=config.graph_expansions,
                                alpha=config.graph_alpha, seed=config.seed, patience=config.graph_patience,
                                finish_descent=True)  # never worse than the greedy pass, whatever the budget
    cost = (lambda: _graph_cost(target, config.compiler, phases)) if target.kind == "cpu" else None
    graph, report = search_graph(graph, cost, gconfig, rules)
    # the global layout choice (search/graph/layout.py), after the rewrites; "auto" on CPUs only (its cost and the
    # blocked-conv tiles are CPU ones), a forced block anywhere
    if config.layout != "nchw" and (config.layout != "auto" or target.kind == "cpu"):
        graph = choose_layouts(graph, target, layout=config.layout)[0]
    if config.layout == "auto" and target.kind == "cpu":  # the pointwise convs left on NCHW: one pixel axis
        graph = merge_pixels_where(graph, target.lanes("float32"))
    if target.kind == "cpu" and (config.rules is None or MERGE_DIMS.name in config.rules):
        # a contraction's output dims that run together in every tensor, as one (its vector columns then split in
        # whole vectors)
        graph = merge_dims_where(graph, target.lanes("float32"))
    if config.winograd and target.kind == "cpu" and (config.rules is None or "winograd_conv3x3" in config.rules):
        graph = winograd_all(graph)
    return untie_all_keys(graph), report  # attention's key operand in a local of its own (so it can be packed)


def _graph_cost(target: Target, compiler: CompilerConfig, phases: PhaseTimer | None = None):
    with phase(phases, "ceilings"):  # measured once per machine and compiler cache, then read from it
        return GraphCost(Ceilings.measured(target, compiler), target)
