"""Random valid ONNX graphs for differential fuzzing (``superopt.testing.fuzz``).

``random_model(seed)`` builds a model of 2 to 12 nodes over ops superopt lowers natively: elementwise
unary and binary ops with numpy broadcasting, MatMul/Gemm/Conv/pools, reductions, softmax, normalizations,
and data movement (Transpose, Reshape, Concat, Split, Slice, Gather, Squeeze/Unsqueeze, Where). Shapes,
attributes and constants are random; a graph has 1 to 3 inputs and 1 to 3 outputs (intermediate tensors
too, which stresses fusion). Every op is built to be valid by construction, so onnxruntime accepts every
graph: one it rejects is a generator bug, reported as its own outcome.

The same seed always gives the same model (``random.Random(seed)`` drives every choice).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSETS = (17, 18)  # reduction axes as attributes (17; LayerNormalization needs 17) or as inputs (18)
# Mish, Selu, HardSwish... exist at 17; GroupNormalization's meaning changed at 21 (not generated)


@dataclass
class _Builder:
    rng: random.Random
    opset: int
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # float32 tensors usable as operands
    counter: int = 0

    def name(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def input(self, shape: tuple[int, ...]) -> str:
        n = self.name("in")
        self.inputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)))
        self.shapes[n] = shape
        return n

    def const(self, value: np.ndarray) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.array(value, order="C"), n))  # (ascontiguousarray makes 0-d 1-d)
        return n

    def weight(self, shape: tuple[int, ...], scale: float = 1.0) -> str:
        return self.const((np.asarray(self.np_rng().standard_normal(shape)) * scale).astype(np.float32))

    def np_rng(self) -> np.random.Generator:
        return np.random.default_rng(self.rng.randrange(2**31))

    def node(self, op: str, ins: list[str], out_shapes: list[tuple[int, ...]], **attrs) -> list[str]:
        outs = [self.name(op.lower()) for _ in out_shapes]
        self.nodes.append(helper.make_node(op, ins, outs, name=self.name(f"n_{op}_"), **attrs))
        for o, s in zip(outs, out_shapes):
            self.shapes[o] = tuple(s)
        return outs

    def ints(self, values) -> str:
        return self.const(np.array(list(values), np.int64))


def _rand_shape(rng: random.Random, rank: int | None = None) -> tuple[int, ...]:
    rank = rng.choice((1, 2, 2, 3, 3, 4, 4)) if rank is None else rank
    return tuple(rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)) for _ in range(rank))


def _broadcast_partner(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: some dims set to 1, maybe leading dims dropped."""
    s = [d if rng.random() < 0.7 else 1 for d in shape]
    drop = rng.randrange(len(s) + 1) if rng.random() < 0.3 else 0
    return tuple(s[drop:])


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(a, b))


UNARY = ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Erf", "Floor", "Ceil", "Softplus", "Sin", "Cos")


def _unary(b: _Builder, x: str) -> str:
    op = b.rng.choice(UNARY + ("LeakyRelu", "Elu", "HardSigmoid", "Clip", "SqrtAbs"))
    s = b.shapes[x]
    if op == "Exp":  # keep magnitudes sane: exp of a tanh
        x = b.node("Tanh", [x], [s])[0]
    if op == "SqrtAbs":
        return b.node("Sqrt", [b.node("Abs", [x], [s])[0]], [s])[0]
    if op == "LeakyRelu":
        return b.node(op, [x], [s], alpha=b.rng.choice((0.01, 0.2)))[0]
    if op == "Elu":
        return b.node(op, [x], [s], alpha=b.rng.choice((1.0, 0.5)))[0]
    if op == "HardSigmoid":
        return b.node(op, [x], [s], alpha=0.2, beta=0.5)[0]
    if op == "Clip":
        lo, hi = sorted((b.rng.uniform(-2, 0), b.rng.uniform(0, 2)))
        return b.node(op, [x, b.const(np.array(lo, np.float32)), b.const(np.array(hi, np.float32))], [s])[0]
    return b.node(op, [x], [s])[0]


def _partner(b: _Builder, x: str) -> tuple[str, tuple[int, ...]]:
    """A second operand for a binary op (name, shape): an existing compatible tensor, a new input, or a constant."""
    s = b.shapes[x]
    same = [t for t, ts in b.shapes.items() if t != x and _compatible(ts, s)]
    r = b.rng.random()
    if same and r < 0.4:
        y = b.rng.choice(same)
        return y, b.shapes[y]
    ps = _broadcast_partner(b.rng, s)
    if r < 0.6 and len(b.inputs) < 3:
        return b.input(ps), ps
    if b.rng.random() < 0.2:
        return b.const(np.array(b.rng.uniform(-2, 2), np.float32)), ()  # a scalar
    return b.weight(ps), ps


def _compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(a, b) == tuple(b)
    except ValueError:
        return False


def _binary(b: _Builder, x: str) -> str:
    op = b.rng.choice(("Add", "Sub", "Mul", "Div", "Max", "Min", "Where", "Pow"))
    if op == "Pow":  # |x| ** a constant
        sx = b.shapes[x]
        base = b.node("Abs", [x], [sx])[0]
        return b.node("Pow", [base, b.const(np.array(b.rng.choice((2.0, 3.0, 0.5)), np.float32))], [sx])[0]
    y, sy = _partner(b, x)
    sx = b.shapes[x]
    s = _broadcast(sx, sy)
    if b.rng.random() < 0.5:
        x, y, sx, sy = y, x, sy, sx
    if op == "Div":  # y / (|x| + 1): no division by (near) zero
        den = b.node("Add", [b.node("Abs", [y], [sy])[0], b.const(np.array(1.0, np.float32))], [sy])[0]
        return b.node("Div", [x, den], [s])[0]
    if op == "Where":
        cond = b.node("Greater", [x, y], [s])[0]
        del b.shapes[cond]  # bool: not an operand for the float ops
        return b.node("Where", [cond, x, y], [s])[0]
    return b.node(op, [x, y], [s])[0]


def _matmul(b: _Builder, x: str) -> str:
    s = b.shapes[x]
    if len(s) == 1:
        s = s + (1,)
        x = b.node("Unsqueeze", [x, b.ints([1])], [s])[0]
    n = b.rng.choice((1, 3, 8, 16, 17))
    if len(s) == 2 and b.rng.random() < 0.5:
        trans_b = b.rng.random() < 0.5
        w = b.weight((n, s[1]) if trans_b else (s[1], n), 0.3)
        ins = [x, w] + ([b.weight((n,))] if b.rng.random() < 0.7 else [])
        return b.node("Gemm", ins, [(s[0], n)], transB=int(trans_b), alpha=b.rng.choice((1.0, 0.5)))[0]
    w = b.weight((s[-1], n), 0.3)
    return b.node("MatMul", [x, w], [s[:-1] + (n,)])[0]


def _to4d(b: _Builder, x: str) -> str:
    s = b.shapes[x]
    if len(s) == 4:
        return x
    total = int(np.prod(s))
    shape = (1, 1, 1, total) if total < 4 else (1, 1, 2, total // 2) if total % 2 == 0 else (1, 1, 1, total)
    return b.node("Reshape", [x, b.ints(shape)], [shape])[0]


def _conv(b: _Builder, x: str) -> str:
    x = _to4d(b, x)
    n, c, h, w = b.shapes[x]
    k = b.rng.choice((1, 3)) if min(h, w) >= 3 else 1
    stride = b.rng.choice((1, 1, 2))
    pad = b.rng.choice((0, k // 2))
    dil = 1 if k == 1 or min(h, w) < 5 or b.rng.random() < 0.8 else 2
    groups = b.rng.choice([g for g in (1, 1, c) if c % g == 0])
    co = groups * b.rng.choice((1, 2, 4)) if groups > 1 else b.rng.choice((1, 4, 8, 16))
    ek = dil * (k - 1) + 1
    oh, ow = (h + 2 * pad - ek) // stride + 1, (w + 2 * pad - ek) // stride + 1
    wt = b.weight((co, c // groups, k, k), 0.3)
    ins = [x, wt] + ([b.weight((co,))] if b.rng.random() < 0.7 else [])
    return b.node("Conv", ins, [(n, co, oh, ow)], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4,
                  dilations=[dil] * 2, group=groups)[0]


def _pool(b: _Builder, x: str) -> str:
    x = _to4d(b, x)
    n, c, h, w = b.shapes[x]
    op = b.rng.choice(("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"))
    if op.startswith("Global") or min(h, w) < 2:
        return b.node("GlobalAveragePool" if op == "GlobalAveragePool" else "GlobalMaxPool", [x], [(n, c, 1, 1)])[0]
    k, stride = 2, b.rng.choice((1, 2))
    pad = b.rng.choice((0, 1)) if op == "MaxPool" else 0
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    return b.node(op, [x], [(n, c, oh, ow)], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4)[0]


def _reduce(b: _Builder, x: str) -> str:
    s = b.shapes[x]
    op = b.rng.choice(("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Softmax", "LogSoftmax"))
    axis = b.rng.randrange(len(s))
    if op in ("Softmax", "LogSoftmax"):
        return b.node(op, [x], [s], axis=axis - len(s) if b.rng.random() < 0.5 else axis)[0]
    axes = sorted(b.rng.sample(range(len(s)), b.rng.randint(1, len(s))))
    keep = b.rng.random() < 0.5
    out = tuple(1 if i in axes else d for i, d in enumerate(s)) if keep else tuple(d for i, d in enumerate(s) if i not in axes)
    if b.opset >= 18:
        return b.node(op, [x, b.ints(axes)], [out], keepdims=int(keep))[0]
    if op == "ReduceSum":  # axes became an input of ReduceSum at opset 13
        return b.node(op, [x, b.ints(axes)], [out], keepdims=int(keep))[0]
    return b.node(op, [x], [out], axes=axes, keepdims=int(keep))[0]


def _norm(b: _Builder, x: str) -> str:
    s = b.shapes[x]
    if len(s) == 4 and b.rng.random() < 0.5:
        c = s[1]
        ins = [x, b.weight((c,)), b.weight((c,)), b.weight((c,)),
               b.const(np.abs(b.np_rng().standard_normal(c)).astype(np.float32) + 0.5)]
        return b.node("BatchNormalization", ins, [s], epsilon=1e-5)[0]
    axis = -1 if b.rng.random() < 0.7 else -min(2, len(s))
    tail = s[axis:]
    ins = [x, b.weight(tail)] + ([b.weight(tail)] if b.rng.random() < 0.5 else [])
    return b.node("LayerNormalization", ins, [s], axis=axis, epsilon=1e-5)[0]


def _movement(b: _Builder, x: str) -> list[str]:
    s = b.shapes[x]
    op = b.rng.choice(("Transpose", "Reshape", "Concat", "Split", "Slice", "Gather", "Unsqueeze", "Squeeze", "Flatten"))
    r = len(s)
    if op == "Transpose":
        perm = list(range(r))
        b.rng.shuffle(perm)
        return b.node(op, [x], [tuple(s[p] for p in perm)], perm=perm)
    if op == "Reshape" or op == "Flatten":
        if op == "Flatten":
            ax = b.rng.randrange(r + 1)
            out = (int(np.prod(s[:ax])), int(np.prod(s[ax:])))
            return b.node(op, [x], [out], axis=ax)
        total = int(np.prod(s))
        divs = [d for d in range(1, total + 1) if total % d == 0]
        a = b.rng.choice(divs)
        out = (a, total // a) if b.rng.random() < 0.6 else (total,)
        spec = list(out)
        if len(spec) == 2 and b.rng.random() < 0.4:
            spec[1] = -1
        return b.node(op, [x, b.ints(spec)], [out])
    if op == "Concat":
        ax = b.rng.randrange(r)
        other_shape = tuple(d if i != ax else b.rng.randint(1, 5) for i, d in enumerate(s))
        y = b.input(other_shape) if len(b.inputs) < 3 and b.rng.random() < 0.5 else b.weight(other_shape)
        out = tuple(d + other_shape[i] if i == ax else d for i, d in enumerate(s))
        return b.node(op, [x, y] if b.rng.random() < 0.5 else [y, x], [out], axis=ax)
    if op == "Split":
        cands = [i for i, d in enumerate(s) if d >= 2]
        if not cands:
            return [_unary(b, x)]
        ax = b.rng.choice(cands)
        first = b.rng.randint(1, s[ax] - 1)
        sizes = [first, s[ax] - first]
        outs = [tuple(sz if i == ax else d for i, d in enumerate(s)) for sz in sizes]
        return b.node(op, [x, b.ints(sizes)], outs, axis=ax)
    if op == "Slice":
        ax = b.rng.randrange(r)
        d = s[ax]
        step = b.rng.choice((1, 1, 2, -1))
        if step > 0:
            start = b.rng.randrange(d)
            end = b.rng.randint(start + 1, d)
            n = len(range(start, end, step))
        else:
            start, end = d - 1, -d - 1  # the whole axis reversed
            n = d
        out = tuple(n if i == ax else v for i, v in enumerate(s))
        return b.node(op, [x, b.ints([start]), b.ints([end]), b.ints([ax]), b.ints([step])], [out])
    if op == "Gather":
        ax = b.rng.randrange(r)
        k = b.rng.randint(1, 4)
        idx = np.array([b.rng.randrange(-s[ax], s[ax]) for _ in range(k)], np.int64)
        if b.rng.random() < 0.3:
            idx = idx[:1].reshape(())
        out = s[:ax] + idx.shape + s[ax + 1:]
        return b.node(op, [x, b.const(idx)], [out], axis=ax)
    if op == "Unsqueeze":
        ax = b.rng.randrange(r + 1)
        return b.node(op, [x, b.ints([ax])], [s[:ax] + (1,) + s[ax:]])
    ones = [i for i, d in enumerate(s) if d == 1]
    if not ones or r == 1:
        return [_unary(b, x)]
    ax = b.rng.choice(ones)
    return b.node("Squeeze", [x, b.ints([ax])], [s[:ax] + s[ax + 1:]])


def _newer(b: _Builder, x: str) -> str:
    """Ops added for model coverage: activations, scans, sorting, triangular masks, einsum, transposed
    convolution, group/instance norm, resampling, element gathers."""
    s = b.shapes[x]
    r = len(s)
    op = b.rng.choice(("HardSwish", "Mish", "Selu", "Celu", "Softsign", "Trilu", "CumSum", "TopK", "ArgMax", "Einsum",
                       "ConvTranspose", "InstanceNormalization", "Resize", "GatherElements", "Mod"))
    if op == "Mish" and b.opset < 18:
        op = "HardSwish"
    if op in ("HardSwish", "Mish", "Selu", "Softsign"):
        return b.node(op, [x], [s])[0]
    if op == "Celu":
        return b.node(op, [x], [s], alpha=b.rng.choice((1.0, 0.5)))[0]
    if op == "Mod":  # fmod by a constant of the same shape, away from zero
        d = (np.abs(b.np_rng().standard_normal(s)) + 0.5).astype(np.float32)
        return b.node(op, [x, b.const(d)], [s], fmod=1)[0]
    if op == "Trilu" and r >= 2:
        k = b.rng.randint(-2, 2)
        return b.node(op, [x, b.const(np.array(k, np.int64))], [s], upper=b.rng.randint(0, 1))[0]
    if op == "CumSum":
        ax = b.rng.randrange(r)
        return b.node(op, [x, b.const(np.array(ax, np.int64))], [s], exclusive=b.rng.randint(0, 1),
                      reverse=b.rng.randint(0, 1))[0]
    if op == "TopK":
        ax = b.rng.randrange(r)
        k = b.rng.randint(1, s[ax])
        out = tuple(k if i == ax else d for i, d in enumerate(s))
        vals, idx = b.node(op, [x, b.ints([k])], [out, out], axis=ax, largest=b.rng.randint(0, 1))
        del b.shapes[idx]  # int64
        return vals
    if op == "ArgMax":
        ax = b.rng.randrange(r)
        out = tuple(1 if i == ax else d for i, d in enumerate(s))
        idx = b.node(op, [x], [out], axis=ax, keepdims=1)[0]
        del b.shapes[idx]  # int64
        return b.node("Cast", [idx], [out], to=TensorProto.FLOAT)[0]
    if op == "Einsum" and r >= 2:
        n = b.rng.choice((3, 8))
        w = b.weight((s[-1], n), 0.3)
        lead = "abcdef"[: r - 1]
        return b.node(op, [x, w], [s[:-1] + (n,)], equation=f"{lead}y,yz->{lead}z")[0]
    if op == "GatherElements":
        ax = b.rng.randrange(r)
        idx = np.asarray(b.np_rng().integers(-s[ax], s[ax], s), np.int64)
        return b.node(op, [x, b.const(idx)], [s], axis=ax)[0]
    x4 = _to4d(b, x)
    n, c, h, w = b.shapes[x4]
    if op == "ConvTranspose":
        k, stride = b.rng.choice((1, 2, 3)), b.rng.choice((1, 2))
        pad = b.rng.randint(0, (k - 1) // 2)  # keeps every output extent positive
        co = b.rng.choice((1, 4))
        oh, ow = (h - 1) * stride - 2 * pad + k, (w - 1) * stride - 2 * pad + k
        wt = b.weight((c, co, k, k), 0.3)
        return b.node(op, [x4, wt], [(n, co, oh, ow)], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4)[0]
    if op == "Resize":
        mode = b.rng.choice(("nearest", "linear"))
        scale = b.rng.choice((2.0, 0.5)) if min(h, w) >= 2 else 2.0
        out = (n, c, int(h * scale), int(w * scale))
        scales = b.const(np.array([1, 1, scale, scale], np.float32))
        return b.node(op, [x4, "", scales], [out], mode=mode)[0]
    return b.node("InstanceNormalization", [x4, b.weight((c,)), b.weight((c,))], [(n, c, h, w)], epsilon=1e-5)[0]


_FAMILIES = ((_unary, 3), (_binary, 4), (_matmul, 2), (_conv, 1), (_pool, 1), (_reduce, 2), (_norm, 1), (_movement, 3),
             (_newer, 2))


def random_model(seed: int, min_ops: int = 2, max_ops: int = 12) -> onnx.ModelProto:
    """A valid ONNX model with ``min_ops``..``max_ops`` generator steps (a step may add 1 to 3 nodes)."""
    rng = random.Random(seed)
    b = _Builder(rng, rng.choice(OPSETS))
    b.input(_rand_shape(rng))
    families, weights = zip(*_FAMILIES)
    produced: list[str] = []
    for _ in range(rng.randint(min_ops, max_ops)):
        # mostly continue from a recent result, sometimes from anything available
        pool = [t for t in produced[-3:] if t in b.shapes] if produced and rng.random() < 0.8 else []
        pool = pool or list(b.shapes)
        x = rng.choice(pool)
        if int(np.prod(b.shapes[x])) > 4096:  # keep tensors small: reduce first
            x = _reduce(b, x)
        if not b.shapes[x]:  # rank 0: most ops want an axis
            x = b.node("Unsqueeze", [x, b.ints([0])], [(1,)])[0]
        fam = rng.choices(families, weights)[0]
        out = fam(b, x)
        produced.extend(out if isinstance(out, list) else [out])
    outputs = [produced[-1]] + [t for t in rng.sample(produced[:-1], min(len(produced) - 1, rng.randint(0, 2)))]
    graph = helper.make_graph(
        b.nodes, f"fuzz{seed}", b.inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(b.shapes[o])) for o in outputs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)], producer_name="superopt-fuzz")
    model.ir_version = 8
    return model


__all__ = ["random_model", "OPSETS"]
