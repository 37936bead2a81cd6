"""Tokenizer for the op language."""

from __future__ import annotations

import re
from dataclasses import dataclass

from superopt.lang.errors import OpLangError

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\r]+|\#[^\n]*)
      | (?P<nl>[\n;])
      | (?P<num>(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?)
      | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
      | (?P<op>\+=|\*=|<=|>=|==|!=|[-+*/()\[\],=<>:])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # num, name, op, nl, end
    text: str
    pos: int


def tokenize(src: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m:
            raise OpLangError(f"unexpected character {src[pos]!r}", src, pos)
        kind = m.lastgroup
        if kind != "ws":
            out.append(Token(kind, m.group(), pos))
        pos = m.end()
    out.append(Token("end", "", len(src)))
    return out
