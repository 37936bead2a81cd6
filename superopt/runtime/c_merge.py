"""Kernels whose C differs only in integer constants, compiled once: function merging with parameters.

DenseNet's convolutions differ from block to block only in their input channels, so their printed kernels
are the same text but for the reduction's trip counts and the strides that follow from it, and gcc spends a
third of a second on each. A group of such kernels is compiled as one body, ``so_merged_<digest>(args,
lifted)``, that reads each integer literal that differs between the group's members from ``lifted``; each
member becomes a wrapper of its own name that passes its values (LLVM's function merging with parameters,
done on the C text).

A member run through the merged body computes what its own text computes: the body is the member's text with
some literals replaced by ``const`` variables of the literal's own C type holding the same values. What the
change could cost is speed, so a literal stays a literal, and a difference in it keeps kernels apart, where a
constant is what makes the code fast or where C requires a constant:

- preprocessor lines (``#pragma GCC unroll N``, OpenMP clauses), initializers' braces, a call's direct
  arguments (a builtin's immediate), and the right operand of ``/``, ``%``, ``<<`` and ``>>`` (a division by
  a constant is a multiply);
- all that decides a register: the subscript of a local array (a register tile, a vector's lanes), and every
  loop head and ``if`` test that reads a variable such a subscript reads, or a variable one of those is
  defined from. Those loops are unrolled so that each element stays in a register; a bound read at run time
  would put the tile in memory.

What is left to lift is outer trip counts, block tests and address strides.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_KERNEL = re.compile(r"\s*void\s+([A-Za-z_]\w*)\s*\(\s*void\s*\*\*\s*args\s*\)\s*\{")
_TOKEN = re.compile(r"""
    (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<pre>^[ \t]*\#[^\n]*)
  | (?P<number>(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[A-Za-z]*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<op><<=|>>=|<<|>>|->|\+\+|--|&&|\|\||[-+*/%<>=!&|^]=|[^\s])
  | (?P<space>\s+)
""", re.S | re.M | re.X)
_INT_MAX = 2**31 - 1
_CONTROL = {"for", "if", "while", "switch"}
_KEYWORDS = _CONTROL | {"return", "sizeof", "int", "long", "float", "double", "char", "short", "unsigned",
                        "signed", "const", "static", "void", "_Bool", "restrict", "else", "do"}
_DIVISOR_OPS = {"/", "%", "<<", ">>", "/=", "%=", "<<=", ">>="}
_COMPARISONS = {"<", ">", "<=", ">=", "==", "!="}
_INT_TYPES = {"int", "long", "int32_t", "int64_t"}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class _Kernel:
    """A mergeable source: its name, tokens, the key it groups by and its liftable literals' values."""

    source: str
    name: str
    tokens: tuple[_Token, ...]
    key: str
    slots: tuple[int, ...]  # token indices of the liftable literals
    values: tuple[int, ...]
    comments: tuple[tuple[int, int], ...]  # their character spans in ``source``


def _tokenize(source: str) -> list[_Token] | None:
    out, pos = [], 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            return None
        kind = m.lastgroup or ""
        if kind != "space":
            out.append(_Token(kind, m.group(), m.start(), m.end()))
        pos = m.end()
    return out


def _parse(source: str) -> _Kernel | None:
    """``source`` as a mergeable kernel: one function of the ``void NAME(void **args)`` ABI and nothing
    else; None for any other source."""
    head = _KERNEL.match(source)
    toks = _tokenize(source) if head else None
    if not toks:
        return None
    code = [t for t in toks if t.kind != "comment"]
    depth = 0
    for k, t in enumerate(code):
        depth += (t.text == "{") - (t.text == "}")
        if depth < 0 or (depth == 0 and t.text == "}" and k != len(code) - 1):
            return None
    if depth or code[-1].text != "}":
        return None
    fixed = _fixed_literals(code)
    if fixed is None:
        return None
    name = head.group(1)
    if sum(t.text == name for t in code) != 1:
        return None  # (a kernel that names itself: its merged body would call the first member)
    key, slots, values = [], [], []
    for k, t in enumerate(code):
        if t.kind == "name" and t.text == name:
            key.append("\0NAME")
        elif t.kind == "number" and t.text.isdigit() and k not in fixed:
            value = int(t.text)
            key.append("\0INT" if value <= _INT_MAX else "\0LONG")
            slots.append(k)
            values.append(value)
        else:
            key.append(t.text)
    comments = tuple((t.start, t.end) for t in toks if t.kind == "comment")
    return _Kernel(source, name, tuple(code), "\x01".join(key), tuple(slots), tuple(values), comments)


def _fixed_literals(toks: list[_Token]) -> set[int] | None:
    """The indices of the integer literals that must stay literals (see the module's list); None where the
    brackets do not balance. A literal may be lifted only where it is address arithmetic (in a subscript of
    an array that is not local, through parentheses) or in the head of a ``for`` or ``if``."""
    texts = [t.text for t in toks]
    fixed: set[int] = set()
    stack: list[tuple[int, str]] = []  # (index of the open bracket, its role)
    local_arrays: set[str] = set()
    subscripts: list[tuple[int, int, str]] = []
    heads: list[tuple[int, int]] = []  # the parenthesized heads of for / if
    last_close_role = ""
    for k, t in enumerate(toks):
        if t.kind == "pre":
            continue
        if t.text in ("(", "[", "{"):
            prev = texts[k - 1] if k else ""
            if t.text == "(":
                role = ("head" if prev in ("for", "if") else
                        "call" if toks[k - 1].kind == "name" and prev not in _KEYWORDS else "group")
            elif t.text == "[":
                role = "subscript"
            elif any(r == "init" for _, r in stack) or prev == "=" or (prev == ")" and last_close_role == "group"):
                role = "init"  # (a compound literal follows its cast's parentheses)
            else:
                role = "block"
            stack.append((k, role))
        elif t.text in (")", "]", "}"):
            if not stack:
                return None
            start, role = stack.pop()
            last_close_role = role
            if role == "subscript" and start > 0 and toks[start - 1].kind == "name":
                array = texts[start - 1]
                subscripts.append((start, k, array))
                if k == start + 2 and toks[start + 1].kind == "number" and k + 1 < len(toks) and \
                        texts[k + 1] in (";", ",", "=", "["):
                    local_arrays.add(array)  # NAME[literal] declared (or, conservatively, a literal store)
            elif role == "head":
                heads.append((start, k))
        elif t.kind == "number":
            context = next((role for _, role in reversed(stack) if role != "group"), "")
            beside = {texts[k - 1], texts[k + 1] if k + 1 < len(texts) else ""}
            if context not in ("subscript", "head") or texts[k - 1] in _DIVISOR_OPS or \
                    (context == "subscript" and beside & _COMPARISONS):
                fixed.add(k)
    if stack:
        return None
    register: set[str] = set()
    for start, end, array in subscripts:
        if array in local_arrays:
            fixed.update(i for i in range(start, end) if toks[i].kind == "number")
            register.update(texts[i] for i in range(start, end) if toks[i].kind == "name")
    definitions = _definitions(toks)
    grown = True
    while grown:
        grown = False
        for var, spans in definitions.items():
            if var in register:
                for start, end in spans:
                    new = {texts[i] for i in range(start, end) if toks[i].kind == "name"} - register
                    if new:
                        register |= new
                        grown = True
    for start, end in heads:
        if any(toks[i].kind == "name" and texts[i] in register for i in range(start, end)):
            fixed.update(i for i in range(start, end) if toks[i].kind == "number")
    return fixed


def _definitions(toks: list[_Token]) -> dict[str, list[tuple[int, int]]]:
    """Each ``TYPE NAME = expr`` (a declaration or a loop's start): the name to its initializers' spans."""
    out: dict[str, list[tuple[int, int]]] = {}
    for k in range(len(toks) - 2):
        if toks[k].text in _INT_TYPES and toks[k + 1].kind == "name" and toks[k + 2].text == "=":
            end = k + 3
            while end < len(toks) and toks[end].text not in (";", ","):
                end += 1
            out.setdefault(toks[k + 1].text, []).append((k + 3, end))
    return out


def _merged_body(kernel: _Kernel, lifted: dict[int, str], head: str) -> str:
    """``kernel``'s text from its body's opening brace on, after ``head``: the literals at ``lifted``'s token
    indices replaced by its names, comments dropped (they describe one member)."""
    src = kernel.source
    pos = next(t for t in kernel.tokens if t.text == "{").end
    out = [head]
    edits = sorted([(start, end, "") for start, end in kernel.comments] +
                   [(kernel.tokens[k].start, kernel.tokens[k].end, v) for k, v in lifted.items()])
    for start, end, text in edits:
        if start >= pos:
            out += [src[pos:start], text]
            pos = end
    out.append(src[pos:])
    return "".join(out)


def merge_sources(sources: list[str], min_chars: int = 0) -> tuple[list[str], list[str]]:
    """Each group of two or more of ``sources`` of at least ``min_chars`` characters that differ only in
    liftable literals, compiled as one: the merged bodies, and ``sources`` in order with each member
    replaced by its wrapper."""
    distinct = list(dict.fromkeys(sources))  # (a source given twice is one kernel: both get its wrapper)
    kernels = [_parse(s) if len(s) >= min_chars else None for s in distinct]
    groups: dict[str, list[_Kernel]] = {}
    for kernel in kernels:
        if kernel is not None:
            groups.setdefault(kernel.key, []).append(kernel)
    wrappers: dict[str, str] = {}
    bodies = []
    for group in groups.values():
        if len(group) < 2 or len({k.name for k in group}) < len(group):
            continue
        first = group[0]
        varying = [j for j in range(len(first.slots)) if len({k.values[j] for k in group}) > 1]
        ctypes = ["int" if max(k.values[j] for k in group) <= _INT_MAX else "long" for j in varying]
        lifted = {first.slots[j]: f"so_lift{n}" for n, j in enumerate(varying)}
        # the constants' declarations open the body
        decls = "".join(f"\n    const {c} so_lift{n} = ({c})so_lifted[{n}];" for n, c in enumerate(ctypes))
        text = _merged_body(first, lifted, "void so_merged_DIGEST(void **args, const long long *so_lifted) {" + decls)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        text = text.replace("so_merged_DIGEST", f"so_merged_{digest}", 1)
        bodies.append(text)
        proto = f"void so_merged_{digest}(void **args, const long long *so_lifted);"
        for kernel in group:
            values = ", ".join(str(kernel.values[j]) for j in varying)
            wrappers[kernel.source] = (f"{proto}\nvoid {kernel.name}(void **args) {{\n"
                                       f"    static const long long lifted[] = {{{values}}};\n"
                                       f"    so_merged_{digest}(args, lifted);\n}}\n")
    return bodies, [wrappers.get(s, s) for s in sources]
