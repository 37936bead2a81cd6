"""superopt: a search-based superoptimizer for tensor programs.

    import superopt
    prog = superopt.optimize("model.onnx")              # or a Graph, or a torch module with example inputs
    votes = superopt.op("V[n,o] += P[n,i] * W[i,o]")    # a user op from index notation, compiled per shape
    torch.compile(model, backend="superopt")             # registered on import
"""

from importlib import import_module
from typing import Any

_API = {name: "superopt.api" for name in ("optimize", "optimize_op", "define_op", "load_graph", "OptimizeConfig",
                                          "OptimizeReport", "OptimizedProgram", "OptimizedModel", "VerificationError", "load")}
_API |= {"op": "superopt.user_op", "UserOp": "superopt.user_op"}


def __getattr__(name: str) -> Any:  # lazy: ``import superopt`` stays cheap (no numpy/onnx/torch until used)
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'superopt' has no attribute {name!r}")


def _register_torch_backend() -> None:
    """``torch.compile(backend="superopt")`` after ``import superopt``, when torch is already imported (the
    backend module registers itself when it is imported; torch's own entry point finds it otherwise)."""
    import sys

    if "torch" in sys.modules:
        try:
            import_module("superopt.frontends.torch_backend")
        except Exception:  # noqa: BLE001 - registration is a convenience; compile names the real error later
            pass


_register_torch_backend()
__all__ = list(_API)
