"""A compiled program on disk: save it once, load it in a fresh process without compiling again.

Layout of an artifact directory::

    manifest.json      format version, inputs and outputs, target, and the sha256 of every other file
    program.pkl        the optimized graph (its constants stand for entries of constants.bin), the compiler
                       config and the target
    constants.bin      the graph's constants, raw (superopt.runtime.array_file), mapped when loaded; not a
                       constant that the kernels read only packed: packed.bin holds each of its elements
    packed.bin         the constant inputs the kernels read packed, in the packed layout: not packed again
    arrays.json        where each array of constants.bin and packed.bin lies, and the layout each constant
                       held only packed is unpacked from where it is read (the reference, a graph dump)
    schedules.json     compute node -> its schedule trace (the JSON of superopt.schedule.primitives)
    kernels/           the shared libraries (<digest>.so, .sha256, .c), laid out as a compile cache
    report.json        the optimizer's report (when there is one)

Loading checks every file against the manifest first: a missing, truncated or edited file fails with
one line naming it (:class:`ArtifactError`), never with a crash later. The kernels directory is used as
the compile cache, so on the machine (and compiler) that saved the artifact nothing is recompiled;
elsewhere the kernels are rebuilt from the graph and traces into that directory.

``program.pkl`` is a Python pickle: load artifacts you trust (as with ``torch.load``). The weights are mapped
read-only, never copied: a loaded program's constants are views of ``constants.bin``. A weight that the
kernels read only packed is written once, packed (a large model's weights are written to disk once, not
twice); the loaded graph holds it as a constant computed from its packed copy where it is read, which a run
never does.

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

from superopt.ir.graph import Constant, DeferredConstant, Graph
from superopt.ir.types import TensorType
from superopt.runtime.array_file import map_arrays, write_arrays
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.kernel_plan import PackLayout
from superopt.schedule.primitives import trace_from_json, trace_to_json
from superopt.target import Target

FORMAT = "superopt-artifact/3"
# (version 2: every constant in constants.bin; version 1: the constants inside program.pkl, packed when loaded)
_READS = (FORMAT, "superopt-artifact/2", "superopt-artifact/1")


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
    return stage_executor(executor, out, overwrite).commit(report, extra_files)


class StagedArtifact:
    """An artifact whose large files are written, in a temporary sibling of ``out``, and not yet in place:
    :meth:`commit` adds the report and the manifest and renames it to ``out``; :meth:`discard` removes it.
    The program cache stages a program while its verification runs and commits it once it passed."""

    def __init__(self, executor: GraphExecutor, out: Path, tmp: Path, known: dict[str, str]) -> None:
        self.executor, self.out, self.tmp, self.known = executor, out, tmp, known

    def commit(self, report: dict[str, Any] | None = None, extra_files: dict[str, bytes] | None = None) -> Path:
        tmp, out, graph, executor = self.tmp, self.out, self.executor.graph, self.executor
        try:
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
                    files[name] = self.known[name] if name in self.known else _sha(p)
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
            self.discard()
            raise
        return out

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def stage_executor(executor: GraphExecutor, out: str | Path, overwrite: bool = True) -> StagedArtifact:
    """The large files of ``executor``'s artifact (kernels, graph, weights, schedules) written in a temporary
    sibling directory of ``out`` (see :class:`StagedArtifact`)."""
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
        packed = executor.packed_constants()
        constants: list[np.ndarray] = []
        with open(tmp / "program.pkl", "wb") as f:
            pickler = _ConstantPickler(f, constants, _held_packed(executor, list(packed)))
            pickler.dump({"graph": graph, "compiler": compiler, "target": executor.target})
        known: dict[str, str] = {}  # file -> sha256, computed as it was written
        constant_index, known["constants.bin"] = write_arrays(tmp / "constants.bin", constants)
        packed_index, known["packed.bin"] = write_arrays(tmp / "packed.bin", list(packed.values()))
        arrays = {"constants": constant_index,
                  "packed": [[node, local, e] for (node, local), e in zip(packed, packed_index, strict=True)],
                  "unpacked": pickler.unpacked}
        (tmp / "arrays.json").write_text(json.dumps(arrays))
        del constants
        (tmp / "schedules.json").write_text(json.dumps(
            {name: json.loads(trace_to_json(t)) for name, t in sorted(executor.traces.items())}, indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return StagedArtifact(executor, out, tmp, known)


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


def _held_packed(executor: GraphExecutor, packed: list[tuple[str, str]]) -> dict[int, tuple[int, PackLayout, str]]:
    """id(constant) -> (its packed copy's index in ``packed``, the layout, the dtype), for each constant the
    executor reads only packed (under every name that holds it)."""
    g, only = executor.graph, executor.packed_only
    names: dict[int, list[str]] = {}
    for name, c in g.constants:
        names.setdefault(id(c), []).append(name)
    out = {}
    for name, c in g.constants:
        if name in only and all(n in only for n in names[id(c)]):
            node, local = only[name]
            kern = executor.kernels[executor.node_kernel[node]]
            out[id(c)] = (packed.index((node, local)), kern.source.packs[local], c.type.dtype)
    return out


def _unpacked(view: np.ndarray, layout: PackLayout, dtype: str) -> Constant:
    """The constant that was packed into ``view`` (a map of packed.bin), computed from it where it is read."""
    return DeferredConstant(TensorType(tuple(layout.src_shape), dtype), "a weight held packed in packed.bin", (),
                            lambda: layout.unpack_array(view))


def read_program(root: Path) -> tuple[dict[str, Any], dict[str, list], dict[tuple[str, str], np.ndarray]]:
    """The pickled program (graph, compiler, target; its constants mapped from ``constants.bin``), the schedules
    and the packed constants of the artifact at ``root`` (its files checked by the caller)."""
    try:
        arrays = json.loads((root / "arrays.json").read_text()) if (root / "arrays.json").exists() else None
        mapped = map_arrays(root / "constants.bin", arrays["constants"]) if arrays else []
        packed, views = {}, []
        if arrays:
            views = map_arrays(root / "packed.bin", [e for _, _, e in arrays["packed"]])
            packed = {(node, local): v for (node, local, _), v in zip(arrays["packed"], views, strict=True)}
        unpacked = [_unpacked(views[j], PackLayout(tuple(perm), split, factor, tuple(shape)), dtype)
                    for j, perm, split, factor, shape, dtype in (arrays or {}).get("unpacked", [])]
        with open(root / "program.pkl", "rb") as f:
            program = _ConstantUnpickler(f, mapped, unpacked).load()
        schedules = {name: trace_from_json(json.dumps(t))
                     for name, t in json.loads((root / "schedules.json").read_text()).items()}
        if not isinstance(program.get("graph"), Graph):
            raise TypeError("program.pkl holds no graph")
    except Exception as err:  # noqa: BLE001 - any failure here means an unusable artifact
        raise ArtifactError(f"corrupt artifact {root}: {type(err).__name__}: {err}") from None
    return program, schedules, packed


class _ConstantPickler(pickle.Pickler):
    """Pickles each distinct constant as its index in ``arrays`` (appended here), its array left out."""

    def __init__(self, f, arrays: list[np.ndarray], held_packed: dict[int, tuple[int, PackLayout, str]]) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays = arrays
        self.index: dict[int, int] = {}
        self.held_packed = held_packed  # (see _held_packed: saved as a reference to its packed copy)
        self.unpacked: list[list] = []  # [packed index, perm, split axis, factor, shape, dtype] per such constant
        self.unpacked_index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, Constant):  # (a DeferredConstant too: saved as its array)
            return None
        if id(obj) in self.held_packed:
            k = self.unpacked_index.get(id(obj))
            if k is None:
                j, lay, dtype = self.held_packed[id(obj)]
                k = self.unpacked_index[id(obj)] = len(self.unpacked)
                self.unpacked.append([j, list(lay.perm), lay.split_axis, lay.factor, list(lay.src_shape), dtype])
            return ("unpacked", k)
        k = self.index.get(id(obj))
        if k is None:
            k = self.index[id(obj)] = len(self.arrays)
            self.arrays.append(obj.array)
        return ("constant", k)


class _ConstantUnpickler(pickle.Unpickler):
    def __init__(self, f, arrays: list[np.ndarray], unpacked: list[Constant]) -> None:
        super().__init__(f)
        self.arrays = arrays
        self.unpacked = unpacked
        self.made: dict[int, Constant] = {}

    def persistent_load(self, pid: Any) -> Any:
        kind, k = pid
        if kind == "unpacked" and 0 <= k < len(self.unpacked):
            return self.unpacked[k]
        if kind != "constant" or not 0 <= k < len(self.arrays):
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        if k not in self.made:
            self.made[k] = Constant(self.arrays[k])  # (a read-only map: taken as it is, not copied)
        return self.made[k]


__all__ = ["ArtifactError", "FORMAT", "save_executor", "stage_executor", "StagedArtifact", "load_executor", "read_manifest",
           "read_program"]
