"""Extern kind ``tfidf``: ONNX TfIdfVectorizer over integer token ids.

``tfidf(pool, ngram_counts, ngram_indexes, min_n, max_n, max_skip, mode, weights)``: each row of the input
(rank 1: one row; rank 2: one per leading index) is scanned for the pool's n-grams of length ``min_n`` to
``max_n``, their items ``skip + 1`` apart for every skip up to ``max_skip`` (unigrams counted once). The
pool holds the n-grams of length 1, 2, ... back to back, those of length i + 1 from ``ngram_counts[i]``;
the k-th n-gram of the pool is counted in output column ``ngram_indexes[k]``. ``mode``: ``TF`` (counts),
``IDF`` (the weight, or 1, where the count is positive) or ``TFIDF`` (count times weight). float32 out.
"""

from __future__ import annotations

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType

MODES = ("TF", "IDF", "TFIDF")


def _table(a) -> dict[tuple[int, ...], int]:
    pool, counts, indexes = a["pool"], a["ngram_counts"], a["ngram_indexes"]
    table: dict[tuple[int, ...], int] = {}
    k = 0
    for i, start in enumerate(counts):
        n = i + 1
        end = counts[i + 1] if i + 1 < len(counts) else len(pool)
        for j in range(max(end - start, 0) // n):
            if a["min_n"] <= n <= a["max_n"]:
                table[tuple(pool[start + j * n:start + (j + 1) * n])] = indexes[k]
            k += 1
    return table


def _tfidf(xs, a):
    x = np.asarray(xs[0])
    rows = x.reshape(1, -1) if x.ndim <= 1 else x
    table = _table(a)
    size = max(a["ngram_indexes"]) + 1
    freq = np.zeros((rows.shape[0], size), np.float32)
    for r, row in enumerate(rows.tolist()):
        for n in range(a["min_n"], a["max_n"] + 1):
            for d in ([1] if n == 1 else range(1, a["max_skip"] + 2)):
                for s in range(len(row) - d * (n - 1)):
                    hit = table.get(tuple(row[s + d * t] for t in range(n)))
                    if hit is not None:
                        freq[r, hit] += 1
    w = np.asarray(a["weights"], np.float32) if a["weights"] else np.ones(size, np.float32)
    if a["mode"] == "IDF":
        freq = np.where(freq > 0, w, np.float32(0))
    elif a["mode"] == "TFIDF":
        freq = freq * w
    return [freq.reshape((size,) if x.ndim <= 1 else (rows.shape[0], size)).astype(np.float32)]


def _tfidf_type(ts, a):
    x = ts[0]
    if x.dtype not in ("int32", "int64"):
        raise TypeError(f"tfidf: token ids must be int32 or int64, not {x.dtype}")
    if x.rank > 2:
        raise ValueError(f"tfidf: the input must have rank 1 or 2, not {x.rank}")
    if a["mode"] not in MODES:
        raise ValueError(f"tfidf: mode must be one of {MODES}, not {a['mode']!r}")
    if not a["ngram_indexes"]:
        raise ValueError("tfidf: ngram_indexes is empty")
    size = max(a["ngram_indexes"]) + 1
    if a["weights"] and len(a["weights"]) < size:
        raise ValueError(f"tfidf: {len(a['weights'])} weights for {size} outputs")
    return [TensorType((size,) if x.rank <= 1 else (x.shape[0], size), "float32")]


register("tfidf", _tfidf, _tfidf_type)
