"""A short indented text view of a loop nest, for people (debugging, docs, test expectations).

    stage C
      loop i_o 16 parallel
        ...
            accumulate acc[32*i_i + j_i] += (* A B)
"""

from __future__ import annotations

from superopt.ir.expr import Affine
from superopt.loopnest.alloc import Alloc, Fill
from superopt.loopnest.index import BufferAccess, RegisterRef
from superopt.loopnest.kernel import LoopNest
from superopt.loopnest.loop import Loop
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
from superopt.loopnest.values import IndexNumber, Literal, Load, Value


def _lin(e: Affine) -> str:
    return str(e.simplify()).replace("+", " + ")


def _ref(r: BufferAccess | RegisterRef) -> str:
    if isinstance(r, RegisterRef):
        return r.name if r.index is None else f"{r.name}[{_lin(r.index)}]"
    return r.buffer


def _value(v: Value) -> str:
    if isinstance(v, Literal):
        return repr(v.value)
    if isinstance(v, IndexNumber):
        return f"({_lin(v.index)})"
    if isinstance(v, Load):
        return _ref(v.source) + ("?" if v.checks else "")
    return f"({v.op} {' '.join(_value(a) for a in v.args)})"


def _lines(n: Node, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(n, StageNest):
        out.append(f"{pad}stage {n.stage}")
        for c in n.body:
            _lines(c, depth + 1, out)
    elif isinstance(n, Scope):
        out.append(f"{pad}scope")
        for c in n.body:
            _lines(c, depth + 1, out)
    elif isinstance(n, PeeledLoop):
        cond = "".join(f" if {_lin(t.offset)} + {extent} <= {t.limit}" for extent, t in n.outer_full)
        out.append(f"{pad}peeled {n.loop.var} < {n.split}{cond}: full tiles" + (", in one loop" if n.branch else ""))
        _lines(n.loop, depth + 1, out)
        if n.middle is not None:
            out.append(f"{pad}else {n.loop.var} < {n.split}: constant rows, bounded stores")
            for c in n.middle:
                _lines(c, depth + 1, out)
        if n.last is not None:
            out.append(f"{pad}if full, the last tile with constant tails")
            for c in n.last:
                _lines(c, depth + 1, out)
        out.append(f"{pad}then the rest")
        for c in n.general:
            _lines(c, depth + 1, out)
    elif isinstance(n, Loop):
        extra = "".join(f" tail<{t.limit}-({_lin(t.offset)})" for t in n.tail)
        extra += "".join(f" reduction({r.op}:{r.var})" for r in n.reductions)
        out.append(f"{pad}loop {n.var} {n.extent} {n.kind}{' reduce' if n.reduce else ''}{extra}")
        for c in n.body:
            _lines(c, depth + 1, out)
    elif isinstance(n, Alloc):
        out.append(f"{pad}alloc {n.kind} {n.name} {n.dtype}[{n.size}]")
    elif isinstance(n, Fill):
        out.append(f"{pad}fill {n.buffer}[{n.size}] = {n.value.value!r}{' parallel' if n.parallel else ''}")
    elif isinstance(n, Guard):
        conds = " and ".join(f"{_lin(g.index)} < {g.limit}" for g in n.conds)
        out.append(f"{pad}if {conds}")
        _lines(n.body, depth + 1, out)
    elif isinstance(n, Epilogue):
        out.append(f"{pad}epilogue {n.stage}")
        _lines(n.body, depth + 1, out)
    elif isinstance(n, Assign):
        out.append(f"{pad}assign {_ref(n.target)} = {_value(n.value)}")
    elif isinstance(n, Accumulate):
        flag = f" nan-flag {n.nan_flag}" if n.nan_flag else ""
        out.append(f"{pad}accumulate {_ref(n.target)} {n.op} {_value(n.value)}{flag}")
    elif isinstance(n, WriteBack):
        out.append(f"{pad}write-back {_ref(n.target)} {n.op or '='} {_ref(n.source)}")
    elif isinstance(n, RestoreNan):
        out.append(f"{pad}restore-nan {_ref(n.target)} if {n.flag}")
    elif isinstance(n, SplitIndex):
        out.append(f"{pad}let {n.var} = {n.outer}*{n.factor} + {n.inner}")
    elif isinstance(n, Prefetch):
        out.append(f"{pad}prefetch {_ref(n.access)} locality {n.locality}")
    elif isinstance(n, CombineLanes):
        out.append(f"{pad}combine-lanes {_ref(n.target)} {n.op}= {n.source}[{n.lanes}]")
    elif isinstance(n, BoxSlot):
        out.append(f"{pad}let {n.buffer} = this thread's {n.slot} elements of {n.workspace}")
    elif isinstance(n, PackBox):
        counts = ", ".join(" min ".join(str(t) for t in terms) for terms in n.counts)
        who = "every thread packs" if n.every_thread else "pack"
        out.append(f"{pad}{who} box of {n.tensor} from {n.base} ({counts}) into its slot of {n.workspace}")
    else:
        out.append(f"{pad}{n!r}")


def outline(nest: LoopNest) -> str:
    out = [f"workspace {a.name} {a.dtype}[{a.size}]" for a in nest.workspace]
    for s in nest.body:
        _lines(s, 0, out)
    out += [f"pack {p.tensor} -> {[n for _, n in p.loops]}" for p in nest.packs]
    out += [f"box pack {p.tensor} -> {[n for _, n in p.loops]}" for p in nest.box_packs]
    return "\n".join(out)
