"""Measurement records: one JSON object per line, appended to ``<dataset_dir>/measurements.jsonl``.

Each record holds the format version, the workload (IR text and digest, as measured, plus the
rename-invariant workload key of :mod:`superopt.ir.canonical`), which inputs were constants (packed
once, outside the timing), the schedule trace, the target, the timings, the error code and message,
and a timestamp. Version 1 records (before constant inputs and the workload key) still load: every
input was constant then, which ``constant_inputs=None`` says. Appends take an exclusive
``flock`` so several processes may share one file. A writer killed mid-line costs only that line:
the next append starts a line of its own, and :func:`load_records` skips unparsable lines.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from superopt.schedule.primitives import Primitive, trace_from_json, trace_to_json

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
RECORDS_FILE = "measurements.jsonl"


@dataclass(frozen=True)
class MeasureRecord:
    workload_text: str
    workload_digest: str
    trace: tuple[Primitive, ...]
    target: dict
    error_code: str  # an ErrorCode name
    error_msg: str = ""
    times_s: tuple[float, ...] = ()
    median_s: float | None = None
    build_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    source_sha256: str | None = None  # set when a hand-written kernel source replaced codegen
    constant_inputs: tuple[str, ...] | None = None  # sorted local names; None: all (version 1 records)
    workload_key: str | None = None  # superopt.ir.canonical.workload_key (None in version 1 records)
    version: int = FORMAT_VERSION

    def target_key(self) -> str:
        from superopt.target import Target

        return Target.from_dict(self.target).key()

    def to_json(self) -> str:
        return json.dumps({
            "version": self.version,
            "workload": {"text": self.workload_text, "digest": self.workload_digest, "key": self.workload_key},
            "constant_inputs": None if self.constant_inputs is None else list(self.constant_inputs),
            "trace": json.loads(trace_to_json(self.trace)),
            "target": self.target,
            "timings": {"times_s": list(self.times_s), "median_s": self.median_s, "build_s": self.build_s},
            "error_code": self.error_code,
            "error_msg": self.error_msg,
            "timestamp": self.timestamp,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.timestamp)),
            "source_sha256": self.source_sha256,
        }, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> MeasureRecord:
        version = d.get("version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"unsupported measurement record version {version!r} "
                             f"(this code reads {READABLE_VERSIONS})")
        tm = d["timings"]
        consts = d.get("constant_inputs")
        return cls(
            workload_text=d["workload"]["text"], workload_digest=d["workload"]["digest"],
            trace=trace_from_json(json.dumps(d["trace"])), target=d["target"], error_code=d["error_code"],
            error_msg=d.get("error_msg", ""), times_s=tuple(tm.get("times_s", ())),
            median_s=tm.get("median_s"), build_s=tm.get("build_s", 0.0),
            timestamp=d["timestamp"], source_sha256=d.get("source_sha256"),
            constant_inputs=None if consts is None else tuple(consts), workload_key=d["workload"].get("key"),
            version=version)


def records_path(dataset_dir: str | Path) -> Path:
    return Path(dataset_dir) / RECORDS_FILE


def append_records(path: str | Path, records: Iterable[MeasureRecord]) -> None:
    text = "".join(r.to_json() + "\n" for r in records)
    if not text:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":  # a writer was killed mid-line: that line costs only itself
                    text = "\n" + text
            f.write(text.encode("utf-8"))
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_records(path: str | Path) -> list[MeasureRecord]:
    """Read a records file back. Unparsable lines (a writer killed mid-line) are skipped, with one
    warning naming the first; every other record is kept."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    out = []
    bad: list[int] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(MeasureRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError):  # a record of an unknown version still raises
            bad.append(i + 1)
    if bad and not (len(bad) == 1 and bad[0] == len(lines)):  # a cut last line is routine: a writer in flight
        warnings.warn(f"{path}:{bad[0]}: skipped {len(bad)} corrupt measurement record line(s)", stacklevel=2)
    return out
