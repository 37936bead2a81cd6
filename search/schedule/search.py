"""Schedule search for one kernel: a bandit over sketches, evolution of knobs, measured in batches.

Two layers, as in Ansor:
- **Sketch level** (the structure): an upper-confidence-bound tree policy over the sketches that
  fit the kernel (row-wise fusion, tiled stages with or without epilogues, ...): each batch's
  proposals are split among sketches by their best measured speed plus an exploration bonus.
- **Knob level** (the parameters): an evolutionary refinement. Parents are the fastest measured
  points of a sketch; children are mutations (one or two knobs changed) and crossovers (each knob
  from either parent), plus fresh random samples. Children are deduplicated by trace and must
  lower legally; the cost model ranks them and the best of them (with a share picked at random,
  for exploration) are measured.

Every candidate is measured by the measurement service, which verifies it against the reference
interpreter before its time counts. The default heuristic's point is measured first, so the
report's speedup is over the default and the search can only improve on it; its one-knob
neighbours come next (:attr:`SearchConfig.neighbours`), then the evolution. Budgets are trials and
seconds; with the same seed and the same measurements the same candidates are proposed.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from tqdm import tqdm

from costmodel.base import Candidate, CostModel, RandomModel
from search.budget import Budget, StopReason
from search.schedule.model_guided import evolve, thread_partition
from superopt.ir.compute import Compute
from superopt.measure import ErrorCode, MeasureConfig, MeasureInput, MeasureResult, MeasureService
from superopt.schedule.plan import ScheduleError
from superopt.schedule.primitives import Primitive, trace_to_json
from superopt.schedule.space import Point, ScheduleSpace
from superopt.target import Target

STRATEGIES = ("evolutionary", "random")
# the share of a step's time left that evolving proposals in the cost model may take: the rest is for measuring
# (a search of a few seconds spent most of them breeding and scoring a full population)
PROPOSE_TIME_SHARE = 0.25


@dataclass(frozen=True)
class SearchConfig:
    trials: int | None = 64  # measurements, the default's included (None: no limit)
    time_s: float | None = None  # wall-clock budget (checked between batches)
    seed: int = 0
    batch_size: int = 16
    strategy: str = "evolutionary"  # or "random": uniform samples of the space (the baseline)
    progress: bool = False  # a tqdm bar on stderr
    parents: int = 6  # fastest points per sketch that breed
    proposals: int = 48  # children generated per batch, ranked by the cost model
    explore: float = 0.25  # share of each batch picked at random among the proposals
    fresh: float = 0.15  # share of proposals that are fresh random samples
    # with a trained cost model: the proposals seed an evolution in the model (population points, a few
    # generations) and only the model's top of it is measured (plus the explore share)
    population: int = 512
    generations: int = 2
    # only schedules that split the work among threads as the default does (CPU): a kernel of a graph
    # reads what its producer's threads wrote (search/model_guided.thread_partition)
    keep_partition: bool = False
    # > 0: candidates are timed with their constants out of cache (MeasureInput.cold_bytes), as a kernel of a
    # graph finds them
    cold_bytes: int = 0
    # the default's one-knob neighbours (ScheduleSpace.neighbours) are measured first, best-scored first, in at
    # most this share of the trials (all of them under a time budget alone): the default heuristic is near the
    # best on most kernels, and where it is not, one knob it set wrong (the row dim, the panel order, a pack)
    # is a common reason; random children of the default reach one such point among many
    neighbours: float = 0.5

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown search strategy {self.strategy!r} (known: {', '.join(STRATEGIES)})")
        if (self.trials is not None and self.trials < 1) or self.batch_size < 1:
            raise ValueError("a search needs trials >= 1 and batch_size >= 1")
        if not 0.0 <= self.neighbours <= 1.0:
            raise ValueError(f"the neighbours' share of the trials must be within [0, 1], got {self.neighbours}")

    @property
    def budget(self) -> Budget:
        return Budget(self.trials, self.time_s)


class Measurer(Protocol):
    """Builds, verifies and times candidates; ``time_left_s`` is the caller's budget: what it cuts short comes
    back NOT_MEASURED."""

    def measure(self, inputs: Sequence[MeasureInput], time_left_s: float | None = None) -> list[MeasureResult]: ...


@dataclass(frozen=True)
class Trial:
    point: Point
    trace: tuple[Primitive, ...]
    seconds: float  # inf when it failed
    error: str  # ErrorCode name


@dataclass
class SearchReport:
    workload: str  # the compute's digest
    default_s: float | None
    best_s: float | None
    best_trace: tuple[Primitive, ...]
    best_point: Point | None
    trials: int  # measurements made
    failures: dict[str, int]  # ErrorCode name -> count
    stop_reason: str
    elapsed_s: float
    history: list[tuple[int, float]] = field(default_factory=list)  # (measurements so far, best so far) per batch
    log: list[Trial] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.default_s is None or self.best_s is None:
            return None
        return self.default_s / self.best_s

    def best_after(self, n: int) -> float | None:
        """The best time among the first ``n`` measurements (the default's included when it counts)."""
        best = [t for k, t in self.history if k <= n]
        return min(best) if best else None

    def to_dict(self) -> dict:
        return {"workload": self.workload, "default_s": self.default_s, "best_s": self.best_s,
                "speedup": self.speedup, "best_trace": [repr(p) for p in self.best_trace],
                "best_point": self.best_point.to_json() if self.best_point else None, "trials": self.trials,
                "failures": self.failures, "stop_reason": self.stop_reason, "elapsed_s": self.elapsed_s,
                "history": self.history}


def _ucb(group: Sequence[Trial], ref: float, n_all: int, c: float) -> float:
    """UCB1 of a branch: its best speed relative to ``ref`` plus an exploration bonus."""
    best = min(t.seconds for t in group)
    return (ref / best if math.isfinite(best) else 0.0) + c * math.sqrt(math.log(n_all + 1) / len(group))


class ScheduleSearch:
    """The search state of one kernel; :meth:`step` proposes and measures one batch.

    ``tune_graph`` interleaves the steps of many kernels; :func:`search_compute` runs one to its budget."""

    def __init__(self, compute: Compute, target: Target, config: SearchConfig, measurer: Measurer, *,
                 constant_inputs: frozenset[str] | None = None, model: CostModel | None = None) -> None:
        self.compute = compute
        self.target = target
        self.config = config
        self.measurer = measurer
        self.consts = frozenset(compute.inputs) if constant_inputs is None else frozenset(constant_inputs)
        self.space = ScheduleSpace(compute, target, self.consts)
        self.model: CostModel = model if model is not None else RandomModel(config.seed)
        self.rng = random.Random(config.seed)
        self.log: list[Trial] = []
        self.seen: set[str] = set()
        self.failures: Counter[str] = Counter()
        self.history: list[tuple[int, float]] = []
        self.default_s: float | None = None
        self.best: Trial | None = None
        self.started = time.perf_counter()
        self.stop_reason = ""
        self._stale = 0  # batches in a row that proposed nothing new
        self._structures: dict[Point, tuple] = {}  # point -> its structure (a lowering each: cached)
        self._partition = None  # the default's thread partition, when the search keeps it
        self._neighbours: list[tuple[Point, tuple[Primitive, ...]]] | None = None  # (to measure first; None: not made)
        if config.keep_partition and target.kind == "cpu":
            self._partition = thread_partition(self._legal(self.space.default_point()) or ())

    # -- budget ---------------------------------------------------------------------------------

    @property
    def trials(self) -> int:
        return len(self.log)

    def remaining(self) -> float:
        return self.config.budget.trials_left(self.trials)

    def done(self) -> bool:
        if self.stop_reason:
            return True
        if self.config.budget.trials_spent(self.trials):
            self.stop_reason = StopReason("trials", f"trial budget spent ({self.config.trials} measurements)")
        elif self.config.budget.time_spent(time.perf_counter() - self.started):
            self.stop_reason = StopReason("time", f"time budget spent ({self.config.time_s:.0f}s)")
        elif self._stale >= 3:
            self.stop_reason = StopReason("exhausted", "space exhausted: no new legal candidate in 3 batches "
                                                       f"({len(self.seen)} distinct)")
        return bool(self.stop_reason)

    # -- one batch --------------------------------------------------------------------------------

    def step(self, n: int | None = None, time_left_s: float | None = None) -> list[Trial]:
        """Propose up to ``n`` (default: batch size) new candidates, measure them within ``time_left_s``
        (None: the search's own time budget, if any), learn from them. Candidates the time cut short are
        neither trials nor seen: a later step may propose them again."""
        if self.done():
            return []
        if time_left_s is None and self.config.time_s is not None:
            time_left_s = self.config.time_s - (time.perf_counter() - self.started)
        n = min(n or self.config.batch_size, self.remaining())
        first: list[Trial] = []
        if not self.log:  # the default heuristic's point first, alone: its time bounds the slow cut-off
            p = self.space.default_point()
            trace = self._legal(p) or ()
            self.seen.add(trace_to_json(trace))
            started = time.perf_counter()
            first = self._measure([(p, trace)], True, time_left_s)
            if not first:  # the default was cut short: nothing else is measured before it
                return []
            n -= 1
            if time_left_s is not None:
                time_left_s -= time.perf_counter() - started
        batch = self._propose(n, time_left_s)
        if not batch:
            self._stale += 0 if first else 1
            return first
        self._stale = 0
        return first + self._measure(batch, False, time_left_s)

    def _legal(self, p: Point) -> tuple[Primitive, ...] | None:
        try:
            return self.space.trace(p)
        except ScheduleError:
            return None

    def _new(self, p: Point, out: dict[str, tuple[Point, tuple]]) -> None:
        trace = self._legal(p)
        if trace is None or self._partition is not None and thread_partition(trace) != self._partition:
            return
        key = trace_to_json(trace)
        if key not in self.seen and key not in out:
            out[key] = (p, trace)

    def _propose(self, n: int, time_left_s: float | None = None) -> list[tuple[Point, tuple[Primitive, ...]]]:
        if n <= 0:
            return []
        pool: dict[str, tuple[Point, tuple]] = {}
        tries = 0
        if self.config.strategy == "random":
            while len(pool) < n and tries < 40 * n:
                tries += 1
                self._new(self.space.sample(self.rng), pool)
            return list(pool.values())
        first = self._next_neighbours(n)
        if len(first) >= n:
            return first
        for _, trace in first:
            self.seen.add(trace_to_json(trace))  # (so that the proposals below do not repeat them)
        try:
            return first + self._evolved(n - len(first), pool, time_left_s)
        finally:
            for _, trace in first:
                self.seen.discard(trace_to_json(trace))

    def _next_neighbours(self, n: int) -> list[tuple[Point, tuple[Primitive, ...]]]:
        """Up to ``n`` of the default's one-knob neighbours not measured yet, best-scored by the model first,
        within :attr:`SearchConfig.neighbours` of the trial budget."""
        cfg = self.config
        if self._neighbours is None:
            found: dict[str, tuple[Point, tuple]] = {}
            if cfg.neighbours > 0:
                for p in self.space.neighbours(self.space.default_point()):
                    self._new(p, found)
            cands = list(found.values())
            if len(cands) > 1:
                scores = np.asarray(self.model.predict([self._candidate(t) for _, t in cands]), dtype=float)
                cands = [cands[i] for i in np.argsort(-scores, kind="stable")]
            self._neighbours = cands if cfg.trials is None else cands[: int(cfg.neighbours * cfg.trials)]
        left = [c for c in self._neighbours if trace_to_json(c[1]) not in self.seen]
        take, self._neighbours = left[:n], left[n:]
        return take

    def _evolved(self, n: int, pool: dict[str, tuple[Point, tuple]],
                 time_left_s: float | None) -> list[tuple[Point, tuple[Primitive, ...]]]:
        """``n`` children of the measured points (mutations, crossovers, fresh samples), ranked by the model."""
        cfg = self.config
        for sketch, k in self._sketch_shares(cfg.proposals).items():
            for parents, share, structural in self._structure_shares(sketch, k):
                made = tries = 0
                while made < share and tries < 10 * share:
                    tries += 1
                    before = len(pool)
                    self._new(self._child(sketch, parents, structural), pool)
                    made += len(pool) > before
        if getattr(self.model, "trained", False):
            deadline = None if time_left_s is None else time.perf_counter() + PROPOSE_TIME_SHARE * time_left_s
            return self._guided(n, [p for p, _ in pool.values()], deadline)
        cands = list(pool.values())
        if len(cands) <= n:
            return cands
        scores = np.asarray(self.model.predict([self._candidate(t) for _, t in cands]), dtype=float)
        order = list(np.argsort(-scores, kind="stable"))
        n_explore = int(round(n * cfg.explore))
        chosen = order[: n - n_explore]
        rest = order[n - n_explore:]
        chosen += self.rng.sample(rest, min(n_explore, len(rest)))
        return [cands[i] for i in chosen]

    def _guided(self, n: int, seeds: list[Point],
                deadline: float | None = None) -> list[tuple[Point, tuple[Primitive, ...]]]:
        """Evolve the proposals (and the best measured points) in the cost model; measure its top
        ``n`` minus the explore share, and that share drawn at random from the rest (epsilon-greedy)."""
        cfg = self.config
        best = sorted((t for t in self.log if math.isfinite(t.seconds)), key=lambda t: t.seconds)[: cfg.parents]
        scored = evolve(self.space, self.model, self._candidate, self.rng, seeds + [t.point for t in best],
                        population=cfg.population, generations=cfg.generations, exclude=self.seen,
                        deadline=deadline)
        if self._partition is not None:
            scored = [x for x in scored if thread_partition(x.trace) == self._partition]
        n_explore = int(round(n * cfg.explore)) if len(scored) > n else 0
        chosen = scored[: n - n_explore]
        rest = scored[n - n_explore:]
        chosen += self.rng.sample(rest, min(n_explore, len(rest)))
        return [(s.point, s.trace) for s in chosen]

    def _reference_s(self) -> float:
        """The time rewards are relative to: the default's, else the fastest measured."""
        return self.default_s or min((t.seconds for t in self.log if math.isfinite(t.seconds)), default=1.0)

    def _structure_of(self, point: Point) -> tuple:
        s = self._structures.get(point)
        if s is None:
            s = self._structures[point] = self.space.structure(point)
        return s

    def _sketch_shares(self, total: int) -> dict[str, int]:
        """Proposals per sketch: UCB1 over sketches, reward = reference time / best time of the sketch."""
        sketches = self.space.sketches
        if len(sketches) == 1:
            return {sketches[0]: total}
        groups: dict[str, list[Trial]] = {}
        for t in self.log:
            groups.setdefault(t.point.sketch, []).append(t)
        ref, n_all = self._reference_s(), max(1, len(self.log))
        # an unvisited sketch gets a couple of samples first (it may have a single point: naive)
        shares = {s: 2 for s in sketches if s not in groups}
        visited = [s for s in sketches if s in groups]
        ranked = sorted(visited, key=lambda s: -_ucb(groups[s], ref, n_all, 0.5))
        left = total - sum(shares.values())
        # most proposals to the leading sketch, a few to the next two, so no branch starves
        for s, share in zip(ranked, (0.7, 0.15, 0.15)):
            shares[s] = max(1, int(left * share))
        return shares

    def _structure_shares(self, sketch: str, total: int) -> list[tuple[list[Point], int, bool]]:
        """The second level of the tree: within a sketch, UCB1 over the structures measured so far
        (operand roles, loop order, packing, reduction blocking). The leading structure's fastest
        points breed most of the children, the runner-up's some; a share goes to new structures."""
        groups: dict[tuple, list[Trial]] = {}
        for t in self.log:
            if t.point.sketch == sketch:
                groups.setdefault(self._structure_of(t.point), []).append(t)
        if not groups:
            return [([], total, False)]
        ref, n_all = self._reference_s(), sum(len(g) for g in groups.values())

        def ucb(g: list[Trial]) -> float:
            return _ucb(g, ref, n_all, 0.3)

        ranked = sorted(groups.values(), key=ucb, reverse=True)
        out = []
        for g, share in zip(ranked, (0.6, 0.2)):
            ok = sorted((t for t in g if math.isfinite(t.seconds)), key=lambda t: t.seconds)
            if ok:
                out.append(([t.point for t in ok[: self.config.parents]], max(1, int(total * share)), False))
        best_all = sorted((t for g in ranked for t in g if math.isfinite(t.seconds)), key=lambda t: t.seconds)
        # new structures: structural mutations of the best points overall
        out.append(([t.point for t in best_all[: self.config.parents]], max(1, total - sum(n for _, n, _ in out)), True))
        return out

    def _child(self, sketch: str, parents: list[Point], structural: bool) -> Point:
        """A fresh sample, a crossover, or a mutation: of numeric knobs within a structure, of
        structural knobs for the new-structure share."""
        rng, cfg = self.rng, self.config
        r = rng.random()
        if not parents or r < cfg.fresh:
            return self.space.sample(rng, sketch)
        if r < cfg.fresh + 0.2 and len(parents) > 1:
            a, b = rng.sample(parents, 2)
            return self.space.crossover(a, b, rng)
        parent = rng.choice(parents)
        return self.space.mutate(parent, rng, rng.choice((1, 1, 2)), structural=structural)

    def _candidate(self, trace: tuple[Primitive, ...]) -> Candidate:
        return Candidate(self.compute, trace, self.target, self.consts)

    def _measure(self, batch: list[tuple[Point, tuple[Primitive, ...]]], first_is_default: bool,
                 time_left_s: float | None = None) -> list[Trial]:
        # a candidate 20x slower than the best so far is verified and timed once, not in full
        slow = 20 * self.best.seconds if self.best is not None else None
        inputs = [MeasureInput(self.compute, trace, constant_inputs=self.consts, slow_call_s=slow,
                               cold_bytes=self.config.cold_bytes) for _, trace in batch]
        results = self.measurer.measure(inputs, time_left_s)
        trials = []
        for k, ((p, trace), r) in enumerate(zip(batch, results, strict=True)):
            if r.error_code is ErrorCode.NOT_MEASURED:
                continue
            self.seen.add(trace_to_json(trace))
            t = Trial(p, trace, r.cost, r.error_code.name)
            trials.append(t)
            self.log.append(t)
            if not r.ok:
                self.failures[r.error_code.name] += 1
            if k == 0 and first_is_default:
                self.default_s = r.median_s if r.ok else None
                if self.config.strategy == "random":
                    continue  # the random baseline's best is over its own samples only
            if r.ok and (self.best is None or t.seconds < self.best.seconds):
                self.best = t
        if trials:
            self.model.update([self._candidate(t.trace) for t in trials], [t.seconds for t in trials])
        if self.best is not None:
            self.history.append((self.trials, self.best.seconds))
        return trials

    def remeasure(self, traces: Sequence[tuple[Primitive, ...]], time_left_s: float | None = None) -> list[Trial]:
        """Measure already-seen traces again (confirmation); not counted as search trials. Those the time cut
        short are left out."""
        results = self.measurer.measure([MeasureInput(self.compute, tr, constant_inputs=self.consts,
                                                      cold_bytes=self.config.cold_bytes) for tr in traces],
                                        time_left_s)
        return [Trial(Point("remeasure"), tuple(tr), r.cost, r.error_code.name)
                for tr, r in zip(traces, results, strict=True) if r.error_code is not ErrorCode.NOT_MEASURED]

    def report(self) -> SearchReport:
        self.done()
        b = self.best
        return SearchReport(self.compute.digest(), self.default_s, b.seconds if b else None, b.trace if b else (),
                            b.point if b else None, self.trials, dict(self.failures),
                            self.stop_reason or StopReason("caller", "stopped by the caller"), time.perf_counter() - self.started,
                            list(self.history), list(self.log))


def search_compute(compute: Compute, target: Target, config: SearchConfig | None = None, *,
                   constant_inputs: frozenset[str] | None = None, service: Measurer | None = None,
                   model: CostModel | None = None) -> SearchReport:
    """Search schedules of one kernel within the budget; returns the report (best trace, stop reason)."""
    config = config or SearchConfig()
    own = service is None
    if own:
        service = MeasureService(MeasureConfig(threads=target.threads, target=target))
    try:
        s = ScheduleSearch(compute, target, config, service, constant_inputs=constant_inputs, model=model)
        with tqdm(total=config.trials, disable=not config.progress, desc="search", unit="trial") as bar:
            while not s.done():
                got = s.step()
                bar.update(len(got))
                if s.best is not None:
                    bar.set_postfix(best_ms=f"{s.best.seconds * 1e3:.3f}")
        return s.report()
    finally:
        if own:
            service.close()


__all__ = ["SearchConfig", "SearchReport", "ScheduleSearch", "Trial", "search_compute", "ErrorCode"]
