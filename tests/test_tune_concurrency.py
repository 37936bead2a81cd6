"""Durable shared state: two `superopt tune` runs sharing one compile cache and one tuning database
both complete and every record is readable; a run killed with SIGKILL mid-way leaves a database and cache the
next run uses."""

import json
import os
import signal
import subprocess
import sys
import time
import warnings

from search.schedule.database import TuningDatabase

OPS = [("C[i,j] += A[i,k] * B[k,j]", ["A=24x40", "B=40x32"]), ("Y[i,j] = max(X[i,j] * 2.0, 0.0) + X[i,j]", ["X=48x40"])]


def _tune(op, shapes, db, home, trials=6, **kw):
    cmd = [sys.executable, "-m", "superopt.cli", "tune", "--op", op, "--trials", str(trials), "--db", str(db),
           "--threads", "1", "--no-progress", "--no-cost-model", "--json"]
    for s in shapes:
        cmd += ["--shape", s]
    env = {**os.environ, "HOME": str(home)}  # the compile cache lives under ~/.cache/superopt
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)


def _readable(db):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a corrupt line would warn
        return TuningDatabase(db).records()


def test_two_concurrent_tunes_share_cache_and_database(tmp_path):
    db = tmp_path / "db.jsonl"
    procs = [_tune(op, shapes, db, tmp_path) for op, shapes in OPS]
    outs = [p.communicate(timeout=600) for p in procs]
    measured = 0
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        measured += json.loads(out)["measured"]
    records = _readable(db)
    assert len({r.workload_key for r in records}) == 2
    assert len(records) == measured  # every measurement of both runs, none lost or torn
    assert any((tmp_path / ".cache" / "superopt" / "kernels").glob("*.so"))


def test_a_tune_killed_mid_way_leaves_usable_state(tmp_path):
    db = tmp_path / "db.jsonl"
    op, shapes = OPS[0]
    p = _tune(op, shapes, db, tmp_path, trials=200)
    deadline = time.time() + 300
    while time.time() < deadline and (not db.exists() or db.stat().st_size == 0):
        time.sleep(0.2)
    time.sleep(1.0)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    before = _readable(db)
    assert before, "the killed run wrote nothing before it died"
    q = _tune(op, shapes, db, tmp_path, trials=len(before) + 4)
    out, err = q.communicate(timeout=600)
    assert q.returncode == 0, err[-2000:]
    after = _readable(db)
    assert len(after) >= len(before) and {r.workload_key for r in after} == {r.workload_key for r in before}
