"""The register-tiled schedule of a conv on blocked (NCHWc) tensors, as the layout pass writes it.

``P[n,cob,y,x,co_l] += X_c[n,cib,y+kh,x+kw,ci_l] * W_c[cob,cib,kh,kw,ci_l,co_l]``: the output-channel
lanes ``co_l`` (one or two vectors) are the vector loop, a run of ``rows`` output columns ``x`` the
register tile's rows; the image is read as one broadcast scalar per row and reduction step, the
pre-blocked weight as contiguous vectors (no packing: ``W_c`` is already laid out panel by panel).
The tile's rows come from the register file: ``rows * vectors + 1 <= vector_registers`` (the weight
vector is an FMA memory operand), so 7 rows of 2 vectors with AVX2's 16 registers, where the NCHW
heuristic's 8 x 2 spills. Knobs ``<stage>.panel_outer`` and ``<stage>.par`` keep the schedule searchable
(``<stage>.rows`` is recorded with the one value the register budget gives).
"""

from __future__ import annotations

import math

from superopt.ir.expr import Access, Binary
from superopt.ir.statement import Statement
from superopt.runtime.target import Target
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.primitives import CacheWrite, Fuse, Parallel, Primitive, Reorder, Split, Unroll, Vectorize

LANE_BLOCKS = (8, 16)


def _operands(st: Statement) -> tuple[Access, Access] | None:
    e = st.expr
    if isinstance(e, Binary) and e.op == "*" and isinstance(e.a, Access) and isinstance(e.b, Access):
        return e.a, e.b
    return None


def _row_block(n: int, most: int) -> int:
    """Rows per tile: the largest of most..2 that wastes fewest padded rows."""
    if n <= most:
        return n
    return min(range(most, 1, -1), key=lambda r: (math.ceil(n / r) * r - n, -r))


def blocked_conv_schedule(st: Statement, target: Target, consts: frozenset[str] | None,
                          knobs: KnobRecorder | None = None) -> list[Primitive] | None:
    """The schedule of a blocked conv statement, or None when ``st`` is not one (the caller falls back)."""
    kn = knobs or KnobRecorder()
    ops = _operands(st)
    if st.reduce != "+=" or ops is None or len(st.out_dims) != 5 or not st.reduce_dims:
        return None
    lane = st.out_dims[-1]
    ext = st.extent
    if ext[lane] not in LANE_BLOCKS:
        return None
    ws = [a for a in ops if a.index[-1].is_plain_dim and a.index[-1].dims[0] == lane]
    if len(ws) != 1 or (consts is not None and ws[0].tensor not in consts):
        return None
    w = ws[0]
    x = next(a for a in ops if a is not w)
    if any(lane in ix.dims for ix in x.index) or not all(ix.is_plain_dim for ix in w.index):
        return None
    n, cob, y, col = st.out_dims[:4]
    if any(d in ix.dims for ix in w.index for d in (n, y, col)):
        return None
    s = st.out
    lanes = target.lanes("float32")
    vectors = math.ceil(ext[lane] / lanes)
    most = max(2, min(12, (target.vector_registers - 1) // vectors))
    # the rows are set by the register budget, not searched: the learned cost model, trained on NCHW
    # kernels, picked 4 (and 8, 9: spilling) rows for blocked convs, 1.6x slower than the budget's 7
    rows = kn.get(f"{s}.rows", _row_block(ext[col], most), (_row_block(ext[col], most),))
    # the reduction: the activation's channel lanes innermost (a broadcast each), window and blocks outside
    red = list(st.reduce_dims)
    inner_red = [d for d in red if x.index[-1].is_plain_dim and x.index[-1].dims[0] == d]
    red = [d for d in red if d not in inner_red] + inner_red
    prims: list[Primitive] = []
    if ext[col] > rows:
        prims.append(Split(s, col, rows))
        col_o, col_i = f"{col}_o", f"{col}_i"
    else:
        col_o, col_i = None, col
    # weight panels outermost when the weights outweigh the image (deep layers): each panel then stays
    # in cache while the image streams past
    w_bytes = math.prod(ext[d] for ix in w.index for d in ix.dims)
    x_bytes = math.prod(ext[d] for d in {d for ix in x.index for d in ix.dims})
    panel_outer = kn.get(f"{s}.panel_outer", w_bytes >= x_bytes, (False, True))
    spatial = [n, y] + ([col_o] if col_o else [])
    outer = [cob] + spatial if panel_outer else spatial[:2] + [cob] + spatial[2:]
    prims.append(Reorder(s, tuple(outer + red + [col_i, lane])))
    prims.append(CacheWrite(s, red[0]))
    prims.append(Unroll(s, col_i))
    prims.append(Vectorize(s, lane))
    extents = {d: ext[d] for d in (n, cob, y)}
    if col_o:
        extents[col_o] = math.ceil(ext[col] / rows)
    tailed = col_o if col_o and ext[col] % rows else None
    chain = [outer[0]]
    for lp in outer[1:]:
        if lp == tailed or chain[-1] == tailed:
            break
        chain.append(lp)
    par = kn.get(f"{s}.par", 4, (1, 2, 4, 8, 16, 64))
    name, size = chain[0], extents[chain[0]]
    divided = False  # a fuse of two loops of extent > 1 cannot be fused again
    for nxt in chain[1:]:
        if size >= par * target.threads or divided and extents[nxt] > 1:
            break
        prims.append(Fuse(s, name, nxt))
        divided = divided or (size > 1 and extents[nxt] > 1)
        name, size = f"{name}_{nxt}", size * extents[nxt]
    prims.append(Parallel(s, name))
    return prims
