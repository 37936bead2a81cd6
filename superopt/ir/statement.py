"""A statement: one tensor defined over a box of named dimensions.

``out[out_dims] <reduce> expr`` where reduce is ``=`` (assignment) or ``+= max= min= *=``
(reductions over every dimension of ``extents`` absent from ``out_dims``).
"""

from __future__ import annotations

from dataclasses import dataclass

from superopt.ir.expr import Access, Affine, Expr, IndexValue, _fmt_const

# Reduction operator -> identity element.
REDUCE_IDENTITY: dict[str, float] = {"+=": 0.0, "*=": 1.0, "max=": float("-inf"), "min=": float("inf")}
REDUCE_OPS = ("=",) + tuple(REDUCE_IDENTITY)


@dataclass(frozen=True)
class Statement:
    out: str
    out_dims: tuple[str, ...]
    reduce: str
    expr: Expr
    extents: tuple[tuple[str, int], ...]  # every dimension (output first, then reduction), in loop order
    padding: tuple[tuple[str, float], ...] = ()  # tensors whose out-of-range reads yield this value

    def __post_init__(self) -> None:
        if self.reduce not in REDUCE_OPS:
            raise ValueError(f"unknown assignment operator {self.reduce!r}")
        names = [d for d, _ in self.extents]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate dimension in {names}")
        if len(set(self.out_dims)) != len(self.out_dims):
            raise ValueError(f"output dimensions repeat in {self.out}[{','.join(self.out_dims)}]")
        missing = [d for d in self.out_dims if d not in names]
        used = {d for a in self.expr.walk() if isinstance(a, (Access, IndexValue))
                for idx in (a.index if isinstance(a, Access) else (a.index,)) for d in idx.dims}
        missing += sorted(used - set(names))
        if missing:
            raise ValueError(f"statement for {self.out} has no extent for dimension(s) {missing}")
        if self.reduce == "=" and self.reduce_dims:
            raise ValueError(
                f"statement for {self.out} uses '=' but dimension(s) {list(self.reduce_dims)} are not in the "
                f"output; use a reduction (+=, max=, ...) or index the output by them")

    @property
    def extent(self) -> dict[str, int]:
        return dict(self.extents)

    @property
    def reduce_dims(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.extents if d not in self.out_dims)

    @property
    def out_shape(self) -> tuple[int, ...]:
        e = self.extent
        return tuple(e[d] for d in self.out_dims)

    @property
    def pad_value(self) -> dict[str, float]:
        return dict(self.padding)

    def inputs(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for a in self.expr.accesses():
            seen.setdefault(a.tensor)
        return tuple(seen)

    def indexed(self) -> list[tuple[str, tuple[Affine, ...]]]:
        """(tensor, index) of every read of the expression, then of the write of the output."""
        return [(a.tensor, a.index) for a in self.expr.accesses()] + [(self.out, tuple(Affine.dim(d) for d in self.out_dims))]

    def __str__(self) -> str:
        s = f"{self.out}[{','.join(self.out_dims)}] {self.reduce} {self.expr}"
        ext = " ".join(f"{d}:{n}" for d, n in self.extents)
        s += f"  over({ext})"
        if self.padding:
            s += "  pad(" + ", ".join(f"{t}={_fmt_const(v)}" for t, v in self.padding) + ")"
        return s
