"""superopt: a search-based superoptimizer for tensor programs.

    import superopt
    prog = superopt.optimize("model.onnx")              # or a Graph, or a torch module with example inputs
    prog = superopt.optimize_op("C[i,j] += A[i,k] * B[k,j]", {"A": (64, 32), "B": (32, 16)})
"""

from typing import Any

_API = ("optimize", "optimize_op", "define_op", "load_graph", "OptimizeConfig", "OptimizeReport",
        "OptimizedProgram", "VerificationError")


def __getattr__(name: str) -> Any:  # lazy: ``import superopt`` stays cheap (no numpy/onnx/torch until used)
    if name in _API:
        from superopt import api

        return getattr(api, name)
    raise AttributeError(f"module 'superopt' has no attribute {name!r}")


__all__ = list(_API)
