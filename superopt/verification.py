"""Verification: a compiled program's outputs against the float64 reference interpreter.

The reference side (:func:`reference_runs`) needs the graph as imported, with its weights; the check
(:func:`check_program`) needs only what the reference side kept: the feeds, the expected outputs and their
magnitudes, and the indices a sampled reference covers. So the reference can run on a thread from the
start of compilation (:func:`start_reference`) and the imported graph, whose weights are as large as the
compiled program's, can be let go of before the program's own weights are computed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from superopt.heap import return_free_memory
from superopt.interp.inputs import random_inputs
from superopt.interp.sampling import REFERENCE_POINTS, sample_axes, take_sampled
from superopt.ir.graph import Graph


class VerificationError(RuntimeError):
    """Compiled code disagrees with the reference interpreter."""


@dataclass(frozen=True)
class ReferenceRuns:
    """What a program is checked against: each feed with its float64 reference outputs and their magnitudes
    (``expected``: (outputs, magnitudes) per feed), and, where the reference ran on a sample of the graph's
    independent axes, the indices kept per tensor (``keep``; None: the whole outputs). Holds no constant of
    the graph it was computed from."""

    outputs: tuple[str, ...]
    feeds: tuple[dict[str, np.ndarray], ...]
    expected: tuple[tuple[dict[str, np.ndarray], dict[str, np.ndarray | None]], ...]
    keep: Mapping[str, tuple[tuple[int, np.ndarray], ...]] | None = None

    def describe_sample(self) -> str:
        parts = [f"{name} axis {ax}: {len(idx)} indices" for name in self.outputs for ax, idx in (self.keep or {}).get(name, ())]
        return ", ".join(parts)


def reference_runs(graph: Graph, seed: int = 0, inputs: Mapping[str, np.ndarray] | None = None, random: bool = True,
                   reference_points: int | None = REFERENCE_POINTS) -> ReferenceRuns:
    """The reference of ``graph`` on seeded random inputs and, where given and of the graph's input shapes, on
    ``inputs`` (the user's own, which may be far worse conditioned). ``random=False``: only on ``inputs``
    (when they fit). Where the whole reference would run more than ``reference_points`` iteration points, it
    runs on a sample of the graph's independent axes (``superopt.interp.sampling``)."""
    from superopt.interp.magnitude import reference_with_magnitudes

    feeds = []
    if inputs is not None and all(n in inputs and np.shape(inputs[n]) == graph.type_of[n].shape for n in graph.inputs):
        feeds.append({n: np.asarray(inputs[n]).astype(graph.type_of[n].np_dtype, copy=False) for n in graph.inputs})
    if random or not feeds:
        feeds.insert(0, random_inputs(graph, seed))
    sample = sample_axes(graph, reference_points, seed)
    if sample is None:
        expected = tuple(reference_with_magnitudes(graph, feed) for feed in feeds)
    else:
        expected = tuple(reference_with_magnitudes(sample.graph, sample.take_all(feed)) for feed in feeds)
    return ReferenceRuns(tuple(graph.outputs), tuple(feeds), expected, None if sample is None else sample.keep)


def check_program(program: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]], runs: ReferenceRuns,
                  rtol: float | None = None) -> float:
    """The largest error of ``program``'s outputs on each of ``runs``' feeds, each element measured against the
    magnitude of the terms it is computed from (``superopt.interp.tolerance``). Raises
    :class:`VerificationError` naming the worst element when it exceeds ``rtol`` (None: only on a shape or NaN
    mismatch). The program runs at full size on the full inputs; a sampled reference's indices are read from
    its outputs."""
    from superopt.interp.tolerance import check_outputs

    worst = 0.0
    for feed, (ref, mags) in zip(runs.feeds, runs.expected):
        got = program(feed)
        if runs.keep is not None:
            got = {o: take_sampled(runs.keep, o, got[o]) for o in runs.outputs}
        for check in check_outputs(runs.outputs, got, ref, mags, np.inf if rtol is None else rtol):
            if not check.ok:
                where = "" if runs.keep is None else f" (checked on a sample: {runs.describe_sample()})"
                raise VerificationError(f"compiled program differs from the reference: {check.message}{where}")
            worst = max(worst, check.error)
    return worst


def verify(graph: Graph, program: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]], seed: int = 0,
           inputs: Mapping[str, np.ndarray] | None = None, rtol: float | None = None, random: bool = True,
           reference_points: int | None = REFERENCE_POINTS) -> float:
    """:func:`check_program` against :func:`reference_runs` of ``graph``: the largest error (see both)."""
    return check_program(program, reference_runs(graph, seed, inputs, random, reference_points), rtol)


def start_reference(graph: Graph, seed: int = 0, inputs: Mapping[str, np.ndarray] | None = None,
                    reference_points: int | None = REFERENCE_POINTS) -> Future[ReferenceRuns]:
    """:func:`reference_runs` of ``graph`` computed on a thread: it runs while the rewrite search (one core)
    and the C compiler (subprocesses, which leave the interpreter free) do, instead of after them. The
    thread lets go of ``graph`` when it is done."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    def run() -> ReferenceRuns:
        # one BLAS thread: the search and the C compiler's processes have the cores meanwhile, and a second BLAS
        # thread would spin against them (the limit is the process's; neither runs a BLAS call worth a second)
        with threadpool_limits(1, user_api="blas"):
            runs = reference_runs(graph, seed, inputs, True, reference_points)
        return_free_memory()  # (its float64 tensors, freed in this thread's own malloc arena)
        return runs

    pool = ThreadPoolExecutor(1, thread_name_prefix="superopt-reference")
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future
