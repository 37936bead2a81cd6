"""Op programs with symbolic shapes: the two sides of a generated rule, stored as data.

A :class:`Program` is a few :class:`Step` s (core op, argument names, symbolic attributes) over named
inputs with symbolic shapes; :class:`RuleData` pairs a left-hand and a right-hand program over the
same inputs with its math line, the example extents it is verified at, and whether it is polynomial.
Both serialise to plain JSON (``rewrite_rules/generated.json``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rewrite_rules.generator import dims
from rewrite_rules.generator.core_ops import CORE_OPS, Shape, concrete_attrs
from superopt.builder import GraphBuilder
from superopt.ir.graph import Graph


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class Step:
    out: str
    op: str
    args: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)


@dataclass(frozen=True)
class Program:
    """Steps over named inputs; ``outputs``: one name (most rules) or several (multi-output merge rules)."""

    steps: tuple[Step, ...]
    outputs: tuple[str, ...]

    @property
    def output(self) -> str:
        return self.outputs[0]

    @property
    def step_of(self) -> dict[str, Step]:
        return {s.out: s for s in self.steps}

    def ops(self) -> list[str]:
        return [s.op for s in self.steps]

    def to_json(self) -> dict:
        steps = [[s.out, s.op, list(s.args), {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.attrs}]
                 for s in self.steps]
        if len(self.outputs) == 1:
            return {"steps": steps, "output": self.output}
        return {"steps": steps, "outputs": list(self.outputs)}

    @staticmethod
    def from_json(d: Mapping) -> Program:
        steps = tuple(Step(o, op, tuple(args), tuple(sorted((k, _freeze(v)) for k, v in attrs.items())))
                      for o, op, args, attrs in d["steps"])
        return Program(steps, (d["output"],) if "output" in d else tuple(d["outputs"]))

    def text(self, inputs: Sequence[str]) -> str:
        """The outputs' infix math, several in parentheses: ``(A @ B, A @ C)``."""
        if len(self.outputs) == 1:
            return self._text(self.output, inputs)
        step = self.step_of
        cuts = [step.get(o) for o in self.outputs]
        if all(c is not None and c.op == "slice" and c.args == cuts[0].args and c.attr["axis"] == cuts[0].attr["axis"]
               for c in cuts):  # slices of one tensor: a split
            sizes = ", ".join(c.attr["size"] for c in cuts)
            return f"split{cuts[0].attr['axis']}({self._text(cuts[0].args[0], inputs)}, [{sizes}])"
        return "(" + ", ".join(self._text(o, inputs) for o in self.outputs) + ")"

    def _text(self, output: str, inputs: Sequence[str]) -> str:
        """Infix math: ``A @ B``, ``A + B``, ``A * B``, ``A^T``, ``relu(A)``, ``concat1(A, B)``, ``A[q:q+r @1]``."""
        step = self.step_of

        def show(name: str, top: bool = False) -> str:
            if name in inputs:
                return name
            s = step[name]
            a = [show(x) for x in s.args]
            at = s.attr
            if s.op in ("add", "mul", "matmul"):
                sym = {"add": "+", "mul": "*", "matmul": "@"}[s.op]
                e = f"{a[0]} {sym} {a[1]}"
                return e if top else f"({e})"
            if s.op == "transpose":
                return f"{a[0]}^T"
            if s.op == "transpose_last":
                return f"{a[0]}^T(last two)"
            if s.op == "concat":
                return f"concat{at['axis']}({', '.join(a)})"
            if s.op == "slice":
                end = dims.add(at["start"], at["size"])
                return f"{a[0]}[{at['start']}:{end} on axis {at['axis']}]"
            if s.op == "unflatten":
                return f"reshape({a[0]}, {','.join(at['shape'])})"
            return f"{s.op}({', '.join(a)})"

        return show(output, top=True)


def build_program(b: GraphBuilder, program: Program, tensors: Mapping[str, str], binding: Mapping[str, int],
                  fold_constants: bool = False) -> list[str]:
    """Add ``program``'s ops to ``b`` (inputs bound to graph tensors ``tensors``); its output tensors.
    ``fold_constants``: a step whose arguments are all constants of ``b`` becomes a constant (the weights
    of a merge concatenated once, not at every run)."""
    env = dict(tensors)
    for s in program.steps:
        args = [env[a] for a in s.args]
        attrs = concrete_attrs(s.attr, binding)
        if fold_constants and all(a in b.constants for a in args):
            value = CORE_OPS[s.op].numpy([np.asarray(b.constants[a]) for a in args], attrs)
            env[s.out] = b.constant(np.ascontiguousarray(value).astype(b.types[args[0]].dtype), name=s.op)
        else:
            env[s.out] = CORE_OPS[s.op].build(b, args, attrs)
    return [env[o] for o in program.outputs]


def shape_of(shape: Shape, binding: Mapping[str, Any]) -> tuple[int, ...]:
    if shape == (dims.SHAPE_VARIABLE,):
        return tuple(binding[dims.SHAPE_VARIABLE])
    return tuple(dims.value(d, binding) for d in shape)


@dataclass(frozen=True)
class RuleData:
    name: str
    family: str
    math: str
    polynomial: bool
    inputs: tuple[tuple[str, Shape], ...]
    lhs: Program
    rhs: Program
    bindings: tuple[tuple[tuple[str, Any], ...], ...]  # example extents, at least two

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.inputs)

    def example(self, k: int) -> Graph:
        binding = dict(self.bindings[k])
        b = GraphBuilder(f"{self.name}_ex{k}")
        tensors = {n: b.input(n, shape_of(s, binding)) for n, s in self.inputs}
        return b.build(build_program(b, self.lhs, tensors, binding))

    def to_json(self) -> dict:
        return {"name": self.name, "family": self.family, "math": self.math, "polynomial": self.polynomial,
                "inputs": [[n, list(s)] for n, s in self.inputs], "lhs": self.lhs.to_json(), "rhs": self.rhs.to_json(),
                "bindings": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in b} for b in self.bindings]}

    @staticmethod
    def from_json(d: Mapping) -> RuleData:
        return RuleData(d["name"], d["family"], d["math"], bool(d["polynomial"]),
                        tuple((n, tuple(s)) for n, s in d["inputs"]), Program.from_json(d["lhs"]),
                        Program.from_json(d["rhs"]),
                        tuple(tuple(sorted((k, _freeze(v)) for k, v in b.items())) for b in d["bindings"]))
