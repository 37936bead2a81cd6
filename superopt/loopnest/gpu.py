"""Loop-nest statements that only GPU schedules produce."""

from __future__ import annotations

from dataclasses import dataclass

from superopt.loopnest.index import RegisterRef


@dataclass(frozen=True)
class ThreadReduce:
    """All-reduce ``target`` with the reduction ``op`` (``+= *= max= min=``) across the threads of a block
    (axis x): every thread holds a partial (its share of a reduction loop bound to ``thread_x``) and ends
    with the whole. Every thread of the block reaches it (it sits outside any thread-dependent branch)."""

    target: RegisterRef
    op: str
    dtype: str
