"""The cost model's features: one fixed-length vector per candidate, read off its loop nest.

In the spirit of Ansor's per-store features, over superopt's loop-nest IR
(:mod:`superopt.loopnest`), so the C printer, the (future) CUDA printer and this extractor all see
the same tree. A candidate is lowered (``lower`` then ``build_loopnest``) and walked once.
Counts are totals over one kernel call (ops per execution times the trip counts of the enclosing
loops) and enter as ``log2(1 + x)``. The groups, in :data:`FEATURE_NAMES` order:

- **arithmetic** (``ops.*``): fused multiply-adds (an ``+=`` accumulation of a product), adds and
  subtractions, multiplications, divisions, transcendentals (exp, log, tanh, erf, sqrt, pow, ...),
  comparisons and selects (max, min, where, relu, ...), casts; ``ops.vector_fraction``: the share of
  all operations executed inside vectorized loops.
- **loops** (``loop.*``): how many loops of each kind (serial, parallel, vectorized, unrolled) and
  the product of their extents; the parallel extent, its depth and its load balance over the
  target's threads; the innermost vectorized extent, its lane efficiency (extent over whole vectors)
  and whether it is the innermost loop; the unrolled body size; loops cut by a tail and guards
  executed; the innermost serial reduction loop's extent; the product of the loops outside the
  innermost register tile (``loop.outer_product``).
- **allocations** (``alloc.*``): the register tile in elements and in vector registers, the vector
  registers it needs beyond the target's (spills), local and workspace bytes, bytes zero-filled.
- **memory** (``mem.*``): compulsory bytes (every argument once), bytes accessed by loads and stores,
  estimated traffic into L1, L2 and from memory (below), bytes packed inside each call (a run-time
  input's pack; constants are packed once, outside the timing), arithmetic intensity (flops per
  byte of estimated memory traffic and of L2 traffic), non-contiguous accesses in vector loops.
- **buffers** (``buf{r}.*``, the ``BUFFERS`` buffers with the most bytes accessed, zeros when fewer):
  bytes accessed, unique bytes, cache lines touched, innermost stride, stride along the vectorized
  loop, reuse count and reuse distance in bytes (the footprint between two uses of an element:
  the bytes the buffer touches inside the innermost loop that does not move it).
- **estimates** (``est.*``): roofline-style combinations: instructions per core (a vector operation
  counted once per vector, the parallel loop's balance over the threads), L1 and L2 traffic per
  core, memory traffic with run-time packing and zero-fills; ``mem.intensity_l1``.
- **target** (``target.*``): vector bits, vector registers, threads, cores, FMA pipes, cache sizes, so
  one model can serve several machines.

Traffic estimate, per cache of capacity ``C``: each access is charged the footprint of the
outermost loop around it whose whole execution (all buffers under it) fits in ``C``, times the
executions of that loop; L1 and L2 are per core (a parallel loop's body runs on one core), L3 is
shared. It is a reuse model, not a simulator: good enough to tell tiled from untiled.

GPU kernels will add thread and block extents as loop kinds (a new :data:`FEATURE_VERSION`).
A model records the version and names it was trained with and refuses another
(:class:`FeatureVersionError`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from costmodel.base import Candidate
from superopt.loopnest import (
    Accumulate,
    Alloc,
    Fill,
    Guard,
    Loop,
    LoopNest,
    Op,
    Visit,
    accesses,
    build_loopnest,
    statement_ops,
    walk,
)
from superopt.loopnest.names import box_buffer
from superopt.schedule.kernel_plan import KernelPlan
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import trace_to_json
from superopt.target import Target

FEATURE_VERSION = 2
BUFFERS = 3  # per-buffer feature groups (the buffers with the most bytes accessed)
LINE_BYTES = 64
LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled")

_ADD = frozenset({"+", "-", "neg"})
_MUL = frozenset({"*"})
_DIV = frozenset({"/", "mod", "%", "floordiv"})
_TRANSCENDENTAL = frozenset({"exp", "log", "tanh", "erf", "sqrt", "rsqrt", "pow", "sigmoid", "sin", "cos", "tan",
                             "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log1p",
                             "exp2", "log2", "softplus", "gelu"})
_COMPARE = frozenset({"max", "min", "where", "relu", "<", "<=", ">", ">=", "==", "!=", "abs", "sign", "clip",
                      "and", "or", "not", "xor", "floor", "ceil", "round"})
OP_KINDS = ("fma", "add", "mul", "div", "transcendental", "compare", "cast", "other")

_BUFFER_FIELDS = ("bytes", "unique_bytes", "lines", "inner_stride", "vector_stride", "reuse_count", "reuse_bytes")


def _names() -> tuple[str, ...]:
    n = [f"ops.{k}" for k in OP_KINDS] + ["ops.total", "ops.vector_fraction"]
    for k in LOOP_KINDS:
        n += [f"loop.{k}.count", f"loop.{k}.product"]
    n += ["loop.depth", "loop.parallel.extent", "loop.parallel.depth", "loop.parallel.balance", "loop.no_parallel",
          "loop.vector.extent", "loop.vector.efficiency", "loop.vector.innermost", "loop.unroll.body",
          "loop.tails", "loop.guards", "loop.reduce.inner_extent", "loop.outer_product", "loop.stages",
          "loop.epilogues"]
    n += ["alloc.tile_elements", "alloc.tile_registers", "alloc.tile_spill", "alloc.local_bytes",
          "alloc.workspace_bytes", "alloc.fill_bytes"]
    n += ["mem.compulsory", "mem.accessed", "mem.traffic_l1", "mem.traffic_l2", "mem.traffic_dram", "mem.packed",
          "mem.intensity_dram", "mem.intensity_l2", "mem.vector_gathers"]
    for r in range(BUFFERS):
        n += [f"buf{r}.{f}" for f in _BUFFER_FIELDS]
    n += ["est.compute_per_core", "est.l1_per_core", "est.l2_per_core", "est.dram", "mem.intensity_l1"]
    n += ["target.vector_bits", "target.vector_registers", "target.threads", "target.cores", "target.fma_units",
          "target.l1", "target.l2", "target.l3"]
    return tuple(n)


FEATURE_NAMES = _names()
_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}
# the features put as they are (fractions, flags, counts of loops, register counts); every other one is log2(1 + x)
_LINEAR_FEATURES = frozenset({
    "ops.vector_fraction", "loop.depth", "loop.parallel.depth", "loop.parallel.balance", "loop.no_parallel",
    "loop.vector.extent", "loop.vector.efficiency", "loop.vector.innermost", "loop.tails", "loop.stages",
    "loop.epilogues", "alloc.tile_registers", "alloc.tile_spill", *(f"loop.{k}.count" for k in LOOP_KINDS),
    *(f"target.{k}" for k in ("vector_bits", "vector_registers", "threads", "cores", "fma_units"))})


class FeatureVersionError(ValueError):
    """Features of one version given to a model trained on another."""


def check_feature_version(version: int, names: Sequence[str]) -> None:
    """Raise :class:`FeatureVersionError` unless ``version``/``names`` are this extractor's."""
    if version != FEATURE_VERSION or tuple(names) != FEATURE_NAMES:
        raise FeatureVersionError(
            f"cost model was trained on features version {version} ({len(names)} features); this superopt "
            f"extracts version {FEATURE_VERSION} ({len(FEATURE_NAMES)}): retrain it (superopt costmodel train)")


def _log(x: float) -> float:
    return math.log2(1.0 + max(0.0, x))


def _op_kind(op: str) -> str:
    if op in _ADD:
        return "add"
    if op in _MUL:
        return "mul"
    if op in _DIV:
        return "div"
    if op in _TRANSCENDENTAL:
        return "transcendental"
    if op in _COMPARE:
        return "compare"
    if op == "cast":
        return "cast"
    return "other"


def _trips(loops: Sequence[Loop]) -> int:
    return math.prod(lp.extent for lp in loops)


class _Access:
    """One buffer access with its loops: footprints and cache lines per loop depth, computed once."""

    def __init__(self, buffer: str, itemsize: int, loops: tuple[Loop, ...], strides: tuple[int | None, ...],
                 size: int, runs: float = 1.0) -> None:
        self.buffer = buffer
        self.itemsize = itemsize
        self.loops = loops
        self.strides = strides  # per enclosing loop; None: not constant (div/mod)
        self.size = size  # elements of the whole buffer (caps every footprint)
        n = len(loops)
        # footprints[d]: distinct elements touched by one whole execution of loops[d] (d = n: one access)
        self.footprints = [self._footprint(d) for d in range(n + 1)]
        self.line_counts = [self._lines(d) for d in range(n + 1)]
        self.runs = runs  # the share of its loops' executions in which its statement runs (a block's write-back)
        self.executions = runs * math.prod(lp.extent for lp, s in zip(loops, strides)
                                           if not (s == 0 and lp.kind in ("unrolled", "vectorized")))
        # ^ times the access executes; a value held in a register across an unrolled or vectorized loop
        # that does not move it counts once (the compiler keeps it in the register)

    def _footprint(self, depth: int) -> float:
        moving = [(lp.extent, s) for lp, s in zip(self.loops[depth:], self.strides[depth:]) if s != 0]
        count = math.prod(e for e, _ in moving)
        if all(s is not None for _, s in moving):  # a linear index cannot leave its span
            span = 1 + sum((e - 1) * abs(s) for e, s in moving)
            count = min(count, span)
        return float(min(count, self.size))

    def _lines(self, depth: int) -> float:
        elems = self.footprints[depth]
        inner = next((s for s in reversed(self.strides[depth:]) if s != 0), 1)
        if inner is not None and abs(inner) * self.itemsize < LINE_BYTES:
            return math.ceil(elems / (LINE_BYTES // (abs(inner) * self.itemsize)))
        return elems


class FeatureExtractor:
    """Features of candidates, cached by (workload, trace, target): a search scores the same point often. The
    CPU features by default; a target's own part (``costmodel.gpu_features``) passes its extractor and names."""

    def __init__(self, cache_size: int = 200_000, extract_fn: Callable[[Candidate], np.ndarray] | None = None,
                 names: Sequence[str] | None = None) -> None:
        self._cache: dict[tuple, np.ndarray] = {}
        self.cache_size = cache_size
        self._extract = extract_fn if extract_fn is not None else extract
        self.names = tuple(names) if names is not None else FEATURE_NAMES

    def __call__(self, candidates: Sequence[Candidate]) -> np.ndarray:
        out = np.zeros((len(candidates), len(self.names)), dtype=np.float32)
        for i, c in enumerate(candidates):
            key = (c.compute.digest(), trace_to_json(c.trace), c.target.key(), c.constant_inputs)
            row = self._cache.get(key)
            if row is None:
                row = self._extract(c)
                if len(self._cache) >= self.cache_size:
                    self._cache.clear()
                self._cache[key] = row
            out[i] = row
        return out


def lowered(candidate: Candidate) -> tuple[KernelPlan, LoopNest] | None:
    """The candidate's plan and loop nest; None when its trace does not lower. Pass it to
    :func:`named_features` and :func:`strided_vector_reads` of the same candidate so that they share one
    lowering (building the loop nest costs more than reading it)."""
    try:
        plan = lower(candidate.compute, candidate.trace, candidate.target)
        return plan, build_loopnest(plan)
    except ScheduleError:
        return None


def strided_vector_reads(candidate: Candidate,
                         lowering: tuple[KernelPlan, LoopNest] | None = None) -> dict[int | None, float]:
    """The elements that vectorized loops read with a stride other than 0 or 1 (what ``mem.vector_gathers``
    sums), by that stride (None: no one stride). Not a feature of the model: the graph cost prices a stride of 2
    as two contiguous loads and a shuffle per vector (gcc's permutes, the vector tile's ``so_ld16s2``) rather
    than one insert per element. Empty when the trace does not lower. ``lowering``: :func:`lowered` of the
    candidate, when the caller has it."""
    lowering = lowering if lowering is not None else lowered(candidate)
    if lowering is None:
        return {}
    nest = lowering[1]
    out: Counter = Counter()
    for a in accesses(nest):
        vec = [a.access.stride(lp.var) for lp in a.loops if lp.kind == "vectorized"]
        if vec and vec[-1] not in (0, 1):
            out[None if vec[-1] is None else abs(vec[-1])] += _trips(a.loops) * a.weight
    return dict(out)


def extract(candidate: Candidate, lowering: tuple[KernelPlan, LoopNest] | None = None) -> np.ndarray:
    """The feature vector of one candidate (all NaN when its trace does not lower: XGBoost treats NaN
    as missing, and searches only score legal candidates anyway). ``lowering``: :func:`lowered` of the
    candidate, when the caller has it."""
    lowering = lowering if lowering is not None else lowered(candidate)
    if lowering is None:
        return np.full(len(FEATURE_NAMES), np.nan, dtype=np.float32)
    plan, nest = lowering
    return nest_features(plan, nest, candidate.target, candidate.constant_inputs)


def named_features(candidate: Candidate,
                   lowering: tuple[KernelPlan, LoopNest] | None = None) -> dict[str, float] | None:
    """The features of one candidate by name in their own units (counts, bytes, strides: the ``log2(1 + x)``
    undone; fractions and flags as they are); None when its trace does not lower. For estimates outside the
    learned model (the graph search's kernel times) that need the same strides, traffic and packing.
    ``lowering``: :func:`lowered` of the candidate, when the caller has it."""
    f = extract(candidate, lowering)
    if np.isnan(f).any():
        return None
    linear = _LINEAR_FEATURES
    return {n: (2.0 ** min(float(v), 1000.0) - 1.0) if n not in linear else float(v) for n, v in zip(FEATURE_NAMES, f)}


def nest_features(plan: KernelPlan, nest: LoopNest, target: Target, constant_inputs: frozenset[str]) -> np.ndarray:
    f = np.zeros(len(FEATURE_NAMES), dtype=np.float32)

    def put(name: str, value: float) -> None:
        f[_INDEX[name]] = value

    visits = list(walk(nest))
    flops = _arithmetic(nest, put)
    _loops(visits, target, put)
    _allocations(nest, visits, target, put)
    _memory(plan, nest, visits, target, constant_inputs, flops, put)
    _estimates(f, target, put)
    for name, value in (("vector_bits", target.vector_bits), ("vector_registers", target.vector_registers),
                        ("threads", target.threads), ("cores", target.cores), ("fma_units", target.fma_units),
                        ("l1", _log(target.l1_bytes)), ("l2", _log(target.l2_bytes)), ("l3", _log(target.l3_bytes))):
        put(f"target.{name}", value)
    return f


def _estimates(f: np.ndarray, target: Target, put) -> None:
    """Roofline-style combinations of the features above: the work and the traffic one core carries
    (vector instructions counted once per vector), so the trees need not learn the products."""

    def raw(name: str) -> float:
        return 2.0 ** float(f[_INDEX[name]]) - 1.0

    lanes = target.lanes("float32")
    threads = max(1, target.threads)
    cores = 1.0 if f[_INDEX["loop.no_parallel"]] else threads * float(f[_INDEX["loop.parallel.balance"]])
    ops = raw("ops.total")
    vf = float(f[_INDEX["ops.vector_fraction"]])
    instructions = ops * (1 - vf) + ops * vf / lanes
    put("est.compute_per_core", _log(instructions / max(cores, 1.0)))
    put("est.l1_per_core", _log(raw("mem.traffic_l1") / max(cores, 1.0)))
    put("est.l2_per_core", _log(raw("mem.traffic_l2") / max(cores, 1.0)))
    put("est.dram", _log(raw("mem.traffic_dram") + raw("mem.packed") + raw("alloc.fill_bytes")))
    t1 = raw("mem.traffic_l1")
    put("mem.intensity_l1", _log(ops / t1) if t1 else 0.0)


def _arithmetic(nest: LoopNest, put) -> float:
    """Operation counts by kind; returns the flop count (an FMA is two)."""
    counts: Counter[str] = Counter()
    vector_ops = 0.0
    for node, loops, ops in statement_ops(nest):
        trips = _trips(loops)
        ops = Counter(ops)
        fma = isinstance(node, Accumulate) and node.op == "+=" and isinstance(node.value, Op) and node.value.op == "*"
        if fma:
            counts["fma"] += trips
            ops["+"] -= 1
            ops["*"] -= 1
        for op, k in ops.items():
            if k > 0:
                counts[_op_kind(op)] += k * trips
        if any(lp.kind in ("vectorized", "transposed") for lp in loops):
            vector_ops += (sum(k for k in ops.values() if k > 0) + 2 * fma) * trips
    total = sum(counts.values()) + counts["fma"]
    for k in OP_KINDS:
        put(f"ops.{k}", _log(counts[k]))
    put("ops.total", _log(total))
    put("ops.vector_fraction", vector_ops / total if total else 0.0)
    return float(total)


def _loops(visits: list[Visit], target: Target, put) -> None:
    count: Counter[str] = Counter()
    product: defaultdict[str, float] = defaultdict(lambda: 1.0)
    depth = tails = guards = stages = epilogues = 0
    par_extent, par_depth, have_par = 1, 0, False
    vec_extent, vec_innermost = 0, 0.0
    unroll_body, reduce_inner, outer_product = 1, 0, 0
    lanes = target.lanes("float32")
    for v in visits:
        n = v.node
        if isinstance(n, Loop):
            kind = "vectorized" if n.kind == "transposed" else n.kind  # (a block's lanes move as vectors)
            count[kind] += 1
            product[kind] *= n.extent
            depth = max(depth, len(v.loops) + 1)
            tails += bool(n.tail)
            if n.kind == "parallel" and not have_par:
                have_par, par_extent, par_depth = True, n.extent, len(v.loops)
            if n.kind == "vectorized":
                vec_extent = max(vec_extent, n.extent)
                vec_innermost = max(vec_innermost, float(not any(isinstance(c, Loop) for c in n.body)))
        elif isinstance(n, Guard) and any(not c.block for c in n.conds):
            guards += _trips(v.loops)  # (a block test runs once per write-back nest: not per statement)
        elif type(n).__name__ == "StageNest":
            stages += 1
        elif type(n).__name__ == "Epilogue":
            epilogues += 1
        elif isinstance(n, Alloc) and n.kind == "register_tile":
            outer_product = max(outer_product, _trips(v.loops))
        elif isinstance(n, Accumulate):
            serial_red = [lp for lp in v.loops if lp.reduce and lp.kind == "serial"]
            if serial_red:
                reduce_inner = max(reduce_inner, serial_red[-1].extent)
            inner_unrolled = [lp for lp in v.loops if lp.kind in ("unrolled", "vectorized")]
            unroll_body = max(unroll_body, _trips(inner_unrolled))
            if not outer_product:
                outer_product = _trips([lp for lp in v.loops if lp.kind in ("serial", "parallel")])
    for k in LOOP_KINDS:
        put(f"loop.{k}.count", count[k])
        put(f"loop.{k}.product", _log(product[k]) if count[k] else 0.0)
    threads = max(1, target.threads)
    put("loop.depth", depth)
    put("loop.parallel.extent", _log(par_extent if have_par else 0))
    put("loop.parallel.depth", par_depth if have_par else -1)
    put("loop.parallel.balance", par_extent / (math.ceil(par_extent / threads) * threads) if have_par else 1 / threads)
    put("loop.no_parallel", float(not have_par))
    put("loop.vector.extent", vec_extent)
    put("loop.vector.efficiency", vec_extent / (math.ceil(vec_extent / lanes) * lanes) if vec_extent else 0.0)
    put("loop.vector.innermost", vec_innermost)
    put("loop.unroll.body", _log(unroll_body))
    put("loop.tails", tails)
    put("loop.guards", _log(guards))
    put("loop.reduce.inner_extent", _log(reduce_inner))
    put("loop.outer_product", _log(outer_product))
    put("loop.stages", stages)
    put("loop.epilogues", epilogues)


def _allocations(nest: LoopNest, visits: list[Visit], target: Target, put) -> None:
    tile = local = fill = 0
    tiles = {v.node.name for v in visits if isinstance(v.node, Alloc) and v.node.kind == "register_tile"}
    for v in visits:
        n = v.node
        if isinstance(n, Alloc):
            if n.kind == "register_tile":
                tile = max(tile, n.size)
            elif n.kind == "local":
                local += n.nbytes
        elif isinstance(n, Fill) and n.buffer not in tiles:  # a register tile's fill is a few register moves
            fill += n.size * 4 * _trips(v.loops)
    regs = math.ceil(tile / target.lanes("float32"))
    put("alloc.tile_elements", _log(tile))
    put("alloc.tile_registers", regs)
    put("alloc.tile_spill", max(0, regs - (target.vector_registers - 2)))
    put("alloc.local_bytes", _log(local))
    put("alloc.workspace_bytes", _log(sum(nest.workspace_bytes)))
    put("alloc.fill_bytes", _log(fill))


def _buffer_sizes(plan: KernelPlan, nest: LoopNest, visits: list[Visit]) -> dict[str, tuple[int, int]]:
    """Buffer name -> (elements, itemsize)."""
    sizes: dict[str, tuple[int, int]] = {}
    for name, t in plan.types.items():
        sizes[name] = (math.prod(t.shape), np.dtype(t.np_dtype).itemsize)
    for v in visits:
        if isinstance(v.node, Alloc) and v.node.kind in ("local", "workspace"):
            a = v.node
            sizes.setdefault(a.name, (a.size, max(1, a.nbytes // max(1, a.size))))
    for p in nest.box_packs:  # (a thread's box of an input packed inside the kernel: what its reads read)
        sizes[box_buffer(p.tensor)] = (math.prod(n for _, n in p.loops), sizes[p.tensor][1])
    return sizes


def _memory(plan: KernelPlan, nest: LoopNest, visits: list[Visit], target: Target, constant_inputs: frozenset[str],
            flops: float, put) -> None:
    sizes = _buffer_sizes(plan, nest, visits)
    acc: list[_Access] = []
    gathers = 0.0
    for a in accesses(nest):
        elems, itemsize = sizes.get(a.access.buffer, (1 << 40, 4))
        strides = tuple(a.access.stride(lp.var) for lp in a.loops)
        acc.append(_Access(a.access.buffer, itemsize, a.loops, strides, elems, a.runs))
        vec = [s for lp, s in zip(a.loops, strides) if lp.kind == "vectorized"]
        if vec and vec[-1] not in (0, 1):
            gathers += _trips(a.loops) * a.weight  # (a read in one branch of a chain of where on indices: its share)
    compulsory = sum(sizes[p.name][0] * sizes[p.name][1] for p in nest.params if p.name in sizes)
    accessed = sum(x.executions * x.itemsize for x in acc)
    # footprint (bytes) of one whole execution of each loop, over every buffer under it (per buffer: the max)
    loop_fp: defaultdict[int, dict[str, float]] = defaultdict(dict)
    for x in acc:
        for d, lp in enumerate(x.loops):
            fp = x.footprints[d] * x.itemsize
            per = loop_fp[id(lp)]
            per[x.buffer] = max(per.get(x.buffer, 0.0), fp)
    fp_total = {k: sum(v.values()) for k, v in loop_fp.items()}

    threads = max(1, target.threads)

    def traffic(capacity: float, per_core: bool) -> float:
        total = 0.0
        for x in acc:
            depth = None
            for d, lp in enumerate(x.loops):
                # a per-core cache sees a share of a loop that runs (or contains) the parallel loop
                share = threads if per_core and any(o.kind == "parallel" for o in x.loops[d:]) else 1
                if fp_total[id(lp)] / share <= 0.7 * capacity:
                    depth = d
                    break
            if depth is None:  # not even the innermost loop fits: every access goes past the cache
                total += x.executions * x.itemsize
            else:
                total += x.line_counts[depth] * LINE_BYTES * _trips(x.loops[:depth]) * x.runs
        return total

    t_l1 = traffic(target.l1_bytes, True)
    t_l2 = traffic(target.l2_bytes, True)
    t_dram = max(traffic(target.l3_bytes, False), float(compulsory))
    packed = 0
    for p in (*nest.packs, *nest.box_packs):
        if p.tensor not in constant_inputs:
            packed += math.prod(p.src_shape) * 4
    put("mem.compulsory", _log(compulsory))
    put("mem.accessed", _log(accessed))
    put("mem.traffic_l1", _log(t_l1))
    put("mem.traffic_l2", _log(t_l2))
    put("mem.traffic_dram", _log(t_dram))
    put("mem.packed", _log(packed))
    put("mem.intensity_dram", _log(flops / t_dram) if t_dram else 0.0)
    put("mem.intensity_l2", _log(flops / t_l2) if t_l2 else 0.0)
    put("mem.vector_gathers", _log(gathers))
    _buffers(acc, put)


def _buffers(acc: list[_Access], put) -> None:
    by_buf: defaultdict[str, list[_Access]] = defaultdict(list)
    for x in acc:
        by_buf[x.buffer].append(x)
    rows = []
    for buf, xs in by_buf.items():
        total = sum(x.executions * x.itemsize for x in xs)
        x = max(xs, key=lambda a: _trips(a.loops))
        unique = x.footprints[0] * x.itemsize
        lines = x.line_counts[0]
        inner = x.strides[-1] if x.strides else 0
        vec = next((s for lp, s in zip(x.loops, x.strides) if lp.kind == "vectorized"), 0)
        if len(x.loops) >= 2 and x.loops[-2].kind == "transposed" and None not in x.strides[-2:]:
            # a block transposed in registers moves each side in vectors along the loop it is contiguous on
            inner = vec = min(x.strides[-2:], key=abs)
        # reuse: the innermost loop that does not move the buffer; distance = what it touches inside that loop
        reuse_count, reuse_bytes = 1, 0.0
        for d in range(len(x.loops) - 1, -1, -1):
            if x.strides[d] == 0:
                reuse_count = x.loops[d].extent
                reuse_bytes = x.footprints[d + 1] * x.itemsize
                break
        rows.append((total, unique, lines, inner, vec, reuse_count, reuse_bytes, buf))
    rows.sort(key=lambda r: (-r[0], r[-1]))
    for r, (total, unique, lines, inner, vec, reuse_count, reuse_bytes, _) in enumerate(rows[:BUFFERS]):
        put(f"buf{r}.bytes", _log(total))
        put(f"buf{r}.unique_bytes", _log(unique))
        put(f"buf{r}.lines", _log(lines))
        put(f"buf{r}.inner_stride", _log(abs(inner)) if inner is not None else 40.0)
        put(f"buf{r}.vector_stride", _log(abs(vec)) if vec is not None else 40.0)
        put(f"buf{r}.reuse_count", _log(reuse_count))
        put(f"buf{r}.reuse_bytes", _log(reuse_bytes))
