"""``superopt.op(text, tune=..., database=...)``: a new shape is tuned on its first call within the budget given,
the program stays verified, its measurements land in the database, and another process loads the shape's
record from it instead of tuning again; bad values are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import superopt
from superopt.user_op import tune_budget

MM = "C[i,j] += A[i,k] * B[k,j]"
REPO = Path(__file__).resolve().parents[1]


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 16)).astype(np.float32)


def test_a_tuned_shape_is_verified_recorded_and_loaded_by_another_process(tmp_path):
    db = tmp_path / "ops.jsonl"
    mm = superopt.op(MM, tune=4, database=db, threads=1)
    A, B = _inputs()
    np.testing.assert_allclose(mm(A, B), A @ B, rtol=1e-4, atol=1e-4)
    (report,) = mm.reports.values()
    assert report.tune["measured"] >= 4 and report.from_database == 1  # tuned, then scheduled from its records
    records = [json.loads(line) for line in db.read_text().splitlines()]
    assert len(records) == report.tune["measured"]
    # a second process with the same database loads the record: nothing is measured again
    code = ("import json, numpy as np, superopt\n"
            f"mm = superopt.op({MM!r}, tune=4, database={str(db)!r}, threads=1)\n"
            "rng = np.random.default_rng(1)\n"
            "A, B = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 16)).astype(np.float32)\n"
            "err = float(np.abs(mm(A, B) - A @ B).max())\n"
            "(r,) = mm.reports.values()\n"
            "print(json.dumps({'err': err, 'measured': r.tune['measured'], 'from_database': r.from_database}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["measured"] == 0 and got["from_database"] == 1 and got["err"] < 1e-3
    assert len(db.read_text().splitlines()) == len(records)


def test_a_database_alone_is_read_and_not_written(tmp_path):
    db = tmp_path / "ops.jsonl"
    A, B = _inputs()
    superopt.op(MM, tune=3, database=db, threads=1)(A, B)
    before = db.read_text()
    mm = superopt.op(MM, database=db, threads=1)
    np.testing.assert_allclose(mm(A, B), A @ B, rtol=1e-4, atol=1e-4)
    (report,) = mm.reports.values()
    assert report.tune is None and report.from_database == 1 and db.read_text() == before


def test_a_time_budget_is_kept(tmp_path):
    budget = 8.0
    mm = superopt.op(MM, tune=budget, database=tmp_path / "ops.jsonl", threads=1)
    A, B = _inputs()
    t0 = time.perf_counter()
    C = mm(A, B)
    elapsed = time.perf_counter() - t0
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)
    (report,) = mm.reports.values()
    assert report.tune["measured"] >= 1
    assert elapsed <= budget, f"first call took {elapsed:.1f}s with tune={budget}"


@pytest.mark.parametrize("tune, why", [(0, "at least 1"), (-3, "at least 1"), (True, "bad tune=True"),
                                       ("soon", "bad tune 'soon'"), (-2.0, "positive"), (float("nan"), "positive"),
                                       ([4], r"bad tune=\[4\]")])
def test_bad_tune_values_are_one_line_errors(tune, why):
    with pytest.raises(ValueError, match=why) as e:
        superopt.op(MM, tune=tune)
    assert "\n" not in str(e.value)


def test_bad_database_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="bad database") as e:
        superopt.op(MM, database=tmp_path)
    assert "\n" not in str(e.value)


def test_tune_budget_reads_counts_seconds_and_times():
    assert tune_budget(None) == (None, None)
    assert tune_budget(16) == (16, None)
    assert tune_budget(2.5) == (None, 2.5)
    assert tune_budget("2m") == (None, 120.0)
