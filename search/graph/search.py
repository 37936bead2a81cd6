"""Graph search over rewrite rules: which rewrites, where and in which order, by predicted cost.

The state is a whole graph; a move applies one rule at one site (``Rule.matches``/``Rule.apply``).
Fusion rules are moves like any other, so which nodes form one kernel is part of the searched state
and the search leaves two nodes apart when the cost (:class:`search.graph.cost.GraphCost`) says so.
Explored graphs are deduplicated by a rename-invariant digest (:class:`GraphDigests`: ``graph_digest``
plus the multiset of node hashes, so recomputing a value in two nodes is not mistaken for sharing it).

Strategies (:class:`GraphSearchConfig`):

- ``"backtracking"`` (TASO's cost-based backtracking): a priority queue of graphs by cost; the
  cheapest is expanded, and each rewrite of it whose cost is below ``alpha`` x the best cost so far is
  queued. ``alpha > 1`` lets the search pass through slightly worse graphs to reach better ones.
- ``"mcts"``: Monte-Carlo tree search, UCT over rule applications with progressive widening; each
  new tree node is scored by a rollout of ``rollout_depth`` random rewrites, reward = the relative
  cost reduction below the root.
- ``"greedy"``: :func:`rewrite_rules.rewrite_greedy` (first site of the first rule, to a fixed point)
  over the rules given (by default those not in ``EXPLORATION_FAMILIES``): the baseline, and the old
  pipeline behaviour.

Making it fast on real models (resnet50: 176 nodes, about 190 rewrites on the way down):

- a move's cost change, once known (the move was applied somewhere), is cached under the move's
  signature: the rule and a rename-invariant description of what the site sees (the canonical ops
  of the nodes it names, where their inputs come from, who reads their outputs), so the repeated
  blocks of a network share estimates; enumerating moves applies nothing;
- queued moves are applied only when popped (lazy expansion);
- with ``batch`` each expansion also queues the graph with every improving move applied (moves of
  the exploration families excluded: they pay off only through later moves; known
  improvements best first, then the moves not estimated yet; one per node; each kept only if the
  exact cost drops), so independent improvements, which commute, are not explored in every order:
  the search reaches greedy quality in a few expansions and spends its budget on the alternatives;
- the moves not estimated yet go simplifications first, fusion last (fusing first would hide, inside
  one node, what a folding rule rewrites across two); from the start graph a second descent takes
  fusion first, since the other phase order can also lose: ``relu(A) | relu(B) = relu(A | B)`` saves
  a launch, but then the relus can no longer run in their producers' write-backs, and the
  concatenation, free when the producers write its slices, becomes a pass of its own (squeezenet);
- node costs and canonical op digests are cached per node/op object.

Budgets: ``budget_s`` seconds and ``max_expansions`` expanded graphs (and optionally ``patience``).
With ``finish_descent`` the first batch descent from the start graph completes even past ``budget_s``
(it does what a greedy pass does, in about the same time), so the search is never cut off worse than
greedy; the budget then bounds the exploration after it (the pipeline's setting).
Deterministic under ``seed``: moves are enumerated in rule and site order, ties are broken by a
seeded random key; only hitting ``budget_s`` makes the result depend on the machine's speed.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field

from rewrite_rules import EXPLORATION_FAMILIES, Rule, RuleNotApplicable, Site, rewrite_greedy
from search.budget import Budget, StopReason
from search.graph.cost import CanonicalDigests, GraphCost
from superopt.ir.canonical import structural_hashes
from superopt.ir.graph import Graph

STRATEGIES = ("backtracking", "mcts", "greedy")
STOP_NO_RULE = StopReason("exhausted", "no rule applies")
STOP_EXPANSIONS = StopReason("trials", "expansion budget spent")
STOP_TIME = StopReason("time", "time budget spent")
STOP_EXHAUSTED = StopReason("exhausted", "queue exhausted")
STOP_CONVERGED = "converged"  # patience: no gain of min_gain in `patience` expansions


@dataclass(frozen=True)
class GraphSearchConfig:
    strategy: str = "backtracking"  # "backtracking" | "mcts" | "greedy"
    budget_s: float = 2.0  # wall-clock budget
    max_expansions: int | None = 100  # graphs expanded (backtracking) or tree nodes added (mcts); None: no limit
    alpha: float = 1.05  # relaxation: queue a rewrite when its cost < alpha x the best cost
    seed: int = 0
    batch: bool = True  # also queue "every improving move at once" per expansion (see the module docstring)
    batch_passes: int = 8  # rounds of the batch move (each round enumerates the moves the last one enabled)
    patience: int = 0  # stop after this many expansions without a gain of min_gain (0: never)
    finish_descent: bool = False  # the first batch descent completes even past budget_s (never worse than greedy)
    min_gain: float = 1e-3  # relative cost reduction that counts as progress for patience
    rollout_depth: int = 4  # mcts: random rewrites per rollout
    exploration: float = 0.5  # mcts: UCT exploration constant (rewards are relative cost reductions)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown graph search strategy {self.strategy!r} (known: {', '.join(STRATEGIES)})")
        if (not self.budget_s > 0 or (self.max_expansions is not None and self.max_expansions < 0) or not self.alpha >= 1.0
                or self.rollout_depth < 0):
            raise ValueError(f"graph search budgets must be positive and alpha >= 1: {self}")


@dataclass(frozen=True)
class GraphSearchReport:
    strategy: str
    applied: tuple[str, ...]  # rule names on the path to the best graph, in order
    sites: tuple[Site, ...]  # the site of each applied rule
    cost_before: float  # predicted seconds
    cost_after: float
    expansions: int
    graphs_seen: int  # distinct graphs (by digest) evaluated
    elapsed_s: float
    stop_reason: str
    cost_method: str  # which estimate GraphCost used (roofline with which ceilings, or a learned model)
    rule_errors: tuple[str, ...] = ()  # rules that raised (not RuleNotApplicable): their moves were dropped

    @property
    def speedup(self) -> float:
        return self.cost_before / self.cost_after if self.cost_after > 0 else 1.0

    def __str__(self) -> str:
        text = (f"graph search ({self.strategy}): {len(self.applied)} rewrites, predicted {self.cost_before * 1e3:.3f} -> "
                f"{self.cost_after * 1e3:.3f} ms ({self.speedup:.2f}x); {self.expansions} expansions, "
                f"{self.graphs_seen} graphs, {self.elapsed_s:.2f}s; {self.stop_reason}")
        return text + "".join(f"; rule error: {e}" for e in self.rule_errors)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sites"] = [list(map(str, s)) for s in self.sites]
        d["applied"] = list(self.applied)
        return d


# -- digests and states -----------------------------------------------------------------------------


class GraphDigests:
    """A rename-invariant digest of a graph *as a set of kernels*: ``superopt.ir.canonical.graph_digest``
    (what the outputs are computed from, by hash-consing) plus the multiset of its nodes' hashes.

    ``graph_digest`` alone identifies a graph that computes a shared intermediate once with one that
    recomputes it in two identical nodes (equal expressions hash equal), but the search must tell
    materialize from recompute apart: they cost differently. Canonical op digests are memoized per op
    object (the graphs of a search share their untouched ops, so each is canonicalized once)."""

    def __init__(self, canonical: CanonicalDigests | None = None) -> None:
        self.canonical = canonical or CanonicalDigests()

    def __call__(self, graph: Graph) -> str:
        tensor, nodes = structural_hashes(graph, self.canonical.digest)
        text = "outputs " + ",".join(tensor[o] for o in graph.outputs) + " nodes " + ",".join(sorted(nodes))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(eq=False)
class _State:
    graph: Graph
    cost: float
    path: tuple[tuple[Rule, Site], ...]
    digest: str
    moves: list[_Move] | None = None


@dataclass(eq=False)
class _Move:
    estimate: float | None  # predicted cost of the rewritten graph (None: not known yet)
    rule: Rule
    site: Site
    key: Hashable | None  # (rule, site signature): where its cost change is cached
    order: int = 0  # enumeration order (rule, then site)

    def priority(self, parent_cost: float) -> float:
        return self.estimate if self.estimate is not None else parent_cost


@dataclass
class _Budget:
    deadline: float
    max_expansions: int | None
    patience: int = 0
    min_gain: float = 0.0
    expansions: int = 0
    reason: str | None = None
    _mark: float = math.inf  # best cost when progress was last made
    _stale: int = 0  # expansions since

    def progress(self, best_cost: float) -> None:
        """Called after each expansion with the best cost so far (for ``patience``)."""
        if best_cost < self._mark * (1 - self.min_gain):
            self._mark, self._stale = best_cost, 0
        else:
            self._stale += 1

    def spent(self) -> bool:
        if self.reason is None:
            if time.perf_counter() >= self.deadline:
                self.reason = STOP_TIME
            elif Budget(self.max_expansions).trials_spent(self.expansions):
                self.reason = STOP_EXPANSIONS
            elif self.patience and self._stale >= self.patience:
                self.reason = StopReason("converged", f"{STOP_CONVERGED}: no gain of {self.min_gain:.0e} in "
                                                      f"{self.patience} expansions")
        return self.reason is not None

    def out_of_time(self) -> bool:
        if self.reason is None and time.perf_counter() >= self.deadline:
            self.reason = STOP_TIME
        return self.reason == STOP_TIME


class _Explorer:
    """What both searches share: evaluating graphs, enumerating and estimating moves, the batch move."""

    def __init__(self, rules: Sequence[Rule], cost: GraphCost, budget: _Budget) -> None:
        self.rules = list(rules)
        # the rules of a batch descent (the exploration families only pay off through later moves: a descent
        # never applies them, so the graphs inside it are not matched against them)
        self.descent_rules = [r for r in self.rules if r.family not in EXPLORATION_FAMILIES]
        self.cost = cost
        self.budget = budget
        self.digests = GraphDigests(cost.canonical)
        self.seen: dict[str, _State] = {}
        self._deltas: dict[Hashable, float] = {}  # (rule, site signature) -> cost change
        self.errors: dict[str, str] = {}  # rule name -> its first error (a broken rule)

    def state(self, graph: Graph, path: tuple[tuple[Rule, Site], ...]) -> _State | None:
        """A new state for ``graph``; None when an equal graph was seen before."""
        digest = self.digests(graph)
        if digest in self.seen:
            return None
        s = _State(graph, self.cost(graph), path, digest)
        self.seen[digest] = s
        return s

    def _signature(self, graph: Graph, site: Site) -> Hashable | None:
        """A rename-invariant description of what a move at ``site`` sees: per site entry, the node it
        names (its canonical op, where each input comes from, who reads each output) or the literal
        value. Two sites with equal signatures are assumed to change the cost equally (an estimate: the
        exact cost is taken when the move is applied). None when the site names no node or tensor."""
        by_name = graph.node_of
        producer, consumers, consts = graph.producer, graph.consumers, graph.constant
        outputs = set(graph.outputs)
        digest = self.digests.canonical.digest
        named = [by_name.get(v) or producer.get(v) if isinstance(v, str) else None for v in site]
        if not any(named):
            return None
        position = {id(n): k for k, n in enumerate(named) if n is not None}

        def source(t: str) -> tuple:
            p = producer.get(t)
            if p is None:
                return ("const", consts[t].type) if t in consts else ("input", graph.type_of[t])
            if id(p) in position:
                return ("site", position[id(p)], p.outputs.index(t))
            return ("node", digest(p.op), p.outputs.index(t))

        sig = []
        for v, n in zip(site, named):
            if n is None:
                sig.append(("value", v))
                continue
            ins = tuple(source(i) for i in n.inputs)
            same = tuple(n.inputs.index(i) for i in n.inputs)  # which inputs are one tensor
            outs = tuple((o in outputs, tuple(sorted(("site", position[id(c)]) if id(c) in position else
                                                      ("node", digest(c.op)) for c in consumers.get(o, ()))))
                         for o in n.outputs)
            sig.append(("node" if v in by_name else "tensor", digest(n.op), ins, same, outs,
                        n.outputs.index(v) if v not in by_name else -1))
        return tuple(sig)

    def error(self, rule: Rule, where: str, err: Exception) -> None:
        """A rule raised something other than RuleNotApplicable: a bug in the rule. The move is dropped
        (the search goes on without it) and the first such error per rule is kept for the report."""
        self.errors.setdefault(rule.name, f"{rule.name}.{where}: {type(err).__name__}: {err}")

    def key(self, graph: Graph, rule: Rule, site: Site) -> Hashable | None:
        sig = self._signature(graph, site)
        return None if sig is None else (rule.name, sig)

    def moves(self, state: _State, exploration: bool = True) -> list[_Move]:
        """Every (rule, site) of ``state`` in enumeration order, with the estimated cost where a move of
        the same signature was applied before (nothing is applied here). ``exploration=False``: only the
        moves of the rules outside ``EXPLORATION_FAMILIES``, in the same order (a batch descent's graphs:
        the state keeps no list)."""
        if state.moves is not None:
            return state.moves if exploration else [m for m in state.moves if m.rule.family not in EXPLORATION_FAMILIES]
        graph, out, order = state.graph, [], itertools.count()
        for rule in self.rules if exploration else self.descent_rules:
            try:
                for site in rule.matches(graph):
                    key = self.key(graph, rule, site)
                    delta = self._deltas.get(key) if key is not None else None
                    out.append(_Move(None if delta is None else state.cost + delta, rule, site, key, next(order)))
            except Exception as err:  # noqa: BLE001 - a broken rule loses its moves here, named in the report
                self.error(rule, "matches", err)
        if exploration:
            state.moves = out
        return out

    def _applied(self, graph: Graph, cost: float, rule: Rule, site: Site, key: Hashable | None) -> tuple[Graph, float] | None:
        """``rule`` applied at ``site`` and the new cost (recorded under ``key``); None when it does not apply."""
        try:
            new = rule.apply(graph, site)
        except RuleNotApplicable:
            return None
        except Exception as err:  # noqa: BLE001 - a broken rule loses this move, named in the report
            self.error(rule, f"apply at {site}", err)
            return None
        c = cost + self.cost.delta(graph, new)
        if key is not None:
            self._deltas[key] = c - cost
        return new, c

    def apply(self, state: _State, move: _Move) -> _State | None:
        """The state ``move`` leads to (None: not applicable any more, or a graph seen before)."""
        got = self._applied(state.graph, state.cost, move.rule, move.site, move.key)
        if got is None:
            return None
        return self.state(got[0], state.path + ((move.rule, move.site),))

    def batch(self, state: _State, passes: int, cut: bool = True, fusion_first: bool = False) -> _State | None:
        """``state`` with every improving move applied: per pass, the moves known to improve first (best
        estimate first), then those not estimated yet, at most one per node, each kept only when the
        exact cost drops; the next pass enumerates the moves of the result (up to ``passes``). None when
        nothing improves or the result was seen before. ``cut=False``: the time budget does not stop it
        (the first descent from the start graph, so that a search is never worse than a greedy pass).
        ``fusion_first``: the fusion moves not estimated yet before the other ones (the other phase order)."""
        eps = 1e-9 * state.cost
        graph, cost, path = state.graph, state.cost, list(state.path)
        moves = self.moves(state)
        for _ in range(passes):
            applied = len(path)
            known = sorted((m for m in moves if m.estimate is not None and m.estimate < cost - eps
                            and m.rule.family not in EXPLORATION_FAMILIES),
                           key=lambda m: (m.estimate, m.order))
            start, touched = graph, set()
            # moves not estimated yet: simplifications before fusion (fusing first would hide, inside one
            # node, what a folding or hoisting rule rewrites across two), otherwise in enumeration order
            # (exploration moves, which only pay off through later moves, are left to the search proper)
            unknown = sorted((m for m in moves if m.estimate is None and m.rule.family not in EXPLORATION_FAMILIES),
                             key=lambda m: ((m.rule.family == "fusion") != fusion_first, m.order))
            for m in known + unknown:
                if cut and self.budget.out_of_time():
                    break
                names = {v for v in m.site if isinstance(v, str)}
                if names & touched:
                    continue
                key = m.key if graph is start else self.key(graph, m.rule, m.site)
                got = self._applied(graph, cost, m.rule, m.site, key)
                if got is not None and got[1] < cost - eps:
                    graph, cost = got
                    path.append((m.rule, m.site))
                    touched |= names
            if len(path) == applied or cut and self.budget.out_of_time():
                break
            moves = self.moves(_State(graph, cost, (), ""), exploration=False)
        if len(path) == len(state.path):
            return None
        return self.state(graph, tuple(path))


# -- strategies -----------------------------------------------------------------------------------------


def _backtracking(ex: _Explorer, start: _State, config: GraphSearchConfig, rng: random.Random) -> tuple[_State, str]:
    best = start
    tie = itertools.count()
    # entries: (cost, seeded tie-break, counter, state or None, parent, move)
    queue: list = [(start.cost, rng.random(), next(tie), start, None, None)]
    first = True
    while queue:
        # (with finish_descent the start is expanded even when costing it spent the budget: on a loaded
        # machine the search stopped there, with no rule applied, far worse than greedy)
        if not (first and config.finish_descent) and ex.budget.spent():
            return best, ex.budget.reason
        est, _, _, state, parent, move = heapq.heappop(queue)
        if state is None:
            if est >= config.alpha * best.cost:
                continue
            state = ex.apply(parent, move)
            if state is None:
                continue
        if state.cost < best.cost:
            best = state
        if state.cost >= config.alpha * best.cost:
            continue
        ex.budget.expansions += 1
        moves = ex.moves(state)
        if first and not moves:
            return best, STOP_NO_RULE
        first = False
        if config.batch:
            # both phase orders from the start, each run whole (a search is never worse than a greedy pass); the
            # second only where the first left some of the budget: on a large graph (DenseNet-121, 2-3 s a
            # descent) it would double the rewrite's time, and there it is cut like any other move
            for fusion_first in ((False, True) if state is start else (False,)):
                whole = config.finish_descent and state is start and not (fusion_first and ex.budget.out_of_time())
                b = ex.batch(state, config.batch_passes, cut=not whole, fusion_first=fusion_first)
                if b is not None:
                    if b.cost < best.cost:
                        best = b
                    heapq.heappush(queue, (b.cost, rng.random(), next(tie), b, None, None))
        for m in moves:
            p = m.priority(state.cost)
            if p < config.alpha * best.cost:
                heapq.heappush(queue, (p, rng.random(), next(tie), None, state, m))
        ex.budget.progress(best.cost)
    return best, ex.budget.reason or STOP_EXHAUSTED


@dataclass(eq=False)
class _TreeNode:
    state: _State
    untried: list[_Move | str] | None = None  # "batch" stands for the batch move
    children: list[_TreeNode] = field(default_factory=list)
    visits: int = 0
    reward: float = 0.0
    exhausted: bool = False  # every move below it was tried


def _mcts(ex: _Explorer, start: _State, config: GraphSearchConfig, rng: random.Random) -> tuple[_State, str]:
    best = start
    root = _TreeNode(start)

    def untried(node: _TreeNode) -> list:
        if node.untried is None:
            moves = sorted(ex.moves(node.state), key=lambda m: (m.priority(node.state.cost), rng.random()))
            node.untried = (["batch"] if config.batch else []) + moves
        return node.untried

    if not ex.moves(start):
        return best, STOP_NO_RULE
    first = True
    while True:
        if not (first and config.finish_descent) and ex.budget.spent():  # (the root's descent first: see _backtracking)
            return best, ex.budget.reason
        first = False
        node, path = root, [root]
        while True:  # selection, widening a node by one child per doubling of its visits
            room = len(node.children) < 1 + int(math.sqrt(node.visits))
            live = [c for c in node.children if not c.exhausted]
            if untried(node) and (room or not live):
                break
            if not live:
                break
            parent = node
            node = max(live, key=lambda c: (c.reward / max(c.visits, 1) + config.exploration * math.sqrt(
                math.log(parent.visits + 1) / max(c.visits, 1))))
            path.append(node)
        if not untried(node):  # nothing left below this node
            node.exhausted = True
            for p in reversed(path[:-1]):
                if p.untried or any(not c.exhausted for c in p.children):
                    break
                p.exhausted = True
            if root.exhausted:
                return best, STOP_EXHAUSTED
            continue
        move = node.untried.pop(0)
        child_state = ex.batch(node.state, config.batch_passes, cut=not (config.finish_descent and node is root)) \
            if move == "batch" else \
            ex.apply(node.state, move)
        if child_state is None:
            continue
        ex.budget.expansions += 1
        child = _TreeNode(child_state)
        node.children.append(child)
        path.append(child)
        if child_state.cost < best.cost:
            best = child_state
        # rollout: a few random rewrites (among those not much worse) from the new node
        graph, cost, trail, low = child_state.graph, child_state.cost, list(child_state.path), child_state.cost
        pool = [m for m in ex.moves(child_state) if m.priority(cost) < config.alpha * cost]
        for _ in range(config.rollout_depth):
            if not pool or ex.budget.out_of_time():
                break
            m = pool.pop(rng.randrange(len(pool)))
            got = ex._applied(graph, cost, m.rule, m.site, m.key if graph is child_state.graph else None)
            if got is None:
                continue
            graph, cost = got
            trail.append((m.rule, m.site))
            if cost < low:
                low = cost
                if cost < best.cost:
                    s = ex.state(graph, tuple(trail))
                    if s is not None:
                        best = s
        reward = (root.state.cost - low) / root.state.cost
        ex.budget.progress(best.cost)
        for p in path:
            p.visits += 1
            p.reward += reward


def _greedy(graph: Graph, usable: Sequence[Rule]) -> tuple[Graph, tuple[tuple[Rule, Site], ...], str, int]:
    out, report = rewrite_greedy(graph, usable)
    by_name = {r.name: r for r in usable}
    return out, tuple((by_name[n], ()) for n in report.applied), report.stop_reason, len(report.applied)


def default_rules() -> list[Rule]:
    """``rewrite_rules.ALL_RULES`` (hand-written and generated), or ``RULES`` where there is no ALL_RULES; not the
    families applied as passes of their own (``rewrite_rules.PASS_FAMILIES``)."""
    import rewrite_rules

    return [r for r in getattr(rewrite_rules, "ALL_RULES", rewrite_rules.RULES)
            if r.family not in rewrite_rules.PASS_FAMILIES]


def search_graph(graph: Graph, cost: GraphCost | Callable[[], GraphCost | None] | None,
                 config: GraphSearchConfig | None = None,
                 rules: Sequence[Rule] | None = None) -> tuple[Graph, GraphSearchReport]:
    """The cheapest graph found (computing the same as ``graph``) and the search's report.

    ``cost`` may be a function making the GraphCost, called only when some rule matches (measuring the
    machine's ceilings is then skipped for graphs nothing applies to); None (or a function returning
    None) is allowed for ``greedy``, which needs no cost (the report's costs are then 0)."""
    config = config or GraphSearchConfig()
    if rules is None:  # greedy drivers never get the exploration families' moves
        rules = default_rules() if config.strategy != "greedy" else \
            [r for r in default_rules() if r.family not in EXPLORATION_FAMILIES]
    rules = list(rules)
    t0 = time.perf_counter()
    if cost is not None and not isinstance(cost, GraphCost):
        if not any(next(iter(r.matches(graph)), None) is not None for r in rules):
            return graph, GraphSearchReport(config.strategy, (), (), 0.0, 0.0, 0, 1, time.perf_counter() - t0,
                                            STOP_NO_RULE, "not costed: no rule applies")
        cost = cost()
        t0 = time.perf_counter()  # the budget is for searching (measuring the ceilings, once per machine, is not)
    if cost is None and config.strategy != "greedy":
        raise ValueError(f"the {config.strategy} graph search needs a GraphCost")
    if config.strategy == "greedy":
        out, path, reason, steps = _greedy(graph, rules)
        before, after = (cost(graph), cost(out)) if cost is not None else (0.0, 0.0)
        return out, GraphSearchReport("greedy", tuple(r.name for r, _ in path), tuple(s for _, s in path), before,
                                      after, steps, steps + 1, time.perf_counter() - t0, reason,
                                      cost.method if cost is not None else "not costed")
    budget = _Budget(t0 + config.budget_s, config.max_expansions, config.patience, config.min_gain)
    ex = _Explorer(rules, cost, budget)
    start = ex.state(graph, ())
    rng = random.Random(config.seed)
    run = _backtracking if config.strategy == "backtracking" else _mcts
    best, reason = run(ex, start, config, rng)
    return best.graph, GraphSearchReport(config.strategy, tuple(r.name for r, _ in best.path),
                                         tuple(s for _, s in best.path), start.cost, best.cost, budget.expansions,
                                         len(ex.seen), time.perf_counter() - t0, reason, cost.method,
                                         tuple(ex.errors.values()))


__all__ = ["GraphDigests", "GraphSearchConfig", "GraphSearchReport", "STRATEGIES", "default_rules", "search_graph"]
