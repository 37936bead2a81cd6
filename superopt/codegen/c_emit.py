"""Print a :class:`~superopt.loopnest.LoopNest` as C (OpenMP, GCC).

The kernel ABI is ``void NAME(void **args)`` with args = inputs (packed where the nest packs them),
then outputs, then workspace buffers, each a contiguous row-major buffer. Pack routines are ``void
NAME_pack_T(const void* src, void *dst)``. Loop kinds print as ``#pragma omp parallel for`` / ``omp
simd`` (with the loop's reduction clauses) / ``GCC unroll``. Every structural decision is in the
tree (see :mod:`superopt.loopnest.build`); this module only chooses C spellings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from superopt.codegen.c_prelude import PRELUDE
from superopt.ir.expr import Affine
from superopt.ir.types import DTYPES, is_float
from superopt.loopnest import (
    Accumulate,
    Alloc,
    Assign,
    BoxSlot,
    BufferAccess,
    CombineLanes,
    Epilogue,
    Fill,
    FlatIndex,
    Guard,
    GuardCond,
    InBounds,
    IndexNumber,
    Joined,
    Literal,
    Load,
    Loop,
    LoopNest,
    Node,
    Op,
    PackBox,
    PackNest,
    PackStep,
    PeeledLoop,
    Prefetch,
    RegisterRef,
    RestoreNan,
    Scope,
    SplitIndex,
    StageNest,
    Value,
    WriteBack,
    build_loopnest,
)
from superopt.loopnest.block_tests import hoisted_tests, without_tests
from superopt.loopnest.collapse import collapse_reductions
from superopt.loopnest.walk import allocations
from superopt.schedule.kernel_plan import KernelPlan

# OpenMP's iteration schedule for every parallel loop. Guided (chunks of what is left over the thread
# count, shrinking) rather than static: a thread that starts late (a worker waking from its futex on a
# shared host) or runs slower finds fewer iterations left, where static makes the region wait for it;
# models of many small kernels gain most. dynamic,1 hands out one iteration at a time, which costs a
# shared counter per row of a short parallel loop.
OMP_SCHEDULE = "guided"
PARALLEL_FOR = f"#pragma omp parallel for schedule({OMP_SCHEDULE}) num_threads(SO_THREADS)"
PARALLEL_FILL = f"#pragma omp parallel for simd schedule({OMP_SCHEDULE}) num_threads(SO_THREADS)"

__all__ = ["PRELUDE", "KernelSource", "emit_c", "print_c", "ctype", "c_float", "c_linear"]

_FLOAT_FN = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "floor": "floor", "ceil": "ceil",
    "sin": "sin", "cos": "cos", "round": "nearbyint", "abs": "fabs", "tan": "tan", "asin": "asin", "acos": "acos",
    "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
}
_BIT_OPS = {"bitand": "&", "bitor": "|", "bitxor": "^"}
_OMP_REDUCTION = {"+": "+", "*": "*", "max": "max", "min": "min", "or": "|"}


def ctype(dtype: str) -> str:
    return DTYPES[dtype][1]


def c_float(v: float, dtype: str) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    if dtype == "float32":
        return f"{float(v)!r}f"
    if dtype == "float64":
        return repr(float(v))
    if dtype == "bool":
        return "true" if v else "false"
    return str(int(v))


def c_linear(e: Affine) -> str:
    """C text of a linear index expression (simplified; div/mod atoms as ``(v / k)``, ``(v % k)``)."""
    s = e.simplify()
    parts: list[str] = []
    for a, c in s.terms:
        atom = str(a)
        mag = abs(c)
        term = atom if mag == 1 else f"{mag}*{atom}"
        if not parts:
            parts.append(term if c > 0 else f"-{term}")
        else:
            parts.append(f" + {term}" if c > 0 else f" - {term}")
    if s.const or not parts:
        if not parts:
            parts.append(str(s.const))
        else:
            parts.append(f" + {s.const}" if s.const > 0 else f" - {-s.const}")
    return "".join(parts)


def c_index(ix: FlatIndex) -> str:
    extra = [f"{w.stride}*(({c_linear(w.inner)}) {w.op} {w.divisor})" for w in ix.wrapped]
    return " + ".join([c_linear(ix.linear)] + extra) if extra else c_linear(ix.linear)


def c_ref(ref: BufferAccess | RegisterRef) -> str:
    if isinstance(ref, RegisterRef):
        return ref.name if ref.index is None else f"{ref.name}[{c_linear(ref.index)}]"
    return f"{ref.buffer}[{c_index(ref.index)}]"


def c_combine(op: str, a: str, b: str, dtype: str) -> str:
    """``a <op> b`` for a reduction op (``+= *= max= min=``)."""
    suf = "f" if dtype == "float32" else ""
    if op == "+=":
        return f"{a} + {b}"
    if op == "*=":
        return f"{a} * {b}"
    fn = "max" if op == "max=" else "min"
    return f"so_{fn}{suf}({a}, {b})" if is_float(dtype) else f"SO_{fn.upper()}({a}, {b})"


def c_checks(checks: tuple[InBounds, ...]) -> str:
    """A padded read's bounds checks as one C condition."""
    conds = []
    for chk in checks:
        c = c_linear(chk.index)
        if chk.lower:
            conds.append(f"({c}) >= 0")
        if chk.upper is not None:
            conds.append(f"({c}) < {chk.upper}")
    return " && ".join(conds)


def c_value(v: Value, clamp_guarded: bool = False) -> str:
    """C for ``v``. ``clamp_guarded``: a padded read also clamps its index to 0 when out of range (used for the
    branches of a select: gcc 12.2 -O3 -mavx2 if-converts and vectorizes ``c ? (g ? A[i] : 0) : (h ? B[j] : 0)``
    into wrong values; fuzz seed 21387, a Concat read as where(d1 < 3, A[..], B[d1 - 3..]), lost elements)."""
    if isinstance(v, Literal):
        return c_float(v.value, v.dtype)
    if isinstance(v, IndexNumber):
        return f"(({ctype(v.dtype)})({c_linear(v.index)}))"
    if isinstance(v, Load):
        ref = c_ref(v.source)
        if not v.checks:
            return ref
        cond = c_checks(v.checks)
        if clamp_guarded and isinstance(v.source, BufferAccess):
            ref = f"{v.source.buffer}[({cond}) ? ({c_index(v.source.index)}) : 0]"
        return f"({cond} ? {ref} : {c_value(v.fill)})"
    return _c_op(v)


def _c_op(v: Op) -> str:
    dt, op = v.dtype, v.op
    fdt = dt if is_float(dt) else "float32"
    suf = "f" if fdt == "float32" else ""
    args = [c_value(a) for a in v.args]
    if op == "cast":
        return f"(({ctype(dt)})({args[0]}))"
    if op == "where":
        a, b = (c_value(x, clamp_guarded=True) for x in v.args[1:])
        return f"({args[0]} ? {a} : {b})"
    if len(args) == 1:
        x = args[0]
        if op == "isnan":  # of a float operand (integers are never NaN: the loop nest folds those to false)
            return f"(({x}) != ({x}))"
        if op == "isinf":  # the type-generic macro of math.h
            return f"isinf({x})"
        if op == "bitnot":
            return f"(~({x}))"
        if op in ("exp", "erf") and fdt == "float32":
            return f"so_{op}f({x})"
        if op in _FLOAT_FN:
            return f"{_FLOAT_FN[op]}{suf}({x})"
        one = c_float(1.0, fdt)
        return {
            "rsqrt": f"({one} / sqrt{suf}({x}))",
            "sigmoid": f"so_sigmoid{suf}({x})",
            "neg": f"(-({x}))",
            "relu": f"(({x}) < 0 ? 0 : ({x}))",  # NaN stays NaN, as numpy's maximum(x, 0)
            "reciprocal": f"({one} / ({x}))",
            "not": f"(!({x}))",
            "sign": f"(({x}) > 0 ? 1 : (({x}) < 0 ? -1 : ({x})))",  # 0 and NaN are their own sign
        }[op]
    a, b = args
    if op in ("+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!="):
        return f"({a} {op} {b})"
    if op in ("max", "min"):
        return f"so_{op}{suf}({a}, {b})" if is_float(dt) else f"SO_{op.upper()}({a}, {b})"
    if op == "pow":
        fixed = _pow_by_roots(v.args[1], a, fdt)
        return fixed if fixed is not None else f"pow{suf}({a}, {b})"
    if op == "and":
        return f"({a} && {b})"
    if op == "or":
        return f"({a} || {b})"
    if op == "mod":
        return f"so_mod{suf}({a}, {b})" if is_float(dt) else f"so_modl({a}, {b})"
    if op == "fmod":
        return f"fmod{suf}({a}, {b})" if is_float(dt) else f"so_fmodl({a}, {b})"
    if op in _BIT_OPS:
        return f"({a} {_BIT_OPS[op]} {b})"
    if op in ("shl", "shr"):
        return f"so_{op}{32 if dt == 'int32' else 64}({a}, {b})"
    raise TypeError(f"no C spelling for operator {op!r}")


# x ** e for a literal e that square roots and products reach (LRN's beta = 0.75, a norm's 0.5, a square): sqrt is
# correctly rounded and GCC vectorizes it (-fno-math-errno), where powf is a scalar libm call that bounds the
# kernel (AlexNet's LRN: most of its time). The helpers (c_prelude) keep powf's special values.
_POW_BY_ROOTS = {0.5: "so_pow_half", 0.25: "so_pow_quarter", 0.75: "so_pow_three_quarters", 1.5: "so_pow_three_halves",
                 -0.5: "so_pow_minus_half", -0.75: "so_pow_minus_three_quarters"}


def _pow_by_roots(exponent: Value, base: str, fdt: str) -> str | None:
    if not isinstance(exponent, Literal) or fdt != "float32":
        return None
    if exponent.value == 2:
        return f"so_squaref({base})"
    fn = _POW_BY_ROOTS.get(float(exponent.value))
    return None if fn is None else f"{fn}f({base})"


def _streams(n: Node) -> bool:
    """Whether ``n`` holds a block copy stored past the caches (a streamed ``transposed`` loop)."""
    if isinstance(n, Loop) and n.kind == "transposed" and n.stream:
        return True
    return isinstance(n, (Loop, StageNest, Scope)) and any(_streams(b) for b in n.body)


def c_conds(conds: tuple[GuardCond, ...]) -> str:
    """A guard's tests as one C condition."""
    return " && ".join(f"({c_linear(g.index)}) < {g.limit}" for g in conds)


class _CPrinter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ind = 1
        # a stage with streamed blocks: its outermost loop ends every iteration with one store fence (each
        # thread's non-temporal stores ordered before the threads join), not every block with its own
        self._fence = False
        self.lanes: int | None = None  # the target's float32 lanes (vectorized loops of whole vectors as vectors)
        self.dtypes: dict[str, str] = {}  # element type of each buffer and register declared so far
        self.name = "kernel"  # (the kernel's routines are named after it)
        self.threads = 0  # the most threads a parallel loop may start (0: any number)

    def line(self, text: str) -> None:
        self.lines.append("    " * self.ind + text)

    def nodes(self, nodes) -> None:
        for n in nodes:
            self.node(n)

    def node(self, n: Node) -> None:
        if isinstance(n, StageNest):
            self.line(f"/* {n.text} */")
            self._fence = _streams(n)
            self.nodes(n.body)
            if self._fence:  # (no loop around the block: one fence after it)
                self.line("so_stream_fence();")
                self._fence = False
        elif isinstance(n, Scope):
            from superopt.codegen.c_vector_tile import vector_tile_lines  # (it imports this module's spellings)

            self.line("{")
            self.ind += 1
            vector_tile = vector_tile_lines(n)
            if vector_tile is None:
                self.nodes(n.body)
            else:
                self.lines += ["    " * (self.ind + depth) + text for depth, text in vector_tile]
            self.ind -= 1
            self.line("}")
        elif isinstance(n, Loop):
            self.loop(n)
        elif isinstance(n, PeeledLoop):
            self.peeled(n)
        elif isinstance(n, Alloc):
            self.alloc(n)
        elif isinstance(n, Fill):
            if n.parallel:
                self.line(PARALLEL_FILL)
            self.line(f"for (int {n.var} = 0; {n.var} < {n.size}; ++{n.var}) {n.buffer}[{n.var}] = {c_value(n.value)};")
        elif isinstance(n, Epilogue):
            self.line(f"/* epilogue: {n.text} */")
            self.line(self.statement(n.body))
        elif isinstance(n, SplitIndex):
            self.line(f"const int {n.var} = {n.outer} * {n.factor} + {n.inner};")
        elif isinstance(n, BoxSlot):
            ct = ctype(n.dtype)
            self.line(f"{ct} *restrict {n.buffer} = {n.workspace} + (size_t){n.slot} * omp_get_thread_num();")
        elif isinstance(n, PackBox):
            if n.every_thread:  # (the same threads then share the parallel loop, each reading its own slot)
                self.line(f"#pragma omp parallel num_threads(SO_MIN(SO_THREADS, {self.threads}))")
            counts = ", ".join(_least(terms) for terms in n.counts)
            self.line(f"{self.name}_packbox_{n.tensor}({n.tensor} + {c_linear(n.base)}, "
                      f"{n.workspace} + (size_t){n.slot} * omp_get_thread_num(), {counts});")
        elif isinstance(n, CombineLanes):
            omp = _OMP_REDUCTION[n.op]
            t = c_ref(n.target)
            self.line(f"#pragma omp simd reduction({omp}:{t})")
            self.line(f"for (int {n.var} = 0; {n.var} < {n.lanes}; ++{n.var}) {t} = {t} {n.op} {n.source}[{n.var}];")
        elif isinstance(n, RestoreNan):
            self.line(f"if ({n.flag}) {c_ref(n.target)} = NAN;")
        else:
            self.line(self.statement(n))

    def statement(self, n: Assign | Accumulate | WriteBack | Guard) -> str:
        """One statement on one line."""
        if isinstance(n, Guard):
            return f"if ({c_conds(n.conds)}) " + self.statement(n.body)
        if isinstance(n, Prefetch):
            return f"__builtin_prefetch(&{c_ref(n.access)}, 0, {n.locality});"
        if isinstance(n, Assign):
            return f"{c_ref(n.target)} = {c_value(n.value)};"
        if isinstance(n, WriteBack):
            t, src = c_ref(n.target), c_ref(n.source)
            return f"{t} = {c_combine(n.op, t, src, n.dtype) if n.op else src};"
        if isinstance(n, Accumulate):
            t, val = c_ref(n.target), c_value(n.value)
            if n.nan_flag is not None:
                # plain compare-select (one vmaxps) plus an independent NaN flag, instead of so_maxf's
                # NaN test on the loop-carried chain; the flag restores NaN propagation at write-back
                cmp = ">" if n.op == "max=" else "<"
                return (f"{{ {ctype(n.dtype)} so_v = {val}; {t} = {t} {cmp} so_v ? {t} : so_v; "
                        f"{n.nan_flag} |= so_v != so_v; }}")
            return f"{t} = {c_combine(n.op, t, val, n.dtype)};"
        raise TypeError(f"cannot print {n!r}")

    def alloc(self, a: Alloc) -> None:
        ct = ctype(a.dtype)
        self.dtypes[a.name] = a.dtype
        if a.kind == "workspace":
            self.line(f"{ct} *restrict {a.name} = ({ct} *)args[{a.arg_index}];  /* workspace */")
        elif a.kind == "register":
            self.line(f"{ct} {a.name} = {c_value(a.init)};")
        elif a.kind == "flag":
            self.line(f"int {a.name} = {c_value(a.init)};")
        else:  # local buffer or register tile
            self.line(f"{ct} {a.name}[{a.size}] __attribute__((aligned(64)));")

    def peeled(self, n: PeeledLoop) -> None:
        lp, v = n.loop, n.loop.var
        full = str(n.split)
        if n.branch:  # (one parallel region: see superopt.loopnest.versioning)
            self.loop(lp, split=(full, n.general))
            return
        if n.outer_full:  # in a block of its own: index-set splitting may repeat the loop in one scope
            self.line("{")
            self.ind += 1
            conds = " && ".join(f"{c_linear(t.offset)} + {extent} <= {t.limit}" for extent, t in n.outer_full)
            self.line(f"const int {v}_full = ({conds}) ? {n.split} : 0;")
            full = f"{v}_full"
        self.line(f"/* {v} < {full}: full register tiles, constant trip counts */")
        self.loop(lp, stop=full)
        if n.outer_full and n.last is not None:
            self.line(f"if ({full}) {{  /* the last tile, its tails constants */")
            self.ind += 1
            self.loop(replace(lp, body=n.last, tail=()), start=str(n.split))
            self.ind -= 1
            self.line("} else {")
            self.ind += 1
        if n.outer_full and n.middle is not None:
            self.line(f"/* {v} < {n.split}: register tiles of constant rows, bounded stores */")
            self.loop(replace(lp, body=n.middle), start=full, stop=str(n.split))
            full = str(n.split)
        self.loop(replace(lp, body=n.general), start=full)
        if n.outer_full and n.last is not None:
            self.ind -= 1
            self.line("}")
        if n.outer_full:
            self.ind -= 1
            self.line("}")

    def loop(self, lp: Loop, start: str = "0", stop: str | None = None,
             split: tuple[str, tuple[Node, ...]] | None = None) -> None:
        """``lp`` printed from ``start`` to ``stop``; ``split`` = (full, rest): its body for the iterations below
        ``full``, ``rest`` for the others (a :class:`PeeledLoop` in one loop)."""
        tests = hoisted_tests(lp)
        if tests:  # (a write-back nest of one kind of reduction block: tested once, around it)
            self.line(f"if ({c_conds(tests)}) {{")
            self.ind += 1
            self.loop(without_tests(lp, tests), start, stop, split)
            self.ind -= 1
            self.line("}")
            return
        if lp.kind == "transposed" and start == "0" and stop is None:
            self.transposed(lp)
            return
        if lp.kind == "vectorized" and start == "0" and stop is None and not self._fence:
            from superopt.codegen.c_vector_loop import vector_loop_lines  # (it imports this module's spellings)

            vector = vector_loop_lines(lp, self.lanes, self.dtypes)
            if vector is not None:
                self.lines += ["    " * (self.ind + depth) + text for depth, text in vector]
                return
        if lp.kind == "parallel":
            # (a kernel that packs boxes has a workspace slot for each of at most ``threads`` threads)
            self.line(PARALLEL_FOR.replace("SO_THREADS", f"SO_MIN(SO_THREADS, {self.threads})") if self.threads
                      else PARALLEL_FOR)
        elif lp.kind == "unrolled":
            self.line(f"#pragma GCC unroll {lp.extent}")
        elif lp.kind == "vectorized":
            clauses = "".join(f" reduction({_OMP_REDUCTION[r.op]}:{r.var})" for r in lp.reductions)
            self.line("#pragma omp simd" + clauses)
        bound = str(lp.extent) if stop is None else stop
        for t in lp.tail:
            bound = f"SO_MIN({bound}, {t.limit} - ({c_linear(t.offset)}))"
        v = lp.var
        fence, self._fence = self._fence, False
        self.line(f"for (int {v} = {start}; {v} < {bound}; ++{v}) {{")
        self.ind += 1
        if split is None:
            self.nodes(lp.body)
        else:
            self.line(f"if ({v} < {split[0]}) {{  /* full register tiles, constant trip counts */")
            self.ind += 1
            self.nodes(lp.body)
            self.ind -= 1
            self.line("} else {")
            self.ind += 1
            self.nodes(split[1])
            self.ind -= 1
            self.line("}")
        if fence:
            self.line("so_stream_fence();")
        self.ind -= 1
        self.line("}")

    def transposed(self, lp: Loop) -> None:
        """The block of a ``transposed`` loop pair: one so_transposeL from the block's first element (with tails, the
        partial-block copy so_transposeLp of the rows and columns the tails leave; streamed: so_transposeLs)."""
        inner = lp.body[0]
        copy = inner.body[0]
        src, dst = copy.value.source, copy.target

        def origin(a: BufferAccess) -> str:
            lin = Affine.of({v: c for v, c in a.index.linear.terms if v not in (lp.var, inner.var)}, a.index.linear.const)
            return f"{a.buffer} + {c_linear(lin)}"

        args = f"{origin(src)}, {src.stride(inner.var)}, {origin(dst)}, {dst.stride(lp.var)}"
        if lp.prefetch:  # the next block's source rows, while this block's shuffles and stores run
            self.line(f"so_prefetch_rows{lp.extent}({origin(src)} + {lp.prefetch}, {src.stride(inner.var)});")
        if not (lp.tail or inner.tail or lp.stream):
            self.line(f"so_transpose{lp.extent}({args});")
            return

        def count(x: Loop) -> str:  # the block's rows (inner) or columns (lp): the loop's bound
            bound = str(x.extent)
            for t in x.tail:
                bound = f"SO_MIN({bound}, {t.limit} - ({c_linear(t.offset)}))"
            return bound

        kind = "s" if lp.stream else "p"
        self.line(f"so_transpose{lp.extent}{kind}({args}, {count(inner)}, {count(lp)});")

    def kernel(self, nest: LoopNest, name: str) -> str:
        self.lines = [f"void {name}(void **args) {{"]
        self.name, self.threads = name, nest.threads
        self.lanes, self.dtypes = nest.vector_lanes, {p.name: p.dtype for p in nest.params}
        for p in nest.params:
            q = "const " if p.is_input else ""
            ct = ctype(p.dtype)
            self.line(f"{q}{ct} *restrict {p.name} = ({q}{ct} *)args[{p.index}];")
        for a in nest.workspace:  # caller-owned workspace: no malloc (and page faults) per call
            self.alloc(a)
        self.nodes(nest.body)
        self.lines.append("}")
        return "\n".join(self.lines)


def _least(terms: tuple[int | Affine, ...]) -> str:
    """C text of the least of ``terms`` (constants and index expressions)."""
    out = ""
    for t in terms:
        text = str(t) if isinstance(t, int) else f"({c_linear(t)})"
        out = text if not out else f"SO_MIN({out}, {text})"
    return out


def _axis(ix: str | Joined, rename: dict[str, str] | None = None) -> str:
    r = rename or {}
    return r.get(ix, ix) if isinstance(ix, str) else f"({r.get(ix.outer, ix.outer)} * {ix.factor} + {r.get(ix.inner, ix.inner)})"


def print_pack(p: PackNest, name: str) -> str:
    """The pack routine: a copy in the packed loops' order (a transposed pair of loops by blocks), its
    split axis's last panel cut at the source's extent (a run-time bound instead of a test per element, so the copy
    vectorizes) and the rest of that panel zero-filled after it."""
    ct = ctype(p.dtype)
    if p.box:
        counts = ", ".join(f"int {v}_n" for v, _ in p.loops)
        lines = [f"static void {name}_packbox_{p.tensor}(const {ct} *restrict src, {ct} *restrict dst, {counts}) {{"]
        short = " || ".join(f"{v}_n < {n}" for v, n in p.loops)
        lines.append(f"    if ({short}) memset(dst, 0, sizeof({ct}) * {math.prod(n for _, n in p.loops)});")
    else:
        lines = [f"void {name}_pack_{p.tensor}(const void *src_, void *dst_) {{",
                 f"    const {ct} *restrict src = (const {ct} *)src_;",
                 f"    {ct} *restrict dst = ({ct} *)dst_;"]

    def flat_src(rename: dict[str, str] | None = None) -> str:
        out = "0"
        for ix, n in zip(p.src_index, p.src_shape):
            out = f"({out}) * {n} + {_axis(ix, rename)}"
        return out

    def flat_dst(rename: dict[str, str] | None = None) -> str:
        out = "0"
        for v, n in p.loops:
            out = f"({out}) * {n} + {(rename or {}).get(v, v)}"
        return out

    bound = {v: f"{v}_n" if p.box else str(n) for v, n in p.loops}
    cut = None
    if p.in_range is not None and isinstance(p.in_range[0], Joined):
        ix, lim = p.in_range
        bound[ix.inner] = f"SO_MIN({ix.factor}, {lim} - {ix.outer} * {ix.factor})"
        cut = (ix, lim)
    elif p.in_range is not None:  # (not a split axis: a test per element)
        ix, lim = p.in_range
        lines.append("    " + PARALLEL_FOR + (f" collapse({p.parallel})" if p.parallel > 1 else "") if p.parallel else "")
        for i, (v, n) in enumerate(p.loops):
            lines.append("    " * (i + 1) + f"for (int {v} = 0; {v} < {n}; ++{v})")
        lines.append("    " * (len(p.loops) + 1) + f"dst[{flat_dst()}] = ({_axis(ix)} < {lim}) ? src[{flat_src()}] : 0;")
        return "\n".join([x for x in lines if x] + ["}"])
    if p.parallel:
        lines.append("    " + PARALLEL_FOR + (f" collapse({p.parallel})" if p.parallel > 1 else ""))
    order = p.order or tuple(PackStep(v) for v, _ in p.loops)
    heads: list[str] = []  # (runs and blocks come only with a transpose)
    for st in order:
        v = st.var
        if st.how == "runs":
            heads.append(f"for (int {v}_s = 0; {v}_s < {bound[v]}; {v}_s += {p.transpose[5]})")
        elif st.how == "blocks" and any(x.how == "runs" and x.var == v for x in order):
            span, block = p.transpose[5], p.transpose[2]
            heads.append(f"for (int {v} = {v}_s; {v} < SO_MIN({v}_s + {span}, {bound[v]}); {v} += {block})")
        elif st.how == "blocks":
            heads.append(f"for (int {v} = 0; {v} < {bound[v]}; {v} += {p.transpose[2]})")
        else:
            heads.append(f"for (int {v} = 0; {v} < {bound[v]}; ++{v})")
    lines += ["    " * (i + 1) + h for i, h in enumerate(heads)]
    ind = "    " * (len(heads) + 1)
    if p.transpose is not None:  # the two transposed loops by blocks: one block copy each
        inner, outer, block, src_stride, dst_stride, _ = p.transpose
        copy = f"so_transpose{block}(src + {flat_src()}, {src_stride}, dst + {flat_dst()}, {dst_stride});"
        full = f"{outer} + {block} <= {bound[outer]} && {inner} + {block} <= {bound[inner]}"
        if all(bound[v].isdigit() and int(bound[v]) % block == 0 for v in (outer, inner)):
            lines.append(f"{ind}{copy}")  # (whole blocks only)
        else:
            # a block the edges cut short: where it holds a quarter of a block or more, the same shuffles between
            # masked loads and stores (a packed panel of 8 columns against 16 lanes is all such blocks: element by
            # element they took a fifth of their kernel); a sliver (3 rows of 16) costs fewer element copies
            edge = {outer: f"{outer}_e", inner: f"{inner}_e"}
            part = (f"so_transpose{block}p(src + {flat_src()}, {src_stride}, dst + {flat_dst()}, {dst_stride}, "
                    "so_r, so_c);")
            lines += [f"{ind}if ({full}) {copy}",
                      f"{ind}else {{",
                      f"{ind}    const int so_r = SO_MIN({block}, {bound[inner]} - {inner}), "
                      f"so_c = SO_MIN({block}, {bound[outer]} - {outer});",
                      f"{ind}    if (so_r * so_c >= {block * block // 4}) {part}",
                      f"{ind}    else for (int {outer}_e = {outer}; {outer}_e < {outer} + so_c; ++{outer}_e)",
                      f"{ind}        for (int {inner}_e = {inner}; {inner}_e < {inner} + so_r; ++{inner}_e)",
                      f"{ind}            dst[{flat_dst(edge)}] = src[{flat_src(edge)}];",
                      f"{ind}}}"]
    else:
        lines.append(f"{ind}dst[{flat_dst()}] = src[{flat_src()}];")
    if cut is not None:  # the last panel past the source's extent: zeros
        ix, lim = cut
        last = dict(p.loops)[ix.outer] - 1
        lines += ["    {", f"        const int {ix.outer} = {last};"]
        rest = [(v, n) for v, n in p.loops if v != ix.outer]
        for i, (v, n) in enumerate(rest):
            start = lim - last * ix.factor if v == ix.inner else 0
            lines.append("    " * (i + 2) + f"for (int {v} = {start}; {v} < {n}; ++{v})")
        lines += ["    " * (len(rest) + 2) + f"dst[{flat_dst()}] = 0;", "    }"]
    lines.append("}")
    return "\n".join(lines)


@dataclass(frozen=True)
class KernelSource:
    name: str
    code: str  # the kernel and pack functions, without the prelude
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    packs: dict  # input name -> PackLayout
    workspace: tuple[int, ...] = ()  # bytes of each scratch buffer, passed after the outputs
    # every buffer the kernel allocates, as (kind, tensor, bytes): its workspace (caller-owned scratch, in
    # argument order) and its local buffers (on each thread's stack, a stage computed inside another's loop)
    storage: tuple[tuple[str, str, int], ...] = ()


def print_c(nest: LoopNest, name: str = "kernel") -> str:
    """The C text of the kernel ``name`` and its pack routines ``name_pack_T``."""
    parts = [print_pack(p, name) for p in nest.box_packs]  # (static: before the kernel that calls them)
    parts += [_CPrinter().kernel(nest, name)] + [print_pack(p, name) for p in nest.packs]
    return "\n\n".join(parts) + "\n"


def emit_c(plan: KernelPlan | LoopNest, name: str = "kernel") -> KernelSource:
    """C source of a lowered kernel (a KernelPlan is built into its loop nest first), its chains of reduction loops
    that every access walks as one printed as one loop (``loopnest.collapse``)."""
    nest = collapse_reductions(build_loopnest(plan) if isinstance(plan, KernelPlan) else plan)
    storage = tuple((a.kind, a.name, a.nbytes) for a in allocations(nest) if a.kind in ("workspace", "local"))
    return KernelSource(name, print_c(nest, name), nest.inputs, nest.outputs, nest.layouts, nest.workspace_bytes,
                        storage)
