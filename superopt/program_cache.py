"""Whole compiled programs on disk, so a second ``optimize`` of the same model only loads.

An entry is an artifact directory (superopt.artifact: graph, schedules, the kernels' library, the report with
the verification's error, every file under a checksum) plus the kernels' C sources as printed, so that loading
neither lowers nor compiles. It lives under ``<compiler cache_dir>/programs/<key>``, where the key digests all
that decides the program: the model file's bytes, the example inputs, the whole ``OptimizeConfig`` (target and
compiler flags included), the C compiler's version, the tuning database's bytes, and the source and data
files of superopt, search, costmodel and rewrite_rules (a changed rule or printer keys a new entry, never a
stale program). A program is stored only after it passed verification; the checksums make a corrupt or
edited entry a miss (it is compiled again and replaced), never a wrong program.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import asdict, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from superopt.artifact import ArtifactError, read_manifest, save_executor
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.target import compiler_version

_REPO = Path(__file__).resolve().parent.parent
_PACKAGES = ("superopt", "search", "costmodel", "rewrite_rules")


@lru_cache(maxsize=1)
def code_version() -> str:
    """Digest of every source and data file of the packages that shape a compiled program."""
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        root = _REPO / pkg
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so"):
                h.update(str(p.relative_to(_REPO)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def _bytes_digest(model: Any) -> str | None:
    """The model's bytes (a file path, bytes, or a ModelProto), digested; None for anything else."""
    if isinstance(model, (bytes, bytearray)):
        data = bytes(model)
    elif isinstance(model, (str, Path)):
        try:
            return file_digest(Path(model))
        except OSError:
            return None  # the loader names the missing file
    elif type(model).__name__ == "ModelProto":
        data = model.SerializeToString()
    else:
        return None
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file, read in blocks (a model's weights are not held in memory twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _examples_digest(example_inputs: Any) -> str:
    h = hashlib.sha256()

    def add(v: Any) -> None:
        if hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        if isinstance(v, np.ndarray):
            h.update(f"array{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, Mapping):
            for k in sorted(v):
                h.update(f"key{k!r}".encode())
                add(v[k])
        elif isinstance(v, (list, tuple)):
            h.update(f"seq{len(v)}".encode())
            for x in v:
                add(x)
        else:
            h.update(repr(v).encode())

    add(example_inputs)
    return h.hexdigest()


def program_key(model: Any, example_inputs: Any, config: Any) -> str | None:
    """The cache key of ``optimize(model, example_inputs, config)``, or None when the result is not cached:
    a model that is not ONNX bytes or a file, or a config that measures (a schedule search's results
    depend on the time it gets)."""
    if config.budget_s is not None or config.tune_trials is not None or not config.verify:
        return None
    model_digest = _bytes_digest(model)
    if model_digest is None:
        return None
    target = config.resolved_target()
    fields = asdict(replace(config, progress=False))
    h = hashlib.sha256()
    for part in (model_digest, _examples_digest(example_inputs), repr(sorted(fields.items())),
                 json.dumps(target.to_dict(), sort_keys=True, default=str), compiler_version(config.compiler.cc),
                 code_version()):
        h.update(part.encode())
        h.update(b"\0")
    if config.database is not None and Path(config.database).exists():
        h.update(file_digest(Path(config.database)).encode())
    return h.hexdigest()[:40]


def entry_dir(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / "programs" / key


def store(directory: Path, executor: GraphExecutor, report: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write a verified program as a cache entry (atomically, replacing any older one); a cache that cannot
    be written (a full disk, no permission) is no error: the program is just not kept."""
    sources = [k.source for k in executor.kernels]
    try:
        save_executor(executor, directory, report=report,
                      extra_files={"program.json": json.dumps(meta).encode(),
                                   "sources.pkl": pickle.dumps(sources, protocol=pickle.HIGHEST_PROTOCOL)})
    except (ArtifactError, OSError):
        return
    evict(directory.parent, keep=directory)


# the programs kept under one compiler cache, in bytes: past it, the least recently used entries go
MAX_BYTES = 4 << 30


def evict(root: Path, keep: Path | None = None, max_bytes: int = MAX_BYTES) -> list[Path]:
    """Remove the least recently used entries under ``root`` until they hold at most ``max_bytes`` (``keep``
    stays); returns the removed ones."""
    import shutil

    entries = []
    for d in root.iterdir():
        if d.is_dir() and not d.name.startswith("."):
            try:
                entries.append((d.stat().st_mtime, sum(f.stat().st_size for f in d.rglob("*") if f.is_file()), d))
            except OSError:
                continue
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, d in sorted(entries):
        if total <= max_bytes:
            break
        if keep is not None and d == keep:
            continue
        shutil.rmtree(d, ignore_errors=True)
        total -= size
        removed.append(d)
    return removed


def fetch(directory: Path, phases=None) -> tuple[GraphExecutor, dict[str, Any], dict[str, Any]] | None:
    """The cached program at ``directory`` (executor, report, meta), or None when there is none or it fails
    its checksums."""
    if not (directory / "manifest.json").exists():
        return None
    try:
        read_manifest(directory)
        with open(directory / "program.pkl", "rb") as f:
            program = pickle.load(f)
        with open(directory / "sources.pkl", "rb") as f:
            sources = pickle.load(f)
        report = json.loads((directory / "report.json").read_text())
        meta = json.loads((directory / "program.json").read_text())
    except (ArtifactError, OSError, ValueError, pickle.UnpicklingError, EOFError, KeyError):
        return None
    try:
        os.utime(directory)  # recently used: the last to be evicted
    except OSError:
        pass
    target = program["target"]
    compiler = replace(program["compiler"], cache_dir=directory / "kernels")
    executor = GraphExecutor(program["graph"], {n: _trace(t) for n, t in
                                                json.loads((directory / "schedules.json").read_text()).items()},
                             ExecutorConfig(target.threads, compiler, target), phases, sources)
    return executor, report, meta


def _trace(doc: Any) -> list:
    from superopt.schedule.primitives import trace_from_json

    return trace_from_json(json.dumps(doc))


__all__ = ["code_version", "program_key", "entry_dir", "store", "fetch", "evict"]
