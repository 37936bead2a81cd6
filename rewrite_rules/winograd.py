"""Winograd convolution: a blocked 3x3 stride-1 conv as input transform, batched matmul, output transform.

F(m x m, 3x3) (Lavin & Gray, 2015): each m x m tile of output pixels is ``A^T [(G g G^T) . (B^T d B)] A``
for the (m+2) x (m+2) input patch ``d`` around it and the 3x3 kernel ``g``; summed over input channels, the
(m+2)^2 products ``.`` are independent matmuls (output channels x input channels x tiles). F(4x4) computes 36
products per 16 output pixels where the direct conv computes 144 (4x fewer multiplies), F(2x2) 16 per 4
(2.25x), plus two cheap transforms.

On blocked (NCHWc) tensors a conv node ``Xp = pad(X); P[n,cob,y,x,o] += Xp[n,cib,y+kh,x+kw,l] *
W[cob,cib,kh,kw,l,o]; epilogue(P)`` becomes three kernels, joined by reshape aliases:

- ``V[a,b,cib,n,ty,tx,l] = (B^T Xp[.., m*ty.., m*tx.., l] B)[a,b]`` (two separable passes, as ``where`` on
  the row: coefficients in the code, no matrix in memory; X read through the pad stage's index),
- ``M[ab,cob,0,t,o] += V[ab,cib,0,t,l] * U[ab,cob,cib,l,o]`` (``U = G W G^T``, transformed once, ahead of
  time: (m+2)^2/9 times the weights), a blocked conv with a batch of weights (``superopt.schedule.blocked_conv``),
- ``Y[n,cob,ty,p,tx,q,o] = epilogue((A^T M A)[p,q])``: the output tiles, row-major ``[m*ty+p, m*tx+q]``, so
  that a reshape alias gives the conv's own output. The transforms take the ``tile-transform`` sketch
  (``superopt.schedule.tile_transform``).

Where it pays: the matmuls read each transformed weight once per tile, so small images (few tiles) turn
the conv into a stream of the transformed weights: at 256 channels and 14x14 F(4x4) has 16 tiles for
9.4 MiB of transformed weights and loses to the direct conv, where F(2x2) (49 tiles, 4 MiB) still gains.
Hence the schemes' order (F(4x4) first) and the bound on tiles (``MIN_TILES``). Where the tile does not
divide the image, whole tiles are computed (at most ``MAX_PADDED`` times the pixels: 27 x 27 as 28 x 28 with
F(4x4), 13 x 13 as 14 x 14 with F(2x2)) and a copy cuts the image out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Binary, map_expr, substitute_dims
from superopt.ir.graph import DeferredConstant, Extern, Graph, Node
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType
from superopt.lang.parser import compile_op

FAMILY = "algorithm"
MIN_TILES = 32  # tiles per image (times the batch): each transformed weight is used once per tile


@dataclass(frozen=True)
class Scheme:
    """F(m x m, 3x3): ``tile`` output pixels a side from a ``tile + 2`` patch; rows of B^T, G and A^T."""

    tile: int
    bt: tuple[tuple[int, ...], ...]
    g: tuple[tuple[float, ...], ...]
    at: tuple[tuple[int, ...], ...]

    @property
    def patch(self) -> int:
        return self.tile + 2


F4 = Scheme(4, ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
                (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
            ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6),
             (1 / 24, 1 / 12, 1 / 6), (1 / 24, -1 / 12, 1 / 6), (0, 0, 1)),
            ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1)))
F2 = Scheme(2, ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
            ((1, 0, 0), (1 / 2, 1 / 2, 1 / 2), (1 / 2, -1 / 2, 1 / 2), (0, 0, 1)),
            ((1, 1, 1, 0), (0, 1, -1, -1)))
SCHEMES = (F4, F2)  # the first that fits an image: F(4x4) has 16/36 of F(2x2)'s multiplies per output pixel


MAX_PADDED = 1.2  # output pixels computed (whole tiles) per pixel kept, at most


def tiles(h: int, tile: int) -> int:
    return -(-h // tile)


def scheme_for(n: int, h: int, w: int) -> Scheme | None:
    """The scheme whose whole tiles compute at most ``MAX_PADDED`` times the image's pixels and number at least
    ``MIN_TILES``, larger tiles first (F(4x4) at 14 x 14 would compute 16 x 16: F(2x2) there)."""
    for sc in SCHEMES:
        th, tw = tiles(h, sc.tile), tiles(w, sc.tile)
        if th * tw * sc.tile ** 2 <= MAX_PADDED * h * w and n * th * tw >= MIN_TILES:
            return sc
    return None


def _combination(row: tuple[int, ...], taps: list[str]) -> str:
    terms = []
    for c, t in zip(row, taps):
        if c:
            terms.append(("+ " if c > 0 else "- ") + (t if abs(c) == 1 else f"{abs(c)}*{t}"))
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def select_rows(dim: str, matrix: tuple[tuple[int, ...], ...], taps: list[str]) -> str:
    """``sum_k matrix[dim, k] * taps[k]`` as nested ``where`` on ``dim`` (each row its own combination)."""
    text = f"({_combination(matrix[-1], taps)})"
    for r in range(len(matrix) - 2, -1, -1):
        text = f"where({dim} == {r}, {_combination(matrix[r], taps)}, {text})"
    return text


@dataclass(frozen=True)
class _Match:
    node: Node
    pad: Statement
    conv: Statement
    epilogue: tuple[Statement, ...]
    x: str  # graph tensor of the activation
    w: str  # graph constant of the blocked weights
    shape: tuple[int, ...]  # N, CB, H, W, L of the input
    cout_blocks: int
    scheme: Scheme


def _plain(ix: tuple[Affine, ...]) -> tuple[str, ...] | None:
    return tuple(a.dims[0] for a in ix) if all(a.is_plain_dim for a in ix) else None


def _match(graph: Graph, node: Node) -> _Match | None:
    """The conv node's parts when it is a blocked 3x3 stride-1 "same" conv on a constant weight, with only
    elementwise stages after it that read the chain at their own index, and a scheme fits its image."""
    if node.is_extern or len(node.op.outputs) != 1:
        return None
    sts = node.op.statements
    if len(sts) < 2:
        return None
    pad, conv, epi = sts[0], sts[1], sts[2:]
    local = dict(zip(node.op.inputs, node.inputs))
    # the pad stage: Xp[n,c,y,x,l] = X[f(n,c,y,x,l)], zero outside X (f: the offsets, a layout conversion)
    if pad.reduce != "=" or not isinstance(pad.expr, Access) or pad.expr.tensor not in local \
            or dict(pad.padding) != {pad.expr.tensor: 0.0} or len(pad.out_dims) != 5:
        return None
    n, cb, hp, wp, lanes = (pad.extent[d] for d in pad.out_dims)
    h, w_ = hp - 2, wp - 2
    # the conv: P[n,cob,y,x,o] += Xp[n,cib,kh+y,kw+x,l] * W[cob,cib,kh,kw,l,o]
    e = conv.expr
    if conv.reduce != "+=" or conv.padding or not (isinstance(e, Binary) and e.op == "*"
                                                   and isinstance(e.a, Access) and isinstance(e.b, Access)):
        return None
    xa, wa = (e.a, e.b) if e.a.tensor == pad.out else (e.b, e.a)
    if xa.tensor != pad.out or wa.tensor not in local or local[wa.tensor] not in graph.constant:
        return None
    if len(conv.out_dims) != 5 or len(conv.reduce_dims) != 4:
        return None
    on, cob, y, x, o = conv.out_dims
    wd = _plain(wa.index)
    if wd is None or len(wd) != 6 or wd[0] != cob or wd[5] != o:
        return None
    cib, kh, kw, ln = wd[1:5]
    ext = conv.extent
    if (ext[kh], ext[kw]) != (3, 3) or ext[ln] != lanes or ext[o] != lanes or ext[cib] != cb:
        return None
    want_x = (Affine.dim(on), Affine.dim(cib), Affine.of({kh: 1, y: 1}), Affine.of({kw: 1, x: 1}), Affine.dim(ln))
    if xa.index != want_x or (ext[on], ext[y], ext[x]) != (n, h, w_):
        return None
    scheme = scheme_for(n, h, w_)
    if scheme is None:
        return None
    chain = {conv.out}
    for st in epi:
        if st.reduce != "=" or len(st.out_dims) != 5 or tuple(st.extent[d] for d in st.out_dims) != (n, ext[cob], h, w_, lanes):
            return None
        for a in st.expr.accesses():
            if a.tensor in chain and _plain(a.index) != st.out_dims:
                return None
        chain.add(st.out)
    last = epi[-1].out if epi else conv.out
    if node.op.outputs != (last,) or any(a.tensor == pad.out for st in epi for a in st.expr.accesses()):
        return None
    return _Match(node, pad, conv, tuple(epi), local[pad.expr.tensor], local[wa.tensor], (n, cb, h, w_, lanes), ext[cob],
                  scheme)


def transformed_weights(w: np.ndarray, scheme: Scheme = F4) -> np.ndarray:
    """``U[ab, cob, cib, l, o] = (G W[cob,cib,:,:,l,o] G^T)[a, b]`` in float64, stored float32."""
    g = np.array(scheme.g, np.float64)
    u = np.einsum("ai,kcijlo,bj->abkclo", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(scheme.patch ** 2, *w.shape[:2], *w.shape[4:]).astype(w.dtype))


def input_transform(shape: tuple[int, ...], dtype: str = "float32", pad: Statement | None = None,
                    source: TensorType | None = None, scheme: Scheme = F4) -> Compute:
    """``X`` -> ``V`` [6,6,CB,N,H/4,W/4,L]: ``B^T d B`` per 6x6 patch ``d`` of the conv's padded input
    [N,CB,H+2,W+2,L] (``shape`` is [N,CB,H,W,L]), read in place through the pad stage's index (``pad``:
    ``Xp[..] = X[f(..)]``, zero outside X, of type ``source``; None: X blocked, padded by one), which saves
    writing and reading back a padded copy of the image."""
    n, cb, h, w, lanes = shape
    tile, patch = scheme.tile, scheme.patch
    if pad is None:
        pad = compile_op("Xp[n,c,y,x,l] = X[n,c,y-1,x-1,l]", {"X": TensorType(shape, dtype)}, padding={"X": 0.0},
                         extents={"y": h + 2, "x": w + 2}, dtype=dtype).statements[0]
        source = TensorType(shape, dtype)

    def tap(row: int) -> str:
        at = dict(zip(pad.out_dims, (Affine.dim("n"), Affine.dim("c"), Affine.of({"ty": tile}, row),
                                     Affine.of({"tx": tile, "j": 1}), Affine.dim("l"))))
        return f"X[{','.join(str(ix.substitute(at)) for ix in pad.expr.index)}]"

    rows = select_rows("a", scheme.bt, [tap(k) for k in range(patch)])
    cols = select_rows("b", scheme.bt, [f"T1[n,c,ty,tx,a,{k},l]" for k in range(patch)])
    return compile_op(f"T1[n,c,ty,tx,a,j,l] = {rows}\nV[a,b,c,n,ty,tx,l] = {cols}", {"X": source},
                      padding={"X": dict(pad.padding)[pad.expr.tensor]}, outputs=["V"],
                      extents={"n": n, "c": cb, "ty": tiles(h, tile), "tx": tiles(w, tile), "a": patch, "b": patch, "j": patch,
                               "l": lanes}, dtype=dtype)


def batched_matmul(tiles: int, cb: int, kb: int, lanes: int, dtype: str = "float32", scheme: Scheme = F4) -> Compute:
    """``M[ab,cob,z,t,o] += V[ab,cib,z,t,l] * U[ab,cob,cib,l,o]``: 36 (16) blocked 1x1 convs, one per ``ab``."""
    v = TensorType((scheme.patch ** 2, cb, 1, tiles, lanes), dtype)
    u = TensorType((scheme.patch ** 2, kb, cb, lanes, lanes), dtype)
    return compile_op("M[ab,cob,z,t,o] += V[ab,cib,z,t,l] * U[ab,cob,cib,l,o]", {"V": v, "U": u}, dtype=dtype)


def _output_transform(m: _Match, graph: Graph) -> tuple[Compute, dict[str, str]]:
    """``M`` [6,6,KB,N,T,T,L] -> the conv's epilogue applied to ``A^T M A`` as [N,KB,T,4,T',4,L], and the
    graph tensors of the epilogue's other inputs (by local name)."""
    n, _, h, w, lanes = m.shape
    kb, tile, patch = m.cout_blocks, m.scheme.tile, m.scheme.patch
    dtype = graph.type_of[m.x].dtype
    rows = select_rows("p", m.scheme.at, [f"WinoM[{k},b,cob,n,ty,tx,o]" for k in range(patch)])
    cols = select_rows("q", m.scheme.at, [f"WinoO[cob,n,ty,tx,p,{k},o]" for k in range(patch)])
    mt = TensorType((patch, patch, kb, n, tiles(h, tile), tiles(w, tile), lanes), dtype)
    out = fresh_name("S", {a.tensor for st in m.epilogue for a in st.expr.accesses()} | {st.out for st in m.epilogue}
                     | {"WinoM", "WinoO"})
    base = compile_op(f"WinoO[cob,n,ty,tx,p,b,o] = {rows}\n{out}[n,cob,ty,p,tx,q,o] = {cols}", {"WinoM": mt},
                      extents={"p": tile, "q": tile}, outputs=[out], dtype=dtype)
    dims = base.statements[-1].out_dims  # n, cob, ty, p, tx, q, o: the epilogue's dims, its y = 4ty+p, x = 4tx+q
    extents = base.statements[-1].extents
    ty, p, tx, q = dims[2], dims[3], dims[4], dims[5]
    statements = list(base.statements)
    types = dict(base.types)
    renamed = {m.conv.out: out}
    inputs = ["WinoM"]
    local = dict(zip(m.node.op.inputs, m.node.inputs))
    outer_inputs: dict[str, str] = {}
    tile_type = TensorType(tuple(dict(extents)[d] for d in dims), dtype)
    for st in m.epilogue:
        n0, c0, y0, x0, l0 = st.out_dims
        sub = {n0: Affine.dim(dims[0]), c0: Affine.dim(dims[1]), y0: Affine.of({ty: tile, p: 1}),
               x0: Affine.of({tx: tile, q: 1}), l0: Affine.dim(dims[6])}

        def own(e, st=st):
            if isinstance(e, Access) and e.tensor in renamed:
                return Access(renamed[e.tensor], tuple(Affine.dim(d) for d in dims))
            return e

        expr = map_expr(substitute_dims(st.expr, sub), own)  # other reads re-indexed, then the chain's own reads
        # whole tiles past the image's edge read the epilogue's other tensors out of range: zero there (cut away)
        edge = {} if tile * tiles(h, tile) == h and tile * tiles(w, tile) == w else {
            a.tensor: 0.0 for a in expr.accesses() if a.tensor in local and a.tensor not in dict(st.padding)
            and any(ix.coeff(ty) or ix.coeff(tx) for ix in a.index)}
        statements.append(Statement(st.out, dims, "=", expr, extents, st.padding + tuple(edge.items())))
        types[st.out] = tile_type
        renamed[st.out] = st.out
        for a in st.expr.accesses():
            if a.tensor in local and a.tensor not in outer_inputs and a.tensor not in renamed:
                outer_inputs[a.tensor] = local[a.tensor]
                inputs.append(a.tensor)
                types[a.tensor] = graph.type_of[local[a.tensor]]
    return Compute(tuple(inputs), (statements[-1].out,), tuple(statements), tuple(types.items())), outer_inputs


def winograd_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if _match(graph, node) is not None:
            yield (node.name,)


def winograd_conv(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    m = _match(graph, node)
    if m is None:
        raise RuleNotApplicable(f"node {site[0]!r} is not a blocked 3x3 stride-1 conv this rule fits")
    n, cb, h, w, lanes = m.shape
    sc = m.scheme
    th, tw = tiles(h, sc.tile), tiles(w, sc.tile)
    kb, t, patch = m.cout_blocks, n * th * tw, sc.patch
    dtype = graph.type_of[m.x].dtype
    types = dict(graph.types)
    constants = dict(graph.constants)
    used_t = set(types) | {nd.name for nd in graph.nodes}
    used_n = {nd.name for nd in graph.nodes}
    u_name = fresh_name(f"{m.w}_winograd", used_t)
    w = graph.constant[m.w]
    u_type = TensorType((sc.patch ** 2, *w.type.shape[:2], *w.type.shape[4:]), w.type.dtype)
    constants[u_name] = DeferredConstant(u_type, f"winograd {sc!r}", (w,), lambda a: transformed_weights(a, sc))
    types[u_name] = constants[u_name].type
    v6, v5 = fresh_name(f"{node.name}_wino_v", used_t), fresh_name(f"{node.name}_wino_vt", used_t)
    m5, m7 = fresh_name(f"{node.name}_wino_m", used_t), fresh_name(f"{node.name}_wino_mt", used_t)
    y7 = fresh_name(f"{node.name}_wino_y", used_t)
    types[v6] = TensorType((patch, patch, cb, n, th, tw, lanes), dtype)
    types[v5] = TensorType((patch * patch, cb, 1, t, lanes), dtype)
    types[m5] = TensorType((patch * patch, kb, 1, t, lanes), dtype)
    types[m7] = TensorType((patch, patch, kb, n, th, tw, lanes), dtype)
    out_t = graph.type_of[node.outputs[0]]
    out_c, out_inputs = _output_transform(m, graph)
    types[y7] = out_c.type_of[out_c.outputs[0]]
    new = [
        Node(fresh_name(f"{node.name}_wino_in", used_n), input_transform(m.shape, dtype, m.pad, graph.type_of[m.x], sc),
             (m.x,), (v6,)),
        Node(fresh_name(f"{node.name}_wino_vr", used_n), Extern.of("reshape", shape=types[v5].shape), (v6,), (v5,)),
        Node(fresh_name(f"{node.name}_wino_mm", used_n), batched_matmul(t, cb, kb, lanes, dtype, sc), (v5, u_name),
             (m5,)),
        Node(fresh_name(f"{node.name}_wino_mr", used_n), Extern.of("reshape", shape=types[m7].shape), (m5,), (m7,)),
        Node(node.name, out_c, (m7, *out_inputs.values()), (y7,)),
    ]
    padded = (n, kb, th * sc.tile, tw * sc.tile, lanes)
    if padded == tuple(out_t.shape):
        new.append(Node(fresh_name(f"{node.name}_wino_yr", used_n), Extern.of("reshape", shape=out_t.shape), (y7,),
                        node.outputs))
    else:  # whole tiles past the edge: the image cut out of them
        yp = fresh_name(f"{node.name}_wino_yp", used_t)
        types[yp] = TensorType(padded, dtype)
        dims = ("n", "c", "y", "x", "l")
        cut = Statement("O", dims, "=", Access("Y", tuple(Affine.dim(d) for d in dims)), tuple(zip(dims, out_t.shape)))
        crop = Compute(("Y",), ("O",), (cut,), (("Y", types[yp]), ("O", out_t)))
        new += [Node(fresh_name(f"{node.name}_wino_yr", used_n), Extern.of("reshape", shape=padded), (y7,), (yp,)),
                Node(fresh_name(f"{node.name}_wino_crop", used_n), crop, (yp,), node.outputs)]
    k = graph.nodes.index(node)
    nodes = graph.nodes[:k] + tuple(new) + graph.nodes[k + 1:]
    live = {x for nd in nodes for x in (*nd.inputs, *nd.outputs)} | set(graph.inputs) | set(graph.outputs)
    return replace(graph, nodes=nodes, types=tuple((a, b) for a, b in types.items() if a in live),
                   constants=tuple((a, c) for a, c in constants.items() if a in live))


def winograd_all(graph: Graph) -> Graph:
    """Every conv the rule fits, rewritten."""
    for site in list(winograd_sites(graph)):
        graph = winograd_conv(graph, site)
    return graph


def _examples() -> list[Graph]:
    from rewrite_rules.layout import materialize_padding
    from rewrite_rules.layout_choice import block_node_in, cancel_all

    out = []
    rng = np.random.default_rng(0)
    for name, c, k, hw, epilogue in (("conv3x3_relu", 16, 16, 24, True), ("conv3x3_residual", 8, 16, 32, False)):
        b = GraphBuilder(f"winograd_{name}")
        x = b.input("x", (1, c, hw, hw))
        w = b.constant((rng.standard_normal((k, c, 3, 3)) * 0.2).astype(np.float32), "w")
        bias = b.constant(rng.standard_normal(k).astype(np.float32), "bias")
        src = "P[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]\n"
        src += "O[n,co,y,x] = relu(P[n,co,y,x] + B[co])" if epilogue else "O[n,co,y,x] = P[n,co,y,x] + B[co]"
        y = b.compute1(src, {"X": x, "W": w, "B": bias}, "conv", extents={"y": hw, "x": hw}, padding={"X": 0.0},
                       outputs=["O"])
        g = materialize_padding(b.build([y]), ("conv",))
        out.append(cancel_all(block_node_in(g, "conv", 8)))
    return out


# conv3x3(X, W) = A^T [ (G W G^T) . (B^T X B) ] A, tile by tile (F(4x4, 3x3) or F(2x2, 3x3); products summed over channels)
WINOGRAD = Rule("winograd_conv3x3", FAMILY,
                "conv3x3(X, W) per m x m tile = A^T [sum_c (G W G^T) . (B^T X B)] A: (m+2)^2 products per m^2 outputs, not 9m^2",
                winograd_sites, winograd_conv, _examples)

RULES = [WINOGRAD]
