"""Compile C sources into shared libraries, cached on disk by content hash.

A cache entry is ``<digest>.so`` plus ``<digest>.sha256`` (the library's own hash): a missing,
truncated or otherwise corrupt entry fails that check (or fails to load) and is rebuilt.

A library of many kernels is compiled as ``CompilerConfig.jobs`` translation units at once (each with the
prelude, the sources dealt out by size), then linked: gcc is single-threaded. inception_v1's 68 kernels took
82 s in one unit, 37 s in two at once on 2 cores (four or eight units, two at a time: 41-43 s).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from superopt.codegen.c_emit import PRELUDE
from superopt.codegen.c_prelude import THREAD_CONTROL
from superopt.phases import PhaseTimer, phase
from superopt.target import Target, compiler_version, host_target

# the target's own flags (vector width) are added by compile_library
DEFAULT_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC",
                 "-std=gnu11")


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "superopt" / "kernels"


@dataclass(frozen=True)
class CompilerConfig:
    cc: str = "gcc"
    flags: tuple[str, ...] = DEFAULT_FLAGS
    cache_dir: Path = field(default_factory=default_cache_dir)
    timeout_s: float = 120.0  # per translation unit
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)  # translation units compiled at once


class CompileError(RuntimeError):
    """The C compiler rejected generated code (a bug in codegen: the source is attached)."""

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


def library_source(sources: list[str]) -> str:
    """The whole library as one translation unit: the prelude, the thread control, the sources."""
    return PRELUDE + "\n" + THREAD_CONTROL + "\n".join(sources)


def translation_units(sources: list[str], jobs: int) -> list[str]:
    """``sources`` dealt into at most ``jobs`` units of similar size (largest first, each to the smallest
    unit), each unit with the prelude; the first also defines the thread control."""
    units: list[list[str]] = [[] for _ in range(max(1, min(jobs, len(sources))))]
    sizes = [0] * len(units)
    for src in sorted(sources, key=len, reverse=True):
        i = sizes.index(min(sizes))
        units[i].append(src)
        sizes[i] += len(src)
    return [library_source(units[0])] + [PRELUDE + "\n" + "\n".join(u) for u in units[1:]]


def _run_compilers(cmds: list[list[str]], jobs: int, timeout_s: float, code: str) -> None:
    """Run the compiler commands, ``jobs`` at a time; raise CompileError for the first that fails or times
    out (and stop the others: the whole process group, or gcc's cc1 keeps a core busy)."""
    pending, running = list(cmds), []
    failure: CompileError | None = None
    try:
        while (pending or running) and failure is None:
            while pending and len(running) < max(1, jobs):
                running.append((subprocess.Popen(pending.pop(0), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                 text=True, start_new_session=True), time.monotonic()))
            p, started = running.pop(0)
            try:
                _, err = p.communicate(timeout=max(0.0, started + timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                failure = CompileError(f"C compiler timed out after {timeout_s}s", code)
                running.append((p, started))
                break
            if p.returncode != 0:
                failure = CompileError(f"C compilation failed: {err.strip()[:2000]}", code)
    finally:
        for p, _ in running:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.communicate()
    if failure is not None:
        raise failure


def _digest(code: str, config: CompilerConfig) -> str:
    h = hashlib.sha256()
    h.update(" ".join((config.cc, compiler_version(config.cc), *config.flags)).encode())
    h.update(code.encode())
    return h.hexdigest()[:32]


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compile_library(sources: list[str], config: CompilerConfig | None = None, target: Target | None = None,
                    phases: PhaseTimer | None = None) -> Path:
    """Compile (or fetch from cache) one shared library holding all ``sources``, for ``target``
    (None: this machine); the target's flags are part of the cache key. ``phases``: charged the time as
    ``compile``, and counts ``libraries_compiled`` (cache misses)."""
    with phase(phases, "compile"):
        so = _compile_library(sources, config, target)
    if phases is not None and so[1]:
        phases.add("libraries_compiled")
    return so[0]


def _compile_library(sources: list[str], config: CompilerConfig | None, target: Target | None) -> tuple[Path, bool]:
    """The library's path, and whether it was compiled now (False: from the cache)."""
    config = config or CompilerConfig()
    target = target or host_target(cc=config.cc)
    config = replace(config, flags=(*config.flags, *target.compile_flags()))
    code = library_source(sources)
    digest = _digest(code, config)
    cache = Path(config.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    so, sha = cache / f"{digest}.so", cache / f"{digest}.sha256"
    if so.exists() and sha.exists():
        try:
            if sha.read_text().strip() == _file_sha(so):
                return so, False
        except OSError:
            pass
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        out = Path(tmp) / "lib.so"
        units = translation_units(sources, config.jobs)
        if len(units) == 1:
            src = Path(tmp) / "kernels.c"
            src.write_text(units[0])
            _run_compilers([[config.cc, *config.flags, str(src), "-o", str(out), "-lm"]], 1, config.timeout_s, code)
        else:
            objs = []
            for i, unit in enumerate(units):
                (Path(tmp) / f"kernels{i}.c").write_text(unit)
                objs.append(str(Path(tmp) / f"kernels{i}.o"))
            _run_compilers([[config.cc, *config.flags, "-c", str(Path(tmp) / f"kernels{i}.c"), "-o", o]
                            for i, o in enumerate(objs)], config.jobs, config.timeout_s, code)
            _run_compilers([[config.cc, *config.flags, *objs, "-o", str(out), "-lm"]], 1, config.timeout_s, code)
        os.replace(out, so)
        sha.write_text(_file_sha(so))
    (cache / f"{digest}.c").write_text(code)
    return so, True


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
