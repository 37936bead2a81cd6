"""The cost model's ranking metrics on known answers, the dataset reader (both record formats, merged
repeats, whole-workload splits, bad records skipped with one warning), training/evaluation with a
stand-in model, and the ``superopt costmodel`` commands (with the real XGBoost model)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import random
import warnings
import zlib
from collections.abc import Sequence

import numpy as np
import pytest

from costmodel.base import Candidate, candidate_group
from costmodel.dataset import Dataset, load_dataset
from costmodel.metrics import EvalReport, evaluate_scores, mape, pairwise_accuracy, pairwise_counts, top_k_score
from costmodel.train import TrainConfig, cross_validate, evaluate, relative_speed, scatter_plot, train
from search.schedule.database import TuningDatabase, TuningRecord
from superopt.cli_costmodel import main
from superopt.ir.canonical import canonicalize, workload_key
from superopt.ir.compute import Compute
from superopt.lang import compile_op
from superopt.measure.records import MeasureRecord, append_records, records_path
from superopt.schedule.primitives import Primitive, trace_to_json
from superopt.schedule.space import ScheduleSpace
from superopt.target import Target

HAS_XGB = importlib.util.find_spec("xgboost") is not None and importlib.util.find_spec("costmodel.xgb") is not None
needs_xgb = pytest.mark.skipif(not HAS_XGB, reason="costmodel.xgb (the XGBoost model) is not importable")

TARGET = Target(cpu_model="test cpu", cores=2, threads=1)
MM = "C[i,j] += A[i,k] * B[k,j]"
MM_RENAMED = "Out[r,c] += L[r,x] * R[x,c]"  # the same workload as MM, in other names


# ---- metrics -----------------------------------------------------------------------------------------


def test_perfect_and_reversed_predictions():
    groups = ["a"] * 4 + ["b"] * 3
    t = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 2.5])
    best = np.array([1.0] * 4 + [1.0] * 3)
    perfect = best / t
    assert pairwise_accuracy(groups, perfect, t) == 1.0
    assert top_k_score(groups, perfect, t, 1) == 1.0 and top_k_score(groups, perfect, t, 2) == 1.0
    assert mape(groups, perfect, t) == pytest.approx(0.0)
    assert pairwise_accuracy(groups, -perfect, t) == 0.0
    assert pairwise_counts(groups, perfect, t) == (9.0, 9)  # 6 pairs in a, 3 in b


def test_top_k_by_hand():
    groups = ["a", "a", "a", "b", "b", "single"]
    t = np.array([1.0, 2.0, 4.0, 3.0, 6.0, 7.0])
    scores = np.array([0.1, 0.5, 0.9, 1.0, 0.0, 0.3])
    # a: top-1 picks 4.0 -> 1/4; top-2 picks {4, 2} -> 1/2. b: top-1 picks 3.0 -> 1. "single" has one record: left out
    assert top_k_score(groups, scores, t, 1) == pytest.approx((0.25 + 1.0) / 2)
    assert top_k_score(groups, scores, t, 2) == pytest.approx((0.5 + 1.0) / 2)
    assert top_k_score(groups, scores, t, 3) == 1.0
    # equal scores are taken slowest first: a constant model is not lucky
    assert top_k_score(["a"] * 3, [0.0, 0.0, 0.0], [1.0, 2.0, 4.0], 1) == 0.25
    with pytest.raises(ValueError, match="k must be"):
        top_k_score(groups, scores, t, 0)


def test_mape_by_hand():
    # a: true relative times [1, 2], predicted 1/score = [1, 4] -> errors [0, 1]; b: true 1, predicted 2 -> 1
    groups, t, scores = ["a", "a", "b"], [1.0, 2.0, 2.0], [1.0, 0.25, 0.5]
    assert mape(groups, scores, t) == pytest.approx(2 / 3)
    # scores below min_score count as min_score: relative time 1000, error 999
    assert mape(["a"], [0.0], [1.0]) == pytest.approx(999.0)
    assert mape(["a"], [-5.0], [1.0], min_score=0.5) == pytest.approx(1.0)


def test_ties_within_tolerance_are_ignored_and_score_ties_count_half():
    groups, t = ["a"] * 3, [1.0, 1.01, 2.0]
    wrong_on_near_tie = [0.5, 0.9, 0.1]  # orders 1.0 vs 1.01 wrongly, both against 2.0 rightly
    assert pairwise_counts(groups, wrong_on_near_tie, t) == (2.0, 2)
    assert pairwise_accuracy(groups, wrong_on_near_tie, t) == 1.0
    assert pairwise_accuracy(groups, wrong_on_near_tie, t, tolerance=0.0) == pytest.approx(2 / 3)
    assert pairwise_accuracy(groups, [0.0, 0.0, 0.0], t) == 0.5


def test_failed_records_are_excluded():
    groups = ["a", "a", "a", "b", "b"]
    t = np.array([1.0, math.inf, 2.0, 3.0, math.inf])
    scores = np.array([1.0, np.nan, 0.5, 7.0, 100.0])  # failed rows' scores (even nan) do not matter
    keep = np.isfinite(t)
    clean = [g for g, k in zip(groups, keep) if k]
    assert pairwise_accuracy(groups, scores, t) == pairwise_accuracy(clean, scores[keep], t[keep]) == 1.0
    assert top_k_score(groups, scores, t, 1) == 1.0  # b has one ok record left: not a choice
    assert mape(groups, scores, t) == mape(clean, scores[keep], t[keep])
    report = evaluate_scores(groups, scores, t)
    assert (report.records, report.workloads, report.failed, report.pairs) == (3, 2, 2, 1)
    assert report.to_dict()["top1"] == 1.0 and report.to_dict()["top5"] == 1.0


def test_eval_report_json_and_input_checks():
    empty = evaluate_scores([], [], [])
    assert isinstance(empty, EvalReport) and empty.records == 0 and math.isnan(empty.pairwise_accuracy)
    d = empty.to_dict()
    assert d["pairwise_accuracy"] is None and d["top1"] is None and d["mape"] is None
    json.dumps(d, allow_nan=False)
    assert "pairwise accuracy" in evaluate_scores(["a", "a"], [1, 0], [1, 2]).describe()
    with pytest.raises(ValueError, match="differ in length"):
        pairwise_accuracy(["a"], [1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="nan"):
        pairwise_accuracy(["a", "a"], [np.nan, 1.0], [1.0, 2.0])


# ---- synthetic records ---------------------------------------------------------------------------------


def _mm(m: int, src: str = MM) -> Compute:
    names = ("A", "B") if src == MM else ("L", "R")
    return compile_op(src, {names[0]: (m, 32), names[1]: (32, 24)})


def _traces(compute: Compute, n: int, seed: int) -> list[tuple[Primitive, ...]]:
    space = ScheduleSpace(compute, TARGET)
    rng = random.Random(seed)
    out = dict.fromkeys(space.trace(space.sample(rng)) for _ in range(4 * n))
    return list(out)[:n]


def _seconds(trace: Sequence[Primitive]) -> float:
    """A synthetic, deterministic time per schedule (so a stand-in model can know it exactly)."""
    return 1e-3 * (1.0 + (zlib.crc32(trace_to_json(tuple(trace)).encode()) % 997) / 100.0)


def _record(compute: Compute, trace: Sequence[Primitive], seconds: float | None = None, code: str = "OK",
            ts: float = 1.7e9, target: dict | None = None) -> MeasureRecord:
    median = (_seconds(trace) if seconds is None else seconds) if code == "OK" else None
    return MeasureRecord(workload_text=compute.text(), workload_digest=compute.digest(), trace=tuple(trace),
                         target=TARGET.to_dict() if target is None else target, error_code=code,
                         times_s=() if median is None else (median,), median_s=median, timestamp=ts,
                         constant_inputs=(), workload_key=workload_key(compute, ()))


def _dataset_dir(tmp_path, sizes=(16, 24, 32, 40, 48), per=6, renamed: bool = True):
    """Records of one matmul workload per size (the first also in other names), one failed each."""
    d = tmp_path / "ds"
    recs = []
    for m in sizes:
        c = _mm(m)
        traces = _traces(c, per + 1, seed=m)
        recs += [_record(c, tr, ts=1.7e9 + i) for i, tr in enumerate(traces[:per])]
        recs.append(_record(c, traces[per], code="COMPILE_ERROR"))
    if renamed:
        c = _mm(sizes[0], MM_RENAMED)
        recs += [_record(c, tr) for tr in _traces(c, 3, seed=99)]
    append_records(records_path(d), recs)
    return d


class OracleModel:
    """A stand-in with XGBModel's fit/predict that knows the synthetic times: ``best / time`` per group."""

    def fit(self, candidates: Sequence[Candidate], seconds: Sequence[float]) -> None:
        self.fitted = len(candidates)

    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        t = np.array([_seconds(c.trace) for c in candidates])
        return relative_speed([candidate_group(c) for c in candidates], t)


# ---- dataset -------------------------------------------------------------------------------------------


def test_load_dataset_from_a_directory(tmp_path):
    d = _dataset_dir(tmp_path)
    data = load_dataset(d)
    assert len(data) == 5 * 7 + 3
    assert data.groups == tuple(candidate_group(c) for c in data.candidates)
    assert len(set(data.workloads)) == 5 and len(set(data.groups)) == 5  # the renamed spelling joins its workload
    assert int(np.isinf(data.seconds).sum()) == 5
    ok = data.ok()
    assert len(ok) == 33 and np.isfinite(ok.seconds).all()
    for c, t in zip(ok.candidates, ok.seconds):
        assert t == _seconds(c.trace)
    s = data.summary()
    assert (s["records"], s["ok_records"], s["failed_records"], s["workloads"]) == (38, 33, 5, 5)
    assert list(s["targets"]) == [TARGET.key()] and s["time_span"][0] <= s["time_span"][1]
    groups = data.by_group()
    assert sum(len(ix) for ix in groups.values()) == len(data)
    assert all(data.groups[i] == g for g, ix in groups.items() for i in ix)
    assert load_dataset(records_path(d)) == data  # the file itself reads the same
    # a finished dataset kept gzipped (measurements.jsonl.gz) reads the same, as a file or a directory
    snap = tmp_path / "snapshot"
    snap.mkdir()
    (snap / "measurements.jsonl.gz").write_bytes(gzip.compress(records_path(d).read_bytes()))
    assert load_dataset(snap) == data and load_dataset(snap / "measurements.jsonl.gz") == data
    with pytest.raises(ValueError):
        data.seconds[0] = 1.0  # read-only


def test_repeated_candidates_merge_to_their_median(tmp_path):
    c = _mm(16)
    a, b = _traces(c, 2, seed=1)
    f = tmp_path / "m.jsonl"
    append_records(f, [_record(c, a, 1.0, ts=1), _record(c, a, 3.0, ts=5), _record(c, a, code="TIMEOUT", ts=2),
                       _record(c, a, 2.0, ts=3), _record(c, b, code="WRONG_ANSWER")])
    data = load_dataset(f, f)  # the same file twice: every measurement counts twice, the median is the same
    assert len(data) == 2
    assert data.seconds[0] == 2.0 and data.measurements[0] == 8 and data.timestamps[0] == 5
    assert math.isinf(data.seconds[1])


def test_split_never_shares_a_workload(tmp_path):
    data = load_dataset(_dataset_dir(tmp_path, sizes=(8, 16, 24, 32, 40, 48), per=3))
    for seed in range(5):
        tr, te = data.split_by_workload(0.34, seed)
        assert len(tr) + len(te) == len(data)
        assert not set(tr.workloads) & set(te.workloads)
        assert len(set(te.workloads)) == 2 and len(set(tr.workloads)) == 4
    one, other = data.split_by_workload(0.34, 3), data.split_by_workload(0.34, 3)
    assert one[0] == other[0] and one[1] == other[1]
    assert len({frozenset(data.split_by_workload(0.34, s)[1].workloads) for s in range(8)}) > 1  # seeds differ
    tr, te = data.split_by_workload(0.0)
    assert len(tr) == len(data) and len(te) == 0
    assert len(data.split_by_workload(0.99)[0]) > 0  # at least one workload stays for training
    single = data.subset([i for i, w in enumerate(data.workloads) if w == data.workloads[0]])
    with pytest.raises(ValueError, match="only one workload"):
        single.split_by_workload(0.2)
    with pytest.raises(ValueError, match="test fraction"):
        data.split_by_workload(1.0)


def test_bad_records_are_skipped_with_one_warning(tmp_path):
    c = _mm(16)
    good = [_record(c, tr) for tr in _traces(c, 3, seed=2)]
    tr = good[0].trace
    broken_text = json.loads(_record(c, tr).to_json())
    broken_text["workload"]["text"] = "in A: float32[4]\nthis is not an op"
    lines = [good[0].to_json(), "{not json", json.dumps({"some": "object"}), json.dumps(broken_text),
             _record(c, tr, target="x86").to_json(), _record(c, tr, target={"isa_flags": 3}).to_json(),
             good[1].to_json(), "", good[2].to_json()[:40]]  # ... and a truncated line in the middle
    f = tmp_path / "m.jsonl"
    f.write_text("\n".join(lines + [good[2].to_json()]) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_dataset(f)
    assert len(data) == 3
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "skipped 6 of 9 records" in msg
    assert "3 corrupt lines" in msg and "1 workloads that no longer parse" in msg and "2 unknown targets" in msg
    assert f"{f}:2" in msg  # the first corrupt line is named
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset(records_path(_dataset_dir(tmp_path)))  # a clean file warns nothing


def test_records_timed_mostly_while_pre_empted_are_skipped(tmp_path):
    """A median far above the fastest repeat (the core was taken from a thread in most repeats) says
    nothing about the schedule: such a record is skipped and counted, one with a slow outlier is kept."""
    from dataclasses import replace

    c = _mm(16)
    a, b, d = _traces(c, 3, seed=4)
    steady = replace(_record(c, a, 1e-3), times_s=(1.0e-3, 0.98e-3, 1.0e-3, 1.02e-3, 4e-3))  # one outlier
    preempted = replace(_record(c, b, 8e-3), times_s=(8e-3, 8e-3, 7e-3, 8e-3, 2.1e-3))
    once = _record(c, d, 5e-3)  # a slow candidate timed once
    f = tmp_path / "m.jsonl"
    f.write_text("".join(r.to_json() + "\n" for r in (steady, preempted, once)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_dataset(f)
    assert sorted(data.seconds.tolist()) == [1e-3, 5e-3]
    msg = str(caught[0].message)
    assert "skipped 1 of 3 records: 1 pre-empted timings" in msg and f"{f}:2" in msg and "median 8 ms" in msg


def test_tuning_database_files_load_too(tmp_path):
    canon = canonicalize(_mm(24))
    traces = _traces(canon, 4, seed=5)
    db = TuningDatabase(tmp_path / "tuning.jsonl")
    db.add([TuningRecord.of(canon, tr, TARGET, "OK", _seconds(tr)) for tr in traces[:3]]
           + [TuningRecord.of(canon, traces[3], TARGET, "TIMEOUT")])
    data = load_dataset(db.path)
    assert len(data) == 4 and int(np.isfinite(data.seconds).sum()) == 3
    # the canonical records join the measurement records of the same workload under one group
    measured_dir = _dataset_dir(tmp_path, sizes=(24, 32), per=2, renamed=False)
    measured = load_dataset(measured_dir)
    both = load_dataset(db.path, measured_dir)
    assert len(both) == len(data) + len(measured)
    assert data.groups[0] in set(measured.groups) and len(set(both.workloads)) == 2


def test_missing_paths_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such dataset"):
        load_dataset(tmp_path / "nope")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="has no measurements.jsonl"):
        load_dataset(tmp_path / "empty_dir")
    assert len(Dataset.empty()) == 0


# ---- training and evaluation (stand-in model) -----------------------------------------------------------


def test_train_and_evaluate_with_a_stand_in_model(tmp_path):
    data = load_dataset(_dataset_dir(tmp_path))
    model, report = train(data, TrainConfig(test_fraction=0.4, seed=1), make_model=OracleModel)
    assert isinstance(model, OracleModel) and model.fitted == report.train_data["records"]
    assert report.test_data["workloads"] == 2 and report.train_data["workloads"] == 3
    assert report.test is not None
    assert report.test.pairwise_accuracy == 1.0 and report.test.top_k[1] == 1.0
    assert report.test.mape == pytest.approx(0.0, abs=1e-12)
    assert report.train.records + report.test.records == 33 and report.train.failed + report.test.failed == 5
    json.dumps(report.to_dict(), allow_nan=False)
    assert "held-out workloads" in report.describe()
    whole = evaluate(OracleModel(), data)
    assert (whole.records, whole.failed, whole.pairwise_accuracy, whole.top_k[1]) == (33, 5, 1.0, 1.0)
    png = tmp_path / "scatter.png"
    plotted = scatter_plot(OracleModel(), data, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plotted.records == 33


def test_cross_validation_holds_out_every_workload_once(tmp_path):
    data = load_dataset(_dataset_dir(tmp_path))
    folds = data.folds_by_workload(3, seed=2)
    tested = [set(test.workloads) for _, test in folds]
    assert set().union(*tested) == set(data.workloads) and sum(len(t) for t in tested) == 5
    for train_set, test_set in folds:
        assert not set(train_set.workloads) & set(test_set.workloads)
        assert len(train_set) + len(test_set) == len(data)
    with pytest.raises(ValueError, match="cannot make 6 folds of 5 workloads"):
        data.folds_by_workload(6)
    cv = cross_validate(data, 3, TrainConfig(seed=2), make_model=OracleModel)
    s = cv.summary()
    assert s["folds"] == 3 and s["workloads"] == 5 and s["records"] == 33
    assert s["pairwise_accuracy"] == 1.0 and s["top1"] == 1.0 and len(s["per_fold"]) == 3
    assert "3-fold cross-validation by workload" in cv.describe()


# ---- command line ----------------------------------------------------------------------------------------


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@needs_xgb
def test_cli_train_and_eval_round_trip(tmp_path, capsys):
    d = _dataset_dir(tmp_path)
    model = tmp_path / "out" / "model.json"
    rc, out, err = _run(capsys, "costmodel", "train", "--data", str(d), "--out", str(model), "--test-fraction", "0.4",
                        "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert model.is_file() and (tmp_path / "out" / "model.eval.json").is_file()
    assert doc["test"]["workloads"] == 2 and doc["data"]["records"] == 38
    assert json.loads((tmp_path / "out" / "model.eval.json").read_text())["test"] == doc["test"]

    png = tmp_path / "eval.png"
    rc, out, err = _run(capsys, "costmodel", "eval", "--model", str(model), "--data", str(d), "--json", "--plot",
                        str(png))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["eval"]["records"] == 33 and doc["eval"]["failed"] == 5 and doc["unseen_targets"] == []
    assert 0.0 <= doc["eval"]["pairwise_accuracy"] <= 1.0 and png.read_bytes()[:4] == b"\x89PNG"

    rc, out, err = _run(capsys, "costmodel", "eval", "--model", str(model))  # no data: the saved summary
    assert rc == 0, err
    assert "held-out evaluation saved with it" in out

    rc, out, err = _run(capsys, "costmodel", "train", "--data", str(d), "--out", str(model))  # the human report
    assert rc == 0 and "test (1 held-out workloads)" in out and f"wrote {model}" in out
    rc, out, err = _run(capsys, "costmodel", "train", "--data", str(d), "--out", str(model), "--folds", "5",
                        "--test-fraction", "0", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["cross_validation"]["folds"] == 5 and doc["cross_validation"]["workloads"] == 5 and doc["test"] is None
    rc, out, err = _run(capsys, "costmodel", "train", "--data", str(d), "--out", str(model), "--folds", "9")
    assert rc == 2 and "cannot make 9 folds of 5 workloads" in err


def test_cli_missing_data_dir(tmp_path, capsys):
    rc, out, err = _run(capsys, "costmodel", "train", "--data", str(tmp_path / "nope"), "--out",
                        str(tmp_path / "m.json"))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "superopt costmodel train: error: no such dataset" in err and "nope" in err


def test_cli_dataset_without_timed_records(tmp_path, capsys):
    c = _mm(16)
    append_records(records_path(tmp_path / "ds"), [_record(c, tr, code="TIMEOUT") for tr in _traces(c, 2, seed=1)])
    rc, _, err = _run(capsys, "costmodel", "train", "--data", str(tmp_path / "ds"), "--out", str(tmp_path / "m.json"))
    assert rc == 2 and "no verified, timed records" in err and err.count("\n") == 1
    rc, _, err = _run(capsys, "costmodel", "train", "--data", str(_dataset_dir(tmp_path, sizes=(16,), renamed=False)),
                      "--out", str(tmp_path / "m.json"))
    assert rc == 2 and "only one workload" in err


@needs_xgb
def test_cli_corrupt_or_missing_model(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"format\": \"superopt-costmodel-xgb\", \"booster\": \"!!\"")  # cut short
    rc, out, err = _run(capsys, "costmodel", "eval", "--model", str(bad), "--data", str(_dataset_dir(tmp_path)))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "superopt costmodel eval: error: cannot read cost model" in err and "bad.json" in err
    import costmodel.xgb

    monkeypatch.setattr(costmodel.xgb, "pretrained_path", lambda kind="cpu": tmp_path / "none.json")
    rc, _, err = _run(capsys, "costmodel", "eval")  # the default (pretrained) model is looked up lazily
    assert rc == 2 and "no cost model file" in err and "none.json" in err
