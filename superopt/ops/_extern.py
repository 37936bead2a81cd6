"""Adding an extern node, folded into a constant when every input is a constant."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from superopt.builder import GraphBuilder
from superopt.ir.externs import evaluate_extern, infer_extern
from superopt.ir.graph import Extern


def extern_op(b: GraphBuilder, kind: str, inputs: Sequence[str], name: str | None = None, **attrs: Any) -> list[str]:
    values = [b.const_value(i) for i in inputs]
    if not all(v is not None for v in values):
        return b.extern(kind, inputs, name, **attrs)
    attr = Extern.of(kind, **attrs).attr
    types = infer_extern(kind, [b.type(i) for i in inputs], attr)
    outs = evaluate_extern(kind, values, attr)
    return [b.constant(o.astype(t.np_dtype, copy=False)) for o, t in zip(outs, types, strict=True)]
