"""Search in the cost model instead of on the machine: evolution with the model as fitness, and
the zero-measurement pick.

:func:`evolve` is Ansor's evolutionary search: a population of legal points (seeds, their
mutations, fresh samples) is scored by the cost model; the best-scored breed (mutation and
crossover) for a few generations; the result is every point seen, best-scored first. The schedule
search measures only the top of it (plus explorers); :func:`pick_schedule` measures nothing and
takes the model's favourite over the default heuristic only when the model expects it to be
clearly faster.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.base import Candidate, CostModel
from superopt.ir.compute import Compute
from superopt.schedule.default import FOLD_REDUCTIONS, ROWS_INTO_CONTRACTION
from superopt.schedule.plan import ScheduleError
from superopt.schedule.primitives import Fuse, Parallel, Primitive, trace_to_json
from superopt.schedule.space import Point, ScheduleSpace
from superopt.target import Target


@dataclass(frozen=True)
class Scored:
    point: Point
    trace: tuple[Primitive, ...]
    score: float


def evolve(space: ScheduleSpace, model: CostModel, make: Callable[[tuple[Primitive, ...]], Candidate],
           rng: random.Random, seeds: Iterable[Point], *, population: int, generations: int,
           exclude: frozenset[str] | set[str] = frozenset(), fresh: float = 0.2,
           deadline: float | None = None) -> list[Scored]:
    """Evolve ``population`` points for ``generations`` rounds with ``model`` as fitness.

    ``seeds`` start the population (with mutations of them and ``fresh`` random samples); traces in
    ``exclude`` (already measured) are never returned. ``deadline`` (``time.perf_counter()``): no breeding
    after it, and no scoring past the chunk under way (:data:`SCORE_CHUNK`); the points scored by then are
    returned. Returns every legal new point scored, best first."""
    pool: dict[tuple[Primitive, ...], Point] = {}  # trace -> point (traces are hashable records)
    tried: set[Point] = set()  # breeding proposes the same point again and again: resolve each once

    def add(p: Point) -> None:
        if p in tried:
            return
        tried.add(p)
        try:
            trace = space.trace(p)
        except ScheduleError:
            return
        if trace not in pool and not (exclude and trace_to_json(trace) in exclude):
            pool[trace] = p

    seeds = list(seeds)
    for p in seeds:
        add(p)
    def late() -> bool:
        return deadline is not None and time.perf_counter() >= deadline

    _breed(space, rng, seeds, add, population - len(pool), lambda: len(pool) >= population or late(), fresh,
           lambda: len(pool))
    scores: dict[tuple[Primitive, ...], float] = {}
    for gen in range(generations + 1):
        new = [t for t in pool if t not in scores]
        for k in range(0, len(new), SCORE_CHUNK):  # (the seeds' chunk whatever the time)
            if k and late():
                break
            chunk = new[k:k + SCORE_CHUNK]
            scores.update(zip(chunk, np.asarray(model.predict([make(t) for t in chunk]), dtype=float).tolist()))
        if gen == generations or late():
            break
        ranked = sorted(scores, key=lambda t: -scores[t])[: max(4, population // 16)]
        size = len(pool) + population // 2
        _breed(space, rng, [pool[t] for t in ranked] + seeds, add, population // 2,
               lambda s=size: len(pool) >= s or late(), fresh / 2, lambda: len(pool))
    return sorted((Scored(pool[t], t, scores[t]) for t in pool if t in scores), key=lambda s: -s.score)


# points scored by the model at once: at a deadline the scoring stops between chunks (featurizing a point lowers
# its loop nest, milliseconds each)
SCORE_CHUNK = 32


# consecutive proposals that add nothing after which breeding stops: the space (a copy or an elementwise
# kernel has a handful of points) is exhausted around its parents
STALE_TRIES = 128


def _breed(space: ScheduleSpace, rng: random.Random, parents: list[Point], add: Callable[[Point], None],
           wanted: int, full: Callable[[], bool], fresh: float, size: Callable[[], int]) -> None:
    """Children until ``full()``, or 4 tries per wanted child, or :data:`STALE_TRIES` tries in a row that add
    no new point (a small space runs out of new points)."""
    tries = stale = 0
    budget = 4 * max(wanted, 0) + 16
    while not full() and tries < budget and stale < STALE_TRIES:
        tries += 1
        before = size()
        r = rng.random()
        if not parents or r < fresh:
            add(space.sample(rng))
        elif r < fresh + 0.2 and len(parents) > 1:
            a, b = rng.sample(parents, 2)
            add(space.crossover(a, b, rng))
        else:
            add(space.mutate(rng.choice(parents), rng, rng.choice((1, 1, 2)), structural=rng.random() < 0.25))
        stale = 0 if size() > before else stale + 1


# sketches newer than the shipped model's training data (costmodel/pretrained: datasets/zen3-2t-v1): for a
# kernel whose default is one of them, the zero-measurement pick keeps the default (the model has never seen
# their loop nests, so its ranking of them is a guess); the measured search still explores them
UNTRAINED_SKETCHES = frozenset({FOLD_REDUCTIONS, ROWS_INTO_CONTRACTION})


@dataclass(frozen=True)
class ModelPick:
    """The zero-measurement choice for one kernel."""

    trace: tuple[Primitive, ...]
    point: Point
    predicted_gain: float  # the model's score of the pick minus the default's (0: the default kept)
    candidates: int  # points scored
    is_default: bool


# the model's predicted gain (in its score units: normalized speed, best time / time) a pick needs over the
# default: the model's error is larger than its smallest predicted gains, and picks it scored only a few
# hundredths above the default (a 1x1 conv; softmax with the exp's vectorization turned off) ran slower than
# the default. The ablation (benchmarks/search.py --ablation) measures the picks against the default
PICK_MARGIN = 0.1


def thread_partition(trace: Sequence[Primitive]) -> tuple[Primitive, ...]:
    """What decides which thread computes which part of a kernel's output on a CPU: its Fuse and Parallel
    primitives (the parallel loop and the loops fused into it), in order."""
    return tuple(p for p in trace if isinstance(p, (Fuse, Parallel)))


def tile_chains(compute: Compute, trace: Sequence[Primitive], target: Target) -> int:
    """Vector accumulators of the kernel's largest register tile (its independent FMA chains), 0 when it
    has none or does not lower."""
    from superopt.loopnest import build_loopnest, walk
    from superopt.loopnest.alloc import Alloc
    from superopt.schedule.plan import lower

    try:
        nest = build_loopnest(lower(compute, list(trace), target))
    except (ScheduleError, ValueError):
        return 0
    sizes = [v.node.size for v in walk(nest) if isinstance(v.node, Alloc) and v.node.kind == "register_tile"]
    return -(-max(sizes) // target.lanes("float32")) if sizes else 0


def pick_schedule(compute: Compute, target: Target, model: CostModel, *, constant_inputs: frozenset[str],
                  population: int = 512, generations: int = 2, margin: float = PICK_MARGIN, seed: int = 0,
                  keep_partition: bool = True, deadline: float | None = None) -> ModelPick:
    """The model's choice among the default and the model's top candidates, measuring nothing.

    The default wins unless the model scores a candidate above it by more than ``margin`` (score
    units of the model; the XGBoost ranker's scores are comparable within one workload;
    :data:`PICK_MARGIN` by default: the model's error is larger than its smallest predicted gains).

    ``keep_partition``: only candidates that split the work among threads as the default does
    (:func:`thread_partition`). The model learned from kernels timed alone, whose inputs sit in the
    caches of the threads that read them; in a graph, a kernel reads what the one before it wrote,
    and the default heuristic splits consecutive kernels alike. A kernel that splits output channels
    where its neighbours split rows reads its inputs from other cores' caches, and slows the kernel after
    it too, whatever it gains alone.

    A candidate whose register tile holds fewer independent FMA chains than the default's, and fewer
    than the core needs (:attr:`Target.fma_chains`), is not picked: each of its FMAs waits for the one
    before it, which the model has not learned (a depthwise conv's row of 56 columns in 4 accumulators
    against the default's 8 x 32 tile).

    ``deadline`` (``time.perf_counter()``): no breeding after it (:func:`evolve`); the pick is made among the
    candidates scored by then."""
    space = ScheduleSpace(compute, target, constant_inputs)
    default = space.default_point()
    default_trace = space.trace(default)
    if default.sketch in UNTRAINED_SKETCHES:  # the model never saw such kernels: it would guess
        return ModelPick(default_trace, default, 0.0, 0, True)

    def make(trace: tuple[Primitive, ...]) -> Candidate:
        return Candidate(compute, trace, target, frozenset(constant_inputs))

    rng = random.Random(seed)
    scored = evolve(space, model, make, rng, [default], population=population, generations=generations,
                    deadline=deadline)
    if keep_partition and target.kind == "cpu":
        split = thread_partition(default_trace)
        scored = [x for x in scored if thread_partition(x.trace) == split]
    default_score = float(np.asarray(model.predict([make(default_trace)]))[0])
    above = [x for x in scored if x.score > default_score + margin]  # (most kernels have none: no lowering)
    floor = min(tile_chains(compute, default_trace, target), target.fma_chains) if above else 0
    best = next((x for x in above if tile_chains(compute, x.trace, target) >= floor), None)
    if best is None or best.trace == default_trace:
        return ModelPick(default_trace, default, 0.0, len(scored), True)
    return ModelPick(best.trace, best.point, best.score - default_score, len(scored), False)


# a kernel (its nodes together) carrying less of the graph's work than this does not add to the picks'
# allowance: even a pick twice as fast as the default would save under half of it, while a pick takes as long
# (lowering and featurizing its candidates) for a small kernel as for a large one
PICK_MIN_SHARE = 0.01


@dataclass(frozen=True)
class PickAllowance:
    """The seconds the zero-measurement picks of one graph may take: ``per_kernel_s`` for each distinct kernel
    left to pick (not served by the database, not skipped) that carries at least ``min_share`` of the graph's
    work (:func:`superopt.runtime.kernel.kernel_work`, summed over the nodes running it), at least ``min_s``.
    The picks run kernels of most work first (:func:`schedules_from_model`), so the allowance is spent where a
    pick can pay; the kernels it does not reach keep the default schedule."""

    per_kernel_s: float = 0.2
    min_s: float = 1.6
    min_share: float = PICK_MIN_SHARE

    def seconds(self, graph, skip: Iterable[str] = ()) -> float:
        from superopt.runtime.kernel import kernel_work
        from superopt.schedule.graph_defaults import constant_inputs

        skip = set(skip)
        work: dict[tuple[str, frozenset[str]], int] = {}
        total = 0
        for n in graph.nodes:
            if n.is_extern:
                continue
            w = kernel_work(n.op)
            total += w
            if n.name not in skip:
                key = (n.op.digest(), constant_inputs(graph, n))
                work[key] = work.get(key, 0) + w
        heavy = sum(w >= self.min_share * total for w in work.values())
        return max(self.min_s, self.per_kernel_s * heavy)


def schedules_from_model(graph, target: Target, model: CostModel, *, skip: Iterable[str] = (),
                         population: int = 128, generations: int = 2, margin: float = PICK_MARGIN, seed: int = 0,
                         deadline: float | None = None) -> tuple[dict[str, list[Primitive]], dict[str, ModelPick]]:
    """The model schedule pass (zero measurements): node name -> the model's pick, for every compute
    node not in ``skip`` (served by the database). Equal kernels (same workload and constants) are
    picked once; after ``deadline`` (a ``time.perf_counter()`` value) no new kernel is picked (those nodes are
    left out: the caller gives them the default) and the pick under way stops breeding, so with a deadline the
    kernels of most work are picked first. Returns the schedules and each node's :class:`ModelPick`."""
    from superopt.runtime.kernel import kernel_work
    from superopt.schedule.graph_defaults import constant_inputs

    skip = set(skip)
    cache: dict[tuple[str, frozenset[str]], ModelPick] = {}
    out: dict[str, list[Primitive]] = {}
    picks: dict[str, ModelPick] = {}
    nodes = [n for n in graph.nodes if not n.is_extern]
    if deadline is not None:
        nodes.sort(key=lambda n: -kernel_work(n.op))
    for n in nodes:
        if n.is_extern or n.name in skip:
            continue
        consts = constant_inputs(graph, n)
        key = (n.op.digest(), consts)
        if key not in cache:
            if deadline is not None and time.perf_counter() > deadline:
                continue
            cache[key] = pick_schedule(n.op, target, model, constant_inputs=consts, population=population,
                                       generations=generations, margin=margin, seed=seed, deadline=deadline)
        picks[n.name] = cache[key]
        out[n.name] = list(cache[key].trace)
    return out, picks
