"""Ops of ONNX's classical machine-learning domain (``ai.onnx.ml``): Binarizer, ArrayFeatureExtractor and
TreeEnsemble (its trees as constant path tables: comparisons, two matmuls, an aggregation)."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import ewise, lit

DOMAIN = "ai.onnx.ml"


@_conv(f"{DOMAIN}.Binarizer")
def _binarizer(c: _Ctx, x):
    """1 where X > threshold, else 0, in X's element type."""
    return ewise(c.b, f"where({{0}} > {lit(float(c.attr('threshold', 0.0)))}, 1.0, 0.0)", [x[0]], "binarizer")


@_conv(f"{DOMAIN}.ArrayFeatureExtractor")
def _array_feature_extractor(c: _Ctx, x):
    """X[..., indices] with the indices flattened; a 1-D X gives one row (onnxruntime's and onnx.reference's
    reading of the spec)."""
    shape = c.b.shape(x[0])
    idx = x[1]
    if len(c.b.shape(idx)) != 1:
        idx = ops.reshape(c.b, idx, [-1])
    out = ops.gather(c.b, x[0], idx, len(shape) - 1)
    if len(shape) == 1:
        out = ops.reshape(c.b, out, [1, int(np.prod(c.b.shape(idx)))])
    return out


# ---- TreeEnsemble (version 5) -----------------------------------------------------------------------
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_AVERAGE, _SUM, _MIN, _MAX = range(4)


def _tree_paths(c: _Ctx) -> list[tuple[list[tuple[int, bool]], int]]:
    """Every root-to-leaf path of every tree: ([(node, branch taken), ...], leaf)."""
    a = c.attrs
    true_ids, false_ids = list(a["nodes_truenodeids"]), list(a["nodes_falsenodeids"])
    true_leaf, false_leaf = list(a["nodes_trueleafs"]), list(a["nodes_falseleafs"])
    paths: list[tuple[list[tuple[int, bool]], int]] = []

    def walk(node: int, path: list[tuple[int, bool]]) -> None:
        if len(path) > len(true_ids):
            raise OnnxImportError("TreeEnsemble: a tree's branches form a cycle")
        for branch, nxt, leaf in ((True, true_ids[node], true_leaf[node]), (False, false_ids[node], false_leaf[node])):
            if leaf:
                paths.append(([*path, (node, branch)], int(nxt)))
            else:
                walk(int(nxt), [*path, (node, branch)])

    for root in a["tree_roots"]:
        if true_leaf[root] and false_leaf[root] and true_ids[root] == false_ids[root]:  # the tree is one leaf
            paths.append(([], int(true_ids[root])))
        else:
            walk(int(root), [])
    return paths


def _node_conditions(c: _Ctx, x: str, nodes: list[int], dtype: str) -> str:
    """(N, len(nodes)) of 1.0 where each node's comparison sends the row down its true branch, else 0.0."""
    a = c.attrs
    feats = np.asarray(a["nodes_featureids"], np.int64)[nodes]
    modes = np.asarray(a["nodes_modes"]).astype(np.int64)[nodes]
    splits = np.asarray(a.get("nodes_splits"), np.float64)[nodes]
    track = np.asarray(a.get("nodes_missing_value_tracks_true") or [0] * len(a["nodes_modes"]))[nodes]
    xf = ops.gather(c.b, x, c.b.constant(feats, dtype="int64"), 1)  # (N, nodes)
    const = {k: c.b.constant(v.astype(dtype).reshape(1, -1), dtype=dtype)
             for k, v in (("split", splits), ("mode", modes), ("track", track))}
    cmp = ("where({2} == 0.0, {0} <= {1}, where({2} == 1.0, {0} < {1}, where({2} == 2.0, {0} >= {1}, "
           "where({2} == 3.0, {0} > {1}, where({2} == 4.0, {0} == {1}, {0} != {1})))))")
    # a NaN feature compares as IEEE says (only != holds), then takes the true branch where its node tracks
    # missing values to true (onnxruntime's and onnx.reference's order)
    cond = ewise(c.b, f"where({cmp}, 1.0, where(isnan({{0}}), {{3}}, 0.0))",
                 [xf, const["split"], const["mode"], const["track"]], "tree_compare")
    if not (modes == _MEMBER).any():
        return cond
    # set membership: the sets, in the order their nodes appear in nodes_modes, are NaN-delimited runs of values
    values = np.asarray(a.get("membership_values", []), np.float64)
    bounds = np.flatnonzero(np.isnan(values))
    sets = np.split(values, bounds + 1)[: len(bounds)]
    all_modes = np.asarray(a["nodes_modes"]).astype(np.int64)
    if len(sets) != int((all_modes == _MEMBER).sum()):
        raise OnnxImportError("TreeEnsemble: membership_values does not hold one NaN-ended set per BRANCH_MEMBER node")
    set_of = dict(zip(np.flatnonzero(all_modes == _MEMBER), [s[:-1] for s in sets], strict=True))
    width = max(1, max(len(s) for s in set_of.values()))
    table = np.full((len(nodes), width), np.nan)
    for k, n in enumerate(nodes):
        if n in set_of:
            table[k, : len(set_of[n])] = set_of[n]
    n_rows = c.b.shape(x)[0]
    xs = ops.reshape(c.b, xf, [n_rows, len(nodes), 1])
    hit = ewise(c.b, "where({0} == {1}, 1.0, 0.0)", [xs, c.b.constant(table.astype(dtype)[None], dtype=dtype)],
                "tree_member")
    member = ops.reduce(c.b, hit, "max", [2], keepdims=False)  # (N, nodes)
    is_member = c.b.constant((modes == _MEMBER).astype(dtype).reshape(1, -1), dtype=dtype)
    return ewise(c.b, "where({1} > 0.0, where({2} > 0.0, 1.0, where(isnan({0}), {3}, 0.0)), {4})",
                 [xf, is_member, member, const["track"], cond], "tree_condition")


@_conv(f"{DOMAIN}.TreeEnsemble")
def _tree_ensemble(c: _Ctx, x):
    """Every tree's root-to-leaf paths as constant tables: a row reaches a path's leaf when none of the path's
    node conditions disagrees (a count by two matmuls with the path's true/false requirements), and the leaves
    reached are aggregated per target (SUM, AVERAGE over the trees, MIN, MAX; targets no leaf reaches are 0 for
    SUM/AVERAGE and the type's extreme for MIN/MAX, as onnx.reference gives). Only post_transform NONE."""
    a = c.attrs
    dtype = c.b.type(x[0]).dtype
    if dtype not in ("float32", "float64") or len(c.b.shape(x[0])) != 2:
        raise OnnxImportError(f"TreeEnsemble takes a 2-D float input, got {dtype} of shape {c.b.shape(x[0])}")
    if int(a.get("post_transform", 0)) != 0:
        raise OnnxImportError(f"TreeEnsemble post_transform {a['post_transform']} is not supported (NONE only)")
    agg = int(a.get("aggregate_function", _SUM))
    if agg not in (_AVERAGE, _SUM, _MIN, _MAX):
        raise OnnxImportError(f"TreeEnsemble aggregate_function {agg} is not one of 0-3")
    paths = _tree_paths(c)
    nodes = sorted({n for p, _ in paths for n, _ in p})
    col = {n: k for k, n in enumerate(nodes)}
    n_rows, n_paths, n_targets = c.b.shape(x[0])[0], len(paths), int(a["n_targets"])
    weights = np.asarray(a["leaf_weights"], np.float64)
    targets = np.asarray(a["leaf_targetids"], np.int64)
    leaf_w = np.array([weights[leaf] for _, leaf in paths])
    leaf_t = np.array([targets[leaf] for _, leaf in paths])
    if nodes:
        need_true, need_false = np.zeros((len(nodes), n_paths)), np.zeros((len(nodes), n_paths))
        for p, (path, _) in enumerate(paths):
            for n, branch in path:
                (need_true if branch else need_false)[col[n], p] = 1.0
        cond = _node_conditions(c, x[0], nodes, dtype)
        miss = ops.add(c.b, ops.matmul(c.b, ewise(c.b, "1.0 - {0}", [cond], "tree_not"),
                                       c.b.constant(need_true.astype(dtype), dtype=dtype)),
                       ops.matmul(c.b, cond, c.b.constant(need_false.astype(dtype), dtype=dtype)))
        fired = ewise(c.b, "where({0} < 0.5, 1.0, 0.0)", [miss], "tree_fired")  # (N, paths)
    else:
        fired = c.b.constant(np.ones((n_rows, n_paths), dtype), dtype=dtype)
    if agg in (_SUM, _AVERAGE):
        table = np.zeros((n_paths, n_targets))
        table[np.arange(n_paths), leaf_t] = leaf_w / (len(a["tree_roots"]) if agg == _AVERAGE else 1)
        return ops.matmul(c.b, fired, c.b.constant(table.astype(dtype), dtype=dtype))
    info = np.finfo(np.dtype(dtype))
    init = info.max if agg == _MIN else info.min
    table = np.full((1, n_paths, n_targets), init)
    table[0, np.arange(n_paths), leaf_t] = leaf_w
    f3 = ops.reshape(c.b, fired, [n_rows, n_paths, 1])
    masked = ewise(c.b, f"where({{0}} > 0.5, {{1}}, {lit(float(init))})",
                   [f3, c.b.constant(table.astype(dtype), dtype=dtype)], "tree_leaf")
    return ops.reduce(c.b, masked, "min" if agg == _MIN else "max", [1], keepdims=False)
