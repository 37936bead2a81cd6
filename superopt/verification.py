"""Verification: a compiled program's outputs against the float64 reference interpreter.

The reference side (:func:`reference_runs`) needs the graph as imported, with its weights; the check
(:func:`check_program`) needs only what the reference side kept: the feeds, the expected outputs and their
magnitudes, and the indices a sampled reference covers. So the reference can run beside compilation from
its start (:func:`start_reference`: in a forked child at the lowest priority, or on a thread) and the imported
graph, whose weights are as large as the compiled program's, can be let go of before the program's own
weights are computed.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import warnings
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


class ForkedReference:
    """:func:`reference_runs` in a forked child process at the lowest CPU priority; :meth:`result` waits for it
    and raises what it raised.

    On a thread, the reference shares the interpreter lock with the pipeline: each of its Python steps waits
    for the rewrite search's turn, and while it holds the lock the C compiler's next jobs wait to be launched;
    at the same priority it also takes cores from the compiler's processes. A child shares no lock, and at the
    lowest priority it runs on whatever core the pipeline leaves idle: beside the rewrite search (one core),
    the last units of a compile, the build. The child has the graph as it was at the fork (copy-on-write: its
    weights are not copied), so the pipeline need not keep the imported graph alive for it."""

    def __init__(self, graph: Graph, seed: int, inputs: Mapping[str, np.ndarray] | None,
                 reference_points: int | None) -> None:
        read, write = os.pipe()
        with warnings.catch_warnings():
            # (Python 3.12 warns of any fork beside other threads: the child runs the numpy reference alone,
            # takes no lock another thread could hold across the fork but malloc's, which glibc resets)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(read)
            _reference_child(write, graph, seed, inputs, reference_points)  # (never returns)
        os.close(write)
        self.pid = pid
        self._chunks: list[bytes] = []
        # (drained as it is written, a pipe holds 64 KiB; the thread holds no reference to self, so a dropped
        # handle is collected and its child stopped)
        self._reader = threading.Thread(target=_drain, args=(read, pid, self._chunks), daemon=True,
                                        name="superopt-reference")
        self._reader.start()

    def result(self) -> ReferenceRuns:
        self._reader.join()
        if not self._chunks:
            raise VerificationError("the reference's process ended without a result (killed?)")
        kind, value = pickle.loads(b"".join(self._chunks))
        if kind == "error":
            raise value
        return value

    def cancel(self) -> None:
        """Stop the child, if it still runs (the pipeline failed before it needed the reference)."""
        if self._reader.is_alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __del__(self) -> None:
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - (at interpreter exit the modules it needs may be gone)
            pass


def _runs_on_one_blas_thread(graph: Graph, seed: int, inputs: Mapping[str, np.ndarray] | None,
                             reference_points: int | None) -> ReferenceRuns:
    """:func:`reference_runs` (random inputs and the user's) with one BLAS thread: the search and the C
    compiler's processes have the cores meanwhile, and a second BLAS thread would spin against them (the limit
    is the process's; the reference runs no BLAS call worth a second)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        return reference_runs(graph, seed, inputs, True, reference_points)


def _drain(fd: int, pid: int, chunks: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as f:
        while block := f.read(1 << 20):
            chunks.append(block)
    os.waitpid(pid, 0)


def _reference_child(write: int, graph: Graph, seed: int, inputs: Mapping[str, np.ndarray] | None,
                     reference_points: int | None) -> None:
    """The forked child: the reference, pickled to ``write``; exits without the parent's exit handlers."""
    code = 1
    try:
        os.nice(19)
        try:
            answer: tuple = ("ok", _runs_on_one_blas_thread(graph, seed, inputs, reference_points))
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as err:  # noqa: BLE001 - raised again in the parent by result()
            try:
                data = pickle.dumps(("error", err), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
                data = pickle.dumps(("error", VerificationError(f"the reference failed: {type(err).__name__}: {err}")))
        view = memoryview(data)
        while view:
            view = view[os.write(write, view):]
        code = 0
    finally:
        os._exit(code)


# the extern kind whose reference runs an onnxruntime session (superopt.frontends.onnx_fallback.KIND): an
# onnxruntime session made before a fork has thread pools that a forked child lacks
FOREIGN_EXTERN = "onnx_node"


def runs_foreign_code(graph: Graph) -> bool:
    """Whether the reference of ``graph`` (its control-flow bodies included) calls into another runtime, which a
    forked child cannot be trusted to run: an ONNX fallback node's onnxruntime session."""
    for n in graph.nodes:
        if n.is_extern:
            if n.op.kind == FOREIGN_EXTERN:
                return True
            for _, v in n.op.attrs:
                body = getattr(v, "graph", None)
                if isinstance(body, Graph) and runs_foreign_code(body):
                    return True
    return False


def start_reference(graph: Graph, seed: int = 0, inputs: Mapping[str, np.ndarray] | None = None,
                    reference_points: int | None = REFERENCE_POINTS,
                    process: bool = True) -> Future[ReferenceRuns] | ForkedReference:
    """:func:`reference_runs` of ``graph``, computed while the rewrite search (one core) and the C compiler
    (subprocesses) run, instead of after them: in a forked child (:class:`ForkedReference`) where ``process``,
    the platform forks (Linux) and the reference is numpy's alone (:func:`runs_foreign_code`), else on a
    thread, which lets go of ``graph`` when it is done."""
    if process and sys.platform.startswith("linux") and not runs_foreign_code(graph):
        try:
            return ForkedReference(graph, seed, inputs, reference_points)
        except OSError:  # (no process to spare: the thread)
            pass
    from concurrent.futures import ThreadPoolExecutor

    def run() -> ReferenceRuns:
        runs = _runs_on_one_blas_thread(graph, seed, inputs, reference_points)
        return_free_memory()  # (its float64 tensors, freed in this thread's own malloc arena)
        return runs

    pool = ThreadPoolExecutor(1, thread_name_prefix="superopt-reference")
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future
