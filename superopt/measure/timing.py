"""Timing helpers: warm-up, calibration, alternation between systems, medians.

The machine is noisy and shared, so for one workload all systems are timed in
alternation (round-robin): every round times one sample of every system, and
the reported number is the median over rounds of the per-call time within a
sample.  A sample repeats the call ``k`` times, with ``k`` calibrated so that one
sample lasts at least ``min_sample_s`` seconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TimingConfig:
    warmup_calls: int = 3
    rounds: int = 15
    min_sample_s: float = 0.1
    max_calls_per_sample: int = 10_000
    # untimed calls before every sample: the previous system's runtime (torch's OpenMP pool, onnxruntime's
    # spinning thread pool) keeps its workers busy-waiting for a while after its last call; on a 2-core
    # machine that steals a core from whoever is timed next
    settle_calls: int = 1
    # a pause before every sample, after its settle calls' predecessor: a pool that spins while it waits (OpenBLAS's
    # threads spin for about 0.1 s after a call, an OpenMP pool under OMP_WAIT_POLICY=active for a while) goes to
    # sleep before another system's threads need its cores
    settle_s: float = 0.0
    # the clock of a sample: wall time by default; ``time.process_time`` (CPU seconds of this process, all its
    # threads) measures single-threaded systems on a machine that other work shares, where wall time counts
    # the time slices the others take
    clock: Callable[[], float] = time.perf_counter


QUICK = TimingConfig(warmup_calls=2, rounds=7, min_sample_s=0.04)
FULL = TimingConfig(warmup_calls=5, rounds=21, min_sample_s=0.2)


@dataclass
class TimingResult:
    median_s: float
    min_s: float
    samples_s: list[float] = field(default_factory=list)
    calls_per_sample: int = 1


def _calibrate(fn: Callable[[], object], cfg: TimingConfig) -> int:
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return int(min(cfg.max_calls_per_sample, max(1, round(cfg.min_sample_s / one))))


def time_alternating(fns: dict[str, Callable[[], object]], cfg: TimingConfig) -> dict[str, TimingResult]:
    """Time every callable in ``fns`` in alternation; returns per-call times."""
    for fn in fns.values():
        for _ in range(cfg.warmup_calls):
            fn()
    ks = {name: _calibrate(fn, cfg) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(cfg.rounds):
        # rotate the start so no system is always first after another one
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            fn, k = fns[name], ks[name]
            if cfg.settle_s > 0:
                time.sleep(cfg.settle_s)
            for _ in range(cfg.settle_calls):
                fn()
            t0 = cfg.clock()
            for _ in range(k):
                fn()
            samples[name].append((cfg.clock() - t0) / k)
    return {
        name: TimingResult(statistics.median(s), min(s), s, ks[name]) for name, s in samples.items()
    }
