"""Workloads of the schedule-search benchmark (``benchmarks/search.py``), each built at any size.

A :class:`SearchWorkload` pairs the superopt graph as imported (before any pass) with the peers'
view of the same computation (a :class:`benchmarks.workloads.WorkloadInstance`: a torch eager
module, seeded inputs, an ONNX export and a float64 reference). Weights are graph constants
(convolutions, capsule W); activations are run-time inputs. Builders take their sizes, so the tests
build the same workloads tiny and check the graph's reference interpreter against torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from benchmarks import workloads as wl
from superopt.builder import GraphBuilder
from superopt.ir.graph import Graph

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
SGEMM = "C[i,j] += A[i,k] * B[k,j]"


@dataclass
class SearchWorkload:
    name: str
    description: str
    instance: wl.WorkloadInstance  # peers: eager module, inputs, onnx_bytes(), float64 reference, flops
    graph: Graph  # superopt's graph as imported (the search benchmark runs the graph passes itself)
    flops: float  # useful flops (2 per multiply-add)
    memory_bytes: int  # inputs + weights + outputs, each read or written once (float32)
    memory_bound: bool = False  # report the fraction of the memory-bandwidth bound

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """Graph input name -> array: the peers' inputs, in order."""
        return {name: x.detach().numpy() for name, x in zip(self.graph.inputs, self.instance.inputs, strict=True)}

    @property
    def intensity(self) -> float:
        """Flops per byte of compulsory memory traffic."""
        return self.flops / self.memory_bytes


def graph_bytes(graph: Graph) -> int:
    """Bytes of the graph's inputs, constants and outputs (compulsory traffic of one call)."""
    names = set(graph.inputs) | set(graph.outputs) | set(graph.constant)
    return sum(math.prod(graph.type_of[n].shape) * graph.type_of[n].np_dtype.itemsize for n in names)


def _from_onnx(name: str, description: str, inst: wl.WorkloadInstance, flops: float,
               memory_bound: bool = False) -> SearchWorkload:
    from superopt.api import load_graph

    g = load_graph(inst.onnx_bytes())
    return SearchWorkload(name, description, inst, g, flops, graph_bytes(g), memory_bound)


# -- contractions -------------------------------------------------------------------------------------


def build_sgemm(m: int = 1024, k: int = 1024, n: int = 1024) -> SearchWorkload:
    g = wl._gen()
    a, b = wl._randn(m, k, g=g), wl._randn(k, n, g=g)
    inst = wl._block("sgemm", wl.MatMul(), (a, b), 2 * m * n * k)
    gb = GraphBuilder("sgemm")
    c = gb.compute1(SGEMM, {"A": gb.input("A", (m, k)), "B": gb.input("B", (k, n))}, "sgemm")
    graph = gb.build([c])
    return SearchWorkload("sgemm", f"C[i,j] += A[i,k] * B[k,j], {m}x{k} @ {k}x{n}", inst, graph, 2 * m * n * k,
                          graph_bytes(graph))


class CapsuleEinsum(nn.Module):
    """Capsule votes at any size: one einsum over a stride-2 patch view (W packed as given)."""

    def __init__(self, W: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("W", W.clone())

    def forward(self, P: torch.Tensor) -> torch.Tensor:
        n, h, w, i, p, r = P.shape
        kh, kw = self.W.shape[:2]
        oh, ow = (h - kh) // 2 + 1, (w - kw) // 2 + 1
        s = P.stride()
        pt = P.as_strided((n, oh, ow, kh, kw, i, p, r), (s[0], 2 * s[1], 2 * s[2], s[1], s[2], s[3], s[4], s[5]))
        return torch.einsum("nyxhwipr,hwiorq->nyxopq", pt, self.W)


def capsule_flops(p_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> int:
    n, h, w, i, p, _ = p_shape
    kh, kw, _, o, r, q = w_shape
    return 2 * n * ((h - kh) // 2 + 1) * ((w - kw) // 2 + 1) * o * p * q * kh * kw * i * r


def build_capsule(p_shape: tuple[int, ...] = (8, 15, 15, 32, 4, 4),
                  w_shape: tuple[int, ...] = (3, 3, 32, 32, 4, 4)) -> SearchWorkload:
    """At the default size the peers are the suite's (eager = the expert formulation)."""
    flops = capsule_flops(p_shape, w_shape)
    if p_shape == (8, 15, 15, 32, 4, 4) and w_shape == (3, 3, 32, 32, 4, 4):
        inst = wl.build_capsule()
        W = inst.meta["W_tensor"]
    else:
        g = wl._gen()
        P = wl._randn(*p_shape, g=g)
        W = wl._randn(*w_shape, scale=1.0 / math.sqrt(math.prod(w_shape[:3]) * w_shape[4]), g=g)
        inst = wl._block("capsule_votes", CapsuleEinsum(W), (P,), flops)
    gb = GraphBuilder("capsule_votes")
    v = gb.compute1(CAPSULE, {"P": gb.input("P", p_shape), "W": gb.constant(W.numpy().astype(np.float32), "W")},
                    "votes")
    graph = gb.build([v])
    return SearchWorkload("capsule_votes", f"{CAPSULE}, P{list(p_shape)}, W{list(w_shape)} constant", inst,
                          graph, flops, graph_bytes(graph))


# -- convolutions (NCHW, batch 1, weights constant) ---------------------------------------------------------


def build_conv(name: str, cin: int, cout: int, hw: int, kernel: int, pad: int, groups: int = 1,
               memory_bound: bool = False) -> SearchWorkload:
    torch.manual_seed(wl.SEED)
    m = nn.Conv2d(cin, cout, kernel, padding=pad, groups=groups, bias=False)
    with torch.no_grad():  # He-normal, as the light models' seeded weights
        m.weight.copy_(wl._randn(*m.weight.shape, scale=math.sqrt(2.0 / (cin // groups * kernel * kernel)),
                                 g=wl._gen(1)))
    x = wl._randn(1, cin, hw, hw, g=wl._gen())
    out_hw = hw + 2 * pad - kernel + 1
    flops = 2 * cout * out_hw * out_hw * (cin // groups) * kernel * kernel
    inst = wl._block(name, m, (x,), flops)
    what = "depthwise " if groups == cin == cout else ""
    desc = f"{what}{kernel}x{kernel} conv {cin}->{cout}, {hw}x{hw}, pad {pad}, NCHW, batch 1, weights constant"
    return _from_onnx(name, desc, inst, flops, memory_bound)


def build_resnet_conv3x3(channels: int = 64, hw: int = 56) -> SearchWorkload:
    return build_conv("resnet_conv3x3", channels, channels, hw, 3, 1)


def build_resnet_conv1x1(cin: int = 256, cout: int = 64, hw: int = 56) -> SearchWorkload:
    return build_conv("resnet_conv1x1", cin, cout, hw, 1, 0)


def build_depthwise(channels: int = 128, hw: int = 56) -> SearchWorkload:
    return build_conv("depthwise_conv3x3", channels, channels, hw, 3, 1, groups=channels, memory_bound=True)


# -- softmax and attention ---------------------------------------------------------------------------------------


def build_softmax(rows: int = 4096, cols: int = 1024) -> SearchWorkload:
    inst = wl._block("softmax", wl.Softmax(), (wl._randn(rows, cols, g=wl._gen()),), None)
    # max, subtract, exp, sum, divide: 5 operations per element (exp counted as one)
    return _from_onnx("softmax", f"softmax over the last axis of [{rows},{cols}]", inst, 5 * rows * cols, True)


def build_attention(heads: int = 12, seq: int = 256, dim: int = 64) -> SearchWorkload:
    g = wl._gen()
    q, k, v = (wl._randn(1, heads, seq, dim, g=g) for _ in range(3))
    flops = 2 * 2 * heads * seq * seq * dim
    inst = wl._block("attention", wl.Attention(), (q, k, v), flops)
    return _from_onnx("attention", f"softmax(q k^T / 8) v, q,k,v [1,{heads},{seq},{dim}] (the suite's block)", inst,
                      flops)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    build: Callable[[], SearchWorkload]
    tiny: Callable[[], SearchWorkload] | None = field(repr=False, default=None)  # the same, small (tests)


SEARCH_WORKLOADS: tuple[WorkloadSpec, ...] = (
    WorkloadSpec("sgemm", build_sgemm, lambda: build_sgemm(8, 5, 12)),
    WorkloadSpec("capsule_votes", build_capsule, lambda: build_capsule((1, 5, 7, 2, 4, 4), (3, 3, 2, 3, 4, 4))),
    WorkloadSpec("resnet_conv3x3", build_resnet_conv3x3, lambda: build_resnet_conv3x3(4, 6)),
    WorkloadSpec("resnet_conv1x1", build_resnet_conv1x1, lambda: build_resnet_conv1x1(8, 4, 5)),
    WorkloadSpec("depthwise_conv3x3", build_depthwise, lambda: build_depthwise(3, 6)),
    WorkloadSpec("softmax", build_softmax, lambda: build_softmax(6, 10)),
    WorkloadSpec("attention", build_attention, lambda: build_attention(2, 8, 4)),
)
SEARCH_WORKLOADS_BY_NAME = {w.name: w for w in SEARCH_WORKLOADS}
