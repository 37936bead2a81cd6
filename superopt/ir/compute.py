"""A compute op: a short program of statements with its own local tensor names.

The op is self-contained (inputs, outputs and temporaries all typed), so equal computations
hash equally wherever they occur in a graph: the kernel cache keys on :meth:`Compute.digest`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from superopt.ir.statement import Statement
from superopt.ir.types import TensorType


@dataclass(frozen=True)
class Compute:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    statements: tuple[Statement, ...]
    types: tuple[tuple[str, TensorType], ...]

    def __post_init__(self) -> None:
        self.validate()

    @cached_property
    def type_of(self) -> dict[str, TensorType]:
        return dict(self.types)

    @property
    def temporaries(self) -> tuple[str, ...]:
        return tuple(s.out for s in self.statements if s.out not in self.outputs)

    def validate(self) -> None:
        types = dict(self.types)
        defined = set(self.inputs)
        for name in list(self.inputs) + list(self.outputs):
            if name not in types:
                raise ValueError(f"compute op has no type for tensor {name!r}")
        for st in self.statements:
            for a in st.expr.accesses():
                if a.tensor not in defined:
                    raise ValueError(f"statement for {st.out} reads {a.tensor!r} before it is defined")
                rank = types[a.tensor].rank
                if len(a.index) != rank:
                    raise ValueError(f"{a} indexes {a.tensor} with {len(a.index)} indices but it has rank {rank}")
                if a.tensor in st.pad_value:
                    continue
                ext = st.extent
                for axis, (ix, size) in enumerate(zip(a.index, types[a.tensor].shape)):
                    lo, hi = ix.bounds(ext)
                    if lo < 0 or hi >= size:
                        raise ValueError(
                            f"out-of-range access {a}: axis {axis} index {ix} spans [{lo},{hi}] but {a.tensor} "
                            f"has extent {size}; declare padding for {a.tensor} if this is intended")
            if st.out in defined:
                raise ValueError(f"tensor {st.out!r} is defined twice")
            t = types.get(st.out)
            if t is None:
                raise ValueError(f"compute op has no type for tensor {st.out!r}")
            if t.shape != st.out_shape:
                raise ValueError(f"statement for {st.out} has shape {st.out_shape} but {st.out} is {t}")
            defined.add(st.out)
        for o in self.outputs:
            if o not in defined:
                raise ValueError(f"output {o!r} is never computed")

    def text(self) -> str:
        """Canonical text: the inputs with types, every statement, the outputs."""
        t = self.type_of
        lines = [f"in {n}: {t[n]}" for n in self.inputs]
        lines += [f"tmp {n}: {t[n]}" for n in self.temporaries]
        lines += [str(s) for s in self.statements]
        lines += [f"out {n}: {t[n]}" for n in self.outputs]
        return "\n".join(lines)

    @cached_property
    def _digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()

    def digest(self) -> str:
        return self._digest

    def __str__(self) -> str:
        return self.text()
