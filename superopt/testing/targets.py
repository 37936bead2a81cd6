"""Fixed targets for tests that assert the schedule a heuristic picks.

A schedule is a function of the target: its vector width and register file and its caches. A test that expects one
schedule builds it for :func:`xeon_avx512`, the machine its expectation was measured on, whatever the host is,
and compiles and runs it for the host (``superopt.target.host_target``), so that it passes on an AVX2 host too.
"""

from __future__ import annotations

from dataclasses import replace

from superopt.target import Target, avx512_target


def xeon_avx512(threads: int = 2) -> Target:
    """A 2-core AVX-512 Xeon: 32 vector registers of 16 float lanes, 48 KiB of L1, 2 MiB of L2 a core, 300 MiB of L3."""
    return replace(avx512_target(threads), cpu_model="Intel(R) Xeon(R) Processor", l1_bytes=48 << 10,
                   l2_bytes=2 << 20, l3_bytes=300 << 20)


def avx2(threads: int = 2) -> Target:
    """An AVX2 machine: 16 vector registers of 8 float lanes, :func:`superopt.target.avx512_target`'s caches. Its
    kernels run on AVX2 and AVX-512 hosts alike."""
    return replace(avx512_target(threads), cpu_model="x86-64 AVX2", isa_flags=("avx2", "fma"), vector_bits=256,
                   vector_registers=16)
