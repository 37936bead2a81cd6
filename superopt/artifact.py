"""A compiled program on disk: save it once, load it in a fresh process without compiling again.

Layout of an artifact directory::

    manifest.json      format version, inputs and outputs, target, and the sha256 of every other file
    program.pkl        the optimized graph (its constants stand for entries of constants.bin), the compiler
                       config and the target
    constants.bin      the graph's constants, raw (superopt.runtime.array_file), mapped when loaded
    packed.bin         the constant inputs the kernels read packed, in the packed layout: not packed again
    arrays.json        where each array of constants.bin and packed.bin lies
    schedules.json     compute node -> its schedule trace (the JSON of superopt.schedule.primitives)
    kernels/           the shared libraries (<digest>.so, .sha256, .c), laid out as a compile cache
    report.json        the optimizer's report (when there is one)

Loading checks every file against the manifest first: a missing, truncated or edited file fails with
one line naming it (:class:`ArtifactError`), never with a crash later. The kernels directory is used as
the compile cache, so on the machine (and compiler) that saved the artifact nothing is recompiled;
elsewhere the kernels are rebuilt from the graph and traces into that directory.

``program.pkl`` is a Python pickle: load artifacts you trust (as with ``torch.load``). The weights are mapped
read-only, never copied: a loaded program's constants are views of ``constants.bin``, and the pages of a
weight that only its packed copy is read from are never read from disk.

Saving is atomic: the files are written to a temporary sibling directory that is renamed into place
at the end, so an interrupted save leaves no directory that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from superopt.ir.graph import Constant, Graph
from superopt.runtime.array_file import map_arrays, write_arrays
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.primitives import trace_from_json, trace_to_json
from superopt.target import Target

FORMAT = "superopt-artifact/2"
_READS = (FORMAT, "superopt-artifact/1")  # (version 1: the constants inside program.pkl, packed when loaded)


class ArtifactError(ValueError):
    """An artifact directory that cannot be loaded (missing, corrupt, or another format)."""


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:  # in blocks: a program's weights are not read into memory at once
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _libraries(executor: GraphExecutor) -> list[Path]:
    return sorted({Path(k.lib._name) for k in executor.kernels})


def save_executor(executor: GraphExecutor, out: str | Path, report: dict[str, Any] | None = None,
                  extra_files: dict[str, bytes] | None = None, overwrite: bool = True) -> Path:
    """Write ``executor`` (graph, schedules, compiled kernels) as an artifact directory at ``out``.

    ``extra_files``: more files to put in (relative name -> bytes), covered by the manifest too."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ArtifactError(f"{out} already exists")
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=parent))
    except OSError as err:
        raise ArtifactError(f"cannot write to {parent}: {err.strerror or err}") from None
    try:
        graph = executor.graph
        kernels = tmp / "kernels"
        kernels.mkdir()
        for so in _libraries(executor):
            for suffix in (".so", ".sha256", ".c"):
                src = so.with_suffix(suffix)
                if src.exists():
                    shutil.copy2(src, kernels / src.name)
        compiler = executor.config.compiler
        constants: list[np.ndarray] = []
        with open(tmp / "program.pkl", "wb") as f:
            _ConstantPickler(f, constants).dump({"graph": graph, "compiler": compiler, "target": executor.target})
        packed = executor.packed_constants()
        known: dict[str, str] = {}  # file -> sha256, computed as it was written
        constant_index, known["constants.bin"] = write_arrays(tmp / "constants.bin", constants)
        packed_index, known["packed.bin"] = write_arrays(tmp / "packed.bin", list(packed.values()))
        arrays = {"constants": constant_index,
                  "packed": [[node, local, e] for (node, local), e in zip(packed, packed_index, strict=True)]}
        (tmp / "arrays.json").write_text(json.dumps(arrays))
        del constants
        (tmp / "schedules.json").write_text(json.dumps(
            {name: json.loads(trace_to_json(t)) for name, t in sorted(executor.traces.items())}, indent=1))
        if report is not None:
            (tmp / "report.json").write_text(json.dumps(report, indent=1, default=str))
        for name, data in (extra_files or {}).items():
            p = tmp / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                name = str(p.relative_to(tmp))
                files[name] = known[name] if name in known else _sha(p)
        manifest = {
            "format": FORMAT,
            "inputs": [[n, list(graph.type_of[n].shape), graph.type_of[n].dtype] for n in graph.inputs],
            "outputs": [[n, list(graph.type_of[n].shape), graph.type_of[n].dtype] for n in graph.outputs],
            "target": executor.target.key() if hasattr(executor.target, "key") else str(executor.target),
            "files": files,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        for p in tmp.rglob("*"):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the artifact at ``path``, after checking every file it lists."""
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"{root} is not an artifact directory (no such directory)")
    mf = root / "manifest.json"
    try:
        manifest = json.loads(mf.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{root} is not an artifact directory: manifest.json is missing") from None
    except (OSError, ValueError) as err:
        raise ArtifactError(f"corrupt artifact {root}: manifest.json is unreadable ({type(err).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in _READS:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{root}: artifact format {got!r} is not {FORMAT!r}")
    for name, sha in manifest.get("files", {}).items():
        p = root / name
        if not p.is_file():
            raise ArtifactError(f"corrupt artifact {root}: {name} is missing")
        if _sha(p) != sha:
            raise ArtifactError(f"corrupt artifact {root}: {name} does not match its checksum in manifest.json")
    return manifest


def load_executor(path: str | Path, threads: int | None = None) -> tuple[GraphExecutor, dict[str, Any]]:
    """The executor saved at ``path`` (kernels loaded from the artifact, not recompiled) and its report
    (empty when none was saved)."""
    root = Path(path)
    read_manifest(root)
    program, schedules, packed = read_program(root)
    target: Target = program["target"]
    if threads is not None and threads != target.threads:
        target = replace(target, threads=threads)
    compiler = replace(program["compiler"], cache_dir=root / "kernels")
    executor = GraphExecutor(program["graph"], schedules, ExecutorConfig(target.threads, compiler, target),
                             packed=packed)
    report_path = root / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return executor, report


def read_program(root: Path) -> tuple[dict[str, Any], dict[str, list], dict[tuple[str, str], np.ndarray]]:
    """The pickled program (graph, compiler, target; its constants mapped from ``constants.bin``), the schedules
    and the packed constants of the artifact at ``root`` (its files checked by the caller)."""
    try:
        arrays = json.loads((root / "arrays.json").read_text()) if (root / "arrays.json").exists() else None
        mapped = map_arrays(root / "constants.bin", arrays["constants"]) if arrays else []
        with open(root / "program.pkl", "rb") as f:
            program = _ConstantUnpickler(f, mapped).load()
        packed = {}
        if arrays:
            views = map_arrays(root / "packed.bin", [e for _, _, e in arrays["packed"]])
            packed = {(node, local): v for (node, local, _), v in zip(arrays["packed"], views, strict=True)}
        schedules = {name: trace_from_json(json.dumps(t))
                     for name, t in json.loads((root / "schedules.json").read_text()).items()}
        if not isinstance(program.get("graph"), Graph):
            raise TypeError("program.pkl holds no graph")
    except Exception as err:  # noqa: BLE001 - any failure here means an unusable artifact
        raise ArtifactError(f"corrupt artifact {root}: {type(err).__name__}: {err}") from None
    return program, schedules, packed


class _ConstantPickler(pickle.Pickler):
    """Pickles each distinct constant as its index in ``arrays`` (appended here), its array left out."""

    def __init__(self, f, arrays: list[np.ndarray]) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays = arrays
        self.index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, Constant):  # (a DeferredConstant too: saved as its array)
            return None
        k = self.index.get(id(obj))
        if k is None:
            k = self.index[id(obj)] = len(self.arrays)
            self.arrays.append(obj.array)
        return ("constant", k)


class _ConstantUnpickler(pickle.Unpickler):
    def __init__(self, f, arrays: list[np.ndarray]) -> None:
        super().__init__(f)
        self.arrays = arrays
        self.made: dict[int, Constant] = {}

    def persistent_load(self, pid: Any) -> Any:
        kind, k = pid
        if kind != "constant" or not 0 <= k < len(self.arrays):
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        if k not in self.made:
            self.made[k] = Constant(self.arrays[k])  # (a read-only map: taken as it is, not copied)
        return self.made[k]


__all__ = ["ArtifactError", "FORMAT", "save_executor", "load_executor", "read_manifest", "read_program"]
