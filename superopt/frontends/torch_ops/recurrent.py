"""Recurrent layers (``torch.lstm``, ``torch.gru``: what ``nn.LSTM``/``nn.GRU`` call), unrolled over the
sequence, which is static once shapes are known: one input projection for all steps, then per step a
hidden projection and the gate arithmetic, all built-in ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, T, aten, function

Cell = Callable[[Ctx, T, T, Any, T, T | None], tuple[T, Any]]  # (cx, x_proj_t, h, state, w_hh, b_hh) -> (h, state)


def _lstm_cell(cx: Ctx, xp: T, h: T, c: T, w_hh: T, b_hh: T | None) -> tuple[T, T]:
    b = cx.b
    gates = T(ops.add(b, xp, ops.linear(b, h, w_hh, b_hh)))
    i, f, g, o = ops.split(b, gates, -1, [cx.shape(gates)[-1] // 4] * 4)
    c = T(ops.add(b, ops.mul(b, ops.sigmoid(b, f), c), ops.mul(b, ops.sigmoid(b, i), ops.tanh(b, g))))
    return T(ops.mul(b, ops.sigmoid(b, o), ops.tanh(b, c))), c


def _gru_cell(cx: Ctx, xp: T, h: T, state: Any, w_hh: T, b_hh: T | None) -> tuple[T, Any]:
    b = cx.b
    hp = T(ops.linear(b, h, w_hh, b_hh))
    n3 = [cx.shape(xp)[-1] // 3] * 3
    xr, xz, xn = ops.split(b, xp, -1, n3)
    hr, hz, hn = ops.split(b, hp, -1, n3)
    r = ops.sigmoid(b, ops.add(b, xr, hr))
    z = ops.sigmoid(b, ops.add(b, xz, hz))
    n = ops.tanh(b, ops.add(b, xn, ops.mul(b, r, hn)))
    return T(ops.add(b, n, ops.mul(b, z, ops.sub(b, h, n)))), None  # (1 - z) * n + z * h


def _stack(cx: Ctx, ts: Sequence[T]) -> T:
    """(n, ...) from n tensors of shape (...)."""
    rows = [cx.reshape(t, (1, *cx.shape(t))) for t in ts]
    return rows[0] if len(rows) == 1 else T(ops.concat(cx.b, rows, 0))


def _run_rnn(cx: Ctx, cell: Cell, x: T, h0: T, c0: T | None, params: Sequence[T], has_biases: bool, num_layers: int,
             bidirectional: bool, batch_first: bool) -> tuple[T, T, T | None]:
    b = cx.b
    unbatched = cx.rank(x) == 2
    if unbatched:  # (T, I) and (L*D, H)
        x = cx.reshape(x, (cx.shape(x)[0], 1, cx.shape(x)[1]))
        h0 = cx.reshape(h0, (cx.shape(h0)[0], 1, cx.shape(h0)[1]))
        c0 = cx.reshape(c0, (cx.shape(c0)[0], 1, cx.shape(c0)[1])) if c0 is not None else None
    elif batch_first:
        x = cx.swap(x, 0, 1)  # (T, N, I)
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != num_layers * dirs * per:
        raise cx.fail(f"{len(params)} recurrent weights for {num_layers} layer(s) x {dirs} direction(s) "
                      "(projections, proj_size, are not supported)")
    steps = cx.shape(x)[0]
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = (layer * dirs + d) * per
            w_ih, w_hh = params[k], params[k + 1]
            b_ih, b_hh = (params[k + 2], params[k + 3]) if has_biases else (None, None)
            xp = T(ops.linear(b, x, w_ih, b_ih))  # every step's input projection at once: (T, N, G)
            h = cx.slice_axis(h0, 0, layer * dirs + d, layer * dirs + d + 1)
            h = cx.reshape(h, cx.shape(h)[1:])
            c = None
            if c0 is not None:
                c = cx.reshape(cx.slice_axis(c0, 0, layer * dirs + d, layer * dirs + d + 1), cx.shape(h))
            seq: list[T] = [T("")] * steps
            for t in (range(steps) if d == 0 else reversed(range(steps))):
                xt = cx.reshape(cx.slice_axis(xp, 0, t, t + 1), cx.shape(xp)[1:])
                h, c = cell(cx, xt, h, c, w_hh, b_hh)
                seq[t] = h
            hs.append(h)
            cs.append(c)
            outs.append(_stack(cx, seq))
        x = outs[0] if dirs == 1 else T(ops.concat(b, outs, 2))
    h_n = _stack(cx, hs)
    c_n = _stack(cx, cs) if c0 is not None else None
    if unbatched:
        x = cx.reshape(x, (cx.shape(x)[0], cx.shape(x)[2]))
        h_n = cx.reshape(h_n, (cx.shape(h_n)[0], cx.shape(h_n)[2]))
        c_n = cx.reshape(c_n, (cx.shape(c_n)[0], cx.shape(c_n)[2])) if c_n is not None else None
    elif batch_first:
        x = cx.swap(x, 0, 1)
    return x, h_n, c_n


def _check(cx: Ctx, dropout: float, train: bool) -> None:
    if train and dropout > 0:
        raise cx.fail("recurrent dropout in training mode is not supported (call model.eval())")


@function(torch.lstm)
def _lstm(cx: Ctx, x: T, hx: Sequence[T], params: Sequence[T], has_biases: bool, num_layers: int, dropout: float,
          train: bool, bidirectional: bool, batch_first: bool) -> tuple[T, T, T]:
    if not isinstance(has_biases, bool):
        raise cx.fail("the packed-sequence form of torch.lstm is not supported")
    _check(cx, dropout, train)
    h0, c0 = hx
    out, h_n, c_n = _run_rnn(cx, _lstm_cell, x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first)
    return out, h_n, c_n


@function(torch.gru)
def _gru(cx: Ctx, x: T, hx: T, params: Sequence[T], has_biases: bool, num_layers: int, dropout: float, train: bool,
         bidirectional: bool, batch_first: bool) -> tuple[T, T]:
    if not isinstance(has_biases, bool):
        raise cx.fail("the packed-sequence form of torch.gru is not supported")
    _check(cx, dropout, train)
    out, h_n, _ = _run_rnn(cx, _gru_cell, x, hx, None, params, has_biases, num_layers, bidirectional, batch_first)
    return out, h_n


aten("lstm.input")(_lstm)
aten("gru.input")(_gru)
