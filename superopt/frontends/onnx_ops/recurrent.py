"""Recurrent layers: RNN, GRU and LSTM, unrolled over the (static) sequence length into ops.

Per direction, the input projection of every step is one matmul; each step then adds the recurrent
matmul and applies the gate activations elementwise. ``sequence_lens`` must be a compile-time constant:
a batch entry past its length keeps its state and outputs 0, as the spec says.
"""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import ewise, lit

_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _activation(name: str, alpha: float | None, beta: float | None) -> str:
    """An activation as an op-language template over ``{0}``."""
    n = name.lower()
    a = lambda d: lit(d if alpha is None else alpha)  # noqa: E731
    bb = lambda d: lit(d if beta is None else beta)  # noqa: E731
    table = {
        "tanh": "tanh({0})",
        "sigmoid": "sigmoid({0})",
        "relu": "relu({0})",
        "affine": f"{a(1.0)} * {{0}} + {bb(0.0)}",
        "leakyrelu": f"where({{0}} < 0.0, {a(0.01)} * {{0}}, {{0}})",
        "thresholdedrelu": f"where({{0}} > {a(1.0)}, {{0}}, 0.0)",
        "scaledtanh": f"{a(1.0)} * tanh({bb(1.0)} * {{0}})",
        "hardsigmoid": f"max(min({a(0.2)} * {{0}} + {bb(0.5)}, 1.0), 0.0)",
        "elu": f"where({{0}} < 0.0, {a(1.0)} * (exp({{0}}) - 1.0), {{0}})",
        "softsign": "({0} / (1.0 + abs({0})))",
        "softplus": "log(exp({0}) + 1.0)",
    }
    if n not in table:
        raise OnnxImportError(f"recurrent activation {name!r} is not supported")
    return table[n]


class _Layer:
    """What every step of one direction needs: weights, biases, activations, clip."""

    def __init__(self, c: _Ctx, x: list, d: int, hidden: int, acts: list[str]) -> None:
        b = c.b
        self.c, self.h = c, hidden
        g = _GATES[c.node.op_type]
        pick = lambda t: ops.reshape(b, ops.slice_(b, t, [d], [d + 1], [0]), b.shape(t)[1:])  # noqa: E731
        self.w_t = ops.transpose(b, pick(x[1]), [1, 0])  # (input, G*H)
        self.r_t = ops.transpose(b, pick(x[2]), [1, 0])  # (H, G*H)
        bias = x[3] if len(x) > 3 else None
        if bias is not None:
            bd = pick(bias)
            self.wb, self.rb = ops.slice_(b, bd, [0], [g * hidden], [0]), ops.slice_(b, bd, [g * hidden], [2 * g * hidden], [0])
        else:
            self.wb = self.rb = None
        self.acts = acts
        clip = c.attr("clip")
        self.clip = None if clip is None else float(clip)

    def gate(self, t: str, k: int) -> str:
        """Columns [k*H, (k+1)*H) of a (batch, G*H) tensor."""
        return ops.slice_(self.c.b, t, [k * self.h], [(k + 1) * self.h], [1])

    def clipped(self, expr: str) -> str:
        return expr if self.clip is None else f"min(max({expr}, {lit(-self.clip)}), {lit(self.clip)})"

    def apply(self, act: str, expr: str) -> str:
        return act.replace("{0}", f"({self.clipped(expr)})")


def _step_masks(c: _Ctx, x: list, seq: int, batch: int) -> np.ndarray | None:
    lens = x[4] if len(x) > 4 else None
    if lens is None:
        return None
    lv = np.asarray(c.ints(lens, f"{c.node.op_type} sequence_lens"))
    if lv.shape != (batch,):
        raise OnnxImportError(f"{c.node.op_type}: sequence_lens needs {batch} entries, got {lv.shape}")
    if (lv == seq).all():
        return None
    return np.arange(seq)[:, None] < lv[None, :]  # (seq, batch): step t is live for entry b


@_conv("RNN", "GRU", "LSTM")
def _recurrent(c: _Ctx, x):
    b, op = c.b, c.node.op_type
    xs = x[0]
    layout = int(c.attr("layout", 0))
    if layout:
        xs = ops.transpose(b, xs, [1, 0, 2])
    seq, batch, _ = b.shape(xs)
    hidden = int(c.attr("hidden_size"))
    direction = str(c.attr("direction", "forward"))
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if dirs is None:
        raise OnnxImportError(f"{op} direction {direction!r} is not supported")
    names = c.attr("activations")
    per_dir = len(_DEFAULT_ACTS[op])
    names = list(names) if names else _DEFAULT_ACTS[op] * len(dirs)
    alphas = list(c.attr("activation_alpha", []) or [])
    betas = list(c.attr("activation_beta", []) or [])
    acts = [_activation(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
            for i, n in enumerate(names)]
    if op == "LSTM" and c.attr("input_forget", 0):
        raise OnnxImportError("LSTM input_forget=1 is not supported")
    live = _step_masks(c, x, seq, batch)
    dt = b.type(xs).dtype
    ys, hs, cs = [], [], []
    for d, rev in enumerate(dirs):
        layer = _Layer(c, x, d, hidden, acts[d * per_dir : (d + 1) * per_dir])
        proj = ops.matmul(b, xs, layer.w_t)  # (seq, batch, G*H)
        if layer.wb is not None:
            proj = ops.add(b, proj, layer.wb)
        h = _initial(c, x, 5, d, batch, hidden, dt)
        cell = _initial(c, x, 6, d, batch, hidden, dt) if op == "LSTM" else None
        outs: list[str | None] = [None] * seq
        for t in (range(seq - 1, -1, -1) if rev else range(seq)):
            xt = ops.reshape(b, ops.slice_(b, proj, [t], [t + 1], [0]), [batch, -1])
            rec = ops.matmul(b, h, layer.r_t)
            if layer.rb is not None:
                rec = ops.add(b, rec, layer.rb)
            if op == "RNN":
                new_h, new_c = ewise(b, layer.apply(layer.acts[0], "{0} + {1}"), [xt, rec], "rnn_cell"), None
            elif op == "GRU":
                new_h, new_c = _gru_cell(c, layer, x, d, xt, rec, h), None
            else:
                new_h, new_c = _lstm_cell(c, layer, x, d, xt, rec, cell)
            if live is not None:  # entries past their length keep their state
                m = b.constant(live[t].reshape(batch, 1))
                new_h = ops.where(b, m, new_h, h)
                if new_c is not None:
                    new_c = ops.where(b, m, new_c, cell)
                outs[t] = ops.where(b, m, new_h, b.constant(np.zeros((1, 1), dt), dtype=dt))
            else:
                outs[t] = new_h
            h, cell = new_h, new_c
        ys.append(ops.concat(b, [ops.reshape(b, o, [1, 1, batch, hidden]) for o in outs], 0))
        hs.append(ops.reshape(b, h, [1, batch, hidden]))
        if cell is not None:
            cs.append(ops.reshape(b, cell, [1, batch, hidden]))
    y = ops.concat(b, ys, 1) if len(ys) > 1 else ys[0]  # (seq, dirs, batch, H)
    y_h = ops.concat(b, hs, 0) if len(hs) > 1 else hs[0]
    results = [y, y_h]
    if op == "LSTM":
        results.append(ops.concat(b, cs, 0) if len(cs) > 1 else cs[0])
    if layout:
        results = [ops.transpose(b, results[0], [2, 0, 1, 3])] + [ops.transpose(b, r, [1, 0, 2]) for r in results[1:]]
    return results


def _initial(c: _Ctx, x: list, k: int, d: int, batch: int, hidden: int, dt: str) -> str:
    t = x[k] if len(x) > k else None
    if t is None:
        return c.b.constant(np.zeros((batch, hidden), dt), dtype=dt)
    if int(c.attr("layout", 0)):
        t = ops.transpose(c.b, t, [1, 0, 2])
    return ops.reshape(c.b, ops.slice_(c.b, t, [d], [d + 1], [0]), [batch, hidden])


def _gru_cell(c: _Ctx, L: _Layer, x: list, d: int, xt: str, rec: str, h: str) -> str:
    b = c.b
    f, g = L.acts[0], L.acts[1]
    z = ewise(b, L.apply(f, "{0} + {1}"), [L.gate(xt, 0), L.gate(rec, 0)], "gru_z")
    r = ewise(b, L.apply(f, "{0} + {1}"), [L.gate(xt, 1), L.gate(rec, 1)], "gru_r")
    if c.attr("linear_before_reset", 0):
        cand = ewise(b, L.apply(g, "{0} + {1} * {2}"), [L.gate(xt, 2), r, L.gate(rec, 2)], "gru_h")
    else:  # (r * h) @ Rh + Rbh
        rh = ops.matmul(b, ops.mul(b, r, h), L.gate(L.r_t, 2))
        if L.rb is not None:
            rh = ops.add(b, rh, ops.slice_(b, L.rb, [2 * L.h], [3 * L.h], [0]))
        cand = ewise(b, L.apply(g, "{0} + {1}"), [L.gate(xt, 2), rh], "gru_h")
    return ewise(b, "(1.0 - {0}) * {1} + {0} * {2}", [z, cand, h], "gru_state")


def _lstm_cell(c: _Ctx, L: _Layer, x: list, d: int, xt: str, rec: str, cell: str) -> tuple[str, str]:
    b = c.b
    f, g, hact = L.acts
    pre = [ops.add(b, L.gate(xt, k), L.gate(rec, k)) for k in range(4)]  # gates i, o, f, c
    peep = x[7] if len(x) > 7 else None
    if peep is not None:
        pd = ops.reshape(b, ops.slice_(b, peep, [d], [d + 1], [0]), [3 * L.h])
        pi, po, pf = (ops.slice_(b, pd, [k * L.h], [(k + 1) * L.h], [0]) for k in range(3))
        i = ewise(b, L.apply(f, "{0} + {1} * {2}"), [pre[0], pi, cell], "lstm_i")
        fg = ewise(b, L.apply(f, "{0} + {1} * {2}"), [pre[2], pf, cell], "lstm_f")
    else:
        i = ewise(b, L.apply(f, "{0}"), [pre[0]], "lstm_i")
        fg = ewise(b, L.apply(f, "{0}"), [pre[2]], "lstm_f")
    new_c = ewise(b, "{0} * {1} + {2} * " + L.apply(g, "{3}"), [fg, cell, i, pre[3]], "lstm_c")
    if peep is not None:
        o = ewise(b, L.apply(f, "{0} + {1} * {2}"), [pre[1], po, new_c], "lstm_o")
    else:
        o = ewise(b, L.apply(f, "{0}"), [pre[1]], "lstm_o")
    new_h = ewise(b, "{0} * " + hact.replace("{0}", "{1}"), [o, new_c], "lstm_h")
    return new_h, new_c
