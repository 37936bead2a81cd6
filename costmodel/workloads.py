"""Workloads for offline cost-model datasets: which kernels to measure schedules of.

A :class:`Workload` is one canonical compute op (``superopt.ir.canonical.canonicalize``) plus which of
its inputs are constants, and where it came from. :func:`generate_workloads` mixes three sources,
deterministically for a seed and without two workloads of the same workload key:

- ``op``: the built-in ops of :mod:`superopt.ops` (matmul/gemm, conv2d incl. depthwise, 1x1 and
  strided, pooling, softmax, layer norm, activations, reductions, transposes) at random shapes, put
  through the same graph passes as a model (rewrite, then canonical kernels);
- ``model``: the kernels of the light ONNX models shipped in the onnx wheel (:func:`model_workloads`,
  also on its own: a trainer holds out whole models' workloads for evaluation);
- ``random``: random index-notation ops: contractions with batch dims and transposed operands,
  windowed reductions (conv-like, max/avg pooling), row-wise reductions (sum, max, softmax-like) and
  elementwise chains;
- ``transformer``: the projections of transformer blocks (:func:`_transformer_workloads`): a token
  matrix of 16-512 rows times a constant weight of 256-4096 inputs and outputs, stored either way,
  with the epilogues such blocks fuse into it (bias, GELU, SiLU, a gate, a residual). The other
  sources hold few contractions this wide against so few rows.

Every workload is sized so that one call takes roughly 0.05-30 ms on a small machine
(:func:`fits_size` with :data:`CPU_SIZES`; on a GPU, :data:`GPU_SIZES`: from a few microseconds to a few
milliseconds) and has a legal default schedule on the target; anything else is skipped.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from superopt.ir.canonical import canonical_constants, canonicalize, canonicalize_kernels, workload_key
from superopt.ir.compute import Compute
from superopt.ir.flops import flop_count
from superopt.ir.graph import Graph
from superopt.lang import compile_op
from superopt.schedule.graph_defaults import constant_inputs
from superopt.schedule.plan import ScheduleError
from superopt.schedule.space import ScheduleSpace
from superopt.target import Target, host_target

SOURCES = ("op", "model", "random", "transformer", "conv")
# the light models of the onnx wheel (superopt.frontends.light_models.LIGHT_MODELS), the smaller first
DEFAULT_MODELS = ("squeezenet", "resnet50", "inception_v1", "shufflenet", "bvlc_alexnet", "zfnet512", "vgg19",
                  "inception_v2", "densenet121")
DEFAULT_MIX = (("op", 0.25), ("model", 0.25), ("random", 0.35), ("transformer", 0.15))
# sizes: one call should take roughly 0.05-30 ms on one core of a small machine
FLOP_RATE = 2e10  # flop/s of a default schedule on one core (rough)
BYTE_RATE = 1e10  # bytes/s streamed by one core (rough)
MIN_SECONDS = 5e-5  # estimated_seconds below this: a call of a few microseconds, mostly overhead
MAX_FLOPS = 300_000_000
MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class WorkloadSizes:
    """Which workloads are worth measuring on a kind of machine: one call's rough time (flops at
    ``flop_rate`` plus bytes at ``byte_rate``) at least ``min_seconds``, and at most ``max_flops`` and
    ``max_bytes``."""

    flop_rate: float = FLOP_RATE
    byte_rate: float = BYTE_RATE
    min_seconds: float = MIN_SECONDS
    max_flops: float = MAX_FLOPS
    max_bytes: float = MAX_BYTES


CPU_SIZES = WorkloadSizes()
# a GPU: default schedules at about 1 Tflop/s and 0.5 TB/s (rough), calls from 2 us (below that a launch
# is mostly overhead) to about a gigaflop (the float64 reference check on the host stays in seconds)
GPU_SIZES = WorkloadSizes(flop_rate=1e12, byte_rate=5e11, min_seconds=2e-6, max_flops=1e9, max_bytes=256 << 20)
# the CPU emulator of a GPU (runtime.gpu binding "emulator"): blocks and threads as loops on one core, so
# only tiny workloads (a dry run of the GPU path, not data to learn from)
EMULATOR_SIZES = replace(CPU_SIZES, min_seconds=2e-6, max_flops=4e6, max_bytes=2 << 20)


def sizes_for(target: Target) -> WorkloadSizes:
    """The sizes of :func:`generate_workloads` for ``target`` by default: GPU sizes on a cuda target."""
    return GPU_SIZES if target.kind == "cuda" else CPU_SIZES


_SKIPPED = (ValueError, TypeError, KeyError, IndexError)  # parse/shape/schedule errors (ScheduleError is a ValueError)


@dataclass(frozen=True)
class Workload:
    """A canonical compute op to measure, its constant inputs (canonical names) and its source."""

    name: str
    compute: Compute
    constant_inputs: frozenset[str]
    source: str  # "op" | "model" | "random"

    @property
    def key(self) -> str:
        """The rename-invariant workload key that measurement records carry."""
        return workload_key(self.compute, self.constant_inputs)

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "key": self.key,
                "constant_inputs": sorted(self.constant_inputs), "workload": self.compute.text()}


def make_workload(name: str, compute: Compute, constants: Iterable[str] = (), source: str = "random") -> Workload:
    """A workload from any compute: canonicalized, ``constants`` (its own input names) renamed to match."""
    if source not in SOURCES:
        raise ValueError(f"unknown workload source {source!r}; known: {SOURCES}")
    return Workload(name, canonicalize(compute), canonical_constants(compute, constants), source)


# -- size and legality --------------------------------------------------------------------------


def workload_size(compute: Compute) -> tuple[int, int]:
    """(flops, bytes of every input, temporary and output) of one call."""
    return flop_count(compute), sum(t.nbytes for t in compute.type_of.values())


def estimated_seconds(compute: Compute, sizes: WorkloadSizes = CPU_SIZES) -> float:
    """A rough time of one call: flops at ``sizes.flop_rate`` plus bytes at ``sizes.byte_rate`` (by
    default one core of a small machine)."""
    flops, nbytes = workload_size(compute)
    return flops / sizes.flop_rate + nbytes / sizes.byte_rate


def fits_size(compute: Compute, min_seconds: float | None = None, max_flops: float | None = None,
              max_bytes: float | None = None, sizes: WorkloadSizes = CPU_SIZES) -> bool:
    """Whether one call is worth timing (:func:`estimated_seconds` at least ``min_seconds``) and quick
    enough (at most ``max_flops`` and ``max_bytes``); limits not given come from ``sizes``."""
    flops, nbytes = workload_size(compute)
    lo = sizes.min_seconds if min_seconds is None else min_seconds
    return (estimated_seconds(compute, sizes) >= lo and flops <= (sizes.max_flops if max_flops is None else max_flops)
            and nbytes <= (sizes.max_bytes if max_bytes is None else max_bytes))


def has_legal_default(workload: Workload, target: Target) -> bool:
    """Whether the default schedule of the workload lowers on ``target``."""
    try:
        space = ScheduleSpace(workload.compute, target, workload.constant_inputs)
        space.trace(space.default_point())
    except ScheduleError:
        return False
    return True


# -- model kernels ------------------------------------------------------------------------------


def graph_workloads(graph: Graph, prefix: str, source: str) -> list[Workload]:
    """One workload per distinct workload key among the graph's compute nodes (graph order), after the
    passes a model goes through before scheduling (prune, rewrite rules, canonical kernels)."""
    from search.graph.rewrite import RewriteConfig, rewrite_graph

    graph = canonicalize_kernels(rewrite_graph(graph, RewriteConfig(host_target(2)))[0])  # the pipeline's defaults
    out: dict[str, Workload] = {}
    for node in graph.nodes:
        if node.is_extern:
            continue
        w = Workload(f"{prefix}/{node.name}", node.op, constant_inputs(graph, node), source)
        out.setdefault(w.key, w)
    return list(out.values())


@functools.lru_cache(maxsize=16)
def _model_kernels(name: str) -> tuple[Workload, ...]:
    from superopt.frontends.light_models import light_model_path
    from superopt.frontends.onnx_frontend import import_onnx

    return tuple(graph_workloads(import_onnx(str(light_model_path(name))), f"model/{name}", "model"))


def model_workloads(names: Sequence[str] = DEFAULT_MODELS, *, sized: bool = True,
                    target: Target | None = None, sizes: WorkloadSizes | None = None) -> list[Workload]:
    """The distinct kernels of the named light ONNX models (in model, then graph order). ``sized``:
    only those :func:`fits_size` accepts (``sizes``: by default the target's, :func:`sizes_for`);
    ``target``: only those with a legal default schedule there."""
    sizes = sizes or (sizes_for(target) if target is not None else CPU_SIZES)
    out: dict[str, Workload] = {}
    for name in names:
        for w in _model_kernels(name):
            if (not sized or fits_size(w.compute, sizes=sizes)) and (target is None or has_legal_default(w, target)):
                out.setdefault(w.key, w)
    return list(out.values())


# -- random shapes ------------------------------------------------------------------------------


def _dim(rng: random.Random, lo: int, hi: int) -> int:
    """A log-uniform extent in [lo, hi], half the time rounded to a multiple of 8 (when that fits)."""
    v = int(round(2 ** rng.uniform(math.log2(lo), math.log2(hi))))
    if v >= 16 and rng.random() < 0.5:
        v = max(8, v // 8 * 8)
    return min(max(v, lo), hi)


# -- built-in ops (superopt.ops) ----------------------------------------------------------------

OpBuild = Callable[[random.Random], tuple[str, Graph]]


def _graph(name: str, build: Callable, inputs: Sequence[tuple[str, Sequence[int]]],
           constants: Sequence[tuple[str, Sequence[int]]] = (), seed: int = 0) -> Graph:
    """A graph of one built-in op: run-time ``inputs`` and random constant ``constants`` (weights)."""
    from superopt.builder import GraphBuilder

    b = GraphBuilder(name)
    rng = np.random.default_rng(seed)
    args = [b.input(n, s) for n, s in inputs]
    args += [b.constant(rng.standard_normal(tuple(s)).astype(np.float32), n) for n, s in constants]
    out = build(b, *args)
    return b.build(out if isinstance(out, list) else [out])


def _op_matmul(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    m, k, n = _dim(rng, 16, 512), _dim(rng, 16, 1024), _dim(rng, 16, 512)
    if rng.random() < 0.5:
        trans_b = rng.random() < 0.5
        w = (n, k) if trans_b else (k, n)
        g = _graph("gemm", lambda b, x, wt, bias: ops.gemm(b, x, wt, bias, trans_b=trans_b), [("X", (m, k))],
                   [("W", w), ("Bias", (n,))])
        return f"gemm_{m}x{k}x{n}{'_tb' if trans_b else ''}", g
    batch = _dim(rng, 1, 16)
    g = _graph("matmul", ops.matmul, [("A", (batch, m, k)), ("B", (batch, k, n))])
    return f"matmul_{batch}x{m}x{k}x{n}", g


def _op_conv(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    kind = rng.choice(("dense", "depthwise", "pointwise", "strided"))
    c = _dim(rng, 3 if kind == "dense" else 16, 256)
    h = _dim(rng, 7, 64)
    k = 1 if kind == "pointwise" else rng.choice((3, 3, 5, 7) if kind != "depthwise" else (3, 5))
    stride = 2 if kind == "strided" else 1
    groups = c if kind == "depthwise" else 1
    co = c if kind == "depthwise" else _dim(rng, 8, 256)
    pad = k // 2 if rng.random() < 0.7 else 0
    g = _graph("conv", lambda b, x, w, bias: ops.conv2d(b, x, w, bias, strides=(stride, stride), pads=(pad,) * 4,
                                                          groups=groups),
               [("X", (1, c, h, h))], [("W", (co, c // groups, k, k)), ("Bias", (co,))])
    return f"conv2d_{kind}_c{c}_h{h}_co{co}_k{k}_s{stride}_p{pad}", g


def _op_pool(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    c, h = _dim(rng, 16, 256), _dim(rng, 16, 112)
    kk, s = rng.choice(((2, 2), (3, 2), (3, 1)))
    pad = 1 if kk == 3 and rng.random() < 0.5 else 0
    if rng.random() < 0.5:
        g = _graph("max_pool", lambda b, x: ops.max_pool2d(b, x, (kk, kk), (s, s), (pad,) * 4), [("X", (1, c, h, h))])
        return f"max_pool_c{c}_h{h}_k{kk}_s{s}_p{pad}", g
    g = _graph("avg_pool", lambda b, x: ops.avg_pool2d(b, x, (kk, kk), (s, s), (pad,) * 4), [("X", (1, c, h, h))])
    return f"avg_pool_c{c}_h{h}_k{kk}_s{s}_p{pad}", g


def _op_softmax(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    shape = (_dim(rng, 1, 16), _dim(rng, 16, 256), _dim(rng, 32, 1024)) if rng.random() < 0.5 else \
        (_dim(rng, 32, 1024), _dim(rng, 32, 2048))
    fn = rng.choice((ops.softmax, ops.log_softmax))
    return f"{fn.__name__}_{'x'.join(map(str, shape))}", _graph("softmax", fn, [("X", shape)])


def _op_layer_norm(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    rows, cols = _dim(rng, 32, 1024), _dim(rng, 32, 2048)
    if rng.random() < 0.5:
        g = _graph("rms_norm", ops.rms_norm, [("X", (rows, cols))], [("S", (cols,))])
        return f"rms_norm_{rows}x{cols}", g
    g = _graph("layer_norm", ops.layer_norm, [("X", (rows, cols))], [("S", (cols,)), ("Bi", (cols,))])
    return f"layer_norm_{rows}x{cols}", g


def _op_activation(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    rank = rng.choice((2, 3))
    shape = tuple(_dim(rng, 64 if rank == 2 else 16, 1024 if rank == 2 else 128) for _ in range(rank))
    unary = {"relu": ops.relu, "gelu": ops.gelu, "sigmoid": ops.sigmoid, "tanh": ops.tanh, "silu": ops.silu,
             "erf": ops.erf}
    binary = {"add": ops.add, "mul": ops.mul, "sub": ops.sub, "div": ops.div, "max": ops.maximum}
    name = rng.choice(sorted(unary) + sorted(binary))
    if name in unary:
        return f"{name}_{'x'.join(map(str, shape))}", _graph(name, unary[name], [("X", shape)])
    other = shape if rng.random() < 0.5 else shape[-1:]  # same shape or broadcast over the last axis
    return f"{name}_{'x'.join(map(str, shape))}_{len(other)}d", _graph(name, binary[name], [("X", shape), ("Y", other)])


def _op_reduce(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    rank = rng.choice((2, 3))
    shape = tuple(_dim(rng, 64 if rank == 2 else 16, 2048 if rank == 2 else 256) for _ in range(rank))
    kind = rng.choice(("sum", "max", "mean", "min"))
    axes = sorted(rng.sample(range(len(shape)), rng.choice((1, 1, 2)) if len(shape) > 2 else 1))
    g = _graph("reduce", lambda b, x: ops.reduce(b, x, kind, axes, keepdims=True), [("X", shape)])
    return f"reduce_{kind}_{'x'.join(map(str, shape))}_ax{''.join(map(str, axes))}", g


def _op_transpose(rng: random.Random) -> tuple[str, Graph]:
    from superopt import ops

    rank = rng.choice((2, 3, 4))
    shape = tuple(_dim(rng, {2: 64, 3: 16, 4: 8}[rank], {2: 2048, 3: 256, 4: 64}[rank]) for _ in range(rank))
    perm = list(range(rank))
    while perm == sorted(perm):
        rng.shuffle(perm)
    g = _graph("transpose", lambda b, x: ops.transpose(b, x, perm), [("X", shape)])
    return f"transpose_{'x'.join(map(str, shape))}_p{''.join(map(str, perm))}", g


OP_BUILDERS: tuple[OpBuild, ...] = (_op_matmul, _op_matmul, _op_conv, _op_conv, _op_pool, _op_softmax, _op_layer_norm,
                                    _op_activation, _op_reduce, _op_transpose)


def _op_workloads(rng: random.Random) -> list[Workload]:
    name, graph = rng.choice(OP_BUILDERS)(rng)
    return graph_workloads(graph, f"op/{name}", "op")


def _conv_workloads(rng: random.Random) -> list[Workload]:
    """The kernels of one random conv (dense, depthwise, pointwise or strided; the "conv" source: a mix
    that gives convs the weight one of the op source's eight builders does not)."""
    name, graph = _op_conv(rng)
    # the conv's own kernel: the layout pass may add conversions around it (NCHWc blocking, where this
    # machine's ceilings favour it), which the model source already draws
    return [w for w in graph_workloads(graph, f"conv/{name}", "conv")
            if any(st.reduce == "+=" for st in w.compute.statements)]


# -- random index-notation ops --------------------------------------------------------------------

# (name, source, input shapes, keyword arguments of compile_op, constant inputs)
RandomOp = tuple[str, str, dict[str, tuple[int, ...]], dict, tuple[str, ...]]


def _rand_contraction(rng: random.Random) -> RandomOp:
    loops = rng.choice((2, 3, 3, 4))
    m, n, k = _dim(rng, 16, 512), _dim(rng, 16, 512), _dim(rng, 16, 1024)
    a_t, b_t = rng.random() < 0.3, rng.random() < 0.3
    a = "A[k,i]" if a_t else "A[i,k]"
    b = "B[j,k]" if b_t else "B[k,j]"
    sa, sb = ((k, m) if a_t else (m, k)), ((n, k) if b_t else (k, n))
    if loops == 2:
        src, shapes = f"O[i] += {a} * X[k]", {"A": sa, "X": (k,)}
    elif loops == 3:
        src, shapes = f"O[i,j] += {a} * {b}", {"A": sa, "B": sb}
    else:
        bt = _dim(rng, 2, 16)
        form = rng.choice(("batch", "shared", "double"))
        if form == "batch":
            src, shapes = f"O[b,i,j] += A[b,{a[2:]} * B[b,{b[2:]}", {"A": (bt, *sa), "B": (bt, *sb)}
        elif form == "shared":
            src, shapes = f"O[b,i,j] += A[b,{a[2:]} * {b}", {"A": (bt, *sa), "B": sb}
        else:
            k2 = _dim(rng, 2, 16)
            src, shapes = "O[i,j] += A[i,k,l] * B[k,l,j]", {"A": (m, k, k2), "B": (k, k2, n)}
    consts = ("B",) if "B" in shapes and rng.random() < 0.5 else ()
    return f"contraction{loops}", src, shapes, {}, consts


def _rand_window(rng: random.Random) -> RandomOp:
    kind = rng.choice(("conv", "conv_nhwc", "conv1d", "max_pool", "avg_pool"))
    s, kk = rng.choice((1, 2)), rng.choice((1, 2, 3, 5)) if kind.startswith("conv") else rng.choice((2, 3))
    c, h = _dim(rng, 8, 128), _dim(rng, max(kk, 8), 64)
    hw = f"{s}*y+kh" if s > 1 else "y+kh"
    ww = f"{s}*x+kw" if s > 1 else "x+kw"
    ext = {"kh": kk, "kw": kk}
    if kind == "conv":
        o = _dim(rng, 8, 128)
        return (f"window_conv_k{kk}_s{s}", f"O[n,o,y,x] += X[n,c,{hw},{ww}] * W[o,c,kh,kw]",
                {"X": (1, c, h, h), "W": (o, c, kk, kk)}, {"extents": ext}, ("W",))
    if kind == "conv_nhwc":
        o = _dim(rng, 8, 128)
        return (f"window_conv_nhwc_k{kk}_s{s}", f"O[n,y,x,o] += X[n,{hw},{ww},c] * W[kh,kw,c,o]",
                {"X": (1, h, h, c), "W": (kk, kk, c, o)}, {"extents": ext}, ("W",))
    if kind == "conv1d":
        length = _dim(rng, 256, 16384)
        return (f"window_dwconv1d_k{kk}_s{s}", f"O[c,y] += X[c,{hw}] * W[c,kh]",
                {"X": (c, length), "W": (c, kk)}, {"extents": {"kh": kk}}, ("W",))
    if kind == "max_pool":
        return (f"window_max_pool_k{kk}_s{s}", f"O[c,y,x] max= X[c,{hw},{ww}]", {"X": (c, h, h)},
                {"extents": ext}, ())
    return (f"window_avg_pool_k{kk}_s{s}", f"S[c,y,x] += X[c,{hw},{ww}]\nO[c,y,x] = S[c,y,x] / {float(kk * kk)}",
            {"X": (c, h, h)}, {"extents": ext, "outputs": ["O"]}, ())


def _rand_rowwise(rng: random.Random) -> RandomOp:
    rows, cols = _dim(rng, 32, 2048), _dim(rng, 32, 2048)
    kind = rng.choice(("sum", "max", "sumsq", "softmax", "center", "batched"))
    shapes = {"X": (rows, cols)}
    if kind == "sum":
        return "rowwise_sum", "O[i] += X[i,j]", shapes, {}, ()
    if kind == "max":
        return "rowwise_max", "O[i] max= X[i,j]", shapes, {}, ()
    if kind == "sumsq":
        return "rowwise_sumsq", f"S[i] += X[i,j] * X[i,j]\nO[i] = sqrt(S[i] / {float(cols)})", shapes, {"outputs": ["O"]}, ()
    if kind == "softmax":
        src = "M[i] max= X[i,j]\nS[i] += exp(X[i,j] - M[i])\nO[i,j] = exp(X[i,j] - M[i]) / S[i]"
        return "rowwise_softmax", src, shapes, {"outputs": ["O"]}, ()
    if kind == "center":
        return "rowwise_center", f"S[i] += X[i,j]\nO[i,j] = X[i,j] - S[i] / {float(cols)}", shapes, {"outputs": ["O"]}, ()
    b = _dim(rng, 2, 32)
    return "rowwise_batched_max", "O[b,i] max= X[b,i,j]", {"X": (b, rows // 4 + 1, cols)}, {}, ()


_UNARY = ("tanh", "sigmoid", "abs", "relu", "neg")


def _rand_term(rng: random.Random, leaves: Sequence[str], ops: int) -> str:
    """A random expression of ``ops`` operations over the leaf accesses (exp only of bounded values)."""
    if ops == 0:
        return rng.choice(leaves)
    kind = rng.random()
    if kind < 0.35:
        inner = _rand_term(rng, leaves, ops - 1)
        fn = rng.choice((*_UNARY, "exp_tanh"))
        return f"exp(tanh({inner}))" if fn == "exp_tanh" else f"{fn}({inner})"
    left = rng.randint(0, ops - 1)
    a, b = _rand_term(rng, leaves, left), _rand_term(rng, leaves, ops - 1 - left)
    op = rng.choice(("+", "*", "-", "max", "where", "div"))
    if op == "max":
        return f"max({a}, {b})"
    if op == "where":
        return f"where({a} > {b}, {a}, {b} * 0.5)"
    if op == "div":
        return f"({a}) / (abs({b}) + 1.0)"
    return f"({a} {op} {b})"


def _rand_elementwise(rng: random.Random) -> RandomOp:
    rank = rng.choice((1, 2, 3))
    lo, hi = {1: (1 << 13, 1 << 21), 2: (64, 1024), 3: (16, 128)}[rank]
    shape = tuple(_dim(rng, lo, hi) for _ in range(rank))
    dims = ["i", "j", "k"][:rank]
    full = ",".join(dims)
    leaves, shapes = [f"A[{full}]"], {"A": shape}
    if rng.random() < 0.7:
        leaves.append(f"B[{full}]")
        shapes["B"] = shape
    if rank > 1 and rng.random() < 0.5:
        leaves.append(f"C[{dims[-1]}]")  # broadcast along the leading axes
        shapes["C"] = shape[-1:]
    nops = rng.randint(2, 4)
    expr = _rand_term(rng, leaves, nops)
    if "A[" not in expr:  # the full-shape input gives the output its extents
        expr, nops = f"A[{full}] + {expr}", nops + 1
    used = {n: s for n, s in shapes.items() if f"{n}[" in expr}
    return f"elementwise{nops}", f"O[{full}] = {expr}", used, {}, ()


RANDOM_BUILDERS: tuple[Callable[[random.Random], RandomOp], ...] = (
    _rand_contraction, _rand_contraction, _rand_window, _rand_window, _rand_rowwise, _rand_elementwise)


def _random_workloads(rng: random.Random) -> list[Workload]:
    name, src, shapes, kw, consts = rng.choice(RANDOM_BUILDERS)(rng)
    compute = compile_op(src, shapes, **kw)
    label = "_".join("x".join(map(str, s)) for s in shapes.values())
    return [make_workload(f"random/{name}_{label}", compute, [c for c in consts if c in compute.inputs], "random")]


# -- transformer projections --------------------------------------------------------------------

EPILOGUES = ("none", "bias", "bias_gelu", "silu", "gate", "bias_residual")


def _transformer_graph(rng: random.Random) -> tuple[str, Graph]:
    """One projection of a transformer block: rows x (inputs -> outputs) with a constant weight, at most
    :data:`MAX_FLOPS`, and one of :data:`EPILOGUES`."""
    from superopt import ops

    common = (512, 768, 1024, 1536, 2048, 2816, 3072, 4096)  # hidden and feed-forward widths of real models

    def width() -> int:
        return rng.choice(common) if rng.random() < 0.5 else _dim(rng, 256, 4096)

    m = rng.choice((32, 64, 128, 256, 512)) if rng.random() < 0.5 else _dim(rng, 16, 512)
    k, n = width(), width()
    while 2 * m * k * n > MAX_FLOPS:
        if k >= n:
            k = max(256, k // 2)
        else:
            n = max(256, n // 2)
        if k == n == 256:
            m = max(16, m // 2)
    trans_b = rng.random() < 0.5  # torch's Linear stores [outputs, inputs]; exported MatMuls [inputs, outputs]
    epilogue = rng.choice(EPILOGUES)
    inputs = [("X", (m, k))] + ([("G", (m, n))] if epilogue in ("gate", "bias_residual") else [])
    consts = [("W", (n, k) if trans_b else (k, n))] + ([("Bias", (n,))] if epilogue.startswith("bias") else [])

    def build(b, x, *rest):
        other = rest[0] if epilogue in ("gate", "bias_residual") else None
        w = rest[1] if other is not None else rest[0]
        bias = rest[-1] if epilogue.startswith("bias") else None
        y = ops.linear(b, x, w, bias) if trans_b else ops.matmul(b, x, w)
        if bias is not None and not trans_b:
            y = ops.add(b, y, bias)
        if epilogue == "bias_gelu":
            y = ops.gelu(b, y)
        elif epilogue == "silu":
            y = ops.silu(b, y)
        elif epilogue == "gate":
            y = ops.mul(b, ops.silu(b, other), y)
        elif epilogue == "bias_residual":
            y = ops.add(b, y, other)
        return y

    name = f"linear_{m}x{k}x{n}{'_tb' if trans_b else ''}_{epilogue}"
    return name, _graph("linear", build, inputs, consts)


def _transformer_workloads(rng: random.Random) -> list[Workload]:
    name, graph = _transformer_graph(rng)
    kernels = graph_workloads(graph, f"transformer/{name}", "transformer")
    # the projection itself (the kernel with the most flops), not a gate's separate activation
    return [max(kernels, key=lambda w: flop_count(w.compute))] if kernels else []


# -- the mix ------------------------------------------------------------------------------------


def _model_draw(rng: random.Random, models: Sequence[str], taken: set[str], sizes: WorkloadSizes) -> list[Workload]:
    """One random kernel of one random model, of those that fit in size and are not ``taken`` (keys)."""
    kernels = [w for w in _model_kernels(rng.choice(list(models)))
               if w.key not in taken and fits_size(w.compute, sizes=sizes)]
    kernels.sort(key=lambda w: w.key)  # a model's kernel order may differ between processes; keys do not
    return [rng.choice(kernels)] if kernels else []


def generate_workloads(n: int, seed: int, *, target: Target | None = None, models: Sequence[str] = DEFAULT_MODELS,
                       mix: Sequence[tuple[str, float]] = DEFAULT_MIX, max_attempts: int | None = None,
                       sizes: WorkloadSizes | None = None) -> list[Workload]:
    """``n`` distinct workloads (by workload key) drawn from the sources of ``mix`` with their weights;
    the same list for the same seed (and models, mix, target and sizes). Each fits :func:`fits_size`
    (``sizes``: by default the target's, :func:`sizes_for`) and has a legal default schedule on ``target``
    (default: this machine, one thread; a cuda target: the GPU sketches); anything that does not parse,
    build or schedule is skipped. Fewer than ``n`` come back only when ``max_attempts`` draws (default
    ``50 * n + 100``) could not find them."""
    if n < 0:
        raise ValueError(f"generate_workloads: n must be >= 0, got {n}")
    target = target or host_target(1)
    sizes = sizes or sizes_for(target)
    sources = [s for s, wt in mix if wt > 0 and (s != "model" or models)]
    weights = [wt for s, wt in mix if wt > 0 and (s != "model" or models)]
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown or not sources:
        raise ValueError(f"generate_workloads: bad mix {list(mix)}; sources are {SOURCES}")
    rng = random.Random(seed)
    out: dict[str, Workload] = {}
    rejected: set[str] = set()
    draw = {"op": _op_workloads, "random": _random_workloads, "transformer": _transformer_workloads,
            "conv": _conv_workloads,
            "model": lambda r: _model_draw(r, models, rejected | set(out), sizes)}
    for _ in range(max_attempts if max_attempts is not None else 50 * n + 100):
        if len(out) >= n:
            break
        source = rng.choices(sources, weights)[0]
        try:
            candidates = draw[source](rng)
        except _SKIPPED:
            continue
        for w in candidates:
            key = w.key
            if len(out) >= n or key in out or key in rejected:
                continue
            try:
                ok = fits_size(w.compute, sizes=sizes) and has_legal_default(w, target)
            except _SKIPPED:
                ok = False
            if ok:
                out[key] = w
            else:
                rejected.add(key)
    return list(out.values())


__all__ = ["BYTE_RATE", "CPU_SIZES", "DEFAULT_MIX", "DEFAULT_MODELS", "EMULATOR_SIZES", "EPILOGUES", "FLOP_RATE", "GPU_SIZES",
           "MAX_BYTES", "MAX_FLOPS", "MIN_SECONDS", "SOURCES", "Workload", "WorkloadSizes", "estimated_seconds",
           "fits_size", "generate_workloads", "graph_workloads", "has_legal_default", "make_workload",
           "model_workloads", "sizes_for", "workload_size"]
