"""The machine a kernel is scheduled, compiled and timed for, passed explicitly everywhere.

A :class:`Target` is read from the machine once (:func:`host_target`) or built by hand (tests,
cross-compilation, another machine's database records). Every hardware number a scheduling or
codegen decision needs comes from here: no module holds a vector width, register count or cache
size of its own. :meth:`Target.key` is part of every kernel-cache and tuning-database key.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field, replace

# float32 lanes per vector register for the ISA levels codegen targets
_ISA_VECTOR_BITS = (("avx512f", 512), ("avx2", 256), ("avx", 256), ("sse2", 128))


@dataclass(frozen=True)
class GpuSpec:
    """The facts about a CUDA device that scheduling, legality and code generation need."""

    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    memory_bytes: int
    shared_memory_per_block: int  # without opting in to the larger dynamic carve-out
    shared_memory_per_block_optin: int
    shared_memory_per_sm: int
    max_threads_per_block: int
    max_threads_per_sm: int
    registers_per_block: int
    registers_per_sm: int
    max_registers_per_thread: int = 255
    warp_size: int = 32
    max_block_dims: tuple[int, int, int] = (1024, 1024, 64)
    max_grid_dims: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_local_bytes_per_thread: int = 512 << 10

    @property
    def arch(self) -> str:
        """The nvcc architecture: ``sm_90`` for compute capability 9.0."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def describe(self) -> str:
        return (f"{self.name} ({self.arch}, {self.sm_count} SMs, {self.memory_bytes / 2**30:.0f} GiB, "
                f"{self.shared_memory_per_block >> 10} KiB shared memory per block)")

    @classmethod
    def from_dict(cls, d: dict) -> GpuSpec:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        return cls(**kw)


@dataclass(frozen=True)
class Target:
    """A CPU (``kind='cpu'``) or a CUDA device (``kind='cuda'``, its facts in ``gpu``).

    A CPU target's dict (and so its :meth:`key`) has no ``gpu`` entry: CPU database keys are unchanged."""

    cpu_model: str = "generic"
    isa_flags: tuple[str, ...] = ()
    cores: int = 1
    threads: int = 1  # threads a kernel runs with (OpenMP)
    compiler: str = "gcc"
    compiler_version: str = "unknown"
    kind: str = "cpu"
    vector_bits: int = 256  # widest SIMD register codegen uses
    vector_registers: int = 16  # architectural SIMD registers (16 ymm; 32 zmm with AVX-512)
    l1_bytes: int = 32 << 10  # per core, data
    l2_bytes: int = 1 << 20  # per core
    l3_bytes: int = 8 << 20  # shared
    fma_units: int = 2  # vector FMA pipes per core (for roofline estimates)
    cache_line_bytes: int = 64  # the unit a prefetch fetches (schedule.Prefetch)
    extra: tuple[tuple[str, str], ...] = field(default=())  # free-form facts
    gpu: GpuSpec | None = None  # the device of a ``kind='cuda'`` target (None for a CPU)

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` per vector register."""
        size = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "int16": 2}.get(dtype, 4)
        return max(1, self.vector_bits // 8 // size)

    @property
    def max_tile_elements(self) -> int:
        """Largest register-tile (CacheWrite) a schedule may ask for: 8x the register file; beyond
        that the tile spills to the stack for good and the schedule is not worth compiling."""
        return 8 * self.vector_registers * self.lanes("float32")

    @property
    def fma_chains(self) -> int:
        """Independent FMA chains (accumulators) that keep every FMA pipe of a core busy: pipes times
        the FMA latency, 4 cycles on the x86 cores superopt targets (Skylake and later, Zen 2-4). A
        register tile with fewer waits on its own additions."""
        return 4 * self.fma_units

    @property
    def split_sum_lanes(self) -> int:
        """Partial sums of a split vector reduction: four registers' worth of float32."""
        return 4 * self.lanes("float32")

    def compile_flags(self) -> tuple[str, ...]:
        """Flags that make gcc emit code for this target's vector width."""
        return (f"-mprefer-vector-width={self.vector_bits}",)

    def with_threads(self, threads: int) -> Target:
        return replace(self, threads=threads)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["isa_flags"] = list(self.isa_flags)
        d["extra"] = [list(kv) for kv in self.extra]
        if self.gpu is None:
            del d["gpu"]  # CPU targets keep the dict (and key) they had before GPU fields existed
        if self.cache_line_bytes == 64:
            del d["cache_line_bytes"]  # likewise the usual line, so that tuning databases keep their keys
        else:
            d["gpu"]["compute_capability"] = list(self.gpu.compute_capability)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Target:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        kw["isa_flags"] = tuple(kw.get("isa_flags", ()))
        kw["extra"] = tuple(tuple(kv) for kv in kw.get("extra", ()))
        if kw.get("gpu") is not None:
            kw["gpu"] = GpuSpec.from_dict(kw["gpu"])
        return cls(**kw)

    def key(self) -> str:
        """A short stable digest of everything that changes which code is fastest (or legal)."""
        d = self.to_dict()
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        if self.gpu is not None:
            return self.gpu.describe()
        return (f"{self.cpu_model}, {self.vector_bits}-bit vectors x {self.vector_registers} registers, "
                f"{self.threads} thread(s) of {self.cores} core(s)")


def _cpuinfo() -> tuple[str, tuple[str, ...]]:
    model, flags = platform.processor() or "unknown", ()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", "", platform.processor()):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    wanted = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx", "sse4_2",
                              "sse2")
                    flags = tuple(sorted(x for x in line.split(":", 1)[1].split() if x.startswith(wanted)))
    except OSError:
        pass
    return model, flags


def _line_bytes(default: int = 64) -> int:
    """The L1 data cache's line size from sysfs."""
    try:
        return int(open("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size").read()) or default
    except (OSError, ValueError):
        return default


def _cache_bytes(level: str, default: int) -> int:
    """Size of a cache level from sysfs (index0 L1d, index2 L2, index3 L3)."""
    try:
        text = open(f"/sys/devices/system/cpu/cpu0/cache/{level}/size").read().strip()
    except OSError:
        return default
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        return int(text.rstrip("KMG")) * mult
    except ValueError:
        return default


@functools.lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


@functools.lru_cache(maxsize=16)
def host_target(threads: int = 2, cc: str = "gcc") -> Target:
    """This machine, read once (per threads/compiler)."""
    model, flags = _cpuinfo()
    bits = next((b for f, b in _ISA_VECTOR_BITS if f in flags), 128)
    return Target(cpu_model=model, isa_flags=flags, cores=os.cpu_count() or 1, threads=threads, compiler=cc,
                  compiler_version=compiler_version(cc), vector_bits=bits,
                  vector_registers=32 if bits == 512 else 16,
                  l1_bytes=_cache_bytes("index0", 32 << 10), l2_bytes=_cache_bytes("index2", 1 << 20),
                  l3_bytes=_cache_bytes("index3", 8 << 20), cache_line_bytes=_line_bytes())


def avx512_target(threads: int = 2) -> Target:
    """A fixed AVX-512 target (the machine the default heuristic was first tuned on): for tests and
    snapshot comparisons that must not depend on the host."""
    return Target(cpu_model="x86-64 AVX-512", isa_flags=("avx2", "avx512f", "fma"), cores=2, threads=threads,
                  vector_bits=512, vector_registers=32, l1_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20)


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    """``release 13.0, V13.0.88``-style line of ``nvcc --version`` ("unknown" without nvcc)."""
    try:
        text = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return next((ln.split(",", 1)[1].strip() for ln in text.splitlines() if "release" in ln), "unknown")


def cuda_target(gpu: GpuSpec) -> Target:
    """A CUDA target for ``gpu``: one thread per GPU thread; ``vector_bits`` 32 (one float32 lane per
    register) and 64 registers' worth of register tile per thread (``max_tile_elements`` 8 x 64 / 8)."""
    return Target(cpu_model=gpu.name, kind="cuda", cores=gpu.sm_count, threads=1, compiler="nvcc",
                  compiler_version=nvcc_version(), vector_bits=32, vector_registers=8,
                  l1_bytes=gpu.shared_memory_per_sm, l2_bytes=0, l3_bytes=0, fma_units=1, gpu=gpu)


H200 = GpuSpec(name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, memory_bytes=141 * 10**9,
               shared_memory_per_block=48 << 10, shared_memory_per_block_optin=227 << 10,
               shared_memory_per_sm=228 << 10, max_threads_per_block=1024, max_threads_per_sm=2048,
               registers_per_block=65536, registers_per_sm=65536)


def h200_target() -> Target:
    """A fixed sm_90 target (H200) for compile-only use: code generation and nvcc tests without a GPU."""
    return cuda_target(H200)
