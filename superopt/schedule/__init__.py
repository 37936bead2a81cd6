"""Schedules: replayable traces of small frozen records, serializable to JSON.

A schedule never changes what a kernel computes, only how; every trace must give the same result
as the unscheduled kernel (``tests/test_schedule_property.py`` draws random legal traces to check).
"""

from superopt.schedule.primitives import (
    CacheWrite,
    ComputeAt,
    Epilogue,
    Fuse,
    Inline,
    Pack,
    Parallel,
    Primitive,
    Reorder,
    Split,
    Unroll,
    Vectorize,
    trace_from_json,
    trace_to_json,
)

__all__ = [
    "CacheWrite", "ComputeAt", "Epilogue", "Fuse", "Inline", "Pack", "Parallel", "Primitive", "Reorder", "Split", "Unroll",
    "Vectorize", "trace_from_json", "trace_to_json",
]
