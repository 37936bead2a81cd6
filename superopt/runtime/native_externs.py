"""C implementations of the common extern ops, specialized to one node's shapes and attributes.

The numpy implementations in :mod:`superopt.ir.externs` are the reference; each of them costs 5-100 us of
numpy dispatch on the small tensors of real models (a 192-element TopK: 70 us), more than the compiled
kernels around it. :func:`native_extern` prints a C function for a node (shapes, strides and sampling tables
baked in) with the kernels' calling convention, ``void name(void **args)``: the node's inputs, then its
outputs, then an ``int *status``. The executor runs it inside a chain of kernels (runtime/chain.py).

A native extern never reads or writes out of bounds: an index out of range sets ``*status`` to 1 and
returns; the executor then reruns the graph through the numpy path, which raises the reference's error.
Kinds and cases not covered here (and any dtype other than those listed) return None: the node stays a
numpy extern.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from superopt.ir.graph import Graph, Node
from superopt.ir.types import DTYPES

TOPK_MAX_K = 64  # above this the O(n k) insertion selection loses to numpy's sort
_FLOATS = ("float32", "float64")
_INDEX = ("int64", "int32")


@dataclass(frozen=True)
class NativeExtern:
    name: str  # the C function
    code: str


def _c_array(name: str, ctype: str, values: Sequence[float | int]) -> str:
    body = ", ".join(repr(float(v)) if ctype == "double" else str(int(v)) for v in values) or "0"
    return f"static const {ctype} {name}[{max(len(values), 1)}] = {{{body}}};"


def _split(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    """(outer, extent, inner) of ``shape`` around ``axis``."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _gather(node: Node, graph: Graph, fn: str) -> str | None:
    data, idx = (graph.type_of[t] for t in node.inputs)
    if idx.dtype not in _INDEX:
        return None
    outer, n, inner = _split(data.shape, node.op.attr["axis"])
    m, size = math.prod(idx.shape), np.dtype(DTYPES[data.dtype][0]).itemsize
    it = DTYPES[idx.dtype][1]
    return f"""void {fn}(void **args) {{
    const char *data = (const char *)args[0]; const {it} *idx = (const {it} *)args[1];
    char *out = (char *)args[2]; int *status = (int *)args[3];
    for (long j = 0; j < {m}; ++j) {{
        long i = idx[j] < 0 ? idx[j] + {n} : idx[j];
        if (i < 0 || i >= {n}) {{ *status = 1; return; }}
    }}
    for (long o = 0; o < {outer}; ++o)
        for (long j = 0; j < {m}; ++j) {{
            long i = idx[j] < 0 ? idx[j] + {n} : idx[j];
            memcpy(out + (o * {m} + j) * {inner * size}L, data + (o * {n} + i) * {inner * size}L, {inner * size});
        }}
}}
"""


def _gather_elements(node: Node, graph: Graph, fn: str) -> str | None:
    data, idx = (graph.type_of[t] for t in node.inputs)
    if idx.dtype not in _INDEX or data.rank == 0:
        return None
    axis, rank = node.op.attr["axis"], data.rank
    n, size = data.shape[axis], np.dtype(DTYPES[data.dtype][0]).itemsize
    dstride = [math.prod(data.shape[k + 1:]) for k in range(rank)]
    it = DTYPES[idx.dtype][1]
    loops, pos = [], []
    for k in range(rank):
        loops.append("    " * (k + 1) + f"for (long i{k} = 0; i{k} < {idx.shape[k]}; ++i{k})")
        if k != axis:
            pos.append(f"i{k} * {dstride[k]}L")
    pos.append(f"a * {dstride[axis]}L")
    ind = "    " * (rank + 1)
    return f"""void {fn}(void **args) {{
    const char *data = (const char *)args[0]; const {it} *idx = (const {it} *)args[1];
    char *out = (char *)args[2]; int *status = (int *)args[3];
    long j = 0;
{chr(10).join(loops)} {{
{ind}long a = idx[j] < 0 ? idx[j] + {n} : idx[j];
{ind}if (a < 0 || a >= {n}) {{ *status = 1; return; }}
{ind}memcpy(out + j * {size}, data + ({' + '.join(pos)}) * {size}, {size});
{ind}++j;
{ind[:-4]}}}
}}
"""


def _arg_reduce(node: Node, graph: Graph, fn: str) -> str | None:
    x = graph.type_of[node.inputs[0]]
    a = node.op.attr
    if x.dtype not in (*_FLOATS, *_INDEX) or x.rank == 0:
        return None
    outer, n, inner = _split(x.shape, a["axis"])
    ct, isf = DTYPES[x.dtype][1], x.dtype in _FLOATS
    better = ">" if a["fn"] == "max" else "<"
    # np.argmax / np.argmin: the first NaN wins; select_last_index scans from the end (the last one wins)
    nan = "if (v != v) { best = j; break; }" if isf else ""
    js = f"for (long j = {n - 1}; j >= 0; --j)" if a["select_last_index"] else f"for (long j = 0; j < {n}; ++j)"
    start = n - 1 if a["select_last_index"] else 0
    return f"""void {fn}(void **args) {{
    const {ct} *x = (const {ct} *)args[0]; int64_t *out = (int64_t *)args[1];
    for (long o = 0; o < {outer}; ++o)
        for (long i = 0; i < {inner}; ++i) {{
            const {ct} *row = x + o * {n * inner}L + i;
            long best = {start}; {ct} bv = row[{start} * {inner}L];
            {'if (bv != bv) { out[o * ' + str(inner) + 'L + i] = best; continue; }' if isf else ''}
            {js} {{
                {ct} v = row[j * {inner}L];
                {nan}
                if (v {better} bv) {{ bv = v; best = j; }}
            }}
            out[o * {inner}L + i] = best;
        }}
}}
"""


def _topk(node: Node, graph: Graph, fn: str) -> str | None:
    x = graph.type_of[node.inputs[0]]
    a = node.op.attr
    k = a["k"]
    if x.dtype not in (*_FLOATS, *_INDEX) or x.rank == 0 or not 0 < k <= TOPK_MAX_K:
        return None
    outer, n, inner = _split(x.shape, a["axis"])
    ct = DTYPES[x.dtype][1]
    # v strictly better than w (the candidate comes later, so ties keep the earlier one): NaN is larger than
    # every number (first for largest, last for smallest), as in numpy's sort and ONNX TopK
    if x.dtype in _FLOATS:
        better = "(v != v ? w == w : v > w)" if a["largest"] else "(v == v && (w != w || v < w))"
    else:
        better = "(v > w)" if a["largest"] else "(v < w)"
    return f"""void {fn}(void **args) {{
    const {ct} *x = (const {ct} *)args[0]; {ct} *vals = ({ct} *)args[1]; int64_t *idx = (int64_t *)args[2];
    {ct} bv[{k}]; long bi[{k}];
    for (long o = 0; o < {outer}; ++o)
        for (long i = 0; i < {inner}; ++i) {{
            const {ct} *row = x + o * {n * inner}L + i;
            int cnt = 0;
            for (long j = 0; j < {n}; ++j) {{
                {ct} v = row[j * {inner}L];
                if (cnt == {k}) {{ {ct} w = bv[{k - 1}]; if (!{better}) continue; }}
                int p = cnt < {k} ? cnt : {k - 1};
                while (p > 0) {{ {ct} w = bv[p - 1]; if (!{better}) break; bv[p] = bv[p - 1]; bi[p] = bi[p - 1]; --p; }}
                bv[p] = v; bi[p] = j;
                if (cnt < {k}) ++cnt;
            }}
            for (int r = 0; r < {k}; ++r) {{
                vals[(o * {k} + r) * {inner}L + i] = bv[r]; idx[(o * {k} + r) * {inner}L + i] = bi[r];
            }}
        }}
}}
"""


def _resize_tables(shape: Sequence[int], attrs: dict[str, Any]) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
    """Per resized axis: (axis, taps (out, T) int, weights (out, T) float64, outside mask or None), the
    reference's own sampling tables (superopt.ir.externs.resize)."""
    from superopt.ir.externs import resize as rs

    rank, out = len(shape), []
    for axis in range(rank):
        in_len = shape[axis]
        if rs.is_identity_axis(attrs, axis, in_len, rank):
            continue
        out_len = attrs["sizes"][axis]
        scale = rs.axis_scale(attrs, axis, in_len)
        x, outside = rs.source_coordinates(in_len, out_len, scale, attrs["coordinate_transformation_mode"],
                                           rs.axis_roi(attrs, axis, rank))
        if attrs["mode"] == "nearest":
            taps = rs.nearest_indices(x, in_len, attrs["nearest_mode"])[:, None]
            weights = np.ones(taps.shape)
        else:
            taps, weights = rs.interpolation_taps(x, in_len, attrs["mode"], attrs["cubic_coeff_a"],
                                                  attrs["exclude_outside"], scale, attrs.get("antialias", False))
        out.append((axis, np.asarray(taps, np.int64), np.asarray(weights, np.float64),
                    None if outside is None or not outside.any() else np.asarray(outside)))
    return out


def _resize(node: Node, graph: Graph, fn: str) -> str | None:
    x, y = graph.type_of[node.inputs[0]], graph.type_of[node.outputs[0]]
    attrs = node.op.attr
    if x.dtype not in _FLOATS or x.rank == 0 or 0 in x.shape or 0 in y.shape:
        return None
    tables = _resize_tables(x.shape, attrs)
    ct = DTYPES[x.dtype][1]
    cur = list(x.shape)
    decls, passes = [], []
    cap = math.prod(x.shape)
    for axis, taps, _, _ in tables:  # the largest intermediate along the passes
        cur[axis] = taps.shape[0]
        cap = max(cap, math.prod(cur))
    cur = list(x.shape)
    e = float(attrs.get("extrapolation_value", 0.0))
    extrap = repr(e) if math.isfinite(e) else "NAN" if math.isnan(e) else "INFINITY" if e > 0 else "-INFINITY"
    for p, (axis, taps, weights, outside) in enumerate(tables):
        outer, n_in, inner = _split(cur, axis)
        n_out, t = taps.shape
        decls += [_c_array(f"{fn}_tap{p}", "long", taps.ravel()), _c_array(f"{fn}_w{p}", "double", weights.ravel())]
        if outside is not None:
            decls.append(_c_array(f"{fn}_out{p}", "long", outside.astype(np.int64)))
        src = "in" if p == 0 else f"buf{(p + 1) % 2}"
        load = "(double)in" if p == 0 else src
        dst = f"buf{p % 2}"
        ext = f"if ({fn}_out{p}[yo]) {{ s = {extrap}; }}" if outside is not None else ""
        passes.append(f"""    for (long o = 0; o < {outer}; ++o)
        for (long yo = 0; yo < {n_out}; ++yo)
            for (long i = 0; i < {inner}; ++i) {{
                double s = 0.0;
                for (int q = 0; q < {t}; ++q)
                    s += {fn}_w{p}[yo * {t} + q] * {load}[(o * {n_in} + {fn}_tap{p}[yo * {t} + q]) * {inner}L + i];
                {ext}
                {dst}[(o * {n_out} + yo) * {inner}L + i] = s;
            }}""")
        cur[axis] = n_out
    if not tables:
        copy = f"    for (long e = 0; e < {math.prod(x.shape)}; ++e) out[e] = in[e];"
        last = None
    else:
        last = f"buf{(len(tables) - 1) % 2}"
        copy = f"    for (long e = 0; e < {math.prod(y.shape)}; ++e) out[e] = ({ct}){last}[e];"
    second = "buf0" if len(tables) == 1 else f"(double *)malloc({cap} * sizeof(double))"
    bufs = "" if not tables else (f"    double *buf0 = (double *)malloc({cap} * sizeof(double));\n"
                                  f"    double *buf1 = {second};\n"
                                  "    if (!buf0 || !buf1) { *status = 2; free(buf0); if (buf1 != buf0) free(buf1); return; }\n")
    free = "" if not tables else "    if (buf1 != buf0) free(buf1);\n    free(buf0);\n"
    return "\n".join(decls) + f"""
void {fn}(void **args) {{
    const {ct} *in = (const {ct} *)args[0]; {ct} *out = ({ct} *)args[1]; int *status = (int *)args[2];
    (void)status;
{bufs}{chr(10).join(passes)}
{copy}
{free}}}
"""


_EMITTERS = {"gather": _gather, "gather_elements": _gather_elements, "arg_reduce": _arg_reduce, "topk": _topk,
             "resize": _resize}


def native_extern(node: Node, graph: Graph) -> NativeExtern | None:
    """The C function for extern ``node``, or None when its kind or case has none."""
    emit = _EMITTERS.get(node.op.kind)
    if emit is None:
        return None
    key = repr((node.op.kind, sorted(node.op.attr.items(), key=lambda kv: kv[0]),
                [graph.type_of[t] for t in (*node.inputs, *node.outputs)]))
    fn = "so_x_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    code = emit(node, graph, fn)
    return None if code is None else NativeExtern(fn, code)
