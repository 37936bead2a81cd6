"""The tuning database: every measured schedule candidate, keyed by (workload key, target key).

One JSON object per line (:class:`TuningRecord`). Workloads are rename-invariant
(:func:`superopt.ir.canonical.workload_key`: the canonical compute plus which inputs are constants),
and traces are stored in the canonical compute's names, so a record written for one spelling of an
op applies to every other spelling of it. :func:`schedules_from_database` is the database schedule
pass of the pipeline: it takes a graph whose kernels were canonicalized
(:func:`superopt.ir.canonical.canonicalize_kernels`).

Writes are safe for concurrent writers in several processes: :meth:`TuningDatabase.add` takes an
exclusive ``flock``, appends all its lines with one ``write`` and ``fsync``s before unlocking.
Readers never raise on a bad file: a corrupt line anywhere is skipped with a warning naming the file
and line, and the other records are kept. A line cut short by a killed writer is completed with a
newline by the next writer, so it costs only itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from superopt.ir.canonical import canonicalize, workload_key
from superopt.ir.compute import Compute
from superopt.ir.graph import Graph
from superopt.schedule.graph_defaults import constant_inputs
from superopt.schedule.primitives import Primitive, trace_from_json, trace_to_json
from superopt.target import Target

DATABASE_VERSION = 1


@dataclass(frozen=True)
class TuningRecord:
    """One measured candidate: the workload (canonical), the target, the trace and its result."""

    workload_key: str
    workload_text: str  # the canonical compute (``Compute.text()``; ``superopt.lang.parse_compute`` reads it)
    target_key: str
    target: dict
    trace: tuple[Primitive, ...]  # in the canonical compute's stage and loop names
    error_code: str  # an ErrorCode name; "OK" when the candidate was verified and timed
    median_s: float | None = None
    constant_inputs: tuple[str, ...] = ()  # canonical input names bound to constants
    timestamp: float = field(default_factory=time.time)
    version: int = DATABASE_VERSION
    # a confirmation measurement: the default schedule's time measured next to this one, in the same round
    # (seconds; the default's own confirmation record carries its own time)
    paired_default_s: float | None = None
    # measured inside the whole graph (search/graph/confirm.py: the node's time in a per-node run of the graph,
    # per instance), not as a kernel alone; always a paired record
    in_graph: bool = False

    @property
    def ok(self) -> bool:
        return self.error_code == "OK" and self.median_s is not None

    @staticmethod
    def of(compute: Compute, trace: Sequence[Primitive], target: Target, error_code: str,
           median_s: float | None = None, constants: Iterable[str] = (), timestamp: float | None = None,
           paired_default_s: float | None = None, in_graph: bool = False) -> TuningRecord:
        """A record for a canonical ``compute`` (traces are only meaningful in its names)."""
        if canonicalize(compute) != compute:
            raise ValueError("tuning records hold canonical computes and traces: canonicalize the compute "
                             "(superopt.ir.canonical) before scheduling and measuring it")
        consts = tuple(sorted(constants))
        return TuningRecord(workload_key(compute, consts), compute.text(), target.key(), target.to_dict(),
                            tuple(trace), error_code, median_s if error_code == "OK" else None, consts,
                            time.time() if timestamp is None else timestamp,
                            paired_default_s=paired_default_s if error_code == "OK" else None,
                            in_graph=in_graph and error_code == "OK" and paired_default_s is not None)

    def to_json(self) -> str:
        d = {
            "version": self.version, "workload_key": self.workload_key, "workload": self.workload_text,
            "target_key": self.target_key, "target": self.target, "trace": json.loads(trace_to_json(self.trace)),
            "error_code": self.error_code, "median_s": self.median_s,
            "constant_inputs": list(self.constant_inputs), "timestamp": self.timestamp,
        }
        if self.paired_default_s is not None:
            d["paired_default_s"] = self.paired_default_s
        if self.in_graph:
            d["in_graph"] = True
        return json.dumps(d, sort_keys=True)

    @staticmethod
    def from_json(line: str) -> TuningRecord:
        d = json.loads(line)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if d.get("version") != DATABASE_VERSION:
            raise ValueError(f"unsupported tuning record version {d.get('version')!r}")
        median, paired = d["median_s"], d.get("paired_default_s")
        for name, v in (("median_s", median), ("paired_default_s", paired)):
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"bad {name} {v!r}")
        return TuningRecord(str(d["workload_key"]), str(d["workload"]), str(d["target_key"]), dict(d["target"]),
                            trace_from_json(json.dumps(d["trace"])), str(d["error_code"]),
                            None if median is None else float(median),
                            tuple(str(c) for c in d["constant_inputs"]), float(d["timestamp"]),
                            paired_default_s=None if paired is None else float(paired),
                            in_graph=bool(d.get("in_graph", False)) and paired is not None)


def _target_key(target: Target | str) -> str:
    return target if isinstance(target, str) else target.key()


# the least gain (1 - median paired ratio) for which a schedule confirmed next to the default replaces it:
# ratios are medians of a few alternating rounds on a shared machine, within 1-3% of 1 for a schedule no
# faster, so a smaller confirmed gain is as likely noise as a real one
MIN_GAIN = 0.02


class TuningDatabase:
    """A JSON-lines file of :class:`TuningRecord`; reads pick up what other processes appended."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0  # bytes of the file already read (always just after a newline)
        self._lines = 0  # lines already read (for warnings)
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file read
        self._by_key: dict[tuple[str, str], list[TuningRecord]] = {}
        self._all: list[TuningRecord] = []

    # ---- writing -----------------------------------------------------------------------------
    def add(self, records: Iterable[TuningRecord]) -> None:
        """Append ``records`` atomically: one locked write, flushed to disk before the lock is released."""
        data = "".join(r.to_json() + "\n" for r in records).encode()
        if not data:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # a writer died mid-line: end that line, keep ours whole
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ---- reading -----------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Read what was appended since the last call (everything, if the file was replaced)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._identity is not None:
                self._reset()
            return
        identity = (st.st_dev, st.st_ino)
        if identity != self._identity or st.st_size < self._offset:
            self._reset()
            self._identity = identity
        if st.st_size == self._offset:
            return
        with open(self.path, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            try:
                f.seek(self._offset)
                chunk = f.read()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        end = chunk.rfind(b"\n") + 1  # an unfinished last line waits for its newline
        for raw in chunk[:end].split(b"\n")[:-1]:
            self._lines += 1
            if not raw.strip():
                continue
            try:
                rec = TuningRecord.from_json(raw.decode("utf-8"))
            except Exception as e:  # noqa: BLE001 - whatever is wrong with one line costs that line only
                warnings.warn(f"{self.path}:{self._lines}: skipping corrupt tuning record ({type(e).__name__}: "
                              f"{str(e)[:120]})", stacklevel=3)
                continue
            self._all.append(rec)
            self._by_key.setdefault((rec.workload_key, rec.target_key), []).append(rec)
        self._offset += end

    def _reset(self) -> None:
        self._offset = self._lines = 0
        self._identity = None
        self._by_key = {}
        self._all = []

    def records(self, workload_key: str | None = None, target: Target | str | None = None) -> list[TuningRecord]:
        """Every record, or those for one workload key and/or target, in file order."""
        self._refresh()
        if workload_key is not None and target is not None:
            return list(self._by_key.get((workload_key, _target_key(target)), ()))
        tk = None if target is None else _target_key(target)
        return [r for r in self._all if (workload_key is None or r.workload_key == workload_key)
                and (tk is None or r.target_key == tk)]

    def best(self, workload_key: str, target: Target | str) -> TuningRecord | None:
        """The fastest verified (OK) schedule for this workload on this target, or None.

        A schedule measured more than once counts with the median of its measurements, so one lucky
        reading on a noisy machine does not make it the best; the record returned carries that median.
        Where the tuner confirmed its leaders (records with ``paired_default_s``: each leader measured next
        to the default, round after round), the best is chosen among the confirmed schedules alone, by the
        median of their time ratios to the default in the same rounds, times the default's median time
        there: a machine whose speed drifts between minutes moves both sides of each ratio. Where schedules
        were also measured inside the whole graph (``in_graph`` records, paired with the default there), the
        best is chosen among those alone, the same way: a kernel timed alone keeps its constants in the
        caches, and a gain there need not survive in the graph."""
        self._refresh()
        by_trace: dict[tuple, list[TuningRecord]] = {}
        paired: dict[tuple, list[TuningRecord]] = {}
        in_graph: dict[tuple, list[TuningRecord]] = {}
        for r in self._by_key.get((workload_key, _target_key(target)), ()):
            if r.ok:
                if r.in_graph:
                    in_graph.setdefault(r.trace, []).append(r)
                    continue
                by_trace.setdefault(r.trace, []).append(r)
                if r.paired_default_s is not None:
                    paired.setdefault(r.trace, []).append(r)
        if not by_trace and not in_graph:
            return None
        paired = in_graph or paired
        if paired:
            scale = float(np.median([r.paired_default_s for rs in paired.values() for r in rs]))
            # the default's own paired records carry its own time (ratio 1): where it was measured, another
            # schedule replaces it only when faster by more than MIN_GAIN
            has_default = any(_is_default(rs) for rs in paired.values())
            scored = [(scale * ratio, rs[-1].timestamp, rs[-1])
                      for rs in paired.values() for ratio in [_median_ratio(rs)]
                      if not has_default or _is_default(rs) or ratio < 1.0 - MIN_GAIN]
        else:
            scored = [(float(np.median([r.median_s for r in rs])), rs[-1].timestamp, rs[-1]) for rs in by_trace.values()]
        median, _, rec = min(scored, key=lambda x: (x[0], x[1]))
        return replace(rec, median_s=median)

    def confirmed_alone(self, workload_key: str, target: Target | str) -> list[tuple[float, TuningRecord]]:
        """The schedules the tuner confirmed next to the default kernel-alone (``paired_default_s``, not in the
        graph), fastest first, each with the median of its time ratios to the default (below 1: faster):
        the runner-ups the in-graph confirmation tries where the best one lost inside the graph."""
        self._refresh()
        paired: dict[tuple, list[TuningRecord]] = {}
        for r in self._by_key.get((workload_key, _target_key(target)), ()):
            if r.ok and r.paired_default_s is not None and not r.in_graph:
                paired.setdefault(r.trace, []).append(r)
        ranked = [(_median_ratio(rs), rs[-1]) for rs in paired.values()]
        return sorted(ranked, key=lambda x: x[0])

    def measured(self, workload_key: str, target: Target | str) -> int:
        """How many candidates (any outcome) were measured for this workload on this target."""
        self._refresh()
        return len(self._by_key.get((workload_key, _target_key(target)), ()))

    def __len__(self) -> int:
        self._refresh()
        return len(self._all)


def _is_default(records: list[TuningRecord]) -> bool:
    """Paired records of the default schedule itself (each carries its own time as the default's)."""
    return all(r.median_s == r.paired_default_s for r in records)


def _median_ratio(records: list[TuningRecord]) -> float:
    """The median of paired records' time ratios to the default measured beside them (below 1: faster)."""
    return float(np.median([r.median_s / r.paired_default_s for r in records]))


def node_workload_key(graph: Graph, node_name: str) -> str:
    """The workload key of one compute node (its op plus which of its inputs are graph constants)."""
    node = next(n for n in graph.nodes if n.name == node_name)
    return workload_key(node.op, constant_inputs(graph, node))


def schedules_from_database(graph: Graph, target: Target, db: TuningDatabase, check: bool = True
                            ) -> tuple[dict[str, list[Primitive]], list[str]]:
    """The database schedule pass: node name -> the best recorded trace for the target, for every
    compute node that has one, and the names of those nodes. Callers schedule the rest themselves
    (``superopt.schedule.graph_defaults.default_schedules``).

    ``graph``'s kernels must be canonical (``canonicalize_kernels``): records hold canonical traces.
    With ``check``, a recorded trace that no longer lowers (the code generator changed since it was
    measured) is passed over with a warning rather than returned.
    """
    from superopt.schedule.plan import ScheduleError, lower

    out: dict[str, list[Primitive]] = {}
    hits: list[str] = []
    for n in graph.nodes:
        if n.is_extern:
            continue
        if canonicalize(n.op) != n.op:
            raise ValueError(f"node {n.name!r} has a non-canonical compute: run canonicalize_kernels(graph) first")
        rec = db.best(workload_key(n.op, constant_inputs(graph, n)), target)
        if rec is None:
            continue
        if check:
            try:
                lower(n.op, rec.trace, target)
            except ScheduleError as e:
                warnings.warn(f"{db.path}: the recorded schedule for node {n.name!r} no longer lowers ({e}); "
                              "it is scheduled by default", stacklevel=2)
                continue
        out[n.name] = list(rec.trace)
        hits.append(n.name)
    return out, hits


__all__ = ["DATABASE_VERSION", "TuningDatabase", "TuningRecord", "node_workload_key", "schedules_from_database"]
