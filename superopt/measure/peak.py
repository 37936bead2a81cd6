"""The machine's ceilings for rooflines: peak FMA throughput and streaming memory bandwidth.

:func:`fma_peak_gflops` compiles (through the project's own compiler path, so with the target's
flags) a kernel that runs ``A`` independent vector FMA chains on every OpenMP thread
(``acc[j] = acc[j] * m + c`` over GCC vector extensions sized from ``target.vector_bits``); enough
accumulators cover FMA latency x pipes, so the loop is bound by FMA throughput alone. The
accumulators are written out, so nothing is optimized away, and ``m``/``c`` are run-time arguments,
so nothing is constant-folded. GFLOP/s = threads x iterations x A x lanes x 2 / seconds (best of a
few repeats: a ceiling, not a typical value).

:func:`memory_bandwidth_gbs` times a STREAM-style triad ``a[i] = b[i] + s * c[i]`` over three
buffers much larger than the last-level cache (bytes counted as STREAM does: 2 reads + 1 write).

:func:`tile_peak_gflops` measures the practical ceiling of a register-tiled contraction (sgemm, convs):
the default schedule's tile shape (``rows`` x ``vectors`` accumulators, :func:`tile_shape`) fed from
L1, each step broadcasting ``rows`` scalars and loading ``vectors`` vectors for ``rows x vectors``
FMAs. A contraction kernel built on that tile cannot beat the loop with its operands in L1, so the gap
between the two is what the kernel loses to the memory hierarchy; the loop's ratio to the FMA ceiling,
taken in alternation with the FMA-chain kernel (median of per-round ratios, so a busy moment of a
shared machine cancels), is what the tile itself costs. :func:`tile_write_back_sweep` times the same tile
written back every N reduction steps, as a contraction's tiles are: the most a kernel whose tiles reduce over
N steps can reach here (N = 1024 streams the vector operand from L2, as sgemm's packed panel does).

All results are cached per :meth:`Target.key` as small JSON files under the compiler cache
directory (``<cache_dir>/peak/``); ``refresh=True`` measures again.
"""

from __future__ import annotations

import ctypes
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from superopt.runtime.buffers import aligned_empty
from superopt.runtime.compiler import CompilerConfig, compile_library, load_library
from superopt.target import Target

CACHE_VERSION = 1
RETRIES = 3  # extra all-thread measurements when the scaling over one thread looks poor
GOOD_SCALING = 0.9  # of linear
FMA_LATENCY_CYCLES = 4  # upper end for current x86 cores (Zen, Skylake and later); sizes the chains


class _Measured:
    """A cached measurement: its JSON form leaves out ``from_cache`` (where this copy came from)."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("from_cache")
        return d


@dataclass(frozen=True)
class PeakResult(_Measured):
    gflops: float  # all ``threads`` threads
    gflops_1t: float  # one thread
    threads: int
    cores: int
    vector_bits: int
    lanes: int  # float32 per vector
    accumulators: int  # independent vector FMA chains per thread
    iterations: int  # per thread, of the timed run
    seconds: float  # the best timed run, all threads
    measured_at: str = ""
    from_cache: bool = False

    @property
    def scaling(self) -> float:
        """All-threads throughput over one thread's."""
        return self.gflops / self.gflops_1t if self.gflops_1t > 0 else 0.0

    @property
    def ceiling_gflops(self) -> float:
        """The roofline's compute ceiling: the measured all-thread peak, or one thread's peak times the
        threads (up to the cores) where a busy shared machine held the all-thread run below that."""
        return max(self.gflops, self.gflops_1t * min(self.threads, self.cores))

    @property
    def flops_per_iteration(self) -> int:
        """Per thread and loop iteration: accumulators x lanes x 2 (multiply + add)."""
        return self.accumulators * self.lanes * 2

    def implied_ghz(self, fma_units: int) -> float:
        """The clock one thread's throughput implies with ``fma_units`` vector FMA pipes per core."""
        return self.gflops_1t / (fma_units * self.lanes * 2)


@dataclass(frozen=True)
class BandwidthResult(_Measured):
    triad_gbs: float  # a = b + s*c, 12 bytes per element (STREAM convention)
    copy_gbs: float  # a = b, 8 bytes per element
    threads: int
    array_bytes: int  # each of the three arrays
    measured_at: str = ""
    from_cache: bool = False


# -- C sources --------------------------------------------------------------------------------------


def accumulator_count(target: Target) -> int:
    """Independent chains: latency x pipes with room to spare, leaving registers for m and c."""
    return max(2, min(FMA_LATENCY_CYCLES * target.fma_units + 4, target.vector_registers - 4))


def fma_source(lanes: int, accumulators: int) -> str:
    """``so_fma_peak(iters, m, c, init, out)``: ``accumulators`` vector chains of FMAs per thread.

    Thread ``t``'s chain ``j`` starts from ``init + t*A*lanes + j*lanes + lane`` in each lane and runs
    ``x = x*m + c`` ``iters`` times; its final vectors go to ``out[(t*A + j)*lanes + lane]``.
    Returns the number of threads that ran."""
    a = accumulators
    decl = "\n".join(f"        vf a{j} = base + (vf){{{', '.join(str(j * lanes + k) + '.0f' for k in range(lanes))}}};"
                     for j in range(a))
    body = "\n".join(f"            a{j} = a{j} * vm + vc;" for j in range(a))
    store = "\n".join(f"        memcpy(out + ((long)t * {a} + {j}) * {lanes}, &a{j}, sizeof(vf));" for j in range(a))
    return f"""
typedef float vf __attribute__((vector_size({lanes * 4})));
int so_fma_peak(long iters, float m, float c, float init, float *out) {{
    int nthreads = 1;
    #pragma omp parallel num_threads(SO_THREADS)
    {{
        int t = omp_get_thread_num();
        #pragma omp single
        nthreads = omp_get_num_threads();
        vf vm = (vf){{0}} + m, vc = (vf){{0}} + c;
        vf base = (vf){{0}} + (init + (float)(t * {a * lanes}));
{decl}
        for (long i = 0; i < iters; i++) {{
{body}
        }}
{store}
    }}
    return nthreads;
}}
"""


BANDWIDTH_SOURCE = """
void so_triad(long n, float s, float *restrict a, const float *restrict b, const float *restrict c) {
    #pragma omp parallel for schedule(static) num_threads(SO_THREADS)
    for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
void so_copy(long n, float *restrict a, const float *restrict b) {
    #pragma omp parallel for schedule(static) num_threads(SO_THREADS)
    for (long i = 0; i < n; i++) a[i] = b[i];
}
void so_fill(long n, float v, float *restrict a) {
    #pragma omp parallel for schedule(static) num_threads(SO_THREADS)
    for (long i = 0; i < n; i++) a[i] = v + (float)(i & 1023);
}
"""


def tile_shape(target: Target) -> tuple[int, int]:
    """Rows x vectors of the default contraction tile: 4 vectors a row on a 32-register file (2 on 16),
    and the most rows whose accumulators, the row's vectors and a broadcast fit (6 x 4 on AVX-512)."""
    vectors = 4 if target.vector_registers >= 32 else 2
    return max(1, (target.vector_registers - vectors - 1) // vectors), vectors


TILE_STEPS = 64  # reduction steps per sweep: 64 x (rows + vectors x lanes) floats stay in L1


def tile_source(lanes: int, rows: int, vectors: int, steps: int = TILE_STEPS, write_back: bool = False) -> str:
    """``so_tile_peak(iters, a, b, out)``: per thread, ``iters`` sweeps of the register tile over ``steps``
    reduction steps: ``c[r][v] += a[k*rows + r] * b[(k*vectors + v)*lanes : +lanes]``; thread ``t``'s
    accumulators go to ``out[((t*rows + r)*vectors + v)*lanes + lane]``. Returns the threads that ran.

    With ``write_back`` every sweep is one tile of a contraction whose reduction is ``steps`` long: it starts
    from zero accumulators and ends adding them into ``out`` (a load, an add and a store a vector, as a
    kernel writes its tile back), so ``out`` must start at zero and ends at ``iters`` times the products."""
    acc = [[f"c{r}_{v}" for v in range(vectors)] for r in range(rows)]
    decl = "\n".join(f"        vf {', '.join(f'{c} = (vf){{0}}' for c in row)};" for row in acc)
    reset = "".join(f"\n            {' '.join(f'{c} = (vf){{0}};' for c in row)}" for row in acc)
    loads = "\n".join(f"                vf b{v} = bk[{v}];" for v in range(vectors))
    splat = lambda r: "(vf){" + ", ".join([f"ak[{r}]"] * lanes) + "}"  # noqa: E731  (a broadcast load; 0 + s is not)
    fmas = "\n".join(f"                {{ vf x = {splat(r)}; "
                      + " ".join(f"{acc[r][v]} += x * b{v};" for v in range(vectors)) + " }" for r in range(rows))
    slot = lambda r, v: f"out + (((long)t * {rows} + {r}) * {vectors} + {v}) * {lanes}"  # noqa: E731
    store = "\n".join(f"        memcpy({slot(r, v)}, &{acc[r][v]}, sizeof(vf));" for r in range(rows) for v in range(vectors))
    add_back = "".join(f"\n            {{ vf o; memcpy(&o, {slot(r, v)}, sizeof o); o += {acc[r][v]}; "
                          f"memcpy({slot(r, v)}, &o, sizeof o); }}" for r in range(rows) for v in range(vectors))
    return f"""
typedef float vf __attribute__((vector_size({lanes * 4})));
int so_tile_peak(long iters, const float *a, const float *b, float *out) {{
    int nthreads = 1;
    #pragma omp parallel num_threads(SO_THREADS)
    {{
        int t = omp_get_thread_num();
        #pragma omp single
        nthreads = omp_get_num_threads();
{decl}
        for (long i = 0; i < iters; i++) {{{reset if write_back else ""}
            for (int k = 0; k < {steps}; k++) {{
                const float *ak = a + k * {rows};
                const vf *bk = (const vf *)(b + (long)k * {vectors * lanes});
{loads}
{fmas}
            }}{add_back if write_back else ""}
        }}{"" if write_back else chr(10) + store}
    }}
    return nthreads;
}}
"""


# -- cache ----------------------------------------------------------------------------------------------


def _cache_path(kind: str, target: Target, compiler: CompilerConfig) -> Path:
    return Path(compiler.cache_dir) / "peak" / f"{kind}-{target.key()}.json"


def _lookup(kind: str, cls: type, target: Target, compiler: CompilerConfig, refresh: bool) -> tuple[Path, object | None]:
    """The cache file of ``kind`` for ``target``, and its result unless ``refresh`` (None when absent)."""
    path = _cache_path(kind, target, compiler)
    return path, None if refresh else _load_cached(path, cls)


def _load_cached(path: Path, cls: type) -> object | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("version") != CACHE_VERSION:
        return None
    names = {f.name for f in fields(cls)} - {"from_cache"}
    try:
        return cls(**{k: d[k] for k in names}, from_cache=True)
    except (KeyError, TypeError):
        return None


def _store(path: Path, result: PeakResult | BandwidthResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.time_ns()}.tmp")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, **result.to_dict()}, indent=1))
    tmp.replace(path)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


# -- FMA ceiling ----------------------------------------------------------------------------------------


class FmaKernel:
    """The compiled FMA-chain kernel of one target (vector width, accumulator count)."""

    def __init__(self, target: Target, compiler: CompilerConfig | None = None) -> None:
        self.target = target
        self.lanes = target.lanes("float32")
        self.accumulators = accumulator_count(target)
        so = compile_library([fma_source(self.lanes, self.accumulators)], compiler or CompilerConfig(), target)
        self.lib = load_library(so)
        self.lib.so_fma_peak.restype = ctypes.c_int
        self.lib.so_fma_peak.argtypes = [ctypes.c_long, ctypes.c_float, ctypes.c_float, ctypes.c_float,
                                         ctypes.c_void_p]

    def run(self, iterations: int, threads: int, m: float = 0.999, c: float = 1e-3,
            init: float = 0.0) -> tuple[np.ndarray, int]:
        """Run once; returns the accumulators (threads, accumulators, lanes) and the threads that ran."""
        self.lib.so_set_threads(ctypes.c_int(threads))
        out = aligned_empty((threads, self.accumulators, self.lanes), np.float32)
        out.fill(np.nan)
        ran = self.lib.so_fma_peak(iterations, m, c, init, out.ctypes.data)
        return out[:ran], ran

    def flops(self, iterations: int, threads_ran: int) -> int:
        """Floating-point operations of one run."""
        return threads_ran * iterations * self.accumulators * self.lanes * 2

    def calibrate(self, threads: int, min_s: float) -> tuple[int, float, int]:
        """Iterations, doubled from 4096, until a run lasts ``min_s``; with that run's time and thread count."""
        iters = 1 << 12
        while True:
            t0 = time.perf_counter()
            _, ran = self.run(iters, threads)
            dt = time.perf_counter() - t0
            if dt >= min_s or iters >= 1 << 40:
                return iters, dt, ran
            iters *= 2

    def gflops(self, threads: int, seconds: float, repeats: int = 5) -> tuple[float, int, float]:
        """Best GFLOP/s over ``repeats`` runs of about ``seconds / repeats`` each; also the iteration
        count and time of the best run."""
        iters, dt, _ = self.calibrate(threads, 0.02)
        iters = max(1, int(iters * (seconds / max(repeats, 1)) / dt))
        best = (0.0, iters, 0.0)
        for _ in range(max(repeats, 1)):
            t0 = time.perf_counter()
            _, ran = self.run(iters, threads)
            dt = time.perf_counter() - t0
            g = self.flops(iters, ran) / dt / 1e9
            if g > best[0]:
                best = (g, iters, dt)
        return best


def fma_peak_gflops(target: Target, compiler: CompilerConfig | None = None, *, seconds: float = 0.3,
                    refresh: bool = False) -> PeakResult:
    """Peak float32 FMA GFLOP/s with ``target.threads`` threads (and with one), cached per target."""
    compiler = compiler or CompilerConfig()
    path, cached = _lookup("fma", PeakResult, target, compiler, refresh)
    if cached is not None:
        return cached
    k = FmaKernel(target, compiler)
    g1, iters, dt = k.gflops(1, seconds / 2)
    g = g1
    if target.threads > 1:
        g, iters, dt = k.gflops(target.threads, seconds / 2)
        # a shared machine steals cores at random: a ceiling is the best observed, so retry a poor scaling
        for _ in range(RETRIES):
            if g >= GOOD_SCALING * min(target.threads, target.cores) * g1:
                break
            g, iters, dt = max((g, iters, dt), k.gflops(target.threads, seconds / 2))
    res = PeakResult(g, g1, target.threads, target.cores, target.vector_bits, k.lanes, k.accumulators, iters, dt, _now())
    _store(path, res)
    return res


# -- register-tile ceiling -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TilePeakResult(_Measured):
    gflops: float  # best, all ``threads`` threads
    gflops_1t: float  # best, one thread
    fma_fraction: float  # median over alternating rounds of tile / FMA-chain throughput (all threads)
    rows: int
    vectors: int
    lanes: int
    threads: int
    rounds: int
    measured_at: str = ""
    from_cache: bool = False


class TileKernel:
    """The compiled register-tile kernel of one target, with its operands (in L1 at the default ``steps``; the
    vector operand is ``steps`` x the tile's width, 256 KiB at 1024 steps of 4 x 16 lanes: in L2, as sgemm's
    packed panel). ``write_back``: every sweep writes its tile back (:func:`tile_source`)."""

    def __init__(self, target: Target, compiler: CompilerConfig | None = None, steps: int = TILE_STEPS,
                 shape: tuple[int, int] | None = None, write_back: bool = False) -> None:
        self.lanes = target.lanes("float32")
        self.rows, self.vectors = shape or tile_shape(target)
        self.steps = steps
        self.write_back = write_back
        so = compile_library([tile_source(self.lanes, self.rows, self.vectors, steps, write_back)],
                             compiler or CompilerConfig(), target)
        self.lib = load_library(so)
        self.lib.so_tile_peak.restype = ctypes.c_int
        self.lib.so_tile_peak.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        rng = np.random.default_rng(0)
        self.a = aligned_empty((steps, self.rows), np.float32)
        self.a[...] = rng.uniform(-1e-3, 1e-3, self.a.shape)
        self.b = aligned_empty((steps, self.vectors, self.lanes), np.float32)
        self.b[...] = rng.uniform(-1e-3, 1e-3, self.b.shape)

    @property
    def flops_per_iteration(self) -> int:
        return self.steps * self.rows * self.vectors * self.lanes * 2

    def run(self, iterations: int, threads: int) -> tuple[np.ndarray, int]:
        """Run once; returns the accumulators (threads, rows, vectors, lanes) and the threads that ran."""
        self.lib.so_set_threads(ctypes.c_int(threads))
        out = aligned_empty((threads, self.rows, self.vectors, self.lanes), np.float32)
        out.fill(0.0 if self.write_back else np.nan)
        ran = self.lib.so_tile_peak(iterations, self.a.ctypes.data, self.b.ctypes.data, out.ctypes.data)
        return out[:ran], ran

    def gflops(self, threads: int, iterations: int) -> float:
        t0 = time.perf_counter()
        _, ran = self.run(iterations, threads)
        return ran * iterations * self.flops_per_iteration / (time.perf_counter() - t0) / 1e9

    def calibrate(self, seconds: float) -> int:
        """Iterations for one run of about ``seconds``."""
        iters = 16
        while True:
            t0 = time.perf_counter()
            self.run(iters, 1)
            dt = time.perf_counter() - t0
            if dt >= 0.02 or iters >= 1 << 40:
                return max(1, int(iters * seconds / dt))
            iters *= 2


def tile_peak_gflops(target: Target, compiler: CompilerConfig | None = None, *, rounds: int = 7,
                     seconds: float = 0.04, refresh: bool = False) -> TilePeakResult:
    """The register tile's GFLOP/s (best of ``rounds``, all threads and one) and its median ratio to the
    FMA-chain kernel's, the two timed in alternation for ``rounds`` rounds of about ``seconds`` each;
    cached per target."""
    compiler = compiler or CompilerConfig()
    path, cached = _lookup("tile", TilePeakResult, target, compiler, refresh)
    if cached is not None:
        return cached
    tile, fma = TileKernel(target, compiler), FmaKernel(target, compiler)
    t_iters = tile.calibrate(seconds)
    f_iters = max(1, int(t_iters * tile.flops_per_iteration / (fma.accumulators * fma.lanes * 2)))
    best = best_1t = 0.0
    ratios = []
    for _ in range(max(rounds, 1)):
        t0 = time.perf_counter()
        _, ran = fma.run(f_iters, target.threads)
        f = ran * f_iters * fma.accumulators * fma.lanes * 2 / (time.perf_counter() - t0) / 1e9
        g = tile.gflops(target.threads, t_iters)
        best = max(best, g)
        ratios.append(g / f)
        best_1t = max(best_1t, tile.gflops(1, t_iters // 2 or 1))
    res = TilePeakResult(best, best_1t, float(np.median(ratios)), tile.rows, tile.vectors, tile.lanes, target.threads,
                         len(ratios), _now())
    _store(path, res)
    return res


def tile_shapes(target: Target) -> list[tuple[int, int]]:
    """For 1 to 6 vectors a row, the most rows (at most 16) whose accumulators, the row's vectors and a
    broadcast fit the register file, where that makes at least ``Target.fma_chains`` accumulators."""
    regs = target.vector_registers
    shapes = [(min(16, (regs - v - 1) // v), v) for v in range(1, 7)]
    return [(r, v) for r, v in shapes if r >= 1 and r * v >= target.fma_chains]


def tile_sweep(target: Target, compiler: CompilerConfig | None = None, *, rounds: int = 5,
               seconds: float = 0.03) -> list[tuple[int, int, float]]:
    """(rows, vectors, median ratio to the FMA-chain kernel) of every tile of :func:`tile_shapes` that fills
    the register file, each timed in alternation with the chains on all the target's threads: the most any
    register-tiled kernel fed from L1 reaches here. Not cached."""
    compiler = compiler or CompilerConfig()
    fma = FmaKernel(target, compiler)
    return [(*shape, _median_ratio(TileKernel(target, compiler, shape=shape), fma, target.threads, rounds, seconds))
            for shape in tile_shapes(target)]


WRITE_BACK_STEPS = (64, 256, 1024)  # attention's head dimension; a blocked reduction; sgemm's whole reduction


def tile_write_back_sweep(target: Target, compiler: CompilerConfig | None = None, *,
                          steps: tuple[int, ...] = WRITE_BACK_STEPS, rounds: int = 5,
                          seconds: float = 0.03) -> list[tuple[int, float, float]]:
    """(steps, tile alone, tile written back): for each reduction length, the default tile's median ratio to the
    FMA chains without and with a write-back every ``steps`` steps (zeroed accumulators, then a load, add and
    store a vector), each timed in alternation with the chains on all the target's threads. The second is the
    most a contraction whose tiles reduce over ``steps`` can reach here: attention's 64-long reductions pay the
    write-back every 64 steps; at 1024 steps the vector operand (256 KiB on AVX-512) streams from L2, as
    sgemm's packed panel does. Not cached."""
    compiler = compiler or CompilerConfig()
    fma = FmaKernel(target, compiler)
    return [(n, *(_median_ratio(TileKernel(target, compiler, steps=n, write_back=wb), fma, target.threads, rounds,
                                seconds) for wb in (False, True))) for n in steps]


def _median_ratio(tile: TileKernel, fma: FmaKernel, threads: int, rounds: int, seconds: float) -> float:
    """Median over ``rounds`` alternating rounds of ``tile``'s GFLOP/s over the FMA chains', on ``threads``."""
    t_iters = tile.calibrate(seconds)
    f_iters = max(1, int(t_iters * tile.flops_per_iteration / (fma.accumulators * fma.lanes * 2)))
    ratios = []
    for _ in range(max(rounds, 1)):
        t0 = time.perf_counter()
        _, ran = fma.run(f_iters, threads)
        f = ran * f_iters * fma.accumulators * fma.lanes * 2 / (time.perf_counter() - t0) / 1e9
        ratios.append(tile.gflops(threads, t_iters) / f)
    return float(np.median(ratios))


# -- memory bandwidth -----------------------------------------------------------------------------------


def _bandwidth_lib(target: Target, compiler: CompilerConfig) -> ctypes.CDLL:
    lib = load_library(compile_library([BANDWIDTH_SOURCE], compiler, target))
    lib.so_triad.argtypes = [ctypes.c_long, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.so_copy.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    lib.so_fill.argtypes = [ctypes.c_long, ctypes.c_float, ctypes.c_void_p]
    for f in (lib.so_triad, lib.so_copy, lib.so_fill):
        f.restype = None
    return lib


def _first_touched(lib: ctypes.CDLL, n: int, count: int) -> list[np.ndarray]:
    """``count`` aligned float32 buffers of ``n`` elements, first touched (filled) by the threads that will
    stream them (``lib``'s thread count), so their pages sit where those threads run."""
    bufs = [aligned_empty((n,), np.float32) for _ in range(count)]
    for i, x in enumerate(bufs):
        lib.so_fill(n, float(i), x.ctypes.data)
    return bufs


def default_array_bytes(target: Target) -> int:
    """Each of the three arrays: 4x the last-level cache, at least 64 MiB."""
    return max(4 * target.l3_bytes, 64 << 20)


class CopyKernel:
    """The bandwidth library's copy ``a = b`` over two buffers of ``array_bytes`` each, on ``target.threads``
    threads: a probe of the copy bound that a benchmark times as one more system of its alternating rounds,
    so that a memory-bound kernel and its bound are measured alike (medians, under the same load)."""

    def __init__(self, target: Target, array_bytes: int, compiler: CompilerConfig | None = None) -> None:
        self.lib = _bandwidth_lib(target, compiler or CompilerConfig())
        self.threads = target.threads
        self.n = max(array_bytes // 4, 16)
        self.lib.so_set_threads(ctypes.c_int(self.threads))
        self.a, self.b = _first_touched(self.lib, self.n, 2)

    @property
    def bytes_moved(self) -> int:
        """Bytes one call reads and writes (4 per element each way; a write's read for ownership not counted)."""
        return 8 * self.n

    def run(self) -> None:
        self.lib.so_set_threads(ctypes.c_int(self.threads))
        self.lib.so_copy(self.n, self.a.ctypes.data, self.b.ctypes.data)


def measure_bandwidth(target: Target, compiler: CompilerConfig | None = None, *, array_bytes: int | None = None,
                      repeats: int = 5, refresh: bool = False) -> BandwidthResult:
    """Streaming triad and copy bandwidth (best of ``repeats``) with ``target.threads`` threads, cached."""
    compiler = compiler or CompilerConfig()
    path, cached = _lookup("bandwidth", BandwidthResult, target, compiler, refresh or array_bytes is not None)
    if cached is not None:
        return cached
    nbytes = array_bytes or default_array_bytes(target)
    n = nbytes // 4
    lib = _bandwidth_lib(target, compiler)
    lib.so_set_threads(ctypes.c_int(target.threads))
    a, b, c = _first_touched(lib, n, 3)
    triad = copy = 0.0
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        lib.so_triad(n, 3.0, a.ctypes.data, b.ctypes.data, c.ctypes.data)
        triad = max(triad, 12 * n / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        lib.so_copy(n, a.ctypes.data, b.ctypes.data)
        copy = max(copy, 8 * n / (time.perf_counter() - t0) / 1e9)
    res = BandwidthResult(triad, copy, target.threads, 4 * n, _now())
    if array_bytes is None:
        _store(path, res)
    return res


def memory_bandwidth_gbs(target: Target, compiler: CompilerConfig | None = None, *, refresh: bool = False) -> float:
    """Streaming (triad) memory bandwidth in GB/s with ``target.threads`` threads, cached per target."""
    return measure_bandwidth(target, compiler, refresh=refresh).triad_gbs


__all__ = ["PeakResult", "BandwidthResult", "TilePeakResult", "FmaKernel", "TileKernel", "CopyKernel", "fma_peak_gflops",
           "tile_peak_gflops", "measure_bandwidth", "memory_bandwidth_gbs", "accumulator_count", "fma_source",
           "tile_shape", "tile_source"]
