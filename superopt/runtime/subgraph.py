"""Compiled branches and loop bodies: a Graph held by a control-flow extern, compiled once and cached.

A body is compiled for the static shapes of its inputs (the frontend imports it for those shapes) with
the default schedules and one thread (bodies are small and run once per iteration), on this machine.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from superopt.ir.graph import Graph
from superopt.ir.prune import prune_graph
from superopt.runtime.executor import ExecutorConfig, GraphExecutor

_COMPILED: dict[str, GraphExecutor] = {}  # graph digest -> its executor (a body is compiled once per process)
_COMPILING = threading.Lock()  # the verifier's reference thread and the program may ask for a body at once


def _executor(graph: Graph) -> GraphExecutor:
    key = graph.digest()
    hit = _COMPILED.get(key)
    if hit is not None:
        return hit
    with _COMPILING:
        if key not in _COMPILED:
            from superopt.schedule.graph_defaults import default_schedules

            pruned = prune_graph(graph)
            config = ExecutorConfig(threads=1)
            _COMPILED[key] = GraphExecutor(pruned, default_schedules(pruned, config.resolved_target()), config)
        return _COMPILED[key]


def run_body(graph: Graph, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``graph`` compiled on ``xs`` (one array per graph input, cast to its declared type); its outputs
    in order (arrays the caller may keep: the executor gives graph outputs fresh arrays)."""
    if len(xs) != len(graph.inputs):
        raise ValueError(f"body {graph.name!r} takes {len(graph.inputs)} inputs, got {len(xs)}")
    types = graph.type_of
    feed = {n: np.asarray(x, dtype=types[n].np_dtype).reshape(types[n].shape) for n, x in zip(graph.inputs, xs)}
    if not graph.nodes:  # every output is an input or a constant (a branch that folded): nothing to run
        return [np.array(feed[o] if o in feed else graph.constant[o].array) for o in graph.outputs]
    out = _executor(graph)(feed)
    return [out[o].reshape(types[o].shape) for o in graph.outputs]  # (an executor may hand rank 0 back as rank 1)
