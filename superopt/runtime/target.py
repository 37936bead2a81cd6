"""Description of the machine a kernel is compiled for and timed on."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Target:
    cpu_model: str
    isa_flags: tuple[str, ...]
    cores: int
    threads: int
    compiler: str
    compiler_version: str

    def to_dict(self) -> dict:
        return asdict(self)


def _cpuinfo() -> tuple[str, tuple[str, ...]]:
    model, flags = platform.processor() or "unknown", ()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", "", platform.processor()):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    wanted = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx", "sse4_2")
                    flags = tuple(sorted(x for x in line.split(":", 1)[1].split() if x.startswith(wanted)))
    except OSError:
        pass
    return model, flags


@functools.lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def host_target(threads: int = 2, cc: str = "gcc") -> Target:
    model, flags = _cpuinfo()
    return Target(model, flags, os.cpu_count() or 1, threads, cc, compiler_version(cc))
