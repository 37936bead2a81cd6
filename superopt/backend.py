"""An ``onnx.backend.base.Backend`` over superopt: ``prepare``/``run_model``/``run_node``, like onnxruntime.

``prepare(model, device="CPU", mode="compiled")`` imports the model and returns a BackendRep whose ``run``
executes it. Execution strategies are pluggable: :data:`RUNNERS` maps a mode name to a factory
``(ImportedModel) -> runner(list[np.ndarray]) -> list[np.ndarray]``; other engineers add e.g. "compiled".

Graph inputs that the model uses as compile-time values (a Reshape target, Slice bounds, Resize scales or
roi, a Compress condition, ...) are bound at run time: a converter that needs a value it does not have raises
``NeedsConstant`` naming the tensor, the graph inputs that tensor is computed from are bound to the values
given, and the model is imported and compiled once per distinct value of those inputs (cached).

The backend imports strictly by default (``prepare(model, strict=True)``): it measures what superopt
lowers natively (ONNX's conformance node tests), so a node with no native lowering is an error rather
than a run through the ONNX fallback; ``strict=False`` allows the fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from superopt.frontends.onnx_frontend import ImportedModel, OnnxImportError, _NeedsConstant, import_onnx_model
from superopt.interp.reference import evaluate

Runner = Callable[[list[np.ndarray]], list[np.ndarray]]
RunnerFactory = Callable[[ImportedModel], Runner]


def _reference_runner(im: ImportedModel) -> Runner:
    precise = any(t.dtype == "float64" for _, t in im.graph.types)
    dtype = np.float64 if precise else np.float32

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        out = evaluate(im.graph, dict(zip(im.graph.inputs, inputs, strict=False)), dtype=dtype)
        return [
            np.asarray(out[o]).astype(dt, copy=False)
            for o, dt in zip(im.graph.outputs, im.output_np_dtypes or im.output_dtypes, strict=False)
        ]

    return run


def _compiled_runner(im: ImportedModel) -> Runner:
    from superopt.api import compile_graph

    executor = compile_graph(im.graph)  # rewrite rules (fusion, layout, algebraic), then compiled kernels

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        out = executor(dict(zip(im.graph.inputs, inputs, strict=False)))
        return [
            np.asarray(out[o]).astype(dt, copy=False)
            for o, dt in zip(im.graph.outputs, im.output_np_dtypes or im.output_dtypes, strict=False)
        ]

    return run


RUNNERS: dict[str, RunnerFactory] = {"compiled": _compiled_runner, "reference": _reference_runner}
DEFAULT_MODE = "compiled"


def _check_mode(mode: str) -> RunnerFactory:
    if mode not in RUNNERS:
        raise ValueError(f"unknown superopt backend mode {mode!r}; available modes: {sorted(RUNNERS)}")
    return RUNNERS[mode]


class SuperoptRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, mode: str = DEFAULT_MODE, strict: bool = True) -> None:
        self.model = model
        self.mode = mode
        self.strict = strict
        self._factory = _check_mode(mode)
        self._all_inputs = [
            vi.name for vi in model.graph.input if vi.name not in {t.name for t in model.graph.initializer}
        ]
        self._cache: dict[Any, tuple[ImportedModel, Runner]] = {}
        self._static: tuple[ImportedModel, Runner] | None = None
        self._bound: list[str] = []  # graph inputs bound as compile-time values, learnt from NeedsConstant
        try:
            im = import_onnx_model(model, strict=strict)
            self._static = (im, self._factory(im))
        except _NeedsConstant as err:
            self._bound = self._inputs_behind(err)
            if not self._bound:
                raise

    def _inputs_behind(self, err: _NeedsConstant) -> list[str]:
        """The graph inputs the tensor ``err`` needs is computed from (through the ONNX nodes); where the tensor
        is not named, every integer or one-element input (the shape-like ones)."""
        if err.tensor is None:
            return [n for n in self._all_inputs if self._shape_like(n)]
        producer = {o: nd for nd in self.model.graph.node for o in nd.output if o}
        found, todo, seen = [], [err.tensor], set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in self._all_inputs:
                found.append(t)
            elif t in producer:
                todo += [n for n in producer[t].input if n]
        return [n for n in self._all_inputs if n in found]

    def _shape_like(self, name: str) -> bool:
        tt = next(vi for vi in self.model.graph.input if vi.name == name).type.tensor_type
        small = int(np.prod([d.dim_value for d in tt.shape.dim])) <= 1
        return tt.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) or small

    def _for(self, feed: dict[str, np.ndarray]) -> tuple[ImportedModel, Runner]:
        if self._static is not None:
            return self._static
        while True:
            bind = {n: np.asarray(feed[n]) for n in self._bound}
            key = tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in bind.items())
            if key in self._cache:
                return self._cache[key]
            try:
                im = import_onnx_model(self.model, bind=bind, strict=self.strict)
            except _NeedsConstant as err:  # another value is needed too (or a tensor computed from several inputs)
                more = [n for n in self._inputs_behind(err) if n not in self._bound]
                if not more:
                    raise
                self._bound += more
                continue
            self._cache[key] = (im, self._factory(im))
            return self._cache[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feed = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(self._all_inputs):
                raise ValueError(
                    f"model takes {len(self._all_inputs)} inputs {self._all_inputs}, got {len(inputs)}"
                )
            feed = {n: np.asarray(v) for n, v in zip(self._all_inputs, inputs, strict=False)}
        missing = [n for n in self._all_inputs if n not in feed]
        if missing:
            raise ValueError(f"missing model input(s) {missing}")
        im, runner = self._for(feed)
        return tuple(runner([feed[n] for n in im.input_names]))


class SuperoptBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", mode: str = DEFAULT_MODE, strict: bool = True,
                **kwargs: Any) -> SuperoptRep:
        if not cls.supports_device(device):
            raise ValueError(f"superopt backend: device {device!r} is not supported (CPU only)")
        _check_mode(mode)
        if not isinstance(model, onnx.ModelProto):
            from superopt.frontends.onnx_frontend import _load

            model = _load(model)
        return SuperoptRep(model, mode, strict)

    @classmethod
    def run_model(
        cls, model: Any, inputs: Any, device: str = "CPU", mode: str = DEFAULT_MODE, **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, mode).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[np.ndarray],
        device: str = "CPU",
        outputs_info: Any = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        from onnx import helper

        ins = [np.asarray(x) for x in inputs]
        vis = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
            for n, x in zip(node.input, ins, strict=False)
            if n
        ]
        outs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], "run_node", vis, outs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, [x for n, x in zip(node.input, ins, strict=False) if n], device)


prepare = SuperoptBackend.prepare
run_model = SuperoptBackend.run_model
run_node = SuperoptBackend.run_node
supports_device = SuperoptBackend.supports_device
is_compatible = SuperoptBackend.is_compatible

__all__ = [
    "SuperoptBackend",
    "SuperoptRep",
    "RUNNERS",
    "OnnxImportError",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
    "is_compatible",
]
