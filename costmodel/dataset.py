"""The cost model's training data: measurement records and tuning databases read into candidates.

:func:`load_dataset` reads JSON-lines files of either format described in ``datasets/README.md``
(measurement records of ``superopt.measure`` and tuning records of :mod:`search.schedule.database`; each
line is recognized by its shape, so one file may even mix them) into a :class:`Dataset`: one row per
distinct candidate, with its measured time (``inf`` when it failed), its group (the workload on its
target, :func:`costmodel.base.candidate_group`: what times are compared within) and its workload key.

Reading is tolerant: a line that is not a record, a workload text that no longer parses, a target
dict that is not a :class:`~superopt.target.Target` or a trace that no longer reads costs
that record only; one warning per :func:`load_dataset` call counts them. A candidate measured more
than once (same compute text, constant inputs, target and trace) becomes one row whose time is the
median of its successful measurements (``inf`` if none succeeded).
"""

from __future__ import annotations

import gzip
import json
import math
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodel.base import Candidate, candidate_group
from superopt.ir.canonical import workload_key
from superopt.ir.compute import Compute
from superopt.lang import parse_compute
from superopt.measure.records import RECORDS_FILE, MeasureRecord
from superopt.schedule.primitives import Primitive, trace_from_json
from superopt.target import Target

__all__ = ["Dataset", "RawRecord", "load_dataset", "parse_line"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """Rows of (candidate, seconds, group); ``seconds`` is ``inf`` for a failed candidate.

    ``groups`` are what times are compared within (:func:`costmodel.base.candidate_group`: the
    workload on its target), ``workloads`` the rename-invariant workload keys alone
    (:func:`superopt.ir.canonical.workload_key`, constants included; one workload measured on two
    targets is two groups but one workload). ``texts`` is the workload text as recorded (a
    measurement's own names, a tuning record's canonical names), ``timestamps`` the time of each
    row's latest measurement and ``measurements`` how many measurements were merged into the row.
    Arrays are read-only; subsets are new datasets.
    """

    candidates: tuple[Candidate, ...]
    seconds: np.ndarray
    groups: tuple[str, ...]
    workloads: tuple[str, ...]
    texts: tuple[str, ...]
    timestamps: np.ndarray
    measurements: np.ndarray

    def __post_init__(self) -> None:
        for name in ("candidates", "groups", "workloads", "texts"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, dtype in (("seconds", np.float64), ("timestamps", np.float64), ("measurements", np.int64)):
            arr = np.array(getattr(self, name), dtype=dtype).reshape(-1)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        n = len(self.candidates)
        columns = (self.seconds, self.groups, self.workloads, self.texts, self.timestamps, self.measurements)
        if any(len(col) != n for col in columns):
            raise ValueError("Dataset columns differ in length")

    def __len__(self) -> int:
        return len(self.candidates)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dataset):
            return NotImplemented
        return (self.candidates == other.candidates and self.groups == other.groups
                and self.workloads == other.workloads and self.texts == other.texts
                and np.array_equal(self.seconds, other.seconds) and np.array_equal(self.timestamps, other.timestamps)
                and np.array_equal(self.measurements, other.measurements))

    @staticmethod
    def empty() -> Dataset:
        return Dataset((), np.zeros(0), (), (), (), np.zeros(0), np.zeros(0, dtype=np.int64))

    def subset(self, indices: Sequence[int] | np.ndarray) -> Dataset:
        """The rows at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64)
        def pick(col: tuple) -> tuple:
            return tuple(col[i] for i in idx)

        return Dataset(pick(self.candidates), self.seconds[idx], pick(self.groups), pick(self.workloads),
                       pick(self.texts), self.timestamps[idx], self.measurements[idx])

    def ok(self) -> Dataset:
        """Only the verified, timed rows (finite seconds)."""
        return self.subset(np.flatnonzero(np.isfinite(self.seconds)))

    def by_group(self) -> dict[str, np.ndarray]:
        """Group (workload on target) -> the indices of its rows (workloads in order of first appearance)."""
        out: dict[str, list[int]] = {}
        for i, g in enumerate(self.groups):
            out.setdefault(g, []).append(i)
        return {g: np.array(ix, dtype=np.int64) for g, ix in out.items()}

    def folds_by_workload(self, k: int, seed: int = 0) -> list[tuple[Dataset, Dataset]]:
        """``k`` (train, test) pairs: the workloads shuffled (seeded) and dealt into ``k`` folds; each
        fold is the test side once. No workload has rows on both sides of a pair."""
        workloads = sorted(set(self.workloads))
        if not 2 <= k <= len(workloads):
            raise ValueError(f"cannot make {k} folds of {len(workloads)} workloads (need 2 <= k <= workloads)")
        np.random.default_rng(seed).shuffle(workloads)
        out = []
        for f in range(k):
            test = set(workloads[f::k])
            rows = np.array([w in test for w in self.workloads], dtype=bool)
            out.append((self.subset(np.flatnonzero(~rows)), self.subset(np.flatnonzero(rows))))
        return out

    def split_by_workload(self, test_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
        """(train, test): ``round(test_fraction * workloads)`` whole workloads, drawn at random
        (seeded), go to test; at least one each way when ``0 < test_fraction`` and there are two or
        more workloads. No workload has rows on both sides. ``test_fraction=0`` keeps all for train."""
        if not 0 <= test_fraction < 1:
            raise ValueError(f"test fraction must be in [0, 1), got {test_fraction}")
        workloads = sorted(set(self.workloads))
        if test_fraction == 0 or not workloads:
            return self, self.subset([])
        if len(workloads) < 2:
            raise ValueError("cannot hold out workloads: the dataset has only one workload "
                             "(use a test fraction of 0 to train on it all)")
        n_test = min(max(round(test_fraction * len(workloads)), 1), len(workloads) - 1)
        order = np.random.default_rng(seed).permutation(len(workloads))
        held_out = {workloads[i] for i in order[:n_test]}
        is_test = np.array([w in held_out for w in self.workloads], dtype=bool)
        return self.subset(np.flatnonzero(~is_test)), self.subset(np.flatnonzero(is_test))

    def target_keys(self) -> list[str]:
        """The distinct targets' keys, sorted."""
        return sorted({c.target.key() for c in self.candidates})

    def summary(self) -> dict:
        """Counts (rows, measurements merged into them, ok and failed rows, workloads, groups), the targets
        (key -> description) and the time span of the rows' latest measurements (UTC, ISO 8601)."""
        ok = int(np.isfinite(self.seconds).sum())
        targets = {}
        for c in self.candidates:
            targets.setdefault(c.target.key(), c.target.describe())
        span = None
        if len(self):
            span = [_utc(float(self.timestamps.min())), _utc(float(self.timestamps.max()))]
        return {"records": len(self), "measurements": int(self.measurements.sum()), "ok_records": ok,
                "failed_records": len(self) - ok, "workloads": len(set(self.workloads)),
                "groups": len(set(self.groups)),
                "targets": dict(sorted(targets.items())), "time_span": span}


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# ---- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawRecord:
    """One line of either file format, reduced to what a dataset row needs (not yet parsed)."""

    workload_text: str
    constant_inputs: tuple[str, ...] | None  # None: every input (version 1 measurement records)
    trace: tuple[Primitive, ...]
    target: dict
    seconds: float  # inf unless verified and timed
    timestamp: float


def _seconds(error_code: str, median_s: object) -> float:
    if error_code != "OK" or median_s is None:
        return math.inf
    if isinstance(median_s, bool) or not isinstance(median_s, (int, float)) or not (0 < median_s < math.inf):
        raise ValueError(f"bad median_s {median_s!r}")
    return float(median_s)


# A CPU measurement whose median repeat is this much slower than its fastest was pre-empted in most repeats
# (another process, or the hypervisor, took a core from one of its threads, and every parallel region then
# waits for that thread): its median says more about the machine's load than about the schedule (a kernel
# of a fraction of a millisecond can read as several milliseconds in most of its repeats). Each CPU
# repeat averages at least 20 ms of calls, so its own jitter is far below this. (GPU records are left
# alone: their repeats are a few timed launches, and no OpenMP thread waits on a pre-empted one.)
PREEMPTED_RATIO = 1.5


class PreemptedTiming(ValueError):
    """A CPU measurement record whose repeats were mostly pre-empted (:data:`PREEMPTED_RATIO`)."""


def _from_measurement(d: dict) -> RawRecord:
    r = MeasureRecord.from_dict(d)
    seconds = _seconds(r.error_code, r.median_s)
    if math.isfinite(seconds) and len(r.times_s) > 1 and seconds > PREEMPTED_RATIO * min(r.times_s) \
            and r.target.get("kind", "cpu") == "cpu":
        raise PreemptedTiming(f"median {seconds * 1e3:.3g} ms, fastest repeat {min(r.times_s) * 1e3:.3g} ms")
    return RawRecord(r.workload_text, r.constant_inputs, r.trace, r.target, seconds, float(r.timestamp))


def _from_tuning(d: dict) -> RawRecord:
    # search.schedule.database.TuningRecord's layout, read here without importing the search package
    if d.get("version") != 1:
        raise ValueError(f"unsupported tuning record version {d.get('version')!r}")
    consts = tuple(str(c) for c in d.get("constant_inputs", ()))
    return RawRecord(str(d["workload"]), consts, trace_from_json(json.dumps(d["trace"])), d["target"],
                     _seconds(str(d["error_code"]), d.get("median_s")), float(d["timestamp"]))


def parse_line(line: str) -> RawRecord:
    """A record of either format; raises (anything) on a line that is neither."""
    d = json.loads(line)
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    if isinstance(d.get("workload"), dict):
        return _from_measurement(d)
    if isinstance(d.get("workload"), str) and "workload_key" in d:
        return _from_tuning(d)
    raise ValueError("neither a measurement record nor a tuning record")


def _records_file(path: Path) -> Path:
    """The records file of a path: itself, or a directory's ``measurements.jsonl`` (or its gzipped
    snapshot ``measurements.jsonl.gz``, how finished datasets are kept in the repository)."""
    if path.is_dir():
        for f in (path / RECORDS_FILE, path / (RECORDS_FILE + ".gz")):
            if f.is_file():
                return f
        raise FileNotFoundError(f"dataset directory {path} has no {RECORDS_FILE}")
    if not path.exists():
        raise FileNotFoundError(f"no such dataset: {path}")
    return path


class _Skips:
    """Counts skipped records by reason, remembering the first example of each."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}

    def add(self, reason: str, where: str, err: BaseException) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        first_line = (str(err).strip().splitlines() or [""])[0]
        self.first.setdefault(reason, f"{where}: {type(err).__name__}: {first_line[:120]}")

    def warn(self, total: int) -> None:
        n = sum(self.counts.values())
        if not n:
            return
        parts = "; ".join(f"{c} {reason} (first: {self.first[reason]})" for reason, c in self.counts.items())
        warnings.warn(f"skipped {n} of {total} records: {parts}", stacklevel=3)


def _read_lines(path: Path, skips: _Skips) -> Iterator[tuple[str, RawRecord]]:
    """(``file:line``, record) for every readable line; unreadable ones are counted in ``skips``."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    for i, line in enumerate(raw.decode("utf-8", errors="replace").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            record = parse_line(line)
        except PreemptedTiming as e:
            skips.add(f"pre-empted timings (median over {PREEMPTED_RATIO}x the fastest repeat)", where, e)
            continue
        except Exception as e:  # noqa: BLE001 - whatever is wrong with one line costs that line only
            skips.add("corrupt lines", where, e)
            continue
        yield where, record


class _Builder:
    """Turns raw records into candidates, caching parsed computes, targets and keys."""

    def __init__(self) -> None:
        self.computes: dict[str, Compute | Exception] = {}
        self.targets: dict[str, tuple[Target, str]] = {}
        self.workloads: dict[tuple[str, tuple[str, ...]], tuple[frozenset[str], str]] = {}
        self.groups: dict[tuple[str, tuple[str, ...], str], str] = {}

    def compute(self, text: str) -> Compute:
        if text not in self.computes:
            try:
                self.computes[text] = parse_compute(text)
            except Exception as e:  # noqa: BLE001 - the language changed: the record no longer applies
                self.computes[text] = e
        got = self.computes[text]
        if isinstance(got, Exception):
            raise got
        return got

    def workload(self, text: str, compute: Compute, consts: tuple[str, ...] | None) -> tuple[frozenset[str], str]:
        """(constant inputs, workload key); version 1 records held every input constant."""
        names = tuple(sorted(compute.inputs if consts is None else consts))
        k = (text, names)
        if k not in self.workloads:
            self.workloads[k] = (frozenset(names), workload_key(compute, names))
        return self.workloads[k]

    def target(self, d: object) -> tuple[Target, str]:
        """The target and its key (a dict of the wrong types fails here, not later)."""
        if not isinstance(d, dict):
            raise TypeError(f"target is a {type(d).__name__}, not a dict")
        k = json.dumps(d, sort_keys=True, default=str)
        if k not in self.targets:
            target = Target.from_dict(d)
            self.targets[k] = (target, target.key())
        return self.targets[k]

    def group(self, cand: Candidate, text: str, target_key: str) -> str:
        k = (text, tuple(sorted(cand.constant_inputs)), target_key)
        if k not in self.groups:
            self.groups[k] = candidate_group(cand)
        return self.groups[k]


@dataclass
class _Row:
    candidate: Candidate
    group: str
    workload: str
    text: str
    times: list[float]
    timestamp: float
    count: int = 1


_RowKey = tuple[str, tuple[str, ...], str, tuple[Primitive, ...]]  # text, constants, target key, trace


def _rows(records: Iterable[tuple[str, RawRecord]], skips: _Skips) -> Iterator[tuple[_RowKey, _Row]]:
    builder = _Builder()
    for where, r in records:
        try:
            compute = builder.compute(r.workload_text)
            consts, workload = builder.workload(r.workload_text, compute, r.constant_inputs)
        except Exception as e:  # noqa: BLE001
            skips.add("workloads that no longer parse", where, e)
            continue
        try:
            target, target_key = builder.target(r.target)
        except Exception as e:  # noqa: BLE001
            skips.add("unknown targets", where, e)
            continue
        cand = Candidate(compute, tuple(r.trace), target, consts)
        group = builder.group(cand, r.workload_text, target_key)
        key = (r.workload_text, tuple(sorted(consts)), target_key, cand.trace)
        yield key, _Row(cand, group, workload, r.workload_text, [r.seconds], r.timestamp)


def _merge(rows: Iterable[tuple[_RowKey, _Row]]) -> list[_Row]:
    merged: dict[_RowKey, _Row] = {}
    for key, row in rows:
        seen = merged.get(key)
        if seen is None:
            merged[key] = row
        else:
            seen.times.extend(row.times)
            seen.timestamp = max(seen.timestamp, row.timestamp)
            seen.count += 1
    return list(merged.values())


def _row_seconds(times: list[float]) -> float:
    ok = [t for t in times if math.isfinite(t)]
    return float(np.median(ok)) if ok else math.inf


def load_dataset(*paths: str | Path) -> Dataset:
    """Read measurement-record and tuning-database files (or dataset directories holding
    ``measurements.jsonl``) into one :class:`Dataset`, merging repeated candidates across all of them.

    Raises ``FileNotFoundError`` for a path that does not exist (or a directory without records);
    bad records are skipped with one warning that counts them."""
    if not paths:
        raise ValueError("no dataset given")
    files = [_records_file(Path(p)) for p in paths]
    skips = _Skips()
    lines = [rec for f in files for rec in _read_lines(f, skips)]
    total = len(lines) + sum(skips.counts.values())  # lines skipped while reading count in the total
    rows = _merge(_rows(lines, skips))
    skips.warn(total)
    if not rows:
        return Dataset.empty()
    return Dataset(tuple(r.candidate for r in rows), np.array([_row_seconds(r.times) for r in rows]),
                   tuple(r.group for r in rows), tuple(r.workload for r in rows), tuple(r.text for r in rows),
                   np.array([r.timestamp for r in rows]), np.array([r.count for r in rows], dtype=np.int64))
