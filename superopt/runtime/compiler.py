"""Compile C sources into shared libraries, cached on disk by content hash.

A cache entry is ``<digest>.so`` plus ``<digest>.sha256`` (the library's own hash): a missing,
truncated or otherwise corrupt entry fails that check (or fails to load) and is rebuilt.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from superopt.codegen.c_emit import PRELUDE
from superopt.runtime.target import Target, compiler_version, host_target

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
    timeout_s: float = 120.0


class CompileError(RuntimeError):
    """The C compiler rejected generated code (a bug in codegen: the source is attached)."""

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


def library_source(sources: list[str]) -> str:
    return PRELUDE + "\n" + "\n".join(sources)


def _digest(code: str, config: CompilerConfig) -> str:
    h = hashlib.sha256()
    h.update(" ".join((config.cc, compiler_version(config.cc), *config.flags)).encode())
    h.update(code.encode())
    return h.hexdigest()[:32]


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compile_library(sources: list[str], config: CompilerConfig | None = None, target: Target | None = None) -> Path:
    """Compile (or fetch from cache) one shared library holding all ``sources``, for ``target``
    (None: this machine); the target's flags are part of the cache key."""
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
                return so
        except OSError:
            pass
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src = Path(tmp) / "kernels.c"
        src.write_text(code)
        out = Path(tmp) / "lib.so"
        cmd = [config.cc, *config.flags, str(src), "-o", str(out), "-lm"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=config.timeout_s)
        except subprocess.TimeoutExpired:
            raise CompileError(f"C compiler timed out after {config.timeout_s}s", code) from None
        if res.returncode != 0:
            raise CompileError(f"C compilation failed: {res.stderr.strip()[:2000]}", code)
        os.replace(out, so)
        sha.write_text(_file_sha(so))
    (cache / f"{digest}.c").write_text(code)
    return so


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
