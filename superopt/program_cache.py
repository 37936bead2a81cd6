"""Whole compiled programs on disk, so a second ``optimize`` of the same model only loads.

An entry is an artifact directory (superopt.artifact: graph, schedules, the kernels' library, the report with
the verification's error, every file under a checksum) plus the kernels' C sources as printed, so that loading
neither lowers nor compiles. It lives under ``<compiler cache_dir>/programs/<key>``, where the key digests all
that decides the program: the model file's bytes, the example inputs, the whole ``OptimizeConfig`` (target and
compiler flags included), the C compiler's version, the tuning database's bytes, and the source and data
files of superopt, search, costmodel and rewrite_rules (a changed rule or printer keys a new entry, never a
stale program). A program is stored only after it passed verification: its large files are written (staged,
:func:`stage`) while the verification waits for its reference, and put in place with its report
(:func:`commit`) once it passed, or removed. The checksums make a corrupt or edited entry a miss (it is
compiled again and replaced), never a wrong program.

A hit only loads, and loading reads no weight byte it does not need: the weights are mapped
(superopt.runtime.array_file) with their packed copies, and the checksums of a model file and of an entry's
files are computed once and remembered by the files' identity (device, inode, size, and the nanosecond
modification and change times, which any write moves; ``stat_digests``), as git's index remembers a file's
hash. An entry's files are checked in full again when any of them differs from what was remembered.
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

from superopt.artifact import ArtifactError, StagedArtifact, read_manifest, read_program, stage_executor
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


def _bytes_digest(model: Any, memo: Path | None = None) -> str | None:
    """The model's bytes (a file path, bytes, or a ModelProto), digested; None for anything else. ``memo``: where
    a file's digest is remembered by its identity (:func:`remembered_digest`)."""
    if isinstance(model, (bytes, bytearray)):
        data = bytes(model)
    elif isinstance(model, (str, Path)):
        try:
            return file_digest(Path(model)) if memo is None else remembered_digest(Path(model), memo)
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


# where the digests of model files are remembered, under the programs directory (a file: eviction skips it)
DIGESTS = ".file-digests.json"
# an entry's remembered file identities (not in its manifest)
STAMP = ".verified.json"
# a file changed this recently may change again within the same tick of the kernel's file clock (a coarse clock:
# milliseconds), its identity unchanged: its digest is not remembered
RACY_NS = 100_000_000
MAX_REMEMBERED = 256


def file_identity(path: Path) -> list[int]:
    """What any write to ``path`` changes: device, inode, size, modification and change times (ns); the change
    time cannot be set back by a user (``touch`` moves it forward)."""
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _settled(identity: list[int]) -> bool:
    import time

    return time.time_ns() - max(identity[3], identity[4]) > RACY_NS


def remembered_digest(path: Path, memo: Path) -> str:
    """:func:`file_digest` of ``path``, read from ``memo`` (a JSON file) when the file's identity is the one
    remembered with it, else computed and remembered (when the file has not changed in the last ``RACY_NS``)."""
    key = str(Path(path).resolve())
    ident = file_identity(path)
    try:
        known = json.loads(memo.read_text())
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    hit = known.get(key)
    if isinstance(hit, list) and len(hit) == 2 and hit[0] == ident:
        return hit[1]
    digest = file_digest(path)
    if file_identity(path) == ident and _settled(ident):  # (unchanged while it was read)
        known.pop(key, None)
        known[key] = [ident, digest]
        _write_json(memo, dict(list(known.items())[-MAX_REMEMBERED:]))
    return digest


def _write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` to ``path`` atomically (a temporary sibling renamed into place); a failure is no error."""
    import tempfile

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _entry_identities(directory: Path, manifest_files: Any) -> dict[str, list[int]]:
    return {name: file_identity(directory / name) for name in ["manifest.json", *sorted(manifest_files)]}


def check_entry(directory: Path) -> None:
    """Raise ``ArtifactError`` unless every file of the entry matches its checksum: checked in full unless the
    files are exactly those (by identity) that passed the check before."""
    try:
        stamp = json.loads((directory / STAMP).read_text())
        files = json.loads((directory / "manifest.json").read_text()).get("files", {})
        if stamp == _entry_identities(directory, files):
            return
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    manifest = read_manifest(directory)
    _write_json(directory / STAMP, _entry_identities(directory, manifest.get("files", {})))


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
    model_digest = _bytes_digest(model, Path(config.compiler.cache_dir) / "programs" / DIGESTS)
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


class Staged:
    """A cache entry being written on a thread (:func:`stage`), for :func:`commit` once the program is verified
    or :meth:`discard` if it is not: a large model's weights are written while its reference finishes."""

    def __init__(self, directory: Path, executor: GraphExecutor) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.directory = directory
        self.sources = [k.source for k in executor.kernels]
        pool = ThreadPoolExecutor(1, thread_name_prefix="superopt-cache")
        self.future = pool.submit(stage_executor, executor, directory)
        pool.shutdown(wait=False)

    def staged(self) -> StagedArtifact | None:
        try:
            return self.future.result()
        except (ArtifactError, OSError):
            return None  # (a cache that cannot be written: the program is just not kept)

    def discard(self) -> None:
        done = self.staged()
        if done is not None:
            done.discard()


def stage(directory: Path, executor: GraphExecutor) -> Staged:
    """Start writing ``executor`` as the cache entry at ``directory`` (see :class:`Staged`)."""
    return Staged(directory, executor)


def commit(staged: Staged, report: dict[str, Any], meta: dict[str, Any]) -> None:
    """Put a staged entry in place with the verified program's report (atomically, replacing any older one); a
    cache that cannot be written (a full disk, no permission) is no error: the program is just not kept."""
    directory = staged.directory
    done = staged.staged()
    if done is None:
        return
    try:
        done.commit(report, extra_files={"program.json": json.dumps(meta).encode(),
                                         "sources.pkl": pickle.dumps(staged.sources, protocol=pickle.HIGHEST_PROTOCOL)})
    except (ArtifactError, OSError):
        return
    try:  # (written just now: what was checksummed is what is on disk)
        _write_json(directory / STAMP, _entry_identities(directory, json.loads(
            (directory / "manifest.json").read_text())["files"]))
    except (OSError, ValueError, KeyError):
        pass
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
        check_entry(directory)
        program, schedules, packed = read_program(directory)
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
    executor = GraphExecutor(program["graph"], schedules, ExecutorConfig(target.threads, compiler, target), phases,
                             sources, packed)
    return executor, report, meta


__all__ = ["code_version", "program_key", "entry_dir", "stage", "commit", "Staged", "fetch", "evict",
           "check_entry", "remembered_digest", "file_identity"]
