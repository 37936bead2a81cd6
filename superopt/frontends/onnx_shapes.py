"""Symbolic dimensions of an ONNX model's inputs, and specializing the model to concrete shapes.

superopt compiles for static shapes. A model whose inputs have symbolic dimensions (``batch``, ``seq``,
or unnamed ones) is specialized: its input shapes are fixed to the example shapes given (or to
declared sizes per dimension name), intermediate shape annotations are dropped, and ONNX shape
inference fills them in again for those shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from superopt.frontends.onnx_ops import OnnxImportError

Dim = int | str | None  # a size, a symbolic name, or unknown


def declared_inputs(m: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """The model's run-time inputs (initializers excluded) and their declared shapes."""
    inits = {t.name for t in m.graph.initializer}
    out: dict[str, tuple[Dim, ...]] = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            out[vi.name] = (None,)  # rank unknown: marked symbolic
            continue
        out[vi.name] = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return out


def _has_rank(vi: onnx.ValueInfoProto) -> bool:
    return vi.type.tensor_type.HasField("shape")


def symbolic_inputs(m: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """Inputs with at least one dimension that is not a fixed size."""
    return {n: s for n, s in declared_inputs(m).items() if any(not isinstance(d, int) for d in s)}


def _fmt(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def how_to_give_shapes(m: onnx.ModelProto) -> str:
    sym = symbolic_inputs(m)
    names = sorted({d for s in sym.values() for d in s if isinstance(d, str)})
    first = next(iter(sym), "x")
    hint = f"optimize(model, {{{first!r}: array}}) / superopt optimize --shape {first}=AxB"
    if names:
        hint += f" or --dim {names[0]}=N"
    return hint


def resolve_shapes(m: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None,
                   dims: Mapping[str, int] | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every symbolic input, from ``shapes`` (name -> shape) and ``dims`` (dimension
    name -> size); a one-line :class:`OnnxImportError` explains what is missing or does not fit."""
    shapes = dict(shapes or {})
    dims = dict(dims or {})
    declared = declared_inputs(m)
    unknown = [n for n in shapes if n not in declared]
    if unknown:
        raise OnnxImportError(f"shape given for {unknown[0]!r}, which is not an input of the model "
                              f"(inputs: {list(declared)})")
    used_names = {d for s in declared.values() for d in s if isinstance(d, str)}
    stray = [d for d in dims if d not in used_names]
    if stray:
        raise OnnxImportError(f"--dim {stray[0]}: the model has no dimension named {stray[0]!r} "
                              f"(symbolic dimensions: {sorted(used_names) or 'none'})")
    out: dict[str, tuple[int, ...]] = {}
    for name, decl in declared.items():
        if name in shapes:
            got = tuple(int(d) for d in shapes[name])
            rank_known = decl != (None,) or _has_rank(next(vi for vi in m.graph.input if vi.name == name))
            if rank_known and len(got) != len(decl):
                raise OnnxImportError(f"input {name!r} has shape {_fmt(decl)} but the shape given is {list(got)}")
            for g, d in zip(got, decl):
                if isinstance(d, int) and rank_known and g != d:
                    raise OnnxImportError(f"input {name!r} has shape {_fmt(decl)} but the shape given is {list(got)}")
                if isinstance(d, str) and d in dims and dims[d] != g:
                    raise OnnxImportError(f"input {name!r}: dimension {d!r} is {g} in the shape given but {dims[d]} "
                                          "in --dim")
            if any(g < 0 for g in got):
                raise OnnxImportError(f"input {name!r}: negative dimension in {list(got)}")
            out[name] = got
            continue
        if all(isinstance(d, int) for d in decl):
            continue
        missing = [d for d in decl if not (isinstance(d, int) or (isinstance(d, str) and d in dims))]
        if missing:
            what = "an unnamed dimension" if missing[0] is None else f"symbolic dimension {missing[0]!r}"
            raise OnnxImportError(f"input {name!r} has {what} (shape {_fmt(decl)}); superopt compiles for static "
                                  f"shapes: give example inputs or shapes ({how_to_give_shapes(m)})")
        out[name] = tuple(d if isinstance(d, int) else int(dims[d]) for d in decl)
    return out


def specialize(m: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of ``m`` whose inputs have the given static shapes; the symbolic dims of other shape
    annotations (value_info, outputs) become unknown for shape inference to fill in."""
    declared = declared_inputs(m)
    shapes = {n: tuple(s) for n, s in shapes.items() if declared.get(n) != tuple(s)}
    if not shapes:
        return m
    s = onnx.ModelProto()
    s.CopyFrom(m)
    for vi in s.graph.input:
        if vi.name not in shapes:
            continue
        tt = vi.type.tensor_type
        tt.ClearField("shape")
        tt.shape.SetInParent()
        for d in shapes[vi.name]:
            tt.shape.dim.add().dim_value = int(d)
    for vi in list(s.graph.value_info) + list(s.graph.output):  # symbolic dims -> unknown; types stay (ONNX's own
        tt = vi.type.tensor_type                                  # inference loses some, e.g. GroupNormalization-21's)
        for d in tt.shape.dim if tt.HasField("shape") else ():
            if not d.HasField("dim_value"):
                d.Clear()
    return s


__all__ = ["declared_inputs", "symbolic_inputs", "resolve_shapes", "specialize", "how_to_give_shapes"]
