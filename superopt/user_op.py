"""User ops from index notation: ``superopt.op(text)`` is a callable compiled per input shape.

    votes = superopt.op("V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]", extents={"kh": 3, "kw": 3})
    v = votes(P, W)            # numpy in, numpy out; torch in, torch out

- The text is one or more statements, separated by newlines or ``;``.
- Inputs are the tensors read but never written, in order of first appearance; outputs are the tensors
  written and not read by a later statement, or those named by ``outputs=``, in that order.
- Shapes come from the call: the first call with a new shape signature compiles (and verifies) it; later
  calls with that signature reuse it.
- Verification runs on the call's own inputs: each element's error against a
  float64 reference is measured against the magnitude of the terms it is computed from
  (``superopt.interp.tolerance``), so an ill-conditioned op (a division by a nearly cancelling sum) is not
  failed for rounding it cannot avoid, and a wrong kernel is still caught.
- ``tune=`` searches schedules for each new shape on its first call: an int is a number of measurements, a
  time (``"30s"``, ``"2m"``, or seconds as a float) a wall-clock budget for that call's whole compilation.
  ``database=PATH`` keeps the measurements (a tuning database, JSON lines): a shape it already holds is
  loaded from it and not tuned again, in this process or another. ``database=`` alone only reads it.
- Called with torch tensors, the op runs as a ``torch.library`` custom op (``torch.ops.superopt.<name>``),
  so torch.fx tracing and ``torch.compile`` keep it as one op (with a fake implementation for shapes).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superopt.lang.errors import OpLangError
from superopt.lang.parser import _Parser, compile_op


class UserOpVerificationError(RuntimeError):
    """The compiled user op disagrees with the reference on the call's inputs."""


def _signature(text: str, outputs: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(inputs in order of first appearance, outputs) of the op text."""
    prog = _Parser(text).program()
    written = {st.out for st in prog.statements}
    inputs: list[str] = []
    for st in prog.statements:
        for a, _ in sorted(st.access_pos, key=lambda ap: ap[1]):
            if a.tensor not in written and a.tensor not in inputs:
                inputs.append(a.tensor)
    if outputs is None:
        last_write = {st.out: i for i, st in enumerate(prog.statements)}
        outs = []
        for i, st in enumerate(prog.statements):
            later_reads = {a.tensor for s2 in prog.statements[i + 1:] for a, _ in s2.access_pos}
            if st.out not in later_reads and st.out not in outs and last_write[st.out] == i:
                outs.append(st.out)
    else:
        outs = list(outputs)
        for o in outs:
            if o not in written:
                raise OpLangError(f"output {o!r} is never written", text, 0)
    if not inputs:
        raise OpLangError("the op reads no input tensor", text, 0)
    return inputs, outs


@dataclass(frozen=True)
class _Compiled:
    program: Any  # superopt.api.OptimizedProgram
    out_types: tuple[tuple[tuple[int, ...], str], ...]


class UserOp:
    """A compiled-per-shape op from index notation (see the module docstring)."""

    def __init__(self, text: str, outputs: Sequence[str] | None = None, *, name: str | None = None,
                 extents: Mapping[str, int] | None = None, padding: Mapping[str, float] | None = None,
                 threads: int = 2, cost_model: str | None = None, verify: bool = True,
                 tune: int | float | str | None = None, database: str | Path | None = None) -> None:
        self.text = text
        self.inputs, self.outputs = _signature(text, outputs)
        digest = hashlib.sha256(f"{text}|{self.outputs}|{sorted((extents or {}).items())}".encode()).hexdigest()[:10]
        self.name = name or f"op_{digest}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ValueError(f"op name {self.name!r} must be an identifier")
        self.extents = dict(extents or {})
        self.padding = dict(padding or {})
        self.threads = threads
        self.cost_model = cost_model
        self.verify = verify
        self.tune_trials, self.tune_s = tune_budget(tune)
        if database is not None and (not str(database).strip() or Path(database).is_dir()):
            raise ValueError(f"bad database={str(database)!r}: give the path of a tuning database file (JSON lines)")
        self.database = None if database is None else Path(database)
        self.reports: dict[tuple, Any] = {}  # shape signature -> superopt.api.OptimizeReport of its compilation
        self._compiled: dict[tuple, _Compiled] = {}
        self._torch_op = None
        self.max_error: dict[tuple, float] = {}  # signature -> largest error of the terms' magnitude

    # -- shapes and compilation ------------------------------------------------------------------------
    def compute(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[str] | None = None):
        from superopt.ir.types import TensorType

        dtypes = dtypes or ["float32"] * len(shapes)
        types = {n: TensorType(tuple(int(d) for d in s), dt) for n, s, dt in zip(self.inputs, shapes, dtypes, strict=True)}
        return compile_op(self.text, types, extents=self.extents, padding=self.padding, outputs=self.outputs)

    def output_types(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[str] | None = None
                     ) -> list[tuple[tuple[int, ...], str]]:
        c = self.compute(shapes, dtypes)
        return [(c.type_of[o].shape, c.type_of[o].dtype) for o in self.outputs]

    def _compile(self, arrays: Sequence[np.ndarray]) -> _Compiled:
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        hit = self._compiled.get(key)
        if hit is not None:
            return hit
        from superopt.api import OptimizeConfig, optimize
        from superopt.builder import GraphBuilder

        c = self.compute([a.shape for a in arrays], [_ir_dtype(a.dtype) for a in arrays])
        b = GraphBuilder(self.name)
        ins = [b.input(n, c.type_of[n].shape, c.type_of[n].dtype) for n in c.inputs]
        outs = b.add_compute(c, ins, self.name, out_names=list(c.outputs))
        graph = b.build(outs)
        prog = optimize(graph, OptimizeConfig(threads=self.threads, verify=False, cost_model=self.cost_model,
                                              database=self.database, tune_trials=self.tune_trials,
                                              # (a fifth of the budget is left for the check of the result
                                              # on the call's inputs and the work before and after optimize)
                                              budget_s=None if self.tune_s is None else 0.8 * self.tune_s))
        self.reports[key] = prog.report
        compiled = _Compiled(prog, tuple((c.type_of[o].shape, c.type_of[o].dtype) for o in self.outputs))
        if self.verify:
            self.max_error[key] = self._verify(prog, arrays)
        self._compiled[key] = compiled
        return compiled

    def program(self, *arrays: np.ndarray):
        """The ``superopt.OptimizedProgram`` that runs inputs of these arrays' shapes and dtypes (compiled on first
        use), with its report and its kernels' schedules (``program.executor.traces``)."""
        return self._compile([np.ascontiguousarray(a) for a in arrays]).program

    def _verify(self, prog, arrays: Sequence[np.ndarray]) -> float:
        """The largest error against float64 on these inputs, each element measured against the magnitude of
        the terms it is computed from (``superopt.interp.tolerance``); raises when it exceeds the tolerance."""
        from superopt.api import OptimizeConfig, VerificationError, verify

        feed = dict(zip(prog.graph.inputs, arrays, strict=True))
        try:
            return verify(prog.graph, prog.executor, inputs=feed, rtol=OptimizeConfig().rtol, random=False)
        except VerificationError as e:
            raise UserOpVerificationError(f"{self.name}: {e}") from None

    # -- calling -----------------------------------------------------------------------------------------
    def run_numpy(self, *arrays: np.ndarray) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise TypeError(f"{self.name} takes {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(arrays)}")
        arrays = [np.ascontiguousarray(a) for a in arrays]
        compiled = self._compile(arrays)
        out = compiled.program.executor(dict(zip(compiled.program.graph.inputs, arrays, strict=True)))
        return [out[o] for o in compiled.program.graph.outputs]

    def __call__(self, *args: Any) -> Any:
        if any(type(a).__module__.startswith("torch") for a in args):
            outs = self.torch_op()(*args)
            return outs[0] if len(self.outputs) == 1 else tuple(outs)
        outs = self.run_numpy(*[np.asarray(a) for a in args])
        return outs[0] if len(outs) == 1 else tuple(outs)

    def torch_op(self):
        """``torch.ops.superopt.<name>``: the op registered through ``torch.library`` (once)."""
        if self._torch_op is None:
            self._torch_op = _register_torch(self)
        return self._torch_op

    @property
    def compiled_shapes(self) -> list[tuple]:
        return [tuple(s for s, _ in k) for k in self._compiled]


def tune_budget(tune: int | float | str | None) -> tuple[int | None, float | None]:
    """``tune=`` as (measurements, seconds): an int counts measurements; a float is seconds; a string is a time
    with a unit (``"90s"``, ``"2m"``, ``"1h"``). Anything else is a one-line ValueError naming the value."""
    if tune is None:
        return None, None
    if isinstance(tune, bool) or not isinstance(tune, (int, float, str, np.integer, np.floating)):
        raise ValueError(f"bad tune={tune!r}: give a number of measurements (int), seconds (float) or a time "
                         "such as '30s'")
    if isinstance(tune, (int, np.integer)):
        if tune < 1:
            raise ValueError(f"bad tune={tune!r}: at least 1 measurement")
        return int(tune), None
    if isinstance(tune, str):
        from superopt.cli import parse_time

        return None, parse_time(tune, "tune")
    if not (tune > 0 and np.isfinite(tune)):
        raise ValueError(f"bad tune={tune!r}: the time budget must be a positive number of seconds")
    return None, float(tune)


def _ir_dtype(dt: np.dtype) -> str:
    name = np.dtype(dt).name
    if name not in ("float32", "float64", "int32", "int64", "bool"):
        raise TypeError(f"unsupported input dtype {name}")
    return name


_LIB = None


def _register_torch(op: UserOp):
    import torch

    from superopt.frontends.torch_ops.user_ops import REGISTERED

    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("superopt", "FRAGMENT")
    ins = ", ".join(f"Tensor {n}" for n in op.inputs)
    ret = "Tensor" if len(op.outputs) == 1 else "(" + ", ".join("Tensor" for _ in op.outputs) + ")"
    qual = f"superopt::{op.name}"
    if op.name not in REGISTERED:
        _LIB.define(f"{op.name}({ins}) -> {ret}")

        def impl(*tensors):
            outs = op.run_numpy(*[t.detach().cpu().numpy() for t in tensors])
            res = [torch.from_numpy(np.array(o)) for o in outs]
            return res[0] if len(res) == 1 else tuple(res)

        def fake(*tensors):
            types = op.output_types([t.shape for t in tensors], [str(t.dtype).replace("torch.", "") for t in tensors])
            res = [tensors[0].new_empty(s, dtype=getattr(torch, dt)) for s, dt in types]
            return res[0] if len(res) == 1 else tuple(res)

        _LIB.impl(op.name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(qual, fake, lib=_LIB)
        REGISTERED[op.name] = op
    elif REGISTERED[op.name].text != op.text:
        raise ValueError(f"a different op is already registered as torch.ops.superopt.{op.name}: pass another name=")
    packet = getattr(torch.ops.superopt, op.name)

    def call(*tensors):
        out = packet(*tensors)
        return [out] if len(op.outputs) == 1 else list(out)

    return call


def op(text: str, outputs: Sequence[str] | None = None, **options: Any) -> UserOp:
    """Define a user op from index notation (see the module docstring); ``options``: name, extents, padding,
    threads, cost_model, verify, tune, database."""
    return UserOp(text, outputs, **options)


__all__ = ["UserOp", "UserOpVerificationError", "op", "tune_budget"]
