"""A saved XGBoost booster scored in numpy, without importing xgboost.

Scoring candidates is all the optimize pipeline asks of the shipped cost model, and ``import xgboost`` costs
about 100 MB of resident memory (it imports scipy.sparse and, where installed, scikit-learn): more than a
light model's weights. A booster saved as UBJSON (``Booster.save_raw("ubj")``, what :class:`costmodel.xgb.XGBModel`
files carry) is read here into one array per node field, padded over the trees, and every candidate walks every
tree at once: a node sends a row left when its feature is below the split (compared in float32, as XGBoost
stores features) or, for a missing (NaN) feature, where the node's default says. The score is the base score
plus the leaves, added in float32 in tree order as XGBoost adds them (the same bits), for the objectives
whose prediction is that margin (squared error, ranking).
Training and online updates still go through xgboost.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

# the objectives whose prediction is the raw margin (no link function)
MARGIN_OBJECTIVES = ("reg:squarederror", "rank:pairwise", "rank:ndcg")

_SCALARS = {ord(k): struct.Struct(v) for k, v in
            {"i": ">b", "U": ">B", "I": ">h", "l": ">i", "L": ">q", "d": ">f", "D": ">d"}.items()}
_DTYPES = {ord("i"): ">i1", ord("U"): ">u1", ord("I"): ">i2", ord("l"): ">i4", ord("L"): ">i8", ord("d"): ">f4",
           ord("D"): ">f8"}
_NOOP, _ARRAY, _OBJECT, _END_ARRAY, _END_OBJECT = (ord(c) for c in "N[{]}")


class _Reader:
    """A UBJSON document (draft 12, with the typed and counted containers XGBoost writes)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = bytes(data), 0

    def _marker(self) -> int:
        data, at = self.data, self.at
        while True:
            if at >= len(data):
                raise ValueError("truncated UBJSON")
            m = data[at]
            at += 1
            if m != _NOOP:
                self.at = at
                return m

    def _scalar(self, m: int) -> Any:
        fmt = _SCALARS[m]
        if self.at + fmt.size > len(self.data):
            raise ValueError("truncated UBJSON")
        v = fmt.unpack_from(self.data, self.at)[0]
        self.at += fmt.size
        return v

    def _int(self, m: int) -> int:
        if m not in _SCALARS or m in (ord("d"), ord("D")):
            raise ValueError(f"UBJSON: expected an integer, got {chr(m)!r}")
        return self._scalar(m)

    def _string(self) -> str:
        n = self._int(self._marker())
        if self.at + n > len(self.data):
            raise ValueError("truncated UBJSON")
        out = self.data[self.at:self.at + n].decode("utf-8")
        self.at += n
        return out

    def value(self, m: int | None = None) -> Any:
        m = self._marker() if m is None else m
        if m in _SCALARS:
            return self._scalar(m)
        if m == _ARRAY:
            return self._array()
        if m == _OBJECT:
            return self._object()
        c = chr(m)
        if c in "SH":
            return self._string()
        if c == "C":
            self.at += 1
            return chr(self.data[self.at - 1])
        if c in "TFZ":
            return {"T": True, "F": False, "Z": None}[c]
        raise ValueError(f"UBJSON: unknown marker {c!r}")

    def _container(self) -> tuple[int | None, int | None]:
        typ = count = None
        m = self._marker()
        if m == ord("$"):
            typ = self.data[self.at]
            self.at += 1
            m = self._marker()
        if m == ord("#"):
            count = self._int(self._marker())
        else:
            self.at -= 1
        return typ, count

    def _array(self) -> Any:
        typ, count = self._container()
        if typ in _DTYPES and count is not None:  # a typed array: one block, big-endian
            dt = np.dtype(_DTYPES[typ])
            if self.at + count * dt.itemsize > len(self.data):
                raise ValueError("truncated UBJSON")
            out = np.frombuffer(self.data, dt, count, self.at).astype(dt.newbyteorder("="))
            self.at += count * dt.itemsize
            return out
        if count is not None:
            return [self.value(typ) for _ in range(count)]
        out = []
        while (m := self._marker()) != _END_ARRAY:
            out.append(self.value(m))
        return out

    def _object(self) -> dict[str, Any]:
        typ, count = self._container()
        out = {}
        if count is not None:
            for _ in range(count):
                k = self._string()
                out[k] = self.value(typ)
            return out
        while self._marker() != _END_OBJECT:
            self.at -= 1
            k = self._string()
            out[k] = self.value()
        return out


def read_ubjson(data: bytes) -> Any:
    """The document in ``data`` (typed numeric arrays as numpy arrays)."""
    return _Reader(data).value()


@dataclass(frozen=True)
class TreeEnsemble:
    """The trees of a booster as node arrays of shape (trees, nodes), padded with leaves."""

    left: np.ndarray  # child indices; -1 at a leaf
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray  # float32: the split, or at a leaf its value
    default_left: np.ndarray  # bool
    base_score: float
    depth: int  # the longest root-to-leaf path

    @staticmethod
    def from_ubjson(data: bytes) -> TreeEnsemble:
        """The ensemble of a booster saved with ``save_raw("ubj")``; ``ValueError`` when it is not one this
        scores (another booster kind or objective, categorical splits, vector leaves)."""
        try:
            learner = read_ubjson(data)["learner"]
            objective = learner["objective"]["name"]
            booster = learner["gradient_booster"]
            trees = booster["model"]["trees"]
            base = str(learner["learner_model_param"]["base_score"]).strip("[]")
            base_score = float(base.split(",")[0])
        except (KeyError, TypeError, IndexError) as err:
            raise ValueError(f"not an XGBoost booster ({type(err).__name__}: {err})") from None
        if booster.get("name") != "gbtree" or objective not in MARGIN_OBJECTIVES:
            raise ValueError(f"a {booster.get('name')} booster of objective {objective} is not scored here")
        if int(learner["learner_model_param"].get("num_target", "1")) != 1 or \
                int(learner["learner_model_param"].get("num_class", "0")) > 1:
            raise ValueError("a booster of several outputs is not scored here")
        n = max((len(t["left_children"]) for t in trees), default=1)
        shape = (max(len(trees), 1), n)
        left = np.full(shape, -1, np.int64)
        right = np.full(shape, -1, np.int64)
        feature = np.zeros(shape, np.int64)
        threshold = np.zeros(shape, np.float32)
        default_left = np.zeros(shape, bool)
        for k, t in enumerate(trees):
            if any(np.asarray(t.get("split_type", []), np.int64) != 0) or \
                    int(t.get("tree_param", {}).get("size_leaf_vector", "1")) > 1:
                raise ValueError("categorical splits or vector leaves are not scored here")
            m = len(t["left_children"])
            left[k, :m] = np.asarray(t["left_children"], np.int64)
            right[k, :m] = np.asarray(t["right_children"], np.int64)
            feature[k, :m] = np.asarray(t["split_indices"], np.int64)
            threshold[k, :m] = np.asarray(t["split_conditions"], np.float32)
            default_left[k, :m] = np.asarray(t["default_left"], np.int64) != 0
        if not trees:
            threshold[:] = 0.0
        depth = _depth(left, right)
        return TreeEnsemble(left, right, feature, threshold, default_left, base_score, depth)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The score of each row of ``x`` (rows x features; NaN: missing), float32 as XGBoost gives it."""
        x = np.ascontiguousarray(x, np.float32)
        n_trees, width = self.left.shape
        rows, features = x.shape
        # flat node ids (tree * width + node) of every (tree, row), walked one level at a time; a leaf's children
        # are itself, so a row that reached one stays
        node = np.repeat(np.arange(n_trees, dtype=np.int64) * width, rows)
        row_base = np.tile(np.arange(rows, dtype=np.int64) * features, n_trees)
        flat_x = x.reshape(-1)
        for _ in range(self.depth):
            v = flat_x.take(row_base + self._feature.take(node))
            go_left = v < self._threshold.take(node)
            missing = np.isnan(v)
            if missing.any():
                go_left = np.where(missing, self._default_left.take(node), go_left)
            node = np.where(go_left, self._left.take(node), self._right.take(node))
        leaves = self._threshold.take(node).reshape(n_trees, rows)
        # in float32, from the base score, tree after tree, as XGBoost adds them (the same bits)
        terms = np.concatenate([np.full((1, rows), self.base_score, np.float32), leaves])
        return np.cumsum(terms, axis=0, dtype=np.float32)[-1]

    def __post_init__(self) -> None:
        width = self.left.shape[1]
        offset = (np.arange(self.left.shape[0], dtype=np.int64) * width)[:, None]
        here = offset + np.arange(width, dtype=np.int64)[None, :]
        leaf = self.left < 0
        flat = {"_left": np.where(leaf, here, offset + self.left), "_right": np.where(leaf, here, offset + self.right),
                "_feature": self.feature, "_threshold": self.threshold, "_default_left": self.default_left}
        for name, a in flat.items():
            object.__setattr__(self, name, np.ascontiguousarray(a).reshape(-1))


def _depth(left: np.ndarray, right: np.ndarray) -> int:
    """The most levels a row descends in any tree."""
    offset = (np.arange(left.shape[0], dtype=np.int64) * left.shape[1])[:, None]
    flat_left, flat_right = (left + np.where(left >= 0, offset, 0)).reshape(-1), (right + offset).reshape(-1)
    level, depth = offset.reshape(-1), 0
    while True:
        inner = level[flat_left.take(level) >= 0]
        if not inner.size:
            return depth
        level = np.concatenate([flat_left.take(inner), flat_right.take(inner)])
        depth += 1


__all__ = ["TreeEnsemble", "read_ubjson", "MARGIN_OBJECTIVES"]
