"""Offline training and evaluation of the cost model on a :class:`~costmodel.dataset.Dataset`.

:func:`train` holds out whole workloads (:meth:`Dataset.split_by_workload`), fits a fresh model on
the rest (every record, failed ones included: the model's ``fit`` takes ``inf`` for a failure) and
reports the ranking metrics of :mod:`costmodel.metrics` on both sides. :func:`evaluate` scores a
model on a dataset's verified records; :func:`scatter_plot` draws predicted against measured
relative speed.

The model is :class:`costmodel.xgb.XGBModel` for CPU records and :class:`costmodel.gpu_model.GpuXGBModel`
(the GPU features) for records of a cuda target (:func:`data_kind`: one kind per dataset), unless
``make_model`` gives another with the same ``fit``/``predict`` methods (imported lazily, so this module
loads without XGBoost).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from costmodel.base import Candidate
from costmodel.dataset import Dataset
from costmodel.metrics import DEFAULT_TOLERANCE, EvalReport, evaluate_scores, relative_speed

if TYPE_CHECKING:
    from costmodel.xgb import XGBConfig

__all__ = ["CrossValidation", "TrainConfig", "TrainReport", "cross_validate", "data_kind", "evaluate",
           "predict_scores", "relative_speed", "scatter_plot", "train"]


class Trainable(Protocol):
    def fit(self, candidates: Sequence[Candidate], seconds: Sequence[float]) -> None: ...

    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray: ...


class Scorer(Protocol):
    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray: ...


@dataclass(frozen=True)
class TrainConfig:
    test_fraction: float = 0.2  # of the workloads, held out for the test metrics
    seed: int = 0  # of the split
    tolerance: float = DEFAULT_TOLERANCE  # pairwise accuracy ignores pairs closer than this (relative)
    model: XGBConfig | None = None  # the XGBoost model's config (None: its defaults)


@dataclass(frozen=True)
class TrainReport:
    """What :func:`train` did: the data (all, train split, test split), the metrics on each side
    (``test`` is None when nothing was held out) and the fitting time."""

    data: dict
    train_data: dict
    test_data: dict
    train: EvalReport
    test: EvalReport | None
    train_seconds: float
    test_fraction: float
    seed: int

    def to_dict(self) -> dict:
        return {"data": self.data, "train_data": self.train_data, "test_data": self.test_data,
                "train": self.train.to_dict(), "test": None if self.test is None else self.test.to_dict(),
                "train_seconds": self.train_seconds, "test_fraction": self.test_fraction, "seed": self.seed}

    def describe(self) -> str:
        d = self.data
        lines = [f"data: {d['records']} records ({d['ok_records']} ok) of {d['workloads']} workloads on "
                 f"{len(d['targets'])} target(s)",
                 f"trained on {self.train_data['workloads']} workloads in {self.train_seconds:.1f} s",
                 f"train: {self.train.describe()}"]
        if self.test is None:
            lines.append("test: none held out")
        else:
            lines.append(f"test ({self.test_data['workloads']} held-out workloads): {self.test.describe()}")
        return "\n".join(lines)


def data_kind(dataset: Dataset) -> str:
    """The kind of target (``cpu`` or ``cuda``) of every record; a dataset mixing kinds is a ValueError
    (CPU and GPU kernels have different features: train one model per kind)."""
    kinds = sorted({c.target.kind for c in dataset.candidates})
    if len(kinds) > 1:
        raise ValueError(f"the data mixes targets of kinds {', '.join(kinds)}: train one model per kind "
                         "(give the records of one kind)")
    return kinds[0] if kinds else "cpu"


def _default_model(config: TrainConfig, dataset: Dataset) -> Trainable:
    from costmodel.xgb import model_class

    return model_class(data_kind(dataset))(config.model)


def train(dataset: Dataset, config: TrainConfig | None = None,
          make_model: Callable[[], Trainable] | None = None) -> tuple[Any, TrainReport]:
    """Fit a fresh model on the training workloads and evaluate it on both splits.

    Raises ``ValueError`` when the training split has no verified, timed record."""
    config = config or TrainConfig()
    train_set, test_set = dataset.split_by_workload(config.test_fraction, config.seed)
    if not np.isfinite(train_set.seconds).any():
        raise ValueError("no verified, timed records to train on")
    model = make_model() if make_model is not None else _default_model(config, dataset)
    start = time.perf_counter()
    model.fit(train_set.candidates, train_set.seconds)
    fit_seconds = time.perf_counter() - start
    test_report = evaluate(model, test_set, config.tolerance) if len(test_set) else None
    report = TrainReport(data=dataset.summary(), train_data=train_set.summary(), test_data=test_set.summary(),
                         train=evaluate(model, train_set, config.tolerance), test=test_report,
                         train_seconds=fit_seconds, test_fraction=config.test_fraction, seed=config.seed)
    return model, report


@dataclass(frozen=True)
class CrossValidation:
    """K-fold cross-validation by workload: each fold's held-out metrics, and their pooled summary
    (pairwise accuracy weighted by pairs, top-k by workloads, MAPE by records)."""

    folds: tuple[EvalReport, ...]

    def summary(self) -> dict:
        def mean(values, weights) -> float | None:
            pairs = [(v, w) for v, w in zip(values, weights) if v is not None and math.isfinite(v) and w > 0]
            return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else None

        f = self.folds
        out = {"folds": len(f), "records": sum(r.records for r in f), "workloads": sum(r.workloads for r in f),
               "pairwise_accuracy": mean([r.pairwise_accuracy for r in f], [r.pairs for r in f]),
               "mape": mean([r.mape for r in f], [r.records for r in f])}
        for k in sorted({k for r in f for k in r.top_k}):
            out[f"top{k}"] = mean([r.top_k.get(k) for r in f], [r.workloads for r in f])
        out["per_fold"] = [r.to_dict() for r in f]
        return out

    def describe(self) -> str:
        s = self.summary()
        tops = ", ".join(f"{k} {v:.3f}" for k, v in s.items() if k.startswith("top") and v is not None)
        return (f"{s['folds']}-fold cross-validation by workload ({s['workloads']} held-out workloads in all): "
                f"pairwise {s['pairwise_accuracy']:.3f}, {tops}, MAPE {100 * (s['mape'] or 0):.1f}%")


def cross_validate(dataset: Dataset, k: int, config: TrainConfig | None = None,
                   make_model: Callable[[], Trainable] | None = None) -> CrossValidation:
    """Fit a fresh model on k-1 folds of workloads and evaluate it on the k-th, for every fold."""
    config = config or TrainConfig()
    reports = []
    for train_set, test_set in dataset.folds_by_workload(k, config.seed):
        model = make_model() if make_model is not None else _default_model(config, dataset)
        model.fit(train_set.candidates, train_set.seconds)
        reports.append(evaluate(model, test_set, config.tolerance))
    return CrossValidation(tuple(reports))


def predict_scores(model: Scorer, dataset: Dataset) -> np.ndarray:
    """The model's score of every verified row; failed rows (not predicted) get ``nan``."""
    scores = np.full(len(dataset), np.nan)
    ok = np.flatnonzero(np.isfinite(dataset.seconds))
    if len(ok):
        predicted = np.asarray(model.predict([dataset.candidates[i] for i in ok]), dtype=np.float64).reshape(-1)
        if len(predicted) != len(ok):
            raise ValueError(f"the model returned {len(predicted)} scores for {len(ok)} candidates")
        scores[ok] = predicted
    return scores


def evaluate(model: Scorer, dataset: Dataset, tolerance: float = DEFAULT_TOLERANCE) -> EvalReport:
    """The ranking metrics of ``model`` on ``dataset`` (failed rows are counted, not scored)."""
    return evaluate_scores(dataset.groups, predict_scores(model, dataset), dataset.seconds, tolerance)


def scatter_plot(model: Scorer, dataset: Dataset, path: str | Path, scores: np.ndarray | None = None,
                 tolerance: float = DEFAULT_TOLERANCE) -> EvalReport:
    """Write a PNG of predicted score against measured relative speed, one point per verified row,
    colored by group; log-log (the score axis is linear if some score is not positive). The title
    carries the metrics, which are returned. ``scores`` (from :func:`predict_scores`) saves predicting again."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    scores = predict_scores(model, dataset) if scores is None else np.asarray(scores, dtype=np.float64)
    report = evaluate_scores(dataset.groups, scores, dataset.seconds, tolerance)
    ok = np.isfinite(dataset.seconds)
    measured = relative_speed(dataset.groups, dataset.seconds)[ok]
    predicted = scores[ok]
    index = {g: i for i, g in enumerate(dict.fromkeys(dataset.groups))}
    colors = [index[g] % 20 for g, keep in zip(dataset.groups, ok) if keep]

    fig = Figure(figsize=(7, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.scatter(measured, predicted, c=colors, cmap="tab20", vmin=0, vmax=19, s=10, alpha=0.6, linewidths=0)
    ax.set_xscale("log")
    positive = len(predicted) > 0 and bool((predicted > 0).all())
    if positive:
        ax.set_yscale("log")
        lo = float(min(measured.min(), predicted.min()))
        ax.plot([lo, 1.0], [lo, 1.0], color="gray", linewidth=1, linestyle="--", label="prediction = measured")
        ax.legend(loc="lower right")
    ax.set_xlabel("measured relative speed (best time / time, per workload and target)")
    ax.set_ylabel("predicted score" + ("" if positive else " (linear: some scores <= 0)"))
    ax.set_title(_title(report), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return report


def _title(report: EvalReport) -> str:
    tops = ", ".join(f"top-{k} {v:.3f}" for k, v in sorted(report.top_k.items()))
    return (f"{report.records} records, {report.workloads} workloads\n"
            f"pairwise {report.pairwise_accuracy:.3f}, {tops}, MAPE {100 * report.mape:.1f}%")
