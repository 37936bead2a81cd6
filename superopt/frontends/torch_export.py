"""``torch.export`` input: an ``nn.Module`` (with example inputs) or an ``ExportedProgram`` as a superopt Graph.

    graph = import_torch_program(model, (x,))          # torch.export.export(model, (x,)) first
    graph = import_torch_program(exported_program)     # used as is

``superopt.optimize(model, example_inputs)`` and ``superopt.load_graph`` come here for torch programs. The
graph's inputs are the program's user inputs, in order; parameters, buffers and lifted constants become
graph constants; the outputs are the user outputs (buffer mutations are not part of a Graph). The program is
imported at the level ``torch.export`` produced (ATen ops before decomposition); if a node is not supported
there, the core-ATen decompositions are run and the import is tried once more. A node that neither level
lowers is a one-line error naming it: there is no eager fallback inside a Graph.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from superopt.frontends.torch_fx import FxImportError, import_fx_full
from superopt.ir.graph import Graph


def export_program(model: Any, example_inputs: Sequence[Any] | None) -> torch.export.ExportedProgram:
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"expected a torch nn.Module or ExportedProgram, got {type(model).__name__}")
    if example_inputs is None:
        raise ValueError("a torch nn.Module needs example_inputs (its call arguments) to go through torch.export")
    try:
        return torch.export.export(model, tuple(example_inputs))
    except Exception as e:  # noqa: BLE001 - torch's reason, in one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise FxImportError(f"torch.export failed on {type(model).__name__}: {type(e).__name__}: {first}") from e


def _user_inputs(ep: torch.export.ExportedProgram, example_inputs: Sequence[Any] | None,
                 placeholders: list[torch.fx.Node]) -> dict[str, Any]:
    """User-input placeholder name -> example value (the given inputs, else the program's own examples)."""
    from torch.export.graph_signature import InputKind

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    if example_inputs is None and getattr(ep, "example_inputs", None) is not None:
        args, kwargs = ep.example_inputs
        example_inputs = [*args, *kwargs.values()]
    if example_inputs is None:
        by_name = {n.name: n for n in placeholders}
        values = []
        for name in users:
            v = by_name[name].meta.get("val")
            if not isinstance(v, torch.Tensor) or not all(isinstance(s, int) for s in v.shape):
                raise ValueError(f"input {name!r} has a symbolic shape; pass example_inputs to fix its sizes")
            values.append(torch.zeros(tuple(v.shape), dtype=v.dtype))
        example_inputs = values
    flat = [a for a in torch.utils._pytree.tree_leaves(list(example_inputs))]
    if len(flat) != len(users):
        raise ValueError(f"the program takes {len(users)} user inputs but {len(flat)} example inputs were given")
    return dict(zip(users, flat, strict=True))


def _import(ep: torch.export.ExportedProgram, example_inputs: Sequence[Any] | None, name: str) -> Graph:
    from torch.export.graph_signature import InputKind, OutputKind

    gm = copy.deepcopy(ep.graph_module)  # a copy whose output node may be edited
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    users = _user_inputs(ep, example_inputs, placeholders)
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    examples, constants = [], []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            examples.append(users[spec.arg.name])
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            examples.append(state[spec.target])
            constants.append(spec.arg.name)
        else:
            raise FxImportError(f"unsupported exported-program input {spec.arg.name!r} of kind {spec.kind.name}")
    keep = [i for i, s in enumerate(ep.graph_signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = list(out_node.args[0])
    out_node.args = (tuple(outputs[i] for i in keep),)  # buffer mutations are not outputs of a Graph
    gm.recompile()
    return import_fx_full(gm, examples, name, constant_inputs=constants).graph


def import_torch_program(model: Any, example_inputs: Sequence[Any] | None = None) -> Graph:
    """An ``nn.Module`` (exported with ``example_inputs``) or an ``ExportedProgram`` as a superopt Graph."""
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else "exported_program"
    ep = export_program(model, example_inputs)
    if isinstance(model, torch.nn.Module):
        example_inputs = None  # the program's user inputs are exactly the example inputs it was traced with
    try:
        return _import(ep, example_inputs, name)
    except FxImportError as first:
        try:
            return _import(ep.run_decompositions(), example_inputs, name)
        except FxImportError as second:
            raise FxImportError(f"{first}; after core-ATen decompositions: {second}", reason=first.reason) from first
