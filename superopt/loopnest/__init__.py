"""The loop-nest IR: one explicit, target-independent tree per kernel, between lowering and printing.

``lower(compute, trace, target)`` applies a schedule (a :class:`~superopt.schedule.kernel_plan.KernelPlan`);
:func:`build_loopnest` turns the plan into a :class:`LoopNest` holding every structural decision
(loops with kinds and tail bounds, allocations, init / accumulate / write-back / epilogue,
flattened accesses with strides). Printers (C now, CUDA later) and the cost-model feature extractor
walk this tree; see :mod:`superopt.loopnest.walk`.

Modules: ``index`` (accesses, flat indices, strides), ``values`` (typed scalar values), ``loop``,
``alloc``, ``statements``, ``kernel`` (the root and pack routines), ``build`` (plan -> nest),
``versioning`` (full register tiles peeled from the tail), ``block_tests`` (the reduction-block test
a write-back nest runs under), ``collapse`` (nested reduction loops that every access walks as one,
printed as one by the C printer), ``rebuild`` (a nest rebuilt where a function replaces nodes), ``walk``
(traversal and summaries), ``outline`` (an indented text view for people).
"""

from superopt.loopnest.alloc import Alloc, Fill
from superopt.loopnest.build import build_loopnest
from superopt.loopnest.index import BufferAccess, FlatIndex, GuardCond, InBounds, RegisterRef, WrappedTerm
from superopt.loopnest.kernel import Joined, LoopNest, PackNest, PackStep, Param
from superopt.loopnest.loop import Loop, LoopKind, ReductionClause, TailLimit
from superopt.loopnest.outline import outline
from superopt.loopnest.statements import (
    Accumulate,
    Assign,
    BoxSlot,
    CombineLanes,
    Epilogue,
    Guard,
    Node,
    PackBox,
    PeeledLoop,
    Prefetch,
    RestoreNan,
    Scope,
    SplitIndex,
    StageNest,
    WriteBack,
)
from superopt.loopnest.values import IndexNumber, Literal, Load, Op, Value, op_counts
from superopt.loopnest.walk import AccessVisit, Visit, accesses, allocations, statement_ops, walk

__all__ = [
    "Accumulate", "AccessVisit", "Alloc", "Assign", "BoxSlot", "BufferAccess", "CombineLanes", "Epilogue", "Fill",
    "FlatIndex", "Guard", "GuardCond", "InBounds", "IndexNumber", "Joined", "Literal", "Load", "Loop", "LoopKind",
    "LoopNest", "Node", "Op", "PackBox", "PackNest", "PackStep", "Param", "PeeledLoop", "Prefetch", "ReductionClause",
    "RegisterRef", "RestoreNan",
    "Scope", "SplitIndex", "StageNest", "TailLimit", "Value", "Visit", "WrappedTerm", "WriteBack", "accesses", "allocations",
    "build_loopnest", "op_counts", "outline", "statement_ops", "walk",
]
