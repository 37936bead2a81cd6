"""A register tile printed as vectors: the C spelling of a tile whose vectorized loops hold whole vectors.

The loop nest's register tile (``Alloc`` of kind ``register_tile`` with the target's ``lanes``) is otherwise
printed as a float array that the vectorized loops update: GCC keeps the array in registers inside the
reduction loop, but stores it to the stack after it and reads it back for the write-back. Here the same loops
are printed over an array of GCC vectors (``so_v16 acc_vec[...]``): each vectorized loop of extent ``E``
becomes ``E / lanes`` unrolled steps of one vector, a read along the loop a vector load, a read constant
along it a scalar (broadcast; a padded read keeps its bounds checks), and the write-back stores the registers
straight to the output: one vector store where the output is contiguous along the loop, else one store a
lane (an NCHW conv's channels, capsule votes' columns through div/mod).

Nothing structural changes: the loops, their order and kinds, and every statement are the tree's; what
cannot be spelled this way (a tail, a guard, a loop of a part of a vector, a read neither contiguous nor
constant along the vector loop, an operation with no vector spelling here) leaves the whole tile to the
scalar printer, except a write-back loop whose last vector is partial (the last panel of 250 columns in
tiles of 64, its accumulation run whole over the zero-filled panel): its stores of that vector go lane by
lane up to the bound, and it may read nothing but the tile along the vector. A write-back nest of one kind of
reduction block (``loopnest.block_tests``) is printed under its block test, its statements without it.
With the float-array spelling gcc stores the tile to the stack after the reduction and copies it out, which
costs most where a tile's reduction is short (attention's two 64-step matmul tiles); long reductions (sgemm) hide it.
"""

from __future__ import annotations

import math

from superopt.codegen.c_emit import c_conds, c_linear, c_ref, c_value
from superopt.codegen.c_prelude import VECTOR_LANES, vector_op
from superopt.ir.expr import Affine
from superopt.loopnest import (
    Accumulate,
    Alloc,
    Assign,
    BufferAccess,
    Epilogue,
    Fill,
    Guard,
    IndexNumber,
    Literal,
    Load,
    Loop,
    Op,
    RegisterRef,
    Scope,
    WriteBack,
)
from superopt.loopnest.block_tests import hoisted_tests, without_tests

__all__ = ["vector_tile_lines"]

# A tile added into the output (written back once per reduction block) overlaps its last vector too, that vector
# adding only the lanes past the one before it; off, such a tile keeps the float array where its extent is no
# whole number of vectors (the last panel of a tile 64 wide over 153 columns: 25, a sixth of the work, unvectorized)
OVERLAP_ADDED_ONCE = True


class _NotVector(Exception):
    """The tile has something the vector spelling does not cover."""


def vector_tile_lines(scope: Scope) -> list[tuple[int, str]] | None:
    """(relative indent, line) of ``scope`` printed with its register tile as vectors, or None when the
    scope is not a register tile's or the tile cannot be spelled so."""
    body = scope.body
    if len(body) < 3 or not isinstance(body[0], Alloc) or not isinstance(body[1], Fill):
        return None
    tile, fill = body[0], body[1]
    if tile.kind != "register_tile" or tile.dtype != "float32" or tile.lanes not in VECTOR_LANES \
            or fill.buffer != tile.name:
        return None
    lanes = tile.lanes
    overlap = _overlap_extent(body[2:], lanes)
    if overlap is None and tile.lanes // 2 in VECTOR_LANES:
        # (a row shorter than a vector but longer than half of one: half vectors, the last overlapping, as a
        # depthwise conv's 14 columns in two vectors of 8)
        overlap = _overlap_extent(body[2:], tile.lanes // 2, shorter=tile.lanes)
        lanes = tile.lanes // 2 if overlap is not None else lanes
    pitch = None
    if overlap is not None:
        # (the tile's rows may lie further apart than the overlap extent: the last panel of a tile 64 wide is
        # 25 columns in rows 64 apart, held as 2 vectors a row)
        pitch = _row_pitch(body[2:], tile.name, overlap, tile.size)
        if pitch is None:
            return None
    if overlap is None and tile.size % tile.lanes:
        return None
    printer = _TilePrinter(tile.name, lanes, overlap, pitch)
    count = tile.size // lanes if overlap is None else tile.size // pitch * -(-overlap // lanes)
    try:
        lines = [(0, f"{printer.t} {printer.vec}[{count}];"),
                 (0, f"for (int {fill.var} = 0; {fill.var} < {count}; ++{fill.var}) "
                     f"{printer.vec}[{fill.var}] = ({printer.t}){{0}} + {c_value(fill.value)};")]
        for n in body[2:]:
            lines += printer.node(n, 0, None)
    except _NotVector:
        return None
    return lines


def _overlap_extent(body: tuple, lanes: int, shorter: int | None = None) -> int | None:
    """The extent ``E`` of the tile's vectorized loops where every one of them has it, ``lanes < E`` and ``E`` no
    multiple of ``lanes``, no tail bounds them, and the tile is only accumulated in registers and stored by plain
    assignment or added into the output (:data:`OVERLAP_ADDED_ONCE`): the loops then run as whole vectors, the last
    one starting at ``E - lanes`` so that it overlaps the one before instead of reading or writing past ``E`` (a
    depthwise conv's 28 columns as 16 + 16 from column 12). The overlapped columns are computed twice from the same
    operands, so both stores write the same values; where the tile is added in, the last vector adds only the lanes
    past the one before (``_TilePrinter.store``). None where that does not hold (or every extent is whole vectors)."""
    loops: list[Loop] = []
    ok = True

    def scan(n: object) -> None:
        nonlocal ok
        if isinstance(n, Loop):
            if n.kind == "vectorized":
                loops.append(n)
            for c in n.body:
                scan(c)
        elif isinstance(n, (Epilogue, Guard)):  # (a guarded write-back: a reduction block's read-modify-write)
            scan(n.body)
        elif isinstance(n, Accumulate):
            ok = ok and isinstance(n.target, RegisterRef)  # (a sum folded into memory would add twice)
        elif isinstance(n, WriteBack):  # (one added into the output adds the shared lanes once: _TilePrinter.store)
            ok = ok and (n.op is None or (n.op == "+=" and OVERLAP_ADDED_ONCE))
    for n in body:
        scan(n)
    extents = {lp.extent for lp in loops}
    if not ok or len(extents) != 1 or any(lp.tail for lp in loops):
        return None
    (e,) = extents
    if shorter is not None:  # (half vectors: only for rows shorter than a whole one)
        return e if lanes < e < shorter else None
    return e if e > lanes and e % lanes else None


def _row_pitch(body: tuple, name: str, overlap: int, size: int) -> int | None:
    """The distance between the rows of tile ``name`` whose vectorized loops run ``overlap`` columns: the largest
    divisor of ``size`` of at least ``overlap`` that every index of the tile, less its unit column term, is a
    multiple of (each row then starts a block of its own); None where there is none."""
    refs: list[Affine] = []

    def scan(n: object) -> None:
        if isinstance(n, RegisterRef):
            if n.name == name and n.index is not None:
                refs.append(n.index)
        elif isinstance(n, (tuple, list)):
            for c in n:
                scan(c)
        elif hasattr(n, "__dataclass_fields__"):
            for f in n.__dataclass_fields__:
                scan(getattr(n, f))
    scan(body)
    parts = [ix.const for ix in refs] + [c for ix in refs for v, c in ix.terms if c != 1]
    pitch = 0
    for c in parts:
        pitch = math.gcd(pitch, c)
    pitch = math.gcd(pitch, size)
    return pitch if pitch >= overlap else None


class _TilePrinter:
    def __init__(self, name: str, lanes: int, overlap: int | None = None, pitch: int | None = None) -> None:
        self.name, self.lanes = name, lanes
        self.vec = f"{name}_vec"
        self.t = f"so_v{lanes}"
        self.partial: str | None = None  # inside a write-back loop with a partial vector: its count of valid lanes
        self.overlap = overlap  # the vectorized loops' extent, their last vector overlapping (_overlap_extent)
        self.pitch = pitch or overlap  # the distance between the tile's rows (_row_pitch)

    def node(self, n: object, depth: int, col: str | None) -> list[tuple[int, str]]:
        if isinstance(n, Loop):
            return self.loop(n, depth, col)
        if col is None:  # statements run inside a vectorized loop
            raise _NotVector
        if isinstance(n, Epilogue):
            return [(depth, f"/* epilogue: {n.text} */"), *self.node(n.body, depth, col)]
        if isinstance(n, Accumulate):
            if n.op != "+=" or n.nan_flag is not None:
                raise _NotVector
            if isinstance(n.target, BufferAccess):
                # a sum folded into the write-back (a ReduceEpilogue): one vector of the output a step
                text, is_vec = self.expr(n.value, col)
                if not is_vec or _col_stride(n.target.index, col, self.lanes) != 1:
                    raise _NotVector
                return self.store(n.target, text, col, depth, True)
            if not self._is_tile(n.target):
                raise _NotVector
            ref = self.tile_ref(n.target, col)
            return [(depth, f"{ref} = {ref} + {self.expr(n.value, col)[0]};")]
        if isinstance(n, WriteBack):
            if n.op not in (None, "+=") or not self._is_tile(n.source):
                raise _NotVector
            return self.store(n.target, self.tile_ref(n.source, col), col, depth, n.op == "+=")
        if isinstance(n, Assign):
            text, is_vec = self.expr(n.value, col)
            if not is_vec:
                text = f"({self.t}){{0}} + {text}"
            if self._is_tile(n.target):
                return [(depth, f"{self.tile_ref(n.target, col)} = {text};")]
            if isinstance(n.target, BufferAccess):
                return self.store(n.target, text, col, depth, False)
        raise _NotVector

    def store(self, target: BufferAccess, vector: str, col: str, depth: int, add: bool) -> list[tuple[int, str]]:
        """``target = vector`` (``+=`` with ``add``) for the ``lanes`` elements from ``col``: one vector store
        where the target is contiguous along ``col``, else one scalar store a lane (an NCHW output written
        along its channels, capsule votes' (o, q) columns through div/mod)."""
        ref = c_ref(target)
        lanes = str(self.lanes) if self.partial is None else f"SO_MIN({self.lanes}, {self.partial})"
        first = "0"
        if add and self.overlap is not None:
            # (an overlapping last vector added into the output: the lanes the vector before it added already,
            # its first ``lanes * vec - col``, add nothing; 0 for every other vector, constant once unrolled)
            first = f"{self.lanes} * {col}_vec - {col}"
            vector = f"so_from{self.lanes}({vector}, {first})"
        by_lane = [(depth, "{"), (depth + 1, f"const {self.t} so_w = {vector};"), (depth + 1, f"const int so_c = {col};"),
                   (depth + 1, f"for (int so_l = {first}; so_l < {lanes}; ++so_l) {{"),
                   (depth + 2, f"const int {col} = so_c + so_l;"),
                   (depth + 2, f"{ref} = {f'{ref} + ' if add else ''}so_w[so_l];"),
                   (depth + 1, "}"), (depth, "}")]
        if self.overlap is not None and not _plain_along(target.index, col):
            raise _NotVector  # (a div/mod along an unaligned vector: no one spelling)
        if not _contiguous(target, col, self.lanes):
            return by_lane
        dst = f"&{ref}"
        whole = f"so_st{self.lanes}({dst}, {f'so_ld{self.lanes}({dst}) + ' if add else ''}{vector});"
        if self.partial is None:
            return [(depth, whole)]
        # (a partial vector: its valid lanes one by one; whole vectors before it as before)
        return [(depth, f"if ({self.partial} >= {self.lanes}) {whole}"), (depth, "else"),
                *[(d + 1, line) for d, line in by_lane]]

    def loop(self, lp: Loop, depth: int, col: str | None) -> list[tuple[int, str]]:
        tests = hoisted_tests(lp)
        if tests:  # (a write-back nest of one kind of reduction block: tested once, around it)
            return [(depth, f"if ({c_conds(tests)}) {{"), *self.loop(without_tests(lp, tests), depth + 1, col),
                    (depth, "}")]
        if (lp.tail and lp.kind != "vectorized") or lp.reductions or lp.kind not in ("serial", "unrolled", "vectorized"):
            raise _NotVector
        v = lp.var
        partial = None
        if lp.kind == "vectorized":
            if col is not None:
                raise _NotVector
            if (lp.tail or lp.extent % self.lanes) and self.overlap is None:
                if any(_accumulates(n) for n in lp.body):
                    raise _NotVector  # (only stores may stop short of a vector)
                partial = f"{v}_n"
            steps = -(-lp.extent // self.lanes)
            lines = [(depth, f"#pragma GCC unroll {steps}"),
                     (depth, f"for (int {v}_vec = 0; {v}_vec < {steps}; ++{v}_vec) {{"),
                     (depth + 1, f"const int {v} = {self.lanes} * {v}_vec;")]
            if self.overlap is not None:
                lines[-1] = (depth + 1, f"const int {v} = SO_MIN({self.lanes} * {v}_vec, {lp.extent - self.lanes});")
            if partial:
                bound = str(lp.extent)
                for t in lp.tail:
                    bound = f"SO_MIN({bound}, {t.limit} - ({c_linear(t.offset)}))"
                lines.append((depth + 1, f"const int {partial} = {bound} - {v};"))
            col = v
        else:
            lines = [(depth, f"#pragma GCC unroll {lp.extent}")] if lp.kind == "unrolled" else []
            lines.append((depth, f"for (int {v} = 0; {v} < {lp.extent}; ++{v}) {{"))
        self.partial, before = partial or self.partial, self.partial
        try:
            for n in lp.body:
                lines += self.node(n, depth + 1, col)
        finally:
            self.partial = before
        return [*lines, (depth, "}")]

    def _is_tile(self, ref: object) -> bool:
        return isinstance(ref, RegisterRef) and ref.name == self.name

    def tile_ref(self, ref: RegisterRef, col: str) -> str:
        """The vector of the tile that element ``ref`` starts: its index, moving by 1 along ``col``, over lanes."""
        ix = ref.index
        if ix is None or any(not isinstance(v, str) for v, _ in ix.terms) or ix.coeff(col) != 1:
            raise _NotVector
        terms = {v: c for v, c in ix.terms if v != col}
        if self.overlap is not None:  # (rows of ``overlap`` elements ``pitch`` apart, each held in whole vectors)
            e, steps = self.pitch, -(-self.overlap // self.lanes)
            if ix.const % e or any(c % e for c in terms.values()):
                raise _NotVector
            vec = Affine.of({**{v: c // e * steps for v, c in terms.items()}, f"{col}_vec": 1}, ix.const // e * steps)
            return f"{self.vec}[{c_linear(vec)}]"
        if ix.const % self.lanes or any(c % self.lanes for c in terms.values()):
            raise _NotVector
        vec = Affine.of({**{v: c // self.lanes for v, c in terms.items()}, f"{col}_vec": 1}, ix.const // self.lanes)
        return f"{self.vec}[{c_linear(vec)}]"

    def expr(self, v: object, col: str) -> tuple[str, bool]:
        """(C text, whether it is a vector) of value ``v`` inside the vector loop over ``col``."""
        if isinstance(v, Literal):
            return c_value(v), False
        if isinstance(v, IndexNumber):
            if col in v.index.vars():
                raise _NotVector
            return c_value(v), False
        if isinstance(v, RegisterRef):
            return self.register(v, col)
        if isinstance(v, Load):
            if self.overlap is not None and isinstance(v.source, BufferAccess) and not _plain_along(v.source.index, col):
                raise _NotVector  # (a div/mod along an unaligned vector: no one spelling)
            if isinstance(v.source, RegisterRef) and not v.checks:
                return self.register(v.source, col)
            if isinstance(v.source, BufferAccess) and _constant(v.source, col, self.lanes) \
                    and not any(col in chk.index.vars() for chk in v.checks):
                return c_value(v), False  # (a padded read's bounds checks stay scalar: one per vector step)
            if isinstance(v.source, BufferAccess) and _contiguous(v.source, col, self.lanes) and not v.checks \
                    and self.partial is None:  # (a partial vector's load would read past the bound)
                return f"so_ld{self.lanes}(&{c_ref(v.source)})", True
            if isinstance(v.source, BufferAccess) and _col_stride(v.source.index, col, self.lanes) == 2 \
                    and not v.checks and self.partial is None:
                # (a stride-2 window's image: its even elements, two contiguous loads and a shuffle, reading
                # nothing past the last element the vector uses)
                return f"so_ld{self.lanes}s2(&{c_ref(v.source)})", True
            raise _NotVector
        if isinstance(v, Op):
            if v.dtype != "float32":
                raise _NotVector
            args = [self.expr(a, col) for a in v.args]
            if not any(is_vec for _, is_vec in args):
                return c_value(v), False
            text = vector_op(v.op, [a for a, _ in args], self.lanes)
            if text is not None:
                return text, True
        raise _NotVector

    def register(self, ref: RegisterRef, col: str) -> tuple[str, bool]:
        if self._is_tile(ref):
            return self.tile_ref(ref, col), True
        if ref.index is not None and col in ref.index.vars():
            raise _NotVector
        return c_ref(ref), False


def _accumulates(n: object) -> bool:
    if isinstance(n, Accumulate):
        return True
    if isinstance(n, Loop):
        return any(_accumulates(c) for c in n.body)
    if isinstance(n, Epilogue):
        return _accumulates(n.body)
    return False


def _plain_along(ix, col: str) -> bool:
    """``col`` enters ``ix`` only as a plain linear term (no div/mod atom, nothing wrapped)."""
    return all(isinstance(a, str) or a.var != col for a, _ in ix.linear.terms) \
        and all(col not in w.inner.vars() for w in ix.wrapped)


def _col_stride(ix, col: str, lanes: int) -> int | None:
    """How far ``ix`` moves per step of ``col`` inside one vector of ``lanes`` steps that starts at a multiple of
    ``lanes`` (the vector loop's ``col = lanes * col_vec``), or None when that is not one stride. A div/mod of
    ``col`` by a multiple of ``lanes``, whose other terms are multiples of ``lanes``, stays in one quotient over
    the vector: the div is constant along it and the mod moves by 1 (capsule votes' (o, p) columns)."""
    stride = ix.linear.coeff(col)
    for a, c in ix.linear.terms:  # (col / d) and (col % d) atoms: left by a fuse
        if not isinstance(a, str) and a.var == col:
            if a.divisor % lanes:
                return None
            stride += c if a.op == "%" else 0
    for w in ix.wrapped:
        if col not in w.inner.vars():
            continue
        rest_aligned = w.inner.const % lanes == 0 and all(c % lanes == 0 for v, c in w.inner.terms if v != col)
        nested = any(not isinstance(v, str) and v.var == col for v, _ in w.inner.terms)
        if nested or w.inner.coeff(col) != 1 or w.divisor % lanes or not rest_aligned:
            return None
        if w.op == "%":
            stride += w.stride
        elif w.op != "/":
            return None
    return stride


def _constant(acc: BufferAccess, col: str, lanes: int) -> bool:
    """``acc`` reads one element for every lane of the vector loop over ``col`` (``col`` nowhere in its index,
    or only in a div by a multiple of ``lanes``)."""
    return _col_stride(acc.index, col, lanes) == 0


def _contiguous(acc: BufferAccess, col: str, lanes: int) -> bool:
    """``acc`` reads consecutive elements along ``col``: a plain term of stride 1, or a mod of it by a multiple
    of ``lanes`` (:func:`_col_stride`)."""
    return _col_stride(acc.index, col, lanes) == 1
