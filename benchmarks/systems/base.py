"""The System interface every benchmarked system implements.

A system module under ``benchmarks/systems/`` exposes ``SYSTEM``, an instance of
a :class:`System` subclass (or any object with the same attributes/methods):

* ``name``: short id used in tables (e.g. ``"superopt"``).
* ``available() -> (bool, str)``: whether it can run here, and a note if not.
* ``supports(instance) -> bool``: whether it handles a workload (default: yes).
* ``prepare(instance, quick) -> (fn, prepare_seconds)``: build everything needed
  (compile, create sessions, pack weights, convert inputs) and return a
  zero-argument callable ``fn()`` that runs one inference on ``instance.inputs``
  and returns the output (torch tensor or numpy array, same shape as eager's).
  ``prepare_seconds`` is what is reported as compile/prepare time (include any
  compilation triggered by the first call).  ``fn`` is called many times and
  timed; it must do the full computation each time.

``instance`` is a :class:`benchmarks.workloads.WorkloadInstance`: it provides
``name``, ``module`` (torch eager module), ``inputs`` (tuple of float32 tensors),
``onnx_bytes()`` (serialized ONNX model taking the same inputs in order),
``reference`` (float64 numpy output or None), ``flops`` and ``meta``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

THREADS = 2


class System:
    name: str = "system"
    description: str = ""
    last_note: str = ""  # optional: set by prepare(); shown in the status column

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, instance: Any) -> bool:
        return True

    def skip_in_quick(self, instance: Any) -> bool:
        """Systems may opt out of expensive workloads in --quick mode."""
        return False

    def versions(self) -> dict[str, str]:
        return {}

    def prepare(self, instance: Any, quick: bool = False) -> tuple[Callable[[], Any], float]:
        raise NotImplementedError
