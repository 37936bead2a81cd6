"""Recursive-descent parser for the op language, and extent/type inference into a Compute.

Grammar (statements separated by newlines or ';'):

    program   := (decl | stmt)*
    decl      := ('in' | 'tmp' | 'out') NAME ':' DTYPE '[' INT (',' INT)* ']'
    stmt      := NAME '[' dims ']' ASSIGN expr clause*
    ASSIGN    := '=' | '+=' | '*=' | 'max' '=' | 'min' '='
    clause    := 'over' '(' (NAME ':' INT)* ')'  |  'pad' '(' NAME '=' number (',' ...)* ')'
    expr      := sum (CMP sum)?
    sum       := prod (('+' | '-') prod)*
    prod      := unary (('*' | '/') unary)*
    unary     := '-' unary | atom
    atom      := number | NAME '[' index (',' index)* ']' | NAME '(' expr (',' expr)* ')' | NAME | '(' expr ')'

Index expressions must be affine in the dimensions (``2*y+kh``, ``i-1``). Reduction dimensions
are those absent from the output. Extents come from operand shapes, explicit bindings, or the
"valid window" rule for strided accesses (``2*y+kh`` over 15 with kh<3 gives y<7).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from superopt.ir.compute import Compute
from superopt.ir.expr import (
    BINARY_OPS,
    BOOL_FNS,
    UNARY_FNS,
    Access,
    Affine,
    Binary,
    Cast,
    Compare,
    Const,
    Expr,
    IndexValue,
    Unary,
    Where,
)
from superopt.ir.statement import Statement
from superopt.ir.types import DTYPES, TensorType
from superopt.lang.errors import OpLangError
from superopt.lang.tokens import Token, tokenize

NAMED_CONSTANTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi, "true": True, "false": False}
CAST_FNS = {f"cast_{d}": d for d in DTYPES}


@dataclass
class _RawStatement:
    out: str
    out_dims: list[str]
    out_pos: int
    reduce: str
    expr: Expr
    extents: dict[str, int] = field(default_factory=dict)
    padding: dict[str, float] = field(default_factory=dict)
    access_pos: list[tuple[Access, int]] = field(default_factory=list)
    value_names: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class _Program:
    statements: list[_RawStatement]
    decls: dict[str, tuple[str, TensorType]]  # name -> (role, type)


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.toks = tokenize(src)
        self.i = 0
        self.cur: _RawStatement | None = None

    # -- helpers ---------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def error(self, msg: str, tok: Token | None = None) -> OpLangError:
        return OpLangError(msg, self.src, (tok or self.tok).pos)

    def next(self) -> Token:
        t = self.tok
        self.i += 1
        return t

    def expect(self, text: str) -> Token:
        if self.tok.text != text:
            found = self.tok.text or "end of input"
            raise self.error(f"expected {text!r} but found {found!r}")
        return self.next()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what} but found {self.tok.text or 'end of input'!r}")
        return self.next()

    def skip_newlines(self) -> None:
        while self.tok.kind == "nl":
            self.next()

    # -- program ---------------------------------------------------------------------------
    def program(self) -> _Program:
        stmts: list[_RawStatement] = []
        decls: dict[str, tuple[str, TensorType]] = {}
        self.skip_newlines()
        while self.tok.kind != "end":
            if self.tok.text in ("in", "tmp", "out") and self.peek().kind == "name" and self.peek(2).text == ":":
                role = self.next().text
                name = self.next().text
                self.expect(":")
                decls[name] = (role, self.tensor_type())
            else:
                stmts.append(self.statement())
            if self.tok.kind not in ("nl", "end"):
                raise self.error(f"unexpected {self.tok.text!r} after the end of a statement")
            self.skip_newlines()
        if not stmts:
            raise OpLangError("the op has no statements", self.src, 0)
        return _Program(stmts, decls)

    def tensor_type(self) -> TensorType:
        dt = self.expect_kind("name", "an element type")
        if dt.text not in DTYPES:
            raise self.error(f"unknown element type {dt.text!r}", dt)
        self.expect("[")
        shape: list[int] = []
        while self.tok.text != "]":
            shape.append(self.integer())
            if self.tok.text == ",":
                self.next()
        self.expect("]")
        dims = None
        if self.tok.text == "(":
            self.next()
            dims = []
            while self.tok.text != ")":
                dims.append(self.expect_kind("name", "a dimension name").text)
                if self.tok.text == ",":
                    self.next()
            self.expect(")")
            dims = tuple(dims)
        return TensorType(tuple(shape), dt.text, dims)

    def integer(self) -> int:
        neg = False
        if self.tok.text == "-":
            self.next()
            neg = True
        t = self.expect_kind("num", "an integer")
        if not t.text.isdigit():
            raise self.error(f"expected an integer but found {t.text!r}", t)
        return -int(t.text) if neg else int(t.text)

    def number(self) -> float:
        neg = False
        if self.tok.text == "-":
            self.next()
            neg = True
        t = self.next()
        if t.kind == "num":
            v = float(t.text)
        elif t.kind == "name" and t.text in NAMED_CONSTANTS:
            v = float(NAMED_CONSTANTS[t.text])
        else:
            raise self.error(f"expected a number but found {t.text!r}", t)
        return -v if neg else v

    def statement(self) -> _RawStatement:
        out = self.expect_kind("name", "the output tensor of a statement")
        self.expect("[")
        dims: list[str] = []
        while True:
            d = self.tok
            if d.kind != "name":
                raise self.error("output indices must be plain dimension names", d)
            self.next()
            if d.text in dims:
                raise self.error(f"output dimension {d.text!r} repeats", d)
            dims.append(d.text)
            if self.tok.text == ",":
                self.next()
                continue
            if self.tok.text != "]":
                raise self.error("output indices must be plain dimension names")
            break
        self.expect("]")
        t = self.tok
        if t.text in ("=", "+=", "*="):
            reduce = self.next().text
        elif t.text in ("max", "min") and self.peek().text == "=":
            self.next()
            self.next()
            reduce = t.text + "="
        else:
            raise self.error(f"expected an assignment (=, +=, *=, max=, min=) but found {t.text!r}")
        self.cur = _RawStatement(out.text, dims, out.pos, reduce, Const(0.0))
        self.cur.expr = self.expr()
        while self.tok.text in ("over", "pad") and self.peek().text == "(":
            kw = self.next().text
            self.next()
            while self.tok.text != ")":
                name = self.expect_kind("name", "a name")
                if kw == "over":
                    self.expect(":")
                    self.cur.extents[name.text] = self.integer()
                else:
                    self.expect("=")
                    self.cur.padding[name.text] = self.number()
                if self.tok.text == ",":
                    self.next()
            self.expect(")")
        st, self.cur = self.cur, None
        return st

    # -- expressions ------------------------------------------------------------------------
    def expr(self) -> Expr:
        a = self.sum()
        if self.tok.text in ("<", "<=", ">", ">=", "==", "!="):
            op = self.next().text
            a = Compare(op, a, self.sum())
        return a

    def sum(self) -> Expr:
        a = self.prod()
        while self.tok.text in ("+", "-"):
            op = self.next().text
            a = Binary(op, a, self.prod())
        return a

    def prod(self) -> Expr:
        a = self.unary()
        while self.tok.text in ("*", "/"):
            op = self.next().text
            a = Binary(op, a, self.unary())
        return a

    def unary(self) -> Expr:
        if self.tok.text == "-":
            self.next()
            x = self.unary()
            if isinstance(x, Const) and not isinstance(x.value, bool):
                return Const(-x.value, x.dtype)
            return Unary("neg", x)
        return self.atom()

    def atom(self) -> Expr:
        t = self.tok
        if t.kind == "num":
            self.next()
            return Const(float(t.text), "float32")
        if t.text == "(":
            self.next()
            e = self.expr()
            self.expect(")")
            return e
        if t.kind != "name":
            raise self.error(f"expected a value but found {t.text or 'end of input'!r}")
        self.next()
        if self.tok.text == "[":
            self.next()
            idx = [self.index()]
            while self.tok.text == ",":
                self.next()
                idx.append(self.index())
            self.expect("]")
            a = Access(t.text, tuple(idx))
            self.cur.access_pos.append((a, t.pos))
            return a
        if self.tok.text == "(":
            self.next()
            args = [self.expr()]
            while self.tok.text == ",":
                self.next()
                args.append(self.expr())
            self.expect(")")
            return self.call(t, args)
        if t.text in NAMED_CONSTANTS:
            v = NAMED_CONSTANTS[t.text]
            return Const(v, "bool" if isinstance(v, bool) else "float32")
        self.cur.value_names.append((t.text, t.pos))
        return IndexValue(Affine.dim(t.text))

    def call(self, t: Token, args: list[Expr]) -> Expr:
        fn = t.text

        def arity(n: int) -> None:
            if len(args) != n:
                raise self.error(f"{fn}() takes {n} argument(s), got {len(args)}", t)

        if fn == "where":
            arity(3)
            return Where(*args)
        if fn in CAST_FNS:
            arity(1)
            return Cast(CAST_FNS[fn], args[0])
        if fn in UNARY_FNS:
            arity(1)
            return Unary(fn, args[0])
        if fn in BINARY_OPS:
            arity(2)
            return Binary(fn, args[0], args[1])
        raise self.error(f"unknown function {fn!r}", t)

    def index(self) -> Affine:
        start = self.tok
        e = self.sum()
        try:
            return _to_affine(e)
        except ValueError as err:
            raise self.error(f"index expressions must be affine in the dimensions: {err}", start) from None


def _to_affine(e: Expr) -> Affine:
    if isinstance(e, IndexValue):
        return e.index
    if isinstance(e, Const):
        if isinstance(e.value, bool) or float(e.value) != int(e.value):
            raise ValueError(f"{e} is not an integer")
        return Affine.of({}, int(e.value))
    if isinstance(e, Unary) and e.fn == "neg":
        return _to_affine(e.x).scale(-1)
    if isinstance(e, Binary) and e.op in ("+", "-"):
        b = _to_affine(e.b)
        return _to_affine(e.a) + (b.scale(-1) if e.op == "-" else b)
    if isinstance(e, Binary) and e.op == "*":
        a, b = _to_affine(e.a), _to_affine(e.b)
        if not a.terms:
            return b.scale(a.const)
        if not b.terms:
            return a.scale(b.const)
        raise ValueError(f"{e} multiplies two dimensions")
    raise ValueError(f"{e} is not affine")


# ---- inference ------------------------------------------------------------------------------
def _infer_extents(st: _RawStatement, types: Mapping[str, TensorType], src: str, out_shape=None) -> dict[str, int]:
    ext = dict(st.extents)

    def bind(d: str, n: int, pos: int, why: str) -> None:
        if d in ext and ext[d] != n:
            raise OpLangError(f"dimension {d!r} has extent {ext[d]} elsewhere but {n} from {why}", src, pos)
        ext[d] = n

    if out_shape is not None:
        for d, n in zip(st.out_dims, out_shape):
            if d not in st.extents:
                bind(d, n, st.out_pos, f"the declared shape of {st.out}")
    for a, pos in st.access_pos:
        t = types.get(a.tensor)
        if t is None:
            raise OpLangError(f"unknown tensor {a.tensor!r}: give its shape or define it first", src, pos)
        if len(a.index) != t.rank:
            raise OpLangError(f"{a.tensor} has rank {t.rank} but is indexed with {len(a.index)} indices", src, pos)
        for ix, size in zip(a.index, t.shape):
            if ix.is_plain_dim and a.tensor not in st.padding:
                bind(ix.dims[0], size, pos, f"axis of {a.tensor} ({a})")
    for a, _pos in st.access_pos:  # plain dims of padded tensors, then strided windows
        for ix, size in zip(a.index, types[a.tensor].shape):
            if ix.is_plain_dim and ix.dims[0] not in ext:
                ext[ix.dims[0]] = size
    changed = True
    while changed:
        changed = False
        for a, _ in st.access_pos:
            if a.tensor in st.padding:
                continue
            for ix, size in zip(a.index, types[a.tensor].shape):
                unknown = [d for d in ix.dims if d not in ext]
                if len(unknown) == 1 and ix.coeff(unknown[0]) > 0:
                    d = unknown[0]
                    c = ix.coeff(d)
                    rest = Affine.of({k: v for k, v in ix.terms if k != d}, ix.const)
                    _, hi = rest.bounds(ext)
                    n = (size - 1 - hi) // c + 1
                    if n > 0:
                        ext[d] = n
                        changed = True
    used = list(st.out_dims)
    for a, _ in st.access_pos:
        for ix in a.index:
            used += [d for d in ix.dims if d not in used]
    for name, pos in st.value_names:
        if name not in used and name not in ext:
            raise OpLangError(f"unknown name {name!r}: not a tensor, dimension or constant", src, pos)
        if name not in used:
            used.append(name)
    for d in used:
        if d not in ext:
            pos = next((p for a, p in st.access_pos if any(d in ix.dims for ix in a.index)), st.out_pos)
            raise OpLangError(f"cannot infer the extent of dimension {d!r}; bind it explicitly", src, pos)
    return {d: ext[d] for d in used}


def infer_dtype(e: Expr, types: Mapping[str, TensorType], default: str) -> str:
    if isinstance(e, Access):
        return types[e.tensor].dtype
    if isinstance(e, Compare) or isinstance(e, Unary) and e.fn in BOOL_FNS:
        return "bool"
    if isinstance(e, Cast):
        return e.dtype
    if isinstance(e, (Const, IndexValue)):
        return default if not (isinstance(e, Const) and e.dtype == "bool") else "bool"
    if isinstance(e, Where):
        return infer_dtype(e.a, types, default)
    kids = [infer_dtype(c, types, default) for c in e.children()]
    for pref in ("float64", "float32", "int64", "int32", "bool"):
        if pref in kids:
            return pref
    return default


def _check_ranges(st: _RawStatement, ext: Mapping[str, int], types: Mapping[str, TensorType], src: str) -> None:
    for a, pos in st.access_pos:
        if a.tensor in st.padding:
            continue
        for axis, (ix, size) in enumerate(zip(a.index, types[a.tensor].shape)):
            lo, hi = ix.bounds(ext)
            if lo < 0 or hi >= size:
                raise OpLangError(
                    f"out-of-range access {a}: axis {axis} index {ix} spans [{lo},{hi}] but {a.tensor} has "
                    f"extent {size} (declare padding for {a.tensor} if intended)", src, pos)


def compile_op(
    src: str,
    inputs: Mapping[str, Sequence[int] | TensorType] | None = None,
    *,
    extents: Mapping[str, int] | None = None,
    padding: Mapping[str, float] | None = None,
    outputs: Sequence[str] | None = None,
    dtype: str = "float32",
) -> Compute:
    """Parse index notation into a typed :class:`Compute`.

    ``inputs`` gives each input tensor's shape (or TensorType); ``extents`` binds dimensions that
    cannot be inferred; ``padding`` gives the value read outside a tensor's bounds. Outputs default
    to the tensors written but never read by a later statement.
    """
    # (parsed once per distinct call: the rewrite rules build the same ops again and again, a Winograd
    # transform per conv of each shape in every candidate graph, and a Compute is immutable)
    key = (src, tuple((n, t if isinstance(t, TensorType) else tuple(t)) for n, t in (inputs or {}).items()),
           tuple((extents or {}).items()), tuple((padding or {}).items()),
           None if outputs is None else tuple(outputs), dtype)
    try:
        hash(key)
    except TypeError:  # (a value that is no number: the parse names what is wrong with it)
        return _compile_op.__wrapped__(*key)
    return _compile_op(*key)


@functools.lru_cache(maxsize=4096)
def _compile_op(src: str, inputs: tuple[tuple[str, TensorType | tuple[int, ...]], ...],
                extents: tuple[tuple[str, int], ...], padding: tuple[tuple[str, float], ...],
                outputs: tuple[str, ...] | None, dtype: str) -> Compute:
    inputs, extents, padding = dict(inputs), dict(extents), dict(padding)
    prog = _Parser(src).program()
    types: dict[str, TensorType] = {}
    declared_inputs: list[str] = []
    declared_outputs: list[str] = []
    for name, (role, t) in prog.decls.items():
        types[name] = t
        if role == "in":
            declared_inputs.append(name)
        elif role == "out":
            declared_outputs.append(name)
    for name, t in (inputs or {}).items():
        types[name] = t if isinstance(t, TensorType) else TensorType(tuple(t), dtype)
        if name not in declared_inputs:
            declared_inputs.append(name)
    written: set[str] = set()
    statements: list[Statement] = []
    read_later: set[str] = set()
    for st in prog.statements:
        for a, pos in st.access_pos:
            if a.tensor not in types:
                raise OpLangError(f"unknown tensor {a.tensor!r}: give its shape or define it first", src, pos)
        if st.out in written or st.out in declared_inputs:
            raise OpLangError(f"tensor {st.out!r} is defined twice", src, st.out_pos)
        for k, v in (extents or {}).items():
            st.extents.setdefault(k, v)
        for k, v in (padding or {}).items():
            if any(a.tensor == k for a, _ in st.access_pos):
                st.padding.setdefault(k, v)
        declared = types.get(st.out)
        ext = _infer_extents(st, types, src, declared.shape if declared else None)
        _check_ranges(st, ext, types, src)
        order = list(st.out_dims) + [d for d in ext if d not in st.out_dims]
        if st.reduce == "=" and len(order) > len(st.out_dims):
            extra = [d for d in order if d not in st.out_dims]
            raise OpLangError(f"'=' cannot reduce over {extra}: use +=, max=, min= or *=", src, st.out_pos)
        try:
            s = Statement(st.out, tuple(st.out_dims), st.reduce, st.expr, tuple((d, ext[d]) for d in order),
                          tuple(sorted(st.padding.items())))
        except ValueError as err:
            raise OpLangError(str(err), src, st.out_pos) from None
        out_t = TensorType(s.out_shape, declared.dtype if declared else infer_dtype(st.expr, types, dtype))
        if declared and declared.shape != s.out_shape:
            raise OpLangError(f"{st.out} is declared {declared} but the statement gives shape {s.out_shape}",
                              src, st.out_pos)
        types[st.out] = out_t
        written.add(st.out)
        statements.append(s)
    for s in statements:
        read_later.update(s.inputs())
    outs = list(outputs) if outputs is not None else (
        declared_outputs or [s.out for s in statements if s.out not in read_later])
    for o in outs:
        if o not in written:
            raise OpLangError(f"output {o!r} is never written", src, 0)
    ins = [n for n in declared_inputs if any(n in s.inputs() for s in statements)]
    unread = [n for n in declared_inputs if n not in ins]
    if inputs and unread and not prog.decls:
        raise OpLangError(f"input(s) {unread} are never read", src, 0)
    ins = declared_inputs if prog.decls else ins
    used = set(ins) | written
    return Compute(tuple(ins), tuple(outs), tuple(statements), tuple((n, types[n]) for n in types if n in used))


def parse_compute(text: str) -> Compute:
    """Parse the canonical text of a Compute (``Compute.text()``) back into an equal Compute."""
    return compile_op(text)
