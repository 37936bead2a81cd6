"""torch handlers, one module per family; importing this package fills ``FUNCTIONS``, ``METHODS`` and ``MODULES``."""

from superopt.frontends.torch_ops import (  # noqa: F401  (registration)
    aten,
    attention,
    contraction,
    creation,
    elementwise,
    indexing,
    modules,
    movement,
    pool,
    recurrent,
    reduction,
    resample,
    sorting,
)
from superopt.frontends.torch_ops.context import FUNCTIONS, METHODS, MODULES, Ctx, FxImportError, T, ir_dtype, to_numpy

__all__ = ["FUNCTIONS", "METHODS", "MODULES", "Ctx", "FxImportError", "T", "ir_dtype", "to_numpy"]
