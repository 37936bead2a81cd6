"""What a whole graph costs to run: the sum of its kernels' predicted times.

Every compute node is one kernel (which nodes form one kernel is decided by the graph rewrites, so
fusing two nodes changes the cost); an extern moves its bytes (a ``reshape`` is an alias and moves
none), and so does a concatenation whose producers write its slices in place (the executor never
runs it: :mod:`superopt.runtime.concat_slices`). A kernel's time is, by default, a roofline estimate::

    max(flops / compute ceiling, bytes moved / memory bandwidth) + launch overhead

- flops: :func:`superopt.ir.flops.flop_count`, plus ``padded_read_ops`` (``padded_product_ops`` when
  it feeds a sum of products) per read of a tensor with declared padding inside a reduction window (the
  bounds check a padded read costs per iteration, which :mod:`rewrite_rules.layout`'s padded copy removes);
- bytes: the kernel's distinct input tensors it reads and its outputs once each, plus the round trips of the
  temporaries a multi-statement op stores in its workspace (written once, read by each statement
  that reads it). A temporary the default schedule keeps out of memory costs nothing: an
  elementwise one is inlined into its readers, a reduction read only elementwise at its own index
  becomes a register-tile epilogue. So a fused kernel saves its intermediate's round trip and one
  launch, which is what makes fusion win under this cost.

On a CPU target the roofline sees the kernel's default schedule (``schedules``, on by default): the schedule
is lowered to its loop nest and read by the cost model's own feature extractor
(:func:`costmodel.features.named_features`), so the estimate knows each access's stride against the vector loop,
the bytes a run-time pack moves per call and the work left scalar::

    max(compute + strided vector loads, (bytes + run-time packs + zero-fills) / bandwidth) + launch

- compute: the larger of flops / ceiling and the schedule's instructions per core (a vector operation once per
  vector) at the FMA pipes' rate; a kernel left scalar costs its lanes' worth;
- strided vector loads: each element a vectorized loop reads with a stride other than 0 or 1 is assembled by
  a scalar load and an insert, ``gather_cycles`` cycles per element per core (the clock implied by the FMA
  ceiling): a kernel vectorized along an axis one of its operands is strided in, and left unpacked, is
  bound by this, not by its flops; a stride of 2 (a stride-2 window's image) is two contiguous loads and a
  shuffle, ``stride2_vector_cycles`` per vector;
- bytes: the roofline's (each input and output once, the workspace's round trips) plus what the schedule moves
  on each call: the packs of run-time inputs and zero-filled buffers; a buffer the innermost loop walks with a
  stride (a transposing copy) costs ``strided_bytes`` times its bytes more (part-used lines, no prefetch: the
  three layout copies around the capsule votes' conv, 5 MB, took 0.7 ms, 40% of the stream bandwidth).

Kernels the roofline puts under ``refine_above_s`` keep the roofline: their operands sit in cache and a
call's overhead dominates, where the per-element charges above (which assume operands streamed from memory)
would steer fusion choices on noise (a BERT layer's 4-us attention read its merged Q/K/V as 20 us).

The ceilings come from a :class:`Ceilings` record: measured on this machine
(:meth:`Ceilings.measured`: the FMA peak and stream bandwidth of :mod:`superopt.measure.peak` and a
timed empty parallel kernel call, all cached per target), or given by hand. The module holds no
hardware number of its own.

A learned model replaces the roofline when it can give absolute kernel times: any object with a
``kernel_seconds(compute, target, constant_inputs) -> float | None`` method (None: no prediction for
this kernel, roofline instead). The XGBoost schedule model (:mod:`costmodel.xgb`) scores the
schedules of one workload relative to each other, not absolute times, so it is not usable here;
:attr:`GraphCost.method` says which estimate was used.

Kernel costs are cached per node and op object, so the graphs of a search, which share most of
their nodes, are costed in time proportional to what changed; a learned model's predictions also by
the kernel's canonical workload key (rename-invariant, constants included), so equal kernels
anywhere are predicted once (the roofline is cheaper to recompute than a canonical form).
"""

from __future__ import annotations

import ctypes
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from superopt.ir.canonical import canonical_form
from superopt.ir.compute import Compute
from superopt.ir.expr import Affine, Binary
from superopt.ir.flops import flop_count, statement_flops
from superopt.ir.graph import Extern, Graph, Node
from superopt.ir.statement import Statement
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.concat_slices import writable_in_place
from superopt.schedule.chained import chained_reductions, prefer_recompute
from superopt.schedule.plan_check import epilogue_dims
from superopt.schedule.primitives import Primitive
from superopt.schedule.rowwise import foldable_reductions
from superopt.target import Target

LAUNCH_CACHE_VERSION = 1
ALIAS_EXTERNS = frozenset({"reshape"})  # the executor aliases these: no data moves


@dataclass(frozen=True)
class Ceilings:
    """The machine numbers a roofline needs: compute ceiling, memory bandwidth, per-kernel launch cost."""

    flops_per_s: float
    bytes_per_s: float
    launch_s: float
    source: str = "given"  # where the numbers come from, for the report

    def __post_init__(self) -> None:
        if not (self.flops_per_s > 0 and self.bytes_per_s > 0 and self.launch_s >= 0):
            raise ValueError(f"ceilings must be positive (launch overhead non-negative): {self}")

    @classmethod
    def measured(cls, target: Target, compiler: CompilerConfig | None = None, *, refresh: bool = False) -> Ceilings:
        """This machine's ceilings for ``target`` (its thread count): measured once, then read from the
        cache under the compiler cache directory (``<cache_dir>/peak/``)."""
        from superopt.measure.peak import fma_peak_gflops, measure_bandwidth

        if target.kind != "cpu":
            raise ValueError(f"measured ceilings exist for CPU targets only, not {target.kind!r}: pass Ceilings(...)")
        compiler = compiler or CompilerConfig()
        peak = fma_peak_gflops(target, compiler, refresh=refresh)
        bw = measure_bandwidth(target, compiler, refresh=refresh)
        launch = launch_overhead_s(target, compiler, refresh=refresh)
        return cls(peak.ceiling_gflops * 1e9, bw.triad_gbs * 1e9, launch,
                   f"measured: {peak.ceiling_gflops:.0f} GFLOP/s, {bw.triad_gbs:.1f} GB/s, "
                   f"{launch * 1e6:.1f} us per kernel call ({target.threads} threads)")


# -- launch overhead ------------------------------------------------------------------------------------

LAUNCH_SOURCE = """
int so_empty_parallel(float *x) {
    #pragma omp parallel num_threads(SO_THREADS)
    { if (omp_get_thread_num() == 0) x[0] += 1.0f; }
    return 0;
}
"""


def launch_overhead_s(target: Target, compiler: CompilerConfig | None = None, *, calls: int = 200, repeats: int = 7,
                      refresh: bool = False) -> float:
    """Seconds per call of an empty parallel kernel through ctypes (how the executor calls kernels),
    with ``target.threads`` threads: the median over ``repeats`` batches of ``calls``. Cached per target."""
    import numpy as np

    from superopt.runtime.buffers import aligned_empty
    from superopt.runtime.compiler import compile_library, load_library

    compiler = compiler or CompilerConfig()
    path = Path(compiler.cache_dir) / "peak" / f"launch-{target.key()}.json"
    if not refresh:
        try:
            d = json.loads(path.read_text())
            if d.get("version") == LAUNCH_CACHE_VERSION:
                return float(d["launch_s"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    lib = load_library(compile_library([LAUNCH_SOURCE], compiler, target))
    lib.so_empty_parallel.argtypes = [ctypes.c_void_p]
    lib.so_empty_parallel.restype = ctypes.c_int
    lib.so_set_threads(ctypes.c_int(target.threads))
    buf = aligned_empty((16,), np.float32)
    ptr = buf.ctypes.data
    f = lib.so_empty_parallel
    for _ in range(calls):  # warm the thread pool
        f(ptr)
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            f(ptr)
        per_call.append((time.perf_counter() - t0) / calls)
    launch = statistics.median(per_call)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.time_ns()}.tmp")
    tmp.write_text(json.dumps({"version": LAUNCH_CACHE_VERSION, "launch_s": launch, "threads": target.threads}))
    tmp.replace(path)
    return launch


# -- the kernel estimate --------------------------------------------------------------------------------


class KernelTimeModel(Protocol):
    def kernel_seconds(self, compute: Compute, target: Target, constant_inputs: frozenset[str]) -> float | None:
        """Predicted seconds of the kernel (None: no prediction, the roofline is used)."""


@dataclass(frozen=True)
class KernelEstimate:
    flops: float
    bytes: float
    seconds: float
    how: str  # "roofline", "schedule" (the roofline refined by the default schedule), "model" or "extern"


def _identity_reader(st: Statement, tensor: str, shape: tuple[int, ...]) -> bool:
    """``st`` is an assignment reading ``tensor`` only at its own output index (an elementwise reader)."""
    if st.reduce != "=" or st.out_shape != shape or tensor in st.pad_value:
        return False
    ident = tuple(Affine.dim(d) for d in st.out_dims)
    return all(a.index == ident for a in st.expr.accesses() if a.tensor == tensor)


def _transposed_reader(st: Statement, producer: Statement) -> bool:
    """``st`` is an assignment reading ``producer``'s output at one permutation of its own index (a channel
    shuffle after a grouped conv): the register tile's epilogue, written back transposed."""
    return st.reduce == "=" and not st.padding and producer.reduce != "=" and epilogue_dims(st, producer) is not None


def workspace_bytes(compute: Compute) -> int:
    """Bytes the op's stored temporaries move: written once, read once by each statement reading them.

    Mirrors the default schedule: an elementwise temporary is inlined into its readers (unless it is a
    padded copy feeding a window, or read with padding); a reduction read only elementwise at its own
    index is applied at the register tile's write-back (an epilogue). Neither reaches memory."""
    types = compute.type_of
    total = 0
    stmts = compute.statements
    folded = foldable_reductions(compute)  # a sum read at the contraction's own index: ReduceEpilogue
    chained = chained_reductions(compute)
    recomputed = _recomputed(compute) if chained else set()
    for k, st in enumerate(stmts):
        if st.out in compute.outputs:
            continue
        readers = [c for c in stmts[k + 1:] if st.out in c.inputs()]
        if not readers:
            continue
        shape = types[st.out].shape
        if st.reduce == "=":
            padded_copy = bool(st.padding) and any(c.reduce_dims for c in readers)
            if not padded_copy and all(st.out not in c.pad_value for c in readers):
                continue  # inlined
        elif all(_identity_reader(c, st.out, shape) or _transposed_reader(c, st) or folded.get(c.out) == st.out
                   or chained.get(c.out) == st.out for c in readers):
            # epilogue at the register tile's write-back; a sum that reads a stage computed after this one
            # (a chained reduction) gets a copy of the contraction instead where that is cheaper (its flops:
            # recompute_flops), else this round trip
            if not any(chained.get(c.out) == st.out for c in readers) or st.out in recomputed:
                continue
        total += types[st.out].nbytes * (1 + len(readers))
    return total


def recompute_flops(compute: Compute) -> int:
    """The flops of the contractions the default computes twice (``superopt.schedule.chained``): once for
    the reductions before the stage a chained reduction waits for, once more for that reduction."""
    by = {st.out: st for st in compute.statements}
    return sum(statement_flops(by[p]) for p in _recomputed(compute))


def _recomputed(compute: Compute) -> set[str]:
    return {p for p in set(chained_reductions(compute).values()) if prefer_recompute(compute, p)}


def padded_reads(compute: Compute, products: bool = False) -> int:
    """Reads, over every iteration, of a tensor with declared padding inside a reduction window that can
    fall outside the tensor (each needs a bounds check); with ``products``, only those of a sum of two
    factors where the padded one carries every output dim the other has (a depthwise conv's image, which
    the schedule then vectorizes over, bounds checks and all; a conv's image against weights with output
    channels of their own is read as broadcasts off the vector loop, and a pooling window is no product)."""
    types = compute.type_of
    total = 0
    for st in compute.statements:
        if not st.padding or not st.reduce_dims:
            continue
        if products and (st.reduce != "+=" or not isinstance(st.expr, Binary) or st.expr.op != "*"):
            continue
        ext = st.extent
        iterations = 1
        for _, n in st.extents:
            iterations *= n
        for a in st.expr.accesses():
            if a.tensor not in st.pad_value:
                continue
            if products:
                other = st.expr.b if a == st.expr.a else st.expr.a
                mine = {d for ix in a.index for d in ix.vars()}
                if any(d in st.out_dims and ext[d] > 1 and d not in mine for x in other.accesses()
                       for ix in x.index for d in ix.vars()):
                    continue
            shape = types[a.tensor].shape
            if any(lo < 0 or hi >= size for ix, size in zip(a.index, shape) for lo, hi in [ix.bounds(ext)]):
                total += iterations
    return total


class CanonicalDigests:
    """The canonical digest of each op (``canonicalize(op).digest()``, an extern's text), memoized per op
    object; with the renaming, so a workload key (which inputs are constants) needs no second pass."""

    def __init__(self) -> None:
        self._ops: dict[int, tuple[object, str, dict[str, str]]] = {}

    def form(self, op: Compute | Extern) -> tuple[str, dict[str, str]]:
        hit = self._ops.get(id(op))
        if hit is not None and hit[0] is op:
            return hit[1], hit[2]
        if isinstance(op, Extern):
            digest, rename = op.text(), {}
        else:
            form = canonical_form(op)
            digest, rename = form.compute.digest(), form.rename
        self._ops[id(op)] = (op, digest, rename)
        return digest, rename

    def digest(self, op: Compute | Extern) -> str:
        return self.form(op)[0]

    def workload(self, compute: Compute, constant_inputs: frozenset[str]) -> str:
        """The op's canonical digest plus which inputs (canonical names) are constants: equal exactly when
        :func:`superopt.ir.canonical.workload_key` is."""
        digest, rename = self.form(compute)
        return digest + " const " + ",".join(sorted(rename[n] for n in constant_inputs))


class GraphCost:
    """Predicted seconds of a graph: the sum over its nodes (see the module docstring).

    ``ceilings``: the roofline's machine numbers (:meth:`Ceilings.measured` for this machine).
    ``model``: a :class:`KernelTimeModel` giving absolute kernel times; used where it answers, the
    roofline elsewhere (an object without ``kernel_seconds``, such as the XGBoost schedule model, is
    not used: :attr:`method` says so). ``padded_read_ops``: operations a bounds-checked padded read
    costs per iteration (a model parameter, not a machine number); ``padded_product_ops``: the same for
    a read feeding a multiply-add window (a conv's image read): its bounds checks sit in the vectorized
    tile loop, where they turn the vector loads into masked gathers, so a padded copy is far cheaper for a
    depthwise conv than 2 operations per read would make it look; pooling windows keep 2 (a max pool reads
    each element once, so a padded copy of its input costs more than the checks)."""

    def __init__(self, ceilings: Ceilings, target: Target | None = None, model: object | None = None,
                 padded_read_ops: float = 2.0, padded_product_ops: float = 40.0, schedules: bool = True,
                 gather_cycles: float = 1.0, strided_bytes: float = 1.5, refine_above_s: float = 50e-6,
                 stride2_vector_cycles: float = 2.0) -> None:
        self.ceilings = ceilings
        self.target = target
        # the default schedule's loop nest refines the roofline (a CPU target only: its features are the CPU ones)
        self.schedules = schedules and target is not None and target.kind == "cpu"
        self.gather_cycles = gather_cycles
        self.stride2_vector_cycles = stride2_vector_cycles
        self.strided_bytes = strided_bytes
        self.refine_above_s = refine_above_s
        self.padded_read_ops = padded_read_ops
        self.padded_product_ops = padded_product_ops
        usable = model is not None and callable(getattr(model, "kernel_seconds", None)) and target is not None
        self.model = model if usable else None
        if usable:
            self.method = f"learned kernel times ({type(model).__name__}), roofline where it gives none"
        elif model is not None:
            self.method = (f"roofline ({ceilings.source}); the given {type(model).__name__} ranks schedules of one "
                           "workload and gives no absolute kernel times")
        else:
            self.method = f"roofline ({ceilings.source})"
        if self.schedules and self.model is None:
            self.method += "; strides, traffic and packs of each kernel's default schedule"
        self.canonical = CanonicalDigests()
        self._kernels: dict[str, KernelEstimate] = {}  # canonical workload key -> model estimate
        self._ops: dict[int, tuple[Compute, frozenset[str], KernelEstimate]] = {}  # id(op) -> (op kept alive, ...)
        self._nodes: dict[int, tuple[Node, float]] = {}  # id(node) -> (node kept alive, seconds)
        self.kernel_evaluations = 0

    # -- one kernel ---------------------------------------------------------------------------------
    def roofline(self, compute: Compute, io_bytes: int) -> KernelEstimate:
        products = padded_reads(compute, products=True)
        flops = flop_count(compute) + recompute_flops(compute) + self.padded_read_ops * (padded_reads(compute) - products) \
            + self.padded_product_ops * products
        nbytes = io_bytes + workspace_bytes(compute)
        c = self.ceilings
        return KernelEstimate(flops, nbytes, max(flops / c.flops_per_s, nbytes / c.bytes_per_s) + c.launch_s,
                              "roofline")

    def scheduled(self, compute: Compute, constant_inputs: frozenset[str], roofline: KernelEstimate,
                  trace: Sequence[Primitive] | None = None) -> KernelEstimate:
        """The roofline refined by a schedule of the kernel, by default its default schedule (see the module
        docstring); the roofline itself where the schedule does not lower."""
        from costmodel.base import Candidate
        from costmodel.features import BUFFERS, lowered, named_features, strided_vector_reads
        from superopt.schedule.default import default_schedule
        from superopt.schedule.plan import ScheduleError

        target, c = self.target, self.ceilings
        try:
            trace = default_schedule(compute, target, constant_inputs) if trace is None else trace
            candidate = Candidate(compute, tuple(trace), target, constant_inputs)
            lowering = lowered(candidate)  # (lowered once: the features and the strides read the same nest)
            f = named_features(candidate, lowering) if lowering is not None else None
        except ScheduleError:
            f = None
        if f is None:
            return roofline
        threads, fma = max(1, target.threads), max(1, target.fma_units)
        cycles_per_s = c.flops_per_s / (threads * fma * 2 * target.lanes("float32"))  # one core's, as the peak implies
        cores = 1.0 if f["loop.no_parallel"] else max(1.0, threads * f["loop.parallel.balance"])
        # (the extractor counts a multiply-add as two operations, as flops are counted: a pipe retires one per cycle)
        compute_s = max(roofline.flops / c.flops_per_s, f["est.compute_per_core"] / (2 * fma * cycles_per_s))
        gathers, paired = f["mem.vector_gathers"], 0.0
        if gathers >= 1.0:
            # a stride of 2 is no gather: two contiguous loads and one shuffle make a vector of its even elements
            paired = min(gathers, strided_vector_reads(candidate, lowering).get(2, 0.0))
        strided_s = (self.gather_cycles * (gathers - paired) + self.stride2_vector_cycles * paired
                     / target.lanes("float32")) / cores / cycles_per_s
        # (the extractor's cache-traffic estimates rank tilings of one kernel; as absolute bytes they run 10x over
        # what well-tiled convs move, so the memory term keeps the compulsory bytes and adds what the schedule
        # itself moves per call: run-time packs and zero-fills)
        nbytes = roofline.bytes + f["mem.packed"] + f["alloc.fill_bytes"]
        # a buffer walked with a stride in the innermost loop (a transposing copy's read or write) streams whole
        # lines it uses a part of before they are evicted, and defeats the prefetcher: charged strided_bytes more
        for r in range(BUFFERS):
            if f[f"buf{r}.inner_stride"] > 1.0:
                nbytes += self.strided_bytes * f[f"buf{r}.unique_bytes"]
        seconds = max(compute_s + strided_s, nbytes / c.bytes_per_s) + c.launch_s
        return KernelEstimate(roofline.flops, nbytes, seconds, "schedule")

    def kernel(self, compute: Compute, constant_inputs: frozenset[str] = frozenset()) -> KernelEstimate:
        """The estimate for one compute op (``constant_inputs``: its local names bound to constants).

        Model predictions are cached by the canonical workload key (rename-invariant, constants
        included); the roofline, cheaper to compute than a canonical form, per op object."""
        hit = self._ops.get(id(compute))
        if hit is not None and hit[0] is compute and hit[1] == constant_inputs:
            return hit[2]
        key = self.canonical.workload(compute, constant_inputs) if self.model is not None or self.schedules \
            else None
        est = self._kernels.get(key) if key is not None else None
        if est is None:
            self.kernel_evaluations += 1
            t = compute.type_of
            read = {a.tensor for st in compute.statements for a in st.expr.accesses()}
            io = sum(t[n].nbytes for n in dict.fromkeys(compute.inputs + compute.outputs) if n in read or n in compute.outputs)
            est = self.roofline(compute, io)
            seconds = self.model.kernel_seconds(compute, self.target, constant_inputs) if self.model is not None \
                else None
            if seconds is not None:
                est = KernelEstimate(est.flops, est.bytes, float(seconds), "model")
            elif self.schedules and est.seconds > self.refine_above_s:
                est = self.scheduled(compute, constant_inputs, est)
            if key is not None:
                self._kernels[key] = est
        self._ops[id(compute)] = (compute, constant_inputs, est)
        return est

    def node(self, graph: Graph, node: Node) -> float:
        """Seconds of one node of ``graph`` (cached per node object: rewritten graphs share nodes)."""
        if writable_in_place(graph, node):  # (not cached: it depends on the producers, not on the node alone)
            return 0.0
        hit = self._nodes.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        if node.is_extern:
            if node.op.kind in ALIAS_EXTERNS:
                seconds = 0.0
            else:
                t = graph.type_of
                nbytes = sum(t[n].nbytes for n in dict.fromkeys(node.inputs + node.outputs))
                seconds = nbytes / self.ceilings.bytes_per_s + self.ceilings.launch_s
        else:
            consts = graph.constant
            local = frozenset(x for x, g in zip(node.op.inputs, node.inputs) if g in consts)
            seconds = self.kernel(node.op, local).seconds
        self._nodes[id(node)] = (node, seconds)
        return seconds

    def __call__(self, graph: Graph) -> float:
        """Predicted seconds of ``graph``: the sum over its nodes."""
        return sum(self.node(graph, n) for n in graph.nodes)

    def delta(self, before: Graph, after: Graph) -> float:
        """``self(after) - self(before)`` from the nodes that differ (as objects: a rewrite keeps the
        nodes it does not touch)."""
        old, new = {id(n) for n in before.nodes}, {id(n) for n in after.nodes}
        return (sum(self.node(after, n) for n in after.nodes if id(n) not in old)
                - sum(self.node(before, n) for n in before.nodes if id(n) not in new))

    def breakdown(self, graph: Graph) -> list[tuple[str, float]]:
        """(node name, seconds) per node, in graph order."""
        return [(n.name, self.node(graph, n)) for n in graph.nodes]

    def to_dict(self) -> dict:
        return {"method": self.method, "ceilings": asdict(self.ceilings), "padded_read_ops": self.padded_read_ops,
                "padded_product_ops": self.padded_product_ops, "schedules": self.schedules,
                "gather_cycles": self.gather_cycles, "stride2_vector_cycles": self.stride2_vector_cycles,
                "strided_bytes": self.strided_bytes,
                "refine_above_s": self.refine_above_s}


__all__ = ["ALIAS_EXTERNS", "CanonicalDigests", "Ceilings", "GraphCost", "KernelEstimate", "KernelTimeModel", "launch_overhead_s",
           "padded_reads", "workspace_bytes"]
