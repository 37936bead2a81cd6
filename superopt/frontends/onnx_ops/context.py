"""What every ONNX converter sees: the node, its attributes, the graph builder, and the registry.

A converter is ``fn(ctx, inputs) -> tensor name(s)``, registered for one or more op types with
``@_conv("OpType", ...)`` (an op of another domain as ``"domain.OpType"``, see :func:`op_key`); ``inputs`` are
graph tensor names (``None`` for a skipped optional input). ``ctx.opset`` is the model's default-domain opset
(the one a subgraph's ops are read at), for ops of every domain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from superopt.builder import GraphBuilder

ELEM = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
}


class OnnxImportError(ValueError):
    """A model superopt cannot import; the message is one line and names the culprit."""

    def __init__(self, msg: str) -> None:
        super().__init__(" ".join(str(msg).split()))


class NeedsConstant(OnnxImportError):
    """A node needs a compile-time value (a shape, axes, scales, ...) that is only known at run time;
    ``tensor`` names the graph tensor it needs (None where unknown)."""

    def __init__(self, msg: str, tensor: str | None = None) -> None:
        super().__init__(msg)
        self.tensor = tensor


@dataclass
class _Ctx:
    b: GraphBuilder
    opset: int
    node: onnx.NodeProto
    attrs: dict[str, Any] = field(default_factory=dict)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def const(self, t: str | None, what: str) -> np.ndarray | None:
        if t is None:
            return None
        v = self.b.const_value(t)
        if v is None:
            raise NeedsConstant(f"{what} ({t!r}) must be a constant", tensor=t)
        return v

    def ints(self, t: str | None, what: str) -> list[int] | None:
        v = self.const(t, what)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


Converter = Callable[[_Ctx, list], Any]
CONVERTERS: dict[str, Converter] = {}
DEFAULT_DOMAINS = ("", "ai.onnx")


def op_key(domain: str, op_type: str) -> str:
    """The registry key of an op: its type in the default domain, ``domain.OpType`` in any other."""
    return op_type if domain in DEFAULT_DOMAINS else f"{domain}.{op_type}"


def _conv(*names: str):
    def deco(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return deco


_NeedsConstant = NeedsConstant  # the name the importer and backend have always used
