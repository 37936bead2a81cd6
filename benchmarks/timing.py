"""The benchmarks' timing helpers live in the package (``superopt bench`` uses them too)."""

from superopt.measure.timing import FULL, QUICK, TimingConfig, TimingResult, time_alternating

__all__ = ["FULL", "QUICK", "TimingConfig", "TimingResult", "time_alternating"]
