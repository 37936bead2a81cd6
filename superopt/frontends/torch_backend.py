"""A ``torch.compile`` backend: Dynamo's FX graph -> superopt Graph -> a runner.

    model = torch.compile(model, backend=superopt_backend)   # or backend="superopt"

The runner is produced by a *runner factory* ``Graph -> (list[np.ndarray] -> list[np.ndarray])``.
The default compiles the graph (rewrite rules, default schedules, C kernels); the numpy reference
interpreter is ``interpreter_runner`` (pass ``runner_factory=``).

Inference only: outputs carry no autograd history. Dynamo's lifted parameters and buffers are
baked into the graph as constants; if one is later modified in place (its ``_version`` changes),
or input shapes change (dynamic shapes), the graph is re-imported for the new situation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from superopt.frontends.torch_fx import FxImport, import_fx_full, to_numpy
from superopt.ir.graph import Graph

Runner = Callable[[Sequence[np.ndarray]], list[np.ndarray]]
RunnerFactory = Callable[[Graph], Runner]


def interpreter_runner(graph: Graph) -> Runner:
    """Run ``graph`` with the numpy reference interpreter."""
    from superopt.interp import evaluate

    def run(args: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = evaluate(graph, list(args))
        return [out[o] for o in graph.outputs]

    return run


def executor_runner(graph: Graph) -> Runner:
    """Run ``graph`` compiled (superopt.api.compile_graph: graph rewrites, then the executor)."""
    from superopt.api import compile_graph

    ex = compile_graph(graph)  # rewrite rules (fusion, layout, algebraic), then compiled kernels

    def run(args: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = ex(list(args))
        return [out[o] for o in graph.outputs]

    return run


# compiled by default; ``interpreter_runner`` runs the numpy reference instead
DEFAULT_RUNNER_FACTORY: RunnerFactory = executor_runner


class SuperoptCompiled:
    """The callable handed back to Dynamo: imports (per input signature), runs, rebuilds outputs."""

    def __init__(self, gm: torch.fx.GraphModule, runner_factory: RunnerFactory) -> None:
        self.gm = gm
        self.runner_factory = runner_factory
        self._cache: dict[Any, tuple[FxImport, Runner]] = {}

    def _key(self, args: Sequence[Any], baked: Sequence[int] = ()) -> Any:
        key = []
        for a in args:
            if isinstance(a, torch.Tensor):
                key.append((tuple(a.shape), a.dtype))
            else:
                key.append(("value", a if isinstance(a, (int, float, bool)) else type(a).__name__))
        # baked parameters: re-import if one is replaced or modified in place
        key.extend((i, id(args[i]), args[i]._version) for i in baked)
        return tuple(key)

    def specialize(self, args: Sequence[Any]) -> tuple[FxImport, Runner]:
        for (k, baked), entry in self._cache.items():
            if k == self._key(args, baked):
                return entry
        imp = import_fx_full(self.gm, args)
        entry = (imp, self.runner_factory(imp.graph))
        self._cache[(self._key(args, imp.baked), imp.baked)] = entry
        return entry

    def __call__(self, *args: Any) -> Any:
        imp, runner = self.specialize(args)
        outs = runner([to_numpy(args[i]) for i in imp.input_positions])
        by_name = dict(zip(imp.graph.outputs, outs, strict=True))
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        return _rebuild(imp.output_spec, by_name, device)


def _rebuild(spec: Any, by_name: dict[str, np.ndarray], device: torch.device) -> Any:
    if isinstance(spec, tuple) and len(spec) == 3 and spec[0] == "tensor":
        _, name, dtype = spec
        a = by_name[name]
        if not (a.flags.writeable and a.flags.c_contiguous):
            a = np.array(a, order="C")  # the interpreter may hand back read-only views
        t = torch.from_numpy(a)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        return t.to(device) if device.type != "cpu" else t
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "value":
        return spec[1]
    if isinstance(spec, (tuple, list)):
        return type(spec)(_rebuild(s, by_name, device) for s in spec)
    if isinstance(spec, dict):
        return {k: _rebuild(s, by_name, device) for k, s in spec.items()}
    raise TypeError(f"bad output spec {spec!r}")


def superopt_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                     runner_factory: RunnerFactory | None = None) -> Callable[..., Any]:
    """``torch.compile`` backend. Imports eagerly, so unsupported ops fail at compile time."""
    compiled = SuperoptCompiled(gm, runner_factory or DEFAULT_RUNNER_FACTORY)
    compiled.specialize(list(example_inputs))
    return compiled


def make_backend(runner_factory: RunnerFactory) -> Callable[..., Any]:
    """A backend using another runner, e.g. ``torch.compile(m, backend=make_backend(my_factory))``."""
    return functools.partial(superopt_backend, runner_factory=runner_factory)


def superopt_aot_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                         runner_factory: RunnerFactory | None = None) -> Callable[..., Any]:
    """The same through aot_autograd: the forward graph is ATen-level, with FakeTensor examples, so
    parameters stay run-time inputs. Inference only (under ``torch.no_grad()``)."""
    from torch._dynamo.backends.common import aot_autograd

    fw = functools.partial(superopt_backend, runner_factory=runner_factory)
    return aot_autograd(fw_compiler=fw)(gm, example_inputs)


def _register() -> None:
    try:
        from torch._dynamo import list_backends, register_backend
    except ImportError:  # pragma: no cover - older/newer torch without the API
        return
    try:
        known = list_backends(exclude_tags=())
        if "superopt" not in known:
            register_backend(name="superopt")(superopt_backend)
        if "superopt_aot" not in known:
            register_backend(name="superopt_aot")(superopt_aot_backend)
    except Exception:  # noqa: BLE001 - registration is a convenience, never fatal  # pragma: no cover
        pass


_register()
