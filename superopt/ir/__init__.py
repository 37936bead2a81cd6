"""The superopt IR: scalar expressions over named dimensions, statements, compute ops and graphs.

Everything here is immutable (frozen dataclasses). ``digest()`` gives a stable structural hash
(sha256 of canonical text) that keys every cache on disk; Python's ``hash`` serves in-memory maps.
"""

from superopt.ir.compute import Compute
from superopt.ir.expr import (
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
from superopt.ir.graph import Constant, Extern, Graph, Node
from superopt.ir.statement import REDUCE_IDENTITY, Statement
from superopt.ir.types import DTYPES, TensorType

__all__ = [
    "Access", "Affine", "Binary", "Cast", "Compare", "Const", "Expr", "IndexValue", "Unary", "Where",
    "Statement", "REDUCE_IDENTITY", "Compute", "Graph", "Node", "Extern", "Constant", "TensorType", "DTYPES",
]
