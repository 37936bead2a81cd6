"""Run a whole Graph: compiled kernels and extern ops over a static memory plan.

Intermediate tensors live in a few preallocated buffers reused once their last reader has run;
``reshape`` externs are aliases (no copy); graph outputs are written straight into fresh arrays.
The :class:`MemoryPlan` lists every buffer the executor allocates (and the kernels' stack buffers),
per node and per tensor name, so that "no buffer holds T" is a checkable statement.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.externs import evaluate_extern
from superopt.ir.graph import Graph, Node
from superopt.runtime.buffers import aligned_empty
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.kernel import CompiledKernel, build_kernels
from superopt.runtime.target import Target, host_target
from superopt.schedule.primitives import Primitive


@dataclass(frozen=True)
class ExecutorConfig:
    threads: int = 2
    compiler: CompilerConfig = field(default_factory=CompilerConfig)
    target: Target | None = None  # None: this machine with ``threads`` threads

    def resolved_target(self) -> Target:
        return self.target if self.target is not None else host_target(self.threads, self.compiler.cc)


@dataclass
class _NodeCall:
    kernel: CompiledKernel
    ptrs: ctypes.Array
    reads: list[tuple[int, str]] = field(default_factory=list)  # slot <- a run-time tensor's data
    packs: list[tuple[int, str, str]] = field(default_factory=list)  # slot <- packed per call
    fresh: list[tuple[int, str]] = field(default_factory=list)  # slot <- a new array (graph outputs)
    planned: list[tuple[str, np.ndarray]] = field(default_factory=list)  # outputs in planned buffers


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
    call), ``output`` (a graph output, a fresh array each call) or ``local`` (a stage computed inside
    another's loop, on each thread's stack during the call; not allocated by the executor).

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

    @property
    def intermediate_bytes(self) -> int:
        return sum(self.buffer_bytes)

    @property
    def total_bytes(self) -> int:
        """Bytes the executor holds between calls: intermediates, kernel workspace (once per kernel) and
        constants packed ahead of time."""
        seen: set[tuple] = set()
        total = 0
        for b in self.buffers:
            key = (b.kind, b.kernel, b.tensors) if b.kind == "workspace" else (id(b),)
            if b.kind in ("intermediate", "workspace", "packed") and key not in seen:
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


def _storage_roots(graph: Graph) -> dict[str, str]:
    """Tensor -> the tensor owning its memory (reshape outputs alias their input)."""
    root: dict[str, str] = {}
    for n in graph.nodes:
        for o in n.outputs:
            root[o] = o
        if n.is_extern and n.op.kind == "reshape":
            src = n.inputs[0]
            root[n.outputs[0]] = root.get(src, src)
    return root


def plan_memory(graph: Graph) -> tuple[MemoryPlan, dict[str, str]]:
    root = _storage_roots(graph)
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
            if r != o or r in external or r in fresh or r in buffer_of:
                continue
            need = graph.type_of[o].nbytes
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
    return MemoryPlan(buffer_of, sizes, buffers), root


class GraphExecutor:
    """Compile every compute node of ``graph`` with the complete ``schedules`` it is given (node name ->
    trace; the schedule pass decides them, the executor never does) and run it."""

    def __init__(self, graph: Graph, schedules: Mapping[str, Sequence[Primitive]],
                 config: ExecutorConfig | None = None) -> None:
        self.graph = graph
        self.config = config or ExecutorConfig()
        self.target = self.config.resolved_target()
        items: list[tuple[Compute, list[Primitive]]] = []
        index: dict[tuple[str, str], int] = {}
        self.node_kernel: dict[str, int] = {}
        self.traces: dict[str, list[Primitive]] = {}
        for n in graph.nodes:
            if n.is_extern:
                continue
            if n.name not in schedules:
                raise ValueError(f"no schedule for compute node {n.name!r}: run a schedule pass first "
                                 "(superopt.schedule.graph.default_schedules, or the database/search in search/)")
            trace = list(schedules[n.name])
            self.traces[n.name] = trace
            k = (n.op.digest(), repr(trace))
            if k not in index:
                index[k] = len(items)
                items.append((n.op, trace))
            self.node_kernel[n.name] = index[k]
        self.kernels: list[CompiledKernel] = build_kernels(items, self.config.compiler, self.target.threads,
                                                           self.target) if items else []
        self.memory, self.root = plan_memory(graph)
        self._buffers = [aligned_empty(max(b, 1), np.uint8) for b in self.memory.buffer_bytes]
        self._packed: dict[tuple[str, str], np.ndarray] = {}
        for n in graph.nodes:  # pack constant weights once, ahead of time
            if n.is_extern:
                continue
            kern = self.kernels[self.node_kernel[n.name]]
            for local, g in zip(n.op.inputs, n.inputs):
                if local in kern.pack_fns and g in graph.constant:
                    self._packed[(n.name, local)] = kern.pack(local, graph.constant[g].array)
        self._calls = {n.name: self._prepare_call(n) for n in graph.nodes if not n.is_extern}
        self.memory.buffers += self._kernel_buffers()

    def _kernel_buffers(self) -> list[PlannedBuffer]:
        """Per compute node: its kernel's workspace and stack buffers, packed inputs, fresh outputs."""
        out: list[PlannedBuffer] = []
        g = self.graph
        for n in g.nodes:
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
            for _, local, tensor in call.packs:
                nbytes = math.prod(self.kernels[ki].source.packs[local].shape) * n.op.type_of[local].np_dtype.itemsize
                out.append(PlannedBuffer("packed_per_call", nbytes, (local, tensor), n.name))
            for _, tensor in call.fresh:
                out.append(PlannedBuffer("output", g.type_of[tensor].nbytes, (tensor,), n.name))
        return out

    def _view(self, tensor: str) -> np.ndarray:
        t = self.graph.type_of[tensor]
        buf = self._buffers[self.memory.buffer_of[tensor]]
        return buf[: t.nbytes].view(t.np_dtype).reshape(t.shape)

    def __call__(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        return self._run(inputs, None)

    def profile(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], repeats: int = 5) -> list[NodeTime]:
        """Median wall time of every node over ``repeats`` runs of the graph, slowest first."""
        times: dict[str, list[float]] = {n.name: [] for n in self.graph.nodes}
        self._run(inputs, None)  # warm-up
        for _ in range(repeats):
            self._run(inputs, times)
        out = []
        for n in self.graph.nodes:
            what = n.op.kind if n.is_extern else "; ".join(str(st) for st in n.op.statements)[:160]
            out.append(NodeTime(n.name, float(np.median(times[n.name])), what, self.traces.get(n.name, [])))
        return sorted(out, key=lambda t: -t.seconds)

    def _run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
             times: dict[str, list[float]] | None) -> dict[str, np.ndarray]:
        g = self.graph
        if not isinstance(inputs, Mapping):
            inputs = dict(zip(g.inputs, inputs))
        env: dict[str, np.ndarray] = {}
        for name in g.inputs:
            if name not in inputs:
                raise ValueError(f"missing graph input {name!r}")
            t = g.type_of[name]
            x = np.asarray(inputs[name])
            if tuple(x.shape) != t.shape:
                raise ValueError(f"graph input {name!r} has shape {tuple(x.shape)} but {t.shape} is expected")
            env[name] = np.ascontiguousarray(x, dtype=t.np_dtype)
        for name, c in g.constants:
            env[name] = c.array
        for n in g.nodes:
            t0 = time.perf_counter() if times is not None else 0.0
            self._run_node(n, env)
            if times is not None:
                times[n.name].append(time.perf_counter() - t0)
        result = {}
        for o in g.outputs:
            v = env[o]
            result[o] = v.copy() if (o in g.inputs or o in g.constant or not v.flags.owndata and
                                     self.root.get(o, o) in self.memory.buffer_of) else v
        return result

    def _run_node(self, n: Node, env: dict[str, np.ndarray]) -> None:
        g = self.graph
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
        packed = []  # keeps per-call packed copies alive until the kernel returns
        for slot, local, tensor in call.packs:
            packed.append(call.kernel.pack(local, env[tensor]))
            ptrs[slot] = packed[-1].ctypes.data
        for slot, tensor in call.fresh:
            arr = aligned_empty(g.type_of[tensor].shape, g.type_of[tensor].np_dtype)
            env[tensor] = arr
            ptrs[slot] = arr.ctypes.data
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
                    call.packs.append((i, local, tensor))
            elif local is not None and tensor in g.constant:
                ptrs[i] = g.constant[tensor].array.ctypes.data
            elif root in self.memory.buffer_of:
                ptrs[i] = self._buffers[self.memory.buffer_of[root]].ctypes.data
                if local is None:
                    call.planned.append((tensor, self._view(tensor)))
            elif local is None:
                call.fresh.append((i, tensor))
            else:
                call.reads.append((i, tensor))
        for j, w in enumerate(kern._workspace):
            ptrs[len(slots) + j] = w.ctypes.data
        return call

    def _place(self, tensor: str, value: np.ndarray) -> np.ndarray:
        if tensor in self.memory.buffer_of:
            view = self._view(tensor)
            view[...] = value
            return view
        return value
