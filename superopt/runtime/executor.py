"""Run a whole Graph: compiled kernels and extern ops over a static memory plan.

Intermediate tensors live in a few preallocated buffers reused once their last reader has run;
``reshape`` externs are aliases (no copy); graph outputs are written straight into fresh arrays (on the
chained path, the previous call's array when the caller no longer holds it or any view of it: a caller never
sees an array that a later call overwrites).

A call runs a short list of steps prepared once: each maximal run of compiled kernels and native externs
(runtime/native_externs.py; reshapes between them are aliases) is ONE native call (runtime/chain.py) with
every pointer fixed ahead of time except the graph inputs' and the fresh outputs'; the other externs run
their numpy implementation between chains. ``run_per_node`` is the plain path (one call per node, numpy
externs), used by ``profile`` and kept as the reference the chained path is tested against.
The :class:`MemoryPlan` lists every buffer the executor allocates (and the kernels' stack buffers),
per node and per tensor name, so that "no buffer holds T" is a checkable statement.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from sys import getrefcount
from typing import Literal

import numpy as np

from superopt.codegen.c_emit import KernelSource
from superopt.ir.compute import Compute
from superopt.ir.externs import check_run_time_shapes, evaluate_extern
from superopt.ir.graph import Graph, Node
from superopt.phases import PhaseTimer
from superopt.runtime.buffers import ALIGN, aligned_empty, aligned_empty_at, data_address
from superopt.runtime.chain import RUNNER_SOURCE, Chain, function_address, load_runner
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.concat_slices import ConcatSlices, concat_slices, resolve_slices
from superopt.runtime.kernel import CompiledKernel, build_library, pack_caller_source
from superopt.runtime.native_externs import NativeExtern, native_extern
from superopt.schedule.primitives import Primitive
from superopt.target import Target, host_target


@dataclass(frozen=True)
class ExecutorConfig:
    threads: int = 2
    compiler: CompilerConfig = field(default_factory=CompilerConfig)
    target: Target | None = None  # None: this machine with ``threads`` threads
    chain: bool = True  # run consecutive compiled nodes with one native call (runtime/chain.py)
    native_externs: bool = True  # C implementations of common externs (runtime/native_externs.py), in chains
    # kernels of less work (runtime.kernel.kernel_work: iteration points, plus a weight per element written)
    # are compiled without OpenMP parallel regions. A region costs microseconds on a quiet machine, but when
    # another process holds the other cores each one waits up to a scheduler time slice (milliseconds) for its
    # threads, which turns a small model's microseconds into milliseconds (onnxruntime runs its small ops on
    # the caller's thread for the same reason). Below 1M (well under a millisecond on one core) a kernel runs
    # on one thread; 0 keeps every parallel loop
    serial_below: int = 1_000_000
    # a concatenation whose inputs' producers can write its slices is never run (runtime/concat_slices.py)
    elide_concats: bool = True

    def resolved_target(self) -> Target:
        return self.target if self.target is not None else host_target(self.threads, self.compiler.cc)


@dataclass
class _NodeCall:
    kernel: CompiledKernel
    ptrs: ctypes.Array
    reads: list[tuple[int, str]] = field(default_factory=list)  # slot <- a run-time tensor's data
    # slot <- a run-time input packed on each call into a buffer allocated once (the slot's fixed pointer)
    packs: list[tuple[int, str, str, np.ndarray]] = field(default_factory=list)
    fresh: list[tuple[int, str]] = field(default_factory=list)  # slot <- a new array (graph outputs)
    planned: list[tuple[str, np.ndarray]] = field(default_factory=list)  # outputs in planned buffers


class _NativeFailure(Exception):
    """A native extern set the status flag (an index out of range): the numpy path reports it."""


@dataclass
class _NativeCall:
    fn: int  # the C function's address
    ptrs: ctypes.Array
    reads: list[tuple[int, str]] = field(default_factory=list)  # slot <- a run-time tensor's data
    fresh: list[tuple[int, str]] = field(default_factory=list)  # slot <- a new array (graph outputs)


@dataclass(frozen=True)
class NodeTime:
    node: str
    seconds: float  # median over the profiled runs
    what: str  # the extern kind or the statements
    trace: Sequence[Primitive]


BufferKind = Literal["intermediate", "workspace", "packed", "packed_per_call", "output", "local"]


@dataclass(frozen=True)
class PlannedBuffer:
    """One buffer: ``intermediate`` (a planned buffer shared by graph tensors whose lives do not overlap),
    ``workspace`` (a kernel's stored temporary, allocated once per kernel: nodes running one kernel share
    it), ``packed`` (a constant input packed once), ``packed_per_call`` (a run-time input packed on each
    call, into a buffer allocated once), ``output`` (a graph output, a fresh array each call) or ``local``
    (a stage computed inside another's loop, on each thread's stack during the call; not allocated by the
    executor; also a native extern's scratch, allocated during its call).

    ``tensors``: graph tensor names for intermediates and outputs, the node op's local tensor name
    otherwise (with the graph tensor it packs, for packed inputs); ``node``: the node it belongs to
    (None for an intermediate buffer, which several nodes' tensors share)."""

    kind: BufferKind
    nbytes: int
    tensors: tuple[str, ...]
    node: str | None = None
    kernel: int | None = None  # the compiled kernel owning a workspace (one array per kernel)


@dataclass
class MemoryPlan:
    buffer_of: dict[str, int]  # storage tensor -> buffer index
    buffer_bytes: list[int]
    buffers: list[PlannedBuffer] = field(default_factory=list)  # every buffer, intermediates included
    offset_of: dict[str, int] = field(default_factory=dict)  # tensor -> byte offset in its root's buffer
    elided: frozenset[str] = frozenset()  # concatenations whose inputs were written in place: never run

    @property
    def intermediate_bytes(self) -> int:
        return sum(self.buffer_bytes)

    @property
    def total_bytes(self) -> int:
        """Bytes the executor holds between calls: intermediates, kernel workspace (once per kernel),
        constants packed ahead of time and the buffers run-time inputs are packed into."""
        seen: set[tuple] = set()
        total = 0
        for b in self.buffers:
            key = (b.kind, b.kernel, b.tensors) if b.kind == "workspace" else (id(b),)
            if b.kind in ("intermediate", "workspace", "packed", "packed_per_call") and key not in seen:
                seen.add(key)
                total += b.nbytes
        return total

    def holding(self, tensor: str, node: str | None = None) -> list[PlannedBuffer]:
        """The buffers holding ``tensor`` (a graph tensor, or a node op's local tensor name), of ``node``
        when given."""
        return [b for b in self.buffers if tensor in b.tensors and (node is None or b.node in (node, None))]

    def of_node(self, node: str) -> list[PlannedBuffer]:
        return [b for b in self.buffers if b.node == node]

    def largest(self) -> PlannedBuffer | None:
        return max(self.buffers, key=lambda b: b.nbytes, default=None)

    def __str__(self) -> str:
        rows = [f"{b.kind:16s} {b.nbytes:>14,d} B  {b.node or '-':20s} {', '.join(b.tensors)}"
                for b in sorted(self.buffers, key=lambda b: -b.nbytes)]
        return "\n".join([f"memory plan: {self.total_bytes:,d} bytes held", *rows])


def _storage_roots(graph: Graph, slices: Sequence[ConcatSlices] = ()) -> tuple[dict[str, str], dict[str, int]]:
    """Tensor -> the tensor owning its memory (reshape outputs alias their input; a concatenation's
    inputs written in place live in its output, a nested one's in the outermost), and each slice's byte
    offset there."""
    root: dict[str, str] = {}
    for n in graph.nodes:
        for o in n.outputs:
            root[o] = o
        if n.is_extern and n.op.kind == "reshape":
            src = n.inputs[0]
            root[n.outputs[0]] = root.get(src, src)
    return resolve_slices(root, list(slices))


def plan_memory(graph: Graph, elide_concats: bool = True) -> tuple[MemoryPlan, dict[str, str]]:
    """Intermediate buffers shared by tensors whose lives do not overlap, and (``elide_concats``) the
    concatenations whose inputs their producers write in place (``runtime/concat_slices.py``)."""
    slices = concat_slices(graph) if elide_concats else []
    root, offset_of = _storage_roots(graph, slices)
    external = set(graph.inputs) | set(graph.constant)
    fresh = {root.get(o, o) for o in graph.outputs}  # outputs own fresh arrays each call
    last_use: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for t in n.inputs:
            r = root.get(t, t)
            last_use[r] = max(last_use.get(r, -1), i)
        for o in n.outputs:
            r = root[o]
            last_use[r] = max(last_use.get(r, -1), i)
    buffer_of: dict[str, int] = {}
    sizes: list[int] = []
    free: list[int] = []
    for i, n in enumerate(graph.nodes):
        for o in n.outputs:
            r = root[o]
            if (r != o and o not in offset_of) or r in external or r in fresh or r in buffer_of:
                continue  # (a slice's producer allocates its concatenation's buffer)
            need = graph.type_of[r].nbytes
            fits = sorted((sizes[b], b) for b in free if sizes[b] >= need)
            if fits:
                b = fits[0][1]
                free.remove(b)
            elif free:  # grow the largest free buffer rather than adding one
                b = max(free, key=lambda k: sizes[k])
                free.remove(b)
                sizes[b] = need
            else:
                b = len(sizes)
                sizes.append(need)
            buffer_of[r] = b
        for r, b in list(buffer_of.items()):
            if last_use.get(r) == i and b not in free and not any(
                    buffer_of.get(x) == b and last_use.get(x, -1) > i for x in buffer_of):
                free.append(b)
    members: dict[int, list[str]] = {}
    for r, b in buffer_of.items():
        members.setdefault(b, []).append(r)
    buffers = [PlannedBuffer("intermediate", n, tuple(members.get(b, ()))) for b, n in enumerate(sizes)]
    elided = frozenset(cs.node for cs in slices)
    return MemoryPlan(buffer_of, sizes, buffers, offset_of, elided), root


class GraphExecutor:
    """Compile every compute node of ``graph`` with the complete ``schedules`` it is given (node name ->
    trace; the schedule pass decides them, the executor never does) and run it. ``sources``: the distinct
    kernels' C sources as this executor printed them before (``[k.source for k in kernels]``, from a
    program cache entry keyed by the code that printed them): not lowered and printed again. ``packed``: the
    constant inputs this executor packed before (:meth:`packed_constants`, saved with the same graph, schedules
    and code): used as they are instead of packed again (one whose shape or type does not fit is packed).
    ``deadline`` (``time.monotonic()``): the C compiler stops there (``runtime.compiler.CompileDeadline``)."""

    def __init__(self, graph: Graph, schedules: Mapping[str, Sequence[Primitive]],
                 config: ExecutorConfig | None = None, phases: PhaseTimer | None = None,
                 sources: Sequence[KernelSource] | None = None,
                 packed: Mapping[tuple[str, str], np.ndarray] | None = None, deadline: float | None = None) -> None:
        check_run_time_shapes(graph)  # a value-dependent shape (NonZero, ...) may only be a graph output
        self.graph = graph
        self.config = config or ExecutorConfig()
        self.target = self.config.resolved_target()
        self.memory, self.root = plan_memory(graph, self.config.elide_concats)
        items: list[tuple[Compute, list[Primitive]]] = []
        index: dict[tuple[str, str], int] = {}
        self.node_kernel: dict[str, int] = {}
        self.traces: dict[str, list[Primitive]] = {}
        self.compiled = [n for n in graph.nodes if not n.is_extern and n.name not in self.memory.elided]
        for name in self.memory.elided:  # (kept for artifacts: a reload without the slices runs them)
            self.traces[name] = list(schedules.get(name, []))
        for n in self.compiled:
            if n.name not in schedules:
                raise ValueError(f"no schedule for compute node {n.name!r}: run a schedule pass first "
                                 "(superopt.schedule.graph_defaults.default_schedules, or the database/search in search/)")
            trace = list(schedules[n.name])
            self.traces[n.name] = trace
            k = (n.op.digest(), repr(trace))
            if k not in index:
                index[k] = len(items)
                items.append((n.op, trace))
            self.node_kernel[n.name] = index[k]
        # the extern nodes with a C implementation (one function per distinct node signature)
        self.natives: dict[str, NativeExtern] = {}
        if self.config.chain and self.config.native_externs and items:  # (artifacts save the kernels' library)
            for n in graph.nodes:
                if n.is_extern and n.op.kind != "reshape" and (ne := native_extern(n, graph)) is not None:
                    self.natives[n.name] = ne
        natives = list({ne.name: ne.code for ne in self.natives.values()}.values())

        def extra(sources: list) -> list[str]:
            return [RUNNER_SOURCE, *(pack_caller_source(s) for s in sources if s.packs), *natives]
        self.kernels: list[CompiledKernel] = []
        lib: ctypes.CDLL | None = None
        if items or self.natives:
            lib, self.kernels = build_library(items, self.config.compiler, self.target.threads, self.target, extra,
                                              self.config.serial_below, phases, sources, deadline)
        self._buffers = [aligned_empty(max(b, 1), np.uint8) for b in self.memory.buffer_bytes]
        self._packed: dict[tuple[str, str], np.ndarray] = {}
        for n in self.compiled:  # pack constant weights once, ahead of time
            kern = self.kernels[self.node_kernel[n.name]]
            for local, g in zip(n.op.inputs, n.inputs):
                if local in kern.pack_fns and g in graph.constant:
                    pre = (packed or {}).get((n.name, local))
                    if pre is None or pre.shape != tuple(kern.source.packs[local].shape) or \
                            pre.dtype != np.dtype(n.op.type_of[local].np_dtype) or pre.ctypes.data % ALIGN:
                        pre = kern.pack(local, graph.constant[g].array)
                    self._packed[(n.name, local)] = pre
        self.packed_only = self._packed_only()
        self._calls = {n.name: self._prepare_call(n) for n in self.compiled}
        self.memory.buffers += self._kernel_buffers()
        self._lib = lib
        self._status = ctypes.c_int(0)  # set by a native extern that meets an index out of range
        self._runner = load_runner(lib) if lib is not None and self.config.chain else None
        if self._runner is None:
            self.natives = {}  # no runner: a library built without it (an artifact saved before it existed)
        self._native_calls = {n.name: self._prepare_native(n) for n in graph.nodes if n.name in self.natives}
        self._static_env = self._static_tensors()
        self._output_rules = [(o, self._copies(o)) for o in graph.outputs]
        self._input_types = [(n, graph.type_of[n].shape, np.dtype(graph.type_of[n].np_dtype)) for n in graph.inputs]
        self._steps = self._plan_steps()
        # the intermediates live in the buffers planned once (self._buffers), so two calls at the same time
        # would overwrite each other's: calls from several threads (a control-flow body that the verifier's
        # reference thread and the program both run, or a user's threads) take turns
        self._lock = threading.RLock()

    def _packed_only(self) -> dict[str, tuple[str, str]]:
        """Constant tensor -> the (node, input) of one packed copy of it, for each constant that no run reads
        but through its packed copies: every reader is a compiled kernel that reads it packed, and it is no
        graph output and no other tensor's storage (a reshape's). Such a constant's own array is read only
        where the graph is interpreted (the reference) or saved."""
        g = self.graph
        readers: dict[str, list[tuple[str, str] | None]] = {}
        compiled = {n.name for n in self.compiled}
        for n in g.nodes:
            for i, t in enumerate(n.inputs):
                if t in g.constant:
                    key = (n.name, n.op.inputs[i]) if n.name in compiled else None
                    readers.setdefault(t, []).append(key if key in self._packed else None)
        viewed = {r for t, r in self.root.items() if r != t}
        return {t: keys[0] for t, keys in readers.items()  # type: ignore[misc]
                if None not in keys and t not in g.outputs and t not in viewed}

    def packed_constants(self) -> dict[tuple[str, str], np.ndarray]:
        """(node, the kernel's input name) -> that constant input packed in the layout the kernel reads (what
        ``packed=`` takes back)."""
        return dict(self._packed)

    def _kernel_buffers(self) -> list[PlannedBuffer]:
        """Per compute node: its kernel's workspace and stack buffers, packed inputs, fresh outputs."""
        out: list[PlannedBuffer] = []
        g = self.graph
        for n in g.nodes:
            if n.name in self.memory.elided:
                continue
            if n.is_extern:  # an extern's outputs land in planned buffers, or are new arrays (graph outputs)
                out += [PlannedBuffer("output", g.type_of[o].nbytes, (o,), n.name) for o in n.outputs
                        if self.root.get(o, o) == o and o not in self.memory.buffer_of and n.op.kind != "reshape"]
                continue
            ki = self.node_kernel[n.name]
            for kind, local, nbytes in self.kernels[ki].storage:
                out.append(PlannedBuffer(kind, nbytes, (local,), n.name, ki if kind == "workspace" else None))
            call = self._calls[n.name]
            for local, tensor in zip(n.op.inputs, n.inputs):
                if (n.name, local) in self._packed:
                    out.append(PlannedBuffer("packed", self._packed[(n.name, local)].nbytes, (local, tensor), n.name))
            for _, local, tensor, buf in call.packs:
                out.append(PlannedBuffer("packed_per_call", buf.nbytes, (local, tensor), n.name))
            for _, tensor in call.fresh:
                out.append(PlannedBuffer("output", g.type_of[tensor].nbytes, (tensor,), n.name))
        return out

    def _view(self, tensor: str) -> np.ndarray:
        """The planned tensor's array: its root's buffer (at its slice's offset)."""
        t = self.graph.type_of[tensor]
        buf = self._buffers[self.memory.buffer_of[self.root.get(tensor, tensor)]]
        at = self.memory.offset_of.get(tensor, 0)
        return buf[at: at + t.nbytes].view(t.np_dtype).reshape(t.shape)

    def _address(self, tensor: str) -> int:
        """The planned tensor's first byte."""
        buf = self._buffers[self.memory.buffer_of[self.root.get(tensor, tensor)]]
        return buf.ctypes.data + self.memory.offset_of.get(tensor, 0)

    def __call__(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            env = self._input_env(inputs)
            try:
                for step in self._steps:
                    step(env)
            except _NativeFailure:
                self._status.value = 0
                return self._run(inputs, None)  # the numpy externs raise the reference's error
            return self._results(env)

    def run_per_node(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """The plain path: one call per node, numpy for every extern (the chained path must agree with it)."""
        return self._run(inputs, None)

    @property
    def chains(self) -> list[Chain]:
        """The native chains one call runs, in order."""
        return [s.chain for s in self._steps if isinstance(s, _ChainStep) and s.chain is not None]

    def profile(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], repeats: int = 5) -> list[NodeTime]:
        """Median wall time of every node over ``repeats`` runs of the graph, slowest first (on the per-node
        path: one ctypes call per kernel and numpy externs, so small nodes show more overhead than a call of
        the chained path gives them)."""
        times: dict[str, list[float]] = {n.name: [] for n in self.graph.nodes}
        self._run(inputs, None)  # warm-up
        for _ in range(repeats):
            self._run(inputs, times)
        out = []
        for n in self.graph.nodes:
            what = n.op.kind if n.is_extern else "; ".join(str(st) for st in n.op.statements)[:160]
            out.append(NodeTime(n.name, float(np.median(times[n.name])), what, self.traces.get(n.name, [])))
        return sorted(out, key=lambda t: -t.seconds)

    def node_seconds(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, float]:
        """One run of the graph on the per-node path: each node's wall time, in seconds, where it runs in
        the graph (its inputs just written by their producers, its constants wherever the run before left
        them in the caches)."""
        times: dict[str, list[float]] = {n.name: [] for n in self.graph.nodes}
        self._run(inputs, times)
        return {name: ts[0] for name, ts in times.items()}

    def _run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
             times: dict[str, list[float]] | None) -> dict[str, np.ndarray]:
        g = self.graph
        with self._lock:
            env = self._input_env(inputs)
            for name, c in g.constants:
                if name not in self.packed_only:  # (read through its packed copy: never computed here)
                    env[name] = c.array
            for n in g.nodes:
                t0 = time.perf_counter() if times is not None else 0.0
                self._run_node(n, env)
                if times is not None:
                    times[n.name].append(time.perf_counter() - t0)
            return self._results(env)

    def _input_env(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """The graph inputs, checked and made contiguous in their element types."""
        if inputs.__class__ is not dict and not isinstance(inputs, Mapping):
            inputs = dict(zip(self.graph.inputs, inputs))
        env: dict[str, np.ndarray] = {}
        for name, shape, dtype in self._input_types:
            x = inputs.get(name)
            if x is None and name not in inputs:
                raise ValueError(f"missing graph input {name!r}")
            if x.__class__ is not np.ndarray or x.dtype != dtype or not x.flags.c_contiguous:
                x = np.asarray(x, dtype=dtype)
                if not x.flags.c_contiguous:  # (np.ascontiguousarray would make a rank-0 array rank 1)
                    x = np.ascontiguousarray(x)
            if x.shape != shape:
                raise ValueError(f"graph input {name!r} has shape {tuple(x.shape)} but {shape} is expected")
            env[name] = x
        return env

    def _results(self, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph outputs by name; a planned buffer, a graph input or a constant is handed out as a copy."""
        result = {}
        for o, copy_view in self._output_rules:
            v = env[o] if o in env else self._static_env[o]  # (the per-node path's env holds everything)
            result[o] = v.copy() if copy_view is None or (copy_view and not v.flags.owndata) else v
        return result

    def _run_node(self, n: Node, env: dict[str, np.ndarray]) -> None:
        g = self.graph
        if n.name in self.memory.elided:  # its inputs' producers wrote it
            env[n.outputs[0]] = self._static_env[n.outputs[0]]
            return
        if n.is_extern:
            if n.op.kind == "reshape":
                env[n.outputs[0]] = env[n.inputs[0]].reshape(g.type_of[n.outputs[0]].shape)
            else:
                for o, v in zip(n.outputs, evaluate_extern(n.op.kind, [env[i] for i in n.inputs], n.op.attr)):
                    env[o] = self._place(o, v)
            return
        call = self._calls[n.name]
        ptrs = call.ptrs
        for slot, tensor in call.reads:
            ptrs[slot] = env[tensor].ctypes.data
        for _, local, tensor, buf in call.packs:
            call.kernel.pack_into(local, env[tensor], buf)
        for slot, tensor in call.fresh:
            env[tensor], ptrs[slot] = aligned_empty_at(g.type_of[tensor].shape, np.dtype(g.type_of[tensor].np_dtype))
        for tensor, view in call.planned:
            env[tensor] = view
        call.kernel.fn(ptrs)

    def _prepare_call(self, n: Node) -> _NodeCall:
        """Argument pointers fixed once (constants, packed weights, planned buffers, workspace); only
        run-time inputs, per-call packs and fresh outputs are filled in on each call."""
        kern = self.kernels[self.node_kernel[n.name]]
        g = self.graph
        slots = list(zip(n.op.inputs, n.inputs)) + [(None, o) for o in n.outputs]
        ptrs = (ctypes.c_void_p * (len(slots) + len(kern._workspace)))()
        call = _NodeCall(kern, ptrs)
        for i, (local, tensor) in enumerate(slots):
            root = self.root.get(tensor, tensor)
            if local is not None and local in kern.pack_fns:
                pre = self._packed.get((n.name, local))
                if pre is not None:
                    ptrs[i] = pre.ctypes.data
                else:
                    buf = aligned_empty(kern.source.packs[local].shape, n.op.type_of[local].np_dtype)
                    ptrs[i] = buf.ctypes.data
                    call.packs.append((i, local, tensor, buf))
            elif local is not None and tensor in g.constant:
                ptrs[i] = g.constant[tensor].array.ctypes.data
            elif root in self.memory.buffer_of:
                ptrs[i] = self._address(tensor)
                if local is None:
                    call.planned.append((tensor, self._view(tensor)))
            elif local is None:
                call.fresh.append((i, tensor))
            else:
                call.reads.append((i, tensor))
        for j, w in enumerate(kern._workspace):
            ptrs[len(slots) + j] = w.ctypes.data
        return call

    def _prepare_native(self, n: Node) -> _NativeCall:
        """A native extern's argument array: inputs, outputs, then the status flag."""
        g = self.graph
        slots = [*n.inputs, *n.outputs]
        ptrs = (ctypes.c_void_p * (len(slots) + 1))()
        call = _NativeCall(function_address(getattr(self._lib, self.natives[n.name].name)), ptrs)
        for i, tensor in enumerate(slots):
            root = self.root.get(tensor, tensor)
            if root in g.constant:
                ptrs[i] = g.constant[root].array.ctypes.data
            elif root in self.memory.buffer_of:
                ptrs[i] = self._address(tensor)
            elif i < len(n.inputs):
                call.reads.append((i, tensor))
            else:
                call.fresh.append((i, tensor))
        ptrs[len(slots)] = ctypes.addressof(self._status)
        return call

    def _static_tensors(self) -> dict[str, np.ndarray]:
        """Tensors whose array is the same on every call: constants (and their reshapes), planned buffers' views."""
        g, out = self.graph, {}
        for name, t in g.type_of.items():
            root = self.root.get(name, name)
            if name in self.packed_only:
                continue  # (a loaded program's copy of it may be deferred: reading it would unpack it)
            if name in g.constant:
                out[name] = g.constant[name].array
            elif root in g.constant:
                out[name] = g.constant[root].array.reshape(t.shape)
            elif root in self.memory.buffer_of:
                out[name] = self._view(name)
        return out

    def _copies(self, output: str) -> bool | None:
        """How a graph output is handed out: None: always copied (a graph input or a constant); True: copied
        when it is a view (of a planned buffer); False: as it is (a fresh array)."""
        g = self.graph
        if output in g.inputs or output in g.constant:
            return None
        return self.root.get(output, output) in self.memory.buffer_of

    def _plan_steps(self) -> list:
        """The steps of one call: chains (runtime/chain.py) of compiled nodes and native externs with their
        run-time pointers, and the numpy externs (and nodes packing a run-time input) between them."""
        g, steps = self.graph, []
        seg = _ChainStep(self._status)

        def close() -> None:
            nonlocal seg
            if seg.calls or seg.aliases:
                seg.finish(self._runner)
                steps.append(seg)
            seg = _ChainStep(self._status)

        for n in g.nodes:
            if n.name in self.memory.elided:
                continue
            if n.is_extern and n.op.kind == "reshape":
                if n.outputs[0] not in self._static_env:
                    seg.aliases.append((n.outputs[0], n.inputs[0], g.type_of[n.outputs[0]].shape))
                continue
            if self._runner is not None and n.name in self.natives:
                c = self._native_calls[n.name]
                seg.add(c.fn, c.ptrs, c.reads, c.fresh, self._static_env, g, native=True)
            elif self._runner is not None and not n.is_extern:
                c = self._calls[n.name]
                for _, local, tensor, buf in c.packs:  # pack the run-time input right before the kernel
                    pack_args = (ctypes.c_void_p * 2)(0, buf.ctypes.data)
                    fn = function_address(getattr(self._lib, c.kernel.pack_callers[local]))
                    seg.add(fn, pack_args, [(0, tensor)], [], self._static_env, g)
                seg.add(function_address(c.kernel.fn), c.ptrs, c.reads, c.fresh, self._static_env, g)
            else:
                close()
                steps.append(_NodeStep(self, n))
        close()
        return steps

    def _place(self, tensor: str, value: np.ndarray) -> np.ndarray:
        if self.root.get(tensor, tensor) in self.memory.buffer_of:
            view = self._view(tensor)
            view[...] = value
            return view
        return value


class _ChainStep:
    """Allocate the fresh outputs, alias the run-time reshapes, fill in the run-time pointers, then run the
    chain's native calls (none when the segment holds only aliases)."""

    def __init__(self, status: ctypes.c_int) -> None:
        self.status = status
        self._pool: list = []
        self.calls: list[tuple[int, ctypes.Array]] = []
        self.fresh: dict[str, tuple[tuple[int, ...], np.dtype, list[tuple[ctypes.Array, int]]]] = {}
        self.aliases: list[tuple[str, str, tuple[int, ...]]] = []
        self.reads: dict[str, list[tuple[ctypes.Array, int]]] = {}
        self.native = False
        self.chain: Chain | None = None
        self._fresh: list = []
        self._reads: list = []

    def add(self, fn: int, ptrs: ctypes.Array, reads: Sequence[tuple[int, str]], fresh: Sequence[tuple[int, str]],
            static: Mapping[str, np.ndarray], graph: Graph, native: bool = False) -> None:
        self.calls.append((fn, ptrs))
        self.native |= native
        for slot, tensor in reads:
            if tensor in static:  # a planned buffer or a (reshaped) constant: its pointer never changes
                ptrs[slot] = static[tensor].ctypes.data
            else:
                self.reads.setdefault(tensor, []).append((ptrs, slot))
        for slot, tensor in fresh:
            t = graph.type_of[tensor]
            self.fresh.setdefault(tensor, (t.shape, np.dtype(t.np_dtype), []))[2].append((ptrs, slot))

    def finish(self, runner) -> None:
        if self.calls:
            self.chain = Chain(runner, [f for f, _ in self.calls], [p for _, p in self.calls], self.status)
        self._fresh = [(t, shape, dtype, math.prod(shape) * dtype.itemsize, tuple(targets))
                       for t, (shape, dtype, targets) in self.fresh.items()]
        # the last array handed out for each fresh tensor: reused when nothing but this list refers to it any
        # more (the caller dropped it and every view of it), else a new one is allocated
        self._pool: list[tuple[np.ndarray, int, np.ndarray] | None] = [None] * len(self._fresh)
        self._reads = [(t, tuple(targets)) for t, targets in self.reads.items()]

    def __call__(self, env: dict[str, np.ndarray]) -> None:
        pool = self._pool
        for k, (tensor, shape, dtype, nbytes, targets) in enumerate(self._fresh):
            last = pool[k]
            # reused when only the pool refers to the array (2: the tuple and getrefcount's argument) and to
            # its raw buffer (3: also the array's base), the base of every view numpy makes of it
            if last is not None and getrefcount(last[0]) == 2 and getrefcount(last[2]) == 3:
                arr, addr, _ = last
            else:
                arr, addr = aligned_empty_at(shape, dtype, ALIGN, nbytes)
                pool[k] = (arr, addr, arr.base)
            env[tensor] = arr
            for ptrs, slot in targets:
                ptrs[slot] = addr
        for out, src, shape in self.aliases:
            env[out] = env[src].reshape(shape)
        for tensor, targets in self._reads:
            addr = data_address(env[tensor])
            for ptrs, slot in targets:
                ptrs[slot] = addr
        if self.chain is not None:
            self.chain()
            if self.native and self.status.value:
                raise _NativeFailure


class _NodeStep:
    """One node the per-node way: a numpy extern, or a compiled node that packs a run-time input per call."""

    def __init__(self, executor: GraphExecutor, node: Node) -> None:
        self.executor = executor
        self.node = node
        static = executor._static_env
        self.ins = [(t, static.get(t)) for t in node.inputs]
        self.outs = [(o, static.get(o)) for o in node.outputs]

    def __call__(self, env: dict[str, np.ndarray]) -> None:
        n = self.node
        if n.is_extern:
            args = [env[t] if a is None else a for t, a in self.ins]
            for (o, view), v in zip(self.outs, evaluate_extern(n.op.kind, args, n.op.attr)):
                if view is None:
                    env[o] = v
                else:
                    view[...] = v
            return
        full = {**self.executor._static_env, **env}
        self.executor._run_node(n, full)
        for o, view in self.outs:
            if view is None:
                env[o] = full[o]
