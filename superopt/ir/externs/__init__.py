"""Extern op kinds: what index notation cannot express, with numpy semantics and shape rules.

Each kind maps to ``(evaluate(inputs, attrs) -> outputs, infer(types, attrs) -> types)`` in
:data:`EXTERNS`. Code generators handle ``reshape`` as an alias; the executor and the reference
interpreter call the numpy ``evaluate`` for the rest. The kinds, by family:

- movement: ``reshape``, ``gather``
- indexing: ``gather_elements``, ``gather_nd``, ``scatter_elements``, ``scatter_nd``
- sorting: ``topk`` (sort, argsort), ``arg_reduce`` (argmax, argmin)
- scan: ``cumulative`` (cumsum, cumprod)
- resize: ``resize``
- control_flow: ``if``, ``loop``, ``scan`` (branches and bodies are Graphs, run compiled)
"""

from superopt.ir.externs import control_flow, indexing, movement, resize, scan, sorting  # noqa: F401  (they register kinds)
from superopt.ir.externs.registry import EXTERNS, Evaluate, Infer, evaluate_extern, infer_extern, register
from superopt.ir.types import dtype_name

__all__ = ["EXTERNS", "Evaluate", "Infer", "register", "evaluate_extern", "infer_extern", "dtype_name"]
