"""Extern op kinds: what index notation cannot express, with numpy semantics and shape rules.

Each kind maps to ``(evaluate(inputs, attrs) -> outputs, infer(types, attrs) -> types)`` in
:data:`EXTERNS`. Code generators handle ``reshape`` as an alias; the executor and the reference
interpreter call the numpy ``evaluate`` for the rest. The kinds, by family:

- movement: ``reshape``, ``gather``, ``bitcast``
- indexing: ``gather_elements``, ``gather_nd``, ``scatter_elements``, ``scatter_nd``
- sorting: ``topk`` (sort, argsort), ``arg_reduce`` (argmax, argmin)
- scan: ``cumulative`` (cumsum, cumprod)
- resize: ``resize``
- linalg: ``det``; text: ``tfidf``; detection: ``roi_align``
- data_dependent: ``nonzero``, ``unique``, ``nms`` (output shapes known only at run time)
- control_flow: ``if``, ``loop``, ``scan`` (branches and bodies are Graphs, run compiled)
"""

from superopt.ir.externs import (  # noqa: F401  (they register kinds)
    control_flow,
    data_dependent,
    detection,
    indexing,
    linalg,
    movement,
    resize,
    scan,
    sorting,
    text,
)
from superopt.ir.externs.registry import (
    EXTERNS,
    RUN_TIME_SHAPED,
    Evaluate,
    Infer,
    check_run_time_shapes,
    evaluate_extern,
    infer_extern,
    register,
    run_time_shaped,
)
from superopt.ir.types import dtype_name

__all__ = ["EXTERNS", "RUN_TIME_SHAPED", "Evaluate", "Infer", "register", "evaluate_extern", "infer_extern", "dtype_name",
           "run_time_shaped", "check_run_time_shapes"]
