"""Seeded random inputs, for checking a compiled graph or kernel against the reference.

A graph's inputs (:func:`random_inputs`) and one kernel's (:func:`random_kernel_inputs`, seeded by the kernel's
digest too, with nonzero integers so that divisions and gathers see more than zeros).
"""

from __future__ import annotations

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.graph import Graph


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of a graph, by input name: standard normal floats, 0/1 integers, random bools."""
    rng = np.random.default_rng(seed)
    feed = {}
    for name in graph.inputs:
        t = graph.type_of[name]
        if t.dtype.startswith("float"):
            feed[name] = rng.standard_normal(t.shape).astype(t.np_dtype)
        elif t.dtype == "bool":
            feed[name] = rng.random(t.shape) < 0.5
        else:
            feed[name] = rng.integers(0, 2, t.shape).astype(t.np_dtype)
    return feed


def random_kernel_inputs(compute: Compute, seed: int) -> list[np.ndarray]:
    """Seeded inputs: standard normal floats, nonzero small ints, random bools."""
    rng = np.random.default_rng([seed, int(compute.digest()[:15], 16)])
    out = []
    for name in compute.inputs:
        t = compute.type_of[name]
        dt = t.np_dtype
        if dt == np.bool_:
            a = rng.random(t.shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            a = rng.integers(1, 6, t.shape) * rng.choice(np.array([-1, 1]), t.shape)
            if np.issubdtype(dt, np.unsignedinteger):
                a = np.abs(a)
        else:
            a = rng.standard_normal(t.shape)
        out.append(np.ascontiguousarray(a, dtype=dt))
    return out
