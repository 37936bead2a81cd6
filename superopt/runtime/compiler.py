"""Compile C sources into shared libraries, cached on disk by content hash.

A cache entry is ``<digest>.so`` plus ``<digest>.sha256`` (the library's own hash): a missing,
truncated or otherwise corrupt entry fails that check (or fails to load) and is rebuilt.

A library of many kernels is compiled one translation unit a source (each with the prelude; the short sources
share one), ``CompilerConfig.jobs`` units at once, then linked: gcc is single-threaded. Kernels that differ
only in constants (a network's convolutions over different channel counts) are compiled as one body
(:mod:`superopt.runtime.c_merge`). Each unit's object is cached by its own digest as
``objects/<digest>.o``, so a library that shares kernels with one built before (the same model changed in one
layer, another model with the same layers) compiles only its new kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from superopt.codegen.c_emit import PRELUDE
from superopt.codegen.c_prelude import THREAD_CONTROL
from superopt.phases import PhaseTimer, phase
from superopt.runtime.c_merge import merge_sources
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
    # kernels this long or longer that differ only in constants are compiled as one body (see c_merge);
    # None: none are. A shorter one (an element-wise kernel: one loop nest) costs gcc little, shares the
    # first unit anyway, and loses the most from a trip count read at run time (unrolled by a constant,
    # its loop streams faster)
    merge_min_chars: int | None = 8000


class CompileError(RuntimeError):
    """The C compiler rejected generated code (a bug in codegen: the source is attached)."""

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


class CompileDeadline(CompileError):
    """The caller's deadline ended the build (nothing is known of the code)."""

    def __init__(self, source: str = "") -> None:
        super().__init__("the caller's deadline ended the C compiler's run", source)


def library_source(sources: list[str]) -> str:
    """The whole library as one translation unit: the prelude, the thread control, the sources."""
    return PRELUDE + "\n" + THREAD_CONTROL + "\n".join(sources)


# a source shorter than this (a pack caller, a native extern, the graph runner, a small elementwise kernel) is
# compiled in the first unit with the other short ones: a unit of its own would cost more in compiler starts
# than its compilation
SMALL_SOURCE = 2000


def object_units(sources: list[str]) -> list[tuple[str, int]]:
    """The library's translation units and how many sources each holds: the thread control with the short
    sources, then each other distinct source on its own, each unit with the prelude. One unit a source makes
    each source's object cacheable on its own (a model that changes one kernel recompiles that kernel only)
    and gives the parallel compilers pieces small enough to keep every core busy to the end; the prelude is
    declarations and static inline helpers, which cost gcc next to nothing in a unit that does not call them."""
    distinct = list(dict.fromkeys(sources))
    small = [s for s in distinct if len(s) < SMALL_SOURCE]
    first = PRELUDE + "\n" + THREAD_CONTROL + "\n".join(small)
    return [(first, len(small))] + [(PRELUDE + "\n" + s, 1) for s in distinct if len(s) >= SMALL_SOURCE]


def _run_compilers(cmds: list[list[str]], jobs: int, timeout_s: float, code: str, deadline: float | None = None,
                   finished: Callable[[int], None] | None = None) -> None:
    """Run the compiler commands, ``jobs`` at a time; raise CompileError for the first that fails or times
    out (and stop the others: the whole process group, or gcc's cc1 keeps a core busy). ``deadline``
    (``time.monotonic()``): no command runs past it; ``finished(k)`` is called as command ``k`` succeeds."""
    pending, running = list(enumerate(cmds)), []
    failure: CompileError | None = None
    end = math.inf if deadline is None else deadline
    try:
        while (pending or running) and failure is None:
            while pending and len(running) < max(1, jobs):
                k, cmd = pending.pop(0)
                # stderr to a file, not a pipe: a compiler is waited on by polling, and a full pipe would block it
                err = tempfile.TemporaryFile(mode="w+")
                running.append((k, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                                    start_new_session=True), time.monotonic(), err))
            now = time.monotonic()
            for entry in list(running):  # whichever finishes first is handled first
                k, p, started, err = entry
                if p.poll() is None:
                    if now >= min(started + timeout_s, end):
                        failure = (CompileDeadline(code) if now >= end
                                   else CompileError(f"C compiler timed out after {timeout_s}s", code))
                        break
                    continue
                running.remove(entry)
                err.seek(0)
                msg = err.read()
                err.close()
                if p.returncode != 0:
                    failure = CompileError(f"C compilation failed: {msg.strip()[:2000]}", code)
                    break
                if finished is not None:
                    finished(k)
            else:
                if running and all(p.poll() is None for _, p, _, _ in running):
                    time.sleep(0.005)
    finally:
        for _, p, _, err in running:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            err.close()
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
                    phases: PhaseTimer | None = None, deadline: float | None = None) -> Path:
    """Compile (or fetch from cache) one shared library holding all ``sources``, for ``target``
    (None: this machine); the target's flags are part of the cache key. ``phases``: charged the time as
    ``compile``, counts ``libraries_compiled`` (library cache misses) and ``sources_compiled`` (the
    sources whose objects were not cached either). ``deadline`` (``time.monotonic()``): no compiler runs past
    it (:class:`CompileDeadline`); the objects finished by then are kept in the cache."""
    with phase(phases, "compile"):
        so, compiled = _compile_library(sources, config, target, deadline)
    if phases is not None and compiled is not None:
        phases.add("libraries_compiled")
        phases.add("sources_compiled", compiled)
    return so


def _valid(path: Path) -> bool:
    sha = path.with_suffix(".sha256")
    try:
        return path.exists() and sha.exists() and sha.read_text().strip() == _file_sha(path)
    except OSError:
        return False


def _store(built: Path, path: Path) -> None:
    """``built`` moved into the cache as ``path`` (atomic), with its hash beside it."""
    os.replace(built, path)
    path.with_suffix(".sha256").write_text(_file_sha(path))


def _compile_library(sources: list[str], config: CompilerConfig | None,
                     target: Target | None, deadline: float | None = None) -> tuple[Path, int | None]:
    """The library's path, and how many sources were compiled now (None: the library came from the
    cache). Each unit of :func:`object_units` is an object cached under its own digest; the misses are
    compiled ``config.jobs`` at a time (largest first), then all are linked."""
    config = config or CompilerConfig()
    target = target or host_target(cc=config.cc)
    config = replace(config, flags=(*config.flags, *target.compile_flags()))
    code = library_source(sources)
    cache = Path(config.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    so = cache / f"{_digest(code, config)}.so"
    if _valid(so):
        return so, None
    objects = cache / "objects"
    objects.mkdir(exist_ok=True)
    # (a merged body's unit counts no source: its members' wrappers, in the first unit, count them)
    bodies, wrapped = (([], sources) if config.merge_min_chars is None
                       else merge_sources(sources, config.merge_min_chars))
    grouped = object_units(wrapped) + [(PRELUDE + "\n" + body, 0) for body in bodies]
    units = [u for u, _ in grouped]
    counts = [n for _, n in grouped]
    paths = [objects / f"{_digest(u, config)}.o" for u in units]
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        def build(todo: list[int]) -> None:
            todo = sorted(todo, key=lambda i: -len(units[i]))
            cmds = []
            for k, i in enumerate(todo):
                src = Path(tmp) / f"kernels{k}.c"
                src.write_text(units[i])
                cmds.append([config.cc, *config.flags, "-c", str(src), "-o", str(Path(tmp) / f"kernels{k}.o")])
            # each object is cached as it is finished: one the caller's deadline cut short is built next time
            def keep(k: int) -> None:
                built = Path(tmp) / f"kernels{k}.o"
                if built.exists():  # (a compiler that wrote nothing fails at the link, naming the object)
                    _store(built, paths[todo[k]])

            _run_compilers(cmds, config.jobs, config.timeout_s, code, deadline, keep)

        todo = [i for i, p in enumerate(paths) if not _valid(p)]
        build(todo)
        out = Path(tmp) / "lib.so"
        link = [config.cc, *config.flags, *dict.fromkeys(str(p) for p in paths), "-o", str(out), "-lm"]
        try:
            _run_compilers([link], 1, config.timeout_s, code, deadline)
        except CompileDeadline:
            raise
        except CompileError:
            cached = [i for i in range(len(units)) if i not in todo]
            if not cached:
                raise
            build(cached)  # a cached object that no longer links (another compiler wrote it): built afresh
            _run_compilers([link], 1, config.timeout_s, code, deadline)
        _store(out, so)
    (cache / f"{so.stem}.c").write_text(code)
    return so, sum(counts[i] for i in todo)


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
