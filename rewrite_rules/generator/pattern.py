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
    steps: tuple[Step, ...]
    output: str

    @property
    def step_of(self) -> dict[str, Step]:
        return {s.out: s for s in self.steps}

    def ops(self) -> list[str]:
        return [s.op for s in self.steps]

    def to_json(self) -> dict:
        return {"steps": [[s.out, s.op, list(s.args), {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.attrs}]
                          for s in self.steps], "output": self.output}

    @staticmethod
    def from_json(d: Mapping) -> Program:
        steps = tuple(Step(o, op, tuple(args), tuple(sorted((k, _freeze(v)) for k, v in attrs.items())))
                      for o, op, args, attrs in d["steps"])
        return Program(steps, d["output"])

    def text(self, inputs: Sequence[str]) -> str:
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
            if s.op == "concat":
                return f"concat{at['axis']}({a[0]}, {a[1]})"
            if s.op == "slice":
                end = dims.add(at["start"], at["size"])
                return f"{a[0]}[{at['start']}:{end} on axis {at['axis']}]"
            if s.op == "unflatten":
                return f"reshape({a[0]}, {','.join(at['shape'])})"
            return f"{s.op}({', '.join(a)})"

        return show(self.output, top=True)


def build_program(b: GraphBuilder, program: Program, tensors: Mapping[str, str], binding: Mapping[str, int]) -> str:
    """Add ``program``'s ops to ``b`` (inputs bound to graph tensors ``tensors``); its output tensor."""
    env = dict(tensors)
    for s in program.steps:
        env[s.out] = CORE_OPS[s.op].build(b, [env[a] for a in s.args], concrete_attrs(s.attr, binding))
    return env[program.output]


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
        return b.build([build_program(b, self.lhs, tensors, binding)])

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
