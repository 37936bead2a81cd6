"""Roofline arithmetic shared by the benchmarks: the bound of a kernel from the machine's ceilings.

A kernel of ``flops`` operations that must move ``bytes`` (its compulsory traffic: every operand read once,
the output written once) runs at most at ``min(compute ceiling, bandwidth x flops / bytes)``. The compute
ceiling is the FMA chains' (:func:`superopt.measure.peak.fma_peak_gflops`), or, where a contraction's register
tile is written back every N reduction steps, that ceiling times the written-back tile's fraction of it at the
nearest measured N (:func:`superopt.measure.peak.tile_write_back_sweep`). A memory-bound kernel (no reduction
worth a flop: a transposition, a sum over an axis) is judged by its bytes per second against the bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Ceilings:
    """The machine's limits a roofline is drawn from."""

    fma_gflops: float  # the FMA chains' GFLOP/s on all the threads
    bandwidth_gbs: float  # streaming bandwidth, GB/s
    # (reduction steps N, written-back tile GFLOP/s over the FMA chains') from the --tiles sweep; empty: unknown
    write_back: tuple[tuple[int, float], ...] = ()

    def tile_fraction(self, steps: int) -> tuple[int, float] | None:
        """(N, fraction) of the sweep point nearest to ``steps`` reduction steps on a log scale; None without a
        sweep. A reduction longer than the longest point uses that point (its panel already streams from L2)."""
        if not self.write_back or steps < 1:
            return None
        return min(self.write_back, key=lambda p: (abs(math.log(p[0]) - math.log(steps)), p[0]))

    def compute_gflops(self, steps: int | None = None) -> tuple[float, str]:
        """The compute ceiling for a kernel whose tiles reduce over ``steps`` steps, and its name."""
        tf = self.tile_fraction(steps) if steps else None
        if tf is None:
            return self.fma_gflops, "FMA chains"
        # the tile cannot outrun the chains: a sweep reading above 1 is the noise of a shared machine
        return self.fma_gflops * min(1.0, tf[1]), f"tile written back every {tf[0]}"


@dataclass(frozen=True)
class Roofline:
    """One kernel's bound and what sets it."""

    gflops: float  # the bound
    limit: str  # "FMA chains", "tile written back every N" or "bandwidth"
    intensity: float  # flops per compulsory byte

    def fraction(self, achieved_gflops: float) -> float:
        return achieved_gflops / self.gflops if self.gflops > 0 else math.nan


def roofline(flops: float, bytes_moved: float, ceilings: Ceilings, reduction_steps: int | None = None) -> Roofline:
    """``min(compute ceiling, bandwidth x intensity)`` for ``flops`` over ``bytes_moved`` compulsory bytes."""
    if bytes_moved <= 0:
        raise ValueError(f"a roofline needs the bytes a kernel moves, got {bytes_moved}")
    ai = flops / bytes_moved
    compute, name = ceilings.compute_gflops(reduction_steps)
    memory = ceilings.bandwidth_gbs * ai
    return Roofline(memory, "bandwidth", ai) if memory < compute else Roofline(compute, name, ai)


def bandwidth_fraction(bytes_moved: float, seconds: float, bandwidth_gbs: float) -> float:
    """The achieved bytes per second over the bandwidth."""
    return bytes_moved / seconds / 1e9 / bandwidth_gbs


def is_constant(a: np.ndarray) -> bool:
    """Every element equal (NaNs and infinities included as values): an output a check on values cannot tell from a
    kernel that wrote one number everywhere. A single element is not flagged."""
    flat = np.asarray(a).reshape(-1)
    if flat.size < 2:
        return False
    first = flat[0]
    if np.isnan(first):
        return bool(np.isnan(flat).all())
    return bool((flat == first).all())


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of the positive finite values (NaN where there is none)."""
    v = [x for x in values if x is not None and math.isfinite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else math.nan


__all__ = ["Ceilings", "Roofline", "roofline", "bandwidth_fraction", "is_constant", "geomean"]
