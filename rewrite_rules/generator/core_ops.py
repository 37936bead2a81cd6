"""The core op set the generator enumerates over, each op in four views.

- symbolic: its result shape from symbolic input shapes (:mod:`.dims`), and the attribute choices to
  enumerate (concat axis, slice bounds, reshape factors);
- numeric: a numpy function for fingerprints (float64, and int64 modulo a small prime for polynomial ops);
- building: the op function of :mod:`superopt.ops` that frontends use, so a rule's right-hand side is
  built exactly as a frontend would build it;
- recognition: :func:`classify` tells which core op (and concrete attributes) a real graph node is,
  by rebuilding the op with the op function at the node's own shapes and comparing canonical forms
  (:func:`superopt.ir.canonical.canonicalize`), so a node written by hand in index notation, by the
  ONNX or the torch frontend is recognised alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rewrite_rules.generator import dims
from superopt import ops
from superopt.builder import GraphBuilder
from superopt.ir.canonical import canonicalize
from superopt.ir.expr import Access
from superopt.ir.graph import Graph, Node
from superopt.ir.types import TensorType

Shape = tuple[str, ...]
Attrs = dict[str, Any]


def concrete_attrs(attrs: Mapping[str, Any], binding: Mapping[str, int]) -> Attrs:
    """Symbolic attributes (extent strings) evaluated under ``binding``."""
    out: Attrs = {}
    for k, v in attrs.items():
        if isinstance(v, str):
            out[k] = dims.value(v, binding)
        elif isinstance(v, (list, tuple)):
            out[k] = tuple(dims.value(x, binding) if isinstance(x, str) else int(x) for x in v)
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class CoreOp:
    name: str
    arity: int
    polynomial: bool
    shape: Callable[[list[Shape], Attrs], Shape | None] = field(repr=False)
    numpy: Callable[[list[np.ndarray], Attrs], np.ndarray] = field(repr=False)
    build: Callable[[GraphBuilder, list[str], Attrs], str] = field(repr=False)
    candidates: Callable[[Graph, Node], list[Attrs]] = field(repr=False)  # concrete attrs a node may have
    attr_choices: Callable[[list[Shape]], list[Attrs]] = field(repr=False, default=lambda shapes: [{}])
    commutative: bool = False
    elementwise: bool = False
    extern: bool = False


def _same(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    return shapes[0] if all(s == shapes[0] for s in shapes) else None


def _compute(node: Node, n_in: int) -> bool:
    return not node.is_extern and len(node.inputs) == n_in and len(node.outputs) == 1 and len(node.op.statements) == 1


def _shapes(graph: Graph, node: Node) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    t = graph.type_of
    return [t[i].shape for i in node.inputs], t[node.outputs[0]].shape


def _ewise_candidates(n_in: int):
    def cands(graph: Graph, node: Node) -> list[Attrs]:
        if not _compute(node, n_in):
            return []
        ins, out = _shapes(graph, node)
        return [{}] if all(s == out for s in ins) and out else []
    return cands


def _matmul_fits(a: tuple, b: tuple) -> bool:
    """numpy matmul without broadcasting: 2-D @ 2-D, batched (3-D/4-D) @ 2-D, or equal batch dimensions."""
    if len(a) < 2 or len(b) < 2 or len(a) > 4 or a[-1] != b[-2]:
        return False
    return len(b) == 2 or (len(b) == len(a) and a[:-2] == b[:-2])


def _matmul_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    a, b = shapes
    return a[:-1] + (b[-1],) if _matmul_fits(a, b) else None


def _matmul_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 2):
        return []
    (a, b), _ = _shapes(graph, node)
    return [{}] if _matmul_fits(a, b) else []


def _transpose_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    return (shapes[0][1], shapes[0][0]) if len(shapes[0]) == 2 else None


def _transpose_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 1):
        return []
    (a,), out = _shapes(graph, node)
    return [{}] if len(a) == 2 and out == a[::-1] else []


def _concat_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    a = shapes[0]
    ax = attrs["axis"]
    if ax >= len(a) or any(len(b) != len(a) or any(a[k] != b[k] for k in range(len(a)) if k != ax) for b in shapes):
        return None
    total = a[ax]
    for b in shapes[1:]:
        total = dims.add(total, b[ax])
    return a[:ax] + (total,) + a[ax + 1:]


def _axes(rank: int) -> range | tuple[int, ...]:
    """Axes a concat or slice is enumerated along: every axis up to rank 3; batch and channel of NCHW."""
    return range(rank) if rank <= 3 else (0, 1)


def _concat_choices(shapes: list[Shape]) -> list[Attrs]:
    return [{"axis": ax} for ax in _axes(len(shapes[0]))]


def _concat_candidates(graph: Graph, node: Node) -> list[Attrs]:
    """Concatenations of two or more inputs (a generated rule states an n-ary concat with n arguments)."""
    if len(node.inputs) < 2 or not _compute(node, len(node.inputs)):
        return []
    ins, out = _shapes(graph, node)
    a = ins[0]
    if any(len(b) != len(a) for b in ins) or len(out) != len(a):
        return []
    return [{"axis": ax} for ax in range(len(a)) if out[ax] == sum(b[ax] for b in ins)
            and all(b[k] == out[k] for b in ins for k in range(len(a)) if k != ax)]


def _slice_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    (a,) = shapes
    ax = attrs["axis"]
    return a[:ax] + (attrs["size"],) + a[ax + 1:] if ax < len(a) else None


def _slice_choices(shapes: list[Shape]) -> list[Attrs]:
    """Slices at the seams of a symbolic sum (what a split of a concatenation would cut)."""
    (a,) = shapes
    out = []
    for ax in _axes(len(a)):
        parts = dims.units(a[ax])
        for k in range(1, len(parts)):
            head, tail = "+".join(parts[:k]), "+".join(parts[k:])
            out.append({"axis": ax, "start": "0", "size": dims.canon(head)})
            out.append({"axis": ax, "start": dims.canon(head), "size": dims.canon(tail)})
    return out


def _slice_numpy(xs: list[np.ndarray], a: Attrs) -> np.ndarray:
    ix = [slice(None)] * xs[0].ndim
    ix[a["axis"]] = slice(a["start"], a["start"] + a["size"])
    return xs[0][tuple(ix)]


def _slice_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 1):
        return []
    (a,), out = _shapes(graph, node)
    diff = [k for k in range(len(a)) if len(out) == len(a) and out[k] != a[k]]
    if len(diff) != 1:
        return []
    expr = node.op.statements[0].expr
    if not isinstance(expr, Access):
        return []
    ax = diff[0]
    return [{"axis": ax, "start": expr.index[ax].const, "size": out[ax]}]


def _conv_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    x, w = shapes
    if len(x) != 4 or len(w) != 4 or x[1] != w[1] or w[2:] != ("3", "3") or "3" in x[2:]:
        return None  # (images have symbolic spatial extents: a weight is not convolved as an image)
    return (x[0], w[0], x[2], x[3])


def _conv_numpy(xs: list[np.ndarray], a: Attrs) -> np.ndarray:
    x, w = xs
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", win, w)


def _conv_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 2):
        return []
    (x, w), out = _shapes(graph, node)
    return [{}] if len(x) == 4 and len(w) == 4 and w[2:] == (3, 3) and x[1] == w[1] else []


def _convb_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    """Same-padded conv with bias: X (n,c,h,w), W (o,c,k,k) with an odd kernel extent k, bias (o)."""
    x, w, bias = shapes
    if len(x) != 4 or len(w) != 4 or len(bias) != 1 or x[1] != w[1] or w[2] != w[3] or bias[0] != w[0]:
        return None
    if w[2] in x[2:] or not all(d.isidentifier() for d in x[2:]):
        return None  # (images have their own symbolic spatial extents: a weight is not convolved as an image)
    return (x[0], w[0], x[2], x[3])


def _convb_numpy(xs: list[np.ndarray], a: Attrs) -> np.ndarray:
    x, w, bias = xs
    k = w.shape[2]
    p = (k - 1) // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", win, w) + bias[None, :, None, None]


def _convb_build(b: GraphBuilder, xs: list[str], a: Attrs) -> str:
    p = (b.shape(xs[1])[2] - 1) // 2
    return ops.conv2d(b, xs[0], xs[1], xs[2], pads=(p, p, p, p))


def _convb_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if node.is_extern or len(node.inputs) != 3 or len(node.outputs) != 1 or len(node.op.statements) != 2:
        return []
    (x, w, bias), out = _shapes(graph, node)
    ok = (len(x) == 4 and len(w) == 4 and w[2] == w[3] and w[2] % 2 == 1 and x[1] == w[1] and bias == (w[0],)
          and out == (x[0], w[0], x[2], x[3]))
    return [{}] if ok else []


def _convk_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    """Same-padded conv without bias, any odd kernel extent k (ResNet's convs, followed by a BatchNorm)."""
    x, w = shapes
    return _convb_shape([x, w, (w[0],)], attrs) if len(w) == 4 else None


def _convk_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 2):
        return []
    (x, w), out = _shapes(graph, node)
    ok = (len(x) == 4 and len(w) == 4 and w[2] == w[3] and w[2] % 2 == 1 and x[1] == w[1]
          and out == (x[0], w[0], x[2], x[3]))
    return [{}] if ok else []


def _convk_build(b: GraphBuilder, xs: list[str], a: Attrs) -> str:
    p = (b.shape(xs[1])[2] - 1) // 2
    return ops.conv2d(b, xs[0], xs[1], pads=(p, p, p, p))


def _enlarge_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    """A conv kernel (o,c,k,k) zero-padded by one on each side: (o,c,k+2,k+2) (TASO's kernel enlargement)."""
    (w,) = shapes
    if len(w) != 4 or w[2] != w[3] or not w[2].isidentifier():
        return None
    return w[:2] + (dims.add(w[2], "2"),) * 2


def _enlarge_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 1):
        return []
    (w,), out = _shapes(graph, node)
    return [{}] if len(w) == 4 and out == (w[0], w[1], w[2] + 2, w[3] + 2) else []


def _transpose_last_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    (a,) = shapes
    return a[:-2] + (a[-1], a[-2]) if 3 <= len(a) <= 4 else None


def _transpose_last_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 1):
        return []
    (a,), out = _shapes(graph, node)
    return [{}] if 3 <= len(a) <= 4 and out == a[:-2] + (a[-1], a[-2]) else []


def _addb_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    """A bias along the last axis: X (..., r) + C (r)."""
    x, c = shapes
    return x if len(x) >= 2 and len(c) == 1 and x[-1] == c[0] else None


def _addb_candidates(graph: Graph, node: Node) -> list[Attrs]:
    if not _compute(node, 2):
        return []
    (x, c), out = _shapes(graph, node)
    return [{}] if len(x) >= 2 and len(c) == 1 and x[-1] == c[0] and out == x else []


def _reshape_candidates(rank_in: int, rank_out: int):
    def cands(graph: Graph, node: Node) -> list[Attrs]:
        if not node.is_extern or node.op.kind != "reshape" or len(node.inputs) != 1:
            return []
        (a,), out = _shapes(graph, node)
        if len(a) != rank_in or len(out) != rank_out:
            return []
        return [{"shape": out}] if rank_out == 2 else [{}]
    return cands


def _unflatten_choices(shapes: list[Shape]) -> list[Attrs]:
    (a,) = shapes
    return [{"shape": [f, g]} for f, g in dims.factor_pairs(a[0])] if len(a) == 1 else []


def _unflatten_shape(shapes: list[Shape], attrs: Attrs) -> Shape | None:
    (a,) = shapes
    s = tuple(attrs["shape"])
    return s if len(a) == 1 and dims.mul(s[0], s[1]) == a[0] else None


CORE_OPS: dict[str, CoreOp] = {op.name: op for op in [
    CoreOp("add", 2, True, _same, lambda xs, a: xs[0] + xs[1], lambda b, xs, a: ops.add(b, *xs),
           _ewise_candidates(2), commutative=True, elementwise=True),
    CoreOp("mul", 2, True, _same, lambda xs, a: xs[0] * xs[1], lambda b, xs, a: ops.mul(b, *xs),
           _ewise_candidates(2), commutative=True, elementwise=True),
    CoreOp("relu", 1, False, _same, lambda xs, a: np.maximum(xs[0], 0), lambda b, xs, a: ops.relu(b, *xs),
           _ewise_candidates(1), elementwise=True),
    CoreOp("matmul", 2, True, _matmul_shape, lambda xs, a: xs[0] @ xs[1], lambda b, xs, a: ops.matmul(b, *xs),
           _matmul_candidates),
    CoreOp("transpose", 1, True, _transpose_shape, lambda xs, a: xs[0].T,
           lambda b, xs, a: ops.transpose(b, xs[0], (1, 0)), _transpose_candidates),
    CoreOp("concat", 2, True, _concat_shape, lambda xs, a: np.concatenate(xs, axis=a["axis"]),
           lambda b, xs, a: ops.concat(b, list(xs), a["axis"]), _concat_candidates, _concat_choices),
    CoreOp("slice", 1, True, _slice_shape, _slice_numpy,
           lambda b, xs, a: ops.slice_(b, xs[0], [a["start"]], [a["start"] + a["size"]], [a["axis"]]),
           _slice_candidates, _slice_choices),
    CoreOp("conv3x3", 2, True, _conv_shape, _conv_numpy,
           lambda b, xs, a: ops.conv2d(b, xs[0], xs[1], pads=(1, 1, 1, 1)), _conv_candidates),
    CoreOp("convb", 3, True, _convb_shape, _convb_numpy, _convb_build, _convb_candidates),
    CoreOp("convk", 2, True, _convk_shape, lambda xs, a: _convb_numpy([*xs, np.zeros(xs[1].shape[0])], a), _convk_build,
           _convk_candidates),
    CoreOp("enlarge", 1, True, _enlarge_shape, lambda xs, a: np.pad(xs[0], ((0, 0), (0, 0), (1, 1), (1, 1))),
           lambda b, xs, a: ops.pad(b, xs[0], (0, 0, 1, 1, 0, 0, 1, 1)), _enlarge_candidates),
    CoreOp("transpose_last", 1, True, _transpose_last_shape, lambda xs, a: np.swapaxes(xs[0], -1, -2),
           lambda b, xs, a: ops.transpose(b, xs[0], (*range(len(b.shape(xs[0])) - 2), len(b.shape(xs[0])) - 1,
                                                     len(b.shape(xs[0])) - 2)), _transpose_last_candidates),
    CoreOp("addb", 2, True, _addb_shape, lambda xs, a: xs[0] + xs[1], lambda b, xs, a: ops.add(b, *xs), _addb_candidates),
    CoreOp("flatten", 1, True, lambda s, a: (dims.mul(*s[0]),) if len(s[0]) == 2 else None,
           lambda xs, a: xs[0].reshape(-1), lambda b, xs, a: ops.reshape(b, xs[0], [-1]),
           _reshape_candidates(2, 1), extern=True),
    CoreOp("unflatten", 1, True, _unflatten_shape, lambda xs, a: xs[0].reshape(a["shape"]),
           lambda b, xs, a: ops.reshape(b, xs[0], list(a["shape"])), _reshape_candidates(1, 2), _unflatten_choices,
           extern=True),
]}


# ---- recognising real nodes ----------------------------------------------------------------------------------------

_TEMPLATES: dict[tuple, str | None] = {}
_CLASSIFIED: dict[tuple, tuple[Any, list[tuple[str, Attrs]]]] = {}


def _template_digest(op: CoreOp, in_types: tuple[TensorType, ...], attrs: Attrs) -> str | None:
    """Canonical digest of the single node ``op`` builds at these input types (None: not one compute node)."""
    key = (op.name, in_types, tuple(sorted(attrs.items())))
    if key not in _TEMPLATES:
        b = GraphBuilder("template")
        xs = [b.input(f"x{k}", t.shape, t.dtype) for k, t in enumerate(in_types)]
        digest = None
        try:
            out = op.build(b, xs, attrs)
            if len(b.nodes) == 1 and b.nodes[0].outputs == (out,) and b.nodes[0].inputs == tuple(xs):
                node = b.nodes[0]
                digest = node.op.text() if node.is_extern else canonicalize(node.op).digest()
        except (ValueError, TypeError):
            digest = None
        _TEMPLATES[key] = digest
    return _TEMPLATES[key]


def classify(graph: Graph, node: Node) -> list[tuple[str, Attrs]]:
    """The core ops (with concrete attributes) that ``node`` computes exactly as their op function builds them."""
    in_types = tuple(graph.type_of[i] for i in node.inputs)
    key = (id(node.op), in_types)
    hit = _CLASSIFIED.get(key)
    if hit is not None and hit[0] is node.op:
        return hit[1]
    found: list[tuple[str, Attrs]] = []
    own = None
    for op in CORE_OPS.values():
        if op.extern != node.is_extern:
            continue
        for attrs in op.candidates(graph, node):
            if own is None:
                own = node.op.text() if node.is_extern else canonicalize(node.op).digest()
            if _template_digest(op, in_types, attrs) == own:
                found.append((op.name, attrs))
    if len(_CLASSIFIED) > 200_000:
        _CLASSIFIED.clear()
    _CLASSIFIED[key] = (node.op, found)
    return found
