"""Compile CUDA sources with nvcc (to a cubin, PTX or an object), cached on disk by content hash.

Many kernels go into one translation unit (one nvcc start): a compile check of a whole op table
takes one invocation. :class:`NvccError` carries nvcc's message and the source.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from superopt.codegen.cuda_emit import CUDA_PRELUDE, CudaSource


class NvccError(RuntimeError):
    """nvcc rejected generated CUDA (a bug in codegen: the source is attached) or is missing."""

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "superopt" / "cuda"


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "nvcc").exists():
            return str(Path(root, "bin", "nvcc"))
    return None


@dataclass(frozen=True)
class NvccConfig:
    arch: str = "sm_90"
    flags: tuple[str, ...] = ("-O3", "-std=c++17", "--use_fast_math=false")
    cache_dir: Path = field(default_factory=default_cache_dir)
    timeout_s: float = 300.0


def translation_unit(sources: list[CudaSource]) -> str:
    return CUDA_PRELUDE + "\n" + "\n".join(s.code for s in sources)


def compile_cuda(code: str, kind: str = "cubin", config: NvccConfig | None = None) -> Path:
    """Compile one CUDA translation unit (prelude included) to ``kind`` (``cubin``, ``ptx`` or ``o``) for
    ``config.arch``; returns the cached file. Raises :class:`NvccError`."""
    config = config or NvccConfig()
    nvcc = find_nvcc()
    if nvcc is None:
        raise NvccError("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    flags = [f for f in config.flags if f != "--use_fast_math=false"]
    h = hashlib.sha256(" ".join([nvcc, config.arch, kind, *flags]).encode() + code.encode()).hexdigest()[:32]
    cache = Path(config.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{h}.{kind}"
    if out.exists() and out.stat().st_size > 0:
        return out
    mode = {"cubin": "-cubin", "ptx": "-ptx", "o": "-c"}[kind]
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src = Path(tmp) / "kernels.cu"
        src.write_text(code)
        tmp_out = Path(tmp) / f"out.{kind}"
        cmd = [nvcc, mode, f"-arch={config.arch}", *flags, str(src), "-o", str(tmp_out)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=config.timeout_s)
        except subprocess.TimeoutExpired:
            raise NvccError(f"nvcc timed out after {config.timeout_s}s", code) from None
        if res.returncode != 0:
            raise NvccError(f"nvcc failed: {res.stderr.strip()[:3000]}", code)
        os.replace(tmp_out, out)
    (cache / f"{h}.cu").write_text(code)
    return out
