"""Ranking metrics of a cost model, computed within each workload.

Every function takes three aligned arrays: ``groups`` (the workload key of each record), ``scores``
(the model's prediction; higher = expected faster) and ``seconds`` (the measured time; ``inf`` for a
failed candidate). Failed records (non-finite seconds) are dropped before anything is computed. A
metric with nothing to average over is ``nan``.

- :func:`pairwise_accuracy`: over every pair of records of one workload whose true times differ by
  more than ``tolerance`` (relative: the slower takes more than ``(1 + tolerance)`` times the faster),
  the fraction the scores order correctly (the faster one scored strictly higher); a tie in score
  counts half. Pooled: all pairs of all workloads weigh the same (a workload with ``n`` records has up
  to ``n(n-1)/2`` pairs).
- :func:`top_k_score` (TenSet's): per workload with at least two records, the best true time divided
  by the best true time among the ``k`` records the model scores highest; the mean over those
  workloads. Records of equal score are taken slowest first (a constant model is not lucky).
- :func:`mape`: the model's score is read as a per-workload normalized speed, ``best time / time``
  (1 for the fastest). Its predicted time relative to the workload's true best is ``1 / score``
  (scores below ``min_score`` count as ``min_score``), the true relative time is ``time / best
  time``; the result is the mean over all records (pooled) of
  ``|predicted relative - true relative| / true relative``, a fraction (0.1 is 10%). This equals the
  MAPE of predicted absolute times when each workload's scale is anchored at its true best.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["EvalReport", "evaluate_scores", "mape", "pairwise_accuracy", "pairwise_counts", "top_k_score"]

DEFAULT_TOLERANCE = 0.02
DEFAULT_KS = (1, 5)
_PAIR_BLOCK = 1 << 22  # pair comparisons per vectorized block


def _finite(groups: Sequence[str], scores: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records with a finite time, as arrays; checks lengths and scores."""
    g = np.asarray(list(groups), dtype=object)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    t = np.asarray(seconds, dtype=np.float64).reshape(-1)
    if not len(g) == len(s) == len(t):
        raise ValueError(f"groups, scores and seconds differ in length ({len(g)}, {len(s)}, {len(t)})")
    keep = np.isfinite(t)
    if np.isnan(s[keep]).any():
        raise ValueError("the model predicted nan for some records")
    return g[keep], s[keep], t[keep]


def _by_group(groups: np.ndarray) -> Iterator[np.ndarray]:
    """Index arrays of each workload's records, workloads in order of first appearance."""
    if not len(groups):
        return
    _, first, inverse = np.unique(groups.astype(str), return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse))[:-1]
    chunks = np.split(order, bounds)
    for u in np.argsort(first):
        yield chunks[u]


def _pairs_in_group(s: np.ndarray, t: np.ndarray, tolerance: float) -> tuple[float, int]:
    """(credit, pairs) within one workload: pairs (i, j) with t[j] > t[i] * (1 + tolerance)."""
    n = len(t)
    credit, pairs = 0.0, 0
    block = max(1, _PAIR_BLOCK // max(n, 1))
    for lo in range(0, n, block):
        ti, si = t[lo:lo + block, None], s[lo:lo + block, None]
        slower = t[None, :] > ti * (1.0 + tolerance)  # j is clearly slower than i
        pairs += int(slower.sum())
        credit += float((slower & (si > s[None, :])).sum()) + 0.5 * float((slower & (si == s[None, :])).sum())
    return credit, pairs


def pairwise_counts(groups: Sequence[str], scores: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray,
                    tolerance: float = DEFAULT_TOLERANCE) -> tuple[float, int]:
    """(correctly ordered pairs, counting a score tie as half; pairs compared), pooled over workloads."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    g, s, t = _finite(groups, scores, seconds)
    credit, pairs = 0.0, 0
    for ix in _by_group(g):
        c, p = _pairs_in_group(s[ix], t[ix], tolerance)
        credit += c
        pairs += p
    return credit, pairs


def pairwise_accuracy(groups: Sequence[str], scores: Sequence[float] | np.ndarray,
                      seconds: Sequence[float] | np.ndarray, tolerance: float = DEFAULT_TOLERANCE) -> float:
    """The fraction of clearly ordered same-workload pairs the scores order correctly (pooled)."""
    credit, pairs = pairwise_counts(groups, scores, seconds, tolerance)
    return credit / pairs if pairs else math.nan


def _top_k_in_group(s: np.ndarray, t: np.ndarray, k: int) -> float:
    order = np.lexsort((-t, -s))  # highest score first; equal scores slowest first
    return float(t.min() / t[order[:k]].min())


def top_k_score(groups: Sequence[str], scores: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray,
                k: int = 1) -> float:
    """Mean over workloads with >= 2 records of best time / best time among the top-``k`` scored."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    g, s, t = _finite(groups, scores, seconds)
    per = [_top_k_in_group(s[ix], t[ix], k) for ix in _by_group(g) if len(ix) >= 2]
    return float(np.mean(per)) if per else math.nan


def mape(groups: Sequence[str], scores: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray,
         min_score: float = 1e-3) -> float:
    """Mean absolute percentage error (a fraction) of the relative time ``1 / score`` against the true
    relative time ``time / workload best``, pooled over records."""
    if not min_score > 0:
        raise ValueError(f"min_score must be > 0, got {min_score}")
    g, s, t = _finite(groups, scores, seconds)
    errors = []
    for ix in _by_group(g):
        true_rel = t[ix] / t[ix].min()
        pred_rel = 1.0 / np.maximum(s[ix], min_score)
        errors.append(np.abs(pred_rel - true_rel) / true_rel)
    return float(np.concatenate(errors).mean()) if errors else math.nan


def _json_number(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass(frozen=True)
class EvalReport:
    """The metrics of one model on one set of records (see the module docstring for definitions)."""

    records: int  # records with a finite time (the ones evaluated)
    workloads: int  # workloads with at least one such record
    failed: int  # records left out because they failed
    pairs: int  # pairs compared by pairwise_accuracy
    pairwise_accuracy: float
    top_k: dict[int, float] = field(default_factory=dict)
    mape: float = math.nan
    tolerance: float = DEFAULT_TOLERANCE

    def to_dict(self) -> dict:
        """JSON-ready: ``top_k`` flattens to ``top1``, ``top5``, ...; ``nan`` becomes ``None``."""
        d: dict = {"records": self.records, "workloads": self.workloads, "failed": self.failed, "pairs": self.pairs,
                   "tolerance": self.tolerance, "pairwise_accuracy": _json_number(self.pairwise_accuracy)}
        d.update({f"top{k}": _json_number(v) for k, v in sorted(self.top_k.items())})
        d["mape"] = _json_number(self.mape)
        return d

    def describe(self) -> str:
        """One line: the metrics and the counts they come from."""
        tops = ", ".join(f"top-{k} {v:.3f}" for k, v in sorted(self.top_k.items()))
        return (f"pairwise accuracy {self.pairwise_accuracy:.3f} ({self.pairs} pairs), {tops}, "
                f"MAPE {100 * self.mape:.1f}% over {self.records} records of {self.workloads} workloads"
                + (f" ({self.failed} failed records left out)" if self.failed else ""))


def evaluate_scores(groups: Sequence[str], scores: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray,
                    tolerance: float = DEFAULT_TOLERANCE, ks: Sequence[int] = DEFAULT_KS) -> EvalReport:
    """Every metric at once."""
    t = np.asarray(seconds, dtype=np.float64).reshape(-1)
    finite = np.isfinite(t)
    credit, pairs = pairwise_counts(groups, scores, seconds, tolerance)
    groups_ok = {g for g, ok in zip(groups, finite) if ok}
    return EvalReport(records=int(finite.sum()), workloads=len(groups_ok), failed=int((~finite).sum()), pairs=pairs,
                      pairwise_accuracy=credit / pairs if pairs else math.nan,
                      top_k={k: top_k_score(groups, scores, seconds, k) for k in ks},
                      mape=mape(groups, scores, seconds), tolerance=tolerance)


def relative_speed(groups: Sequence[str], seconds: Sequence[float] | np.ndarray, failed: float = math.nan) -> np.ndarray:
    """``best time of the group / time`` per row (1 for each group's fastest); ``failed`` for a failed
    (non-finite) row: ``nan`` for plots and metrics, 0 as the cost model's training label."""
    t = np.asarray(seconds, dtype=np.float64)
    best: dict[str, float] = {}
    for g, s in zip(groups, t):
        if math.isfinite(s):
            best[g] = min(best.get(g, math.inf), s)
    return np.array([best[g] / s if math.isfinite(s) else failed for g, s in zip(groups, t)], dtype=np.float64)
