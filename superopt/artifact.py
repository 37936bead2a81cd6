"""A compiled program on disk: save it once, load it in a fresh process without compiling again.

Layout of an artifact directory::

    manifest.json      format version, inputs and outputs, target, and the sha256 of every other file
    program.pkl        the optimized graph (constants included), the compiler config and the target
    schedules.json     compute node -> its schedule trace (the JSON of superopt.schedule.primitives)
    kernels/           the shared libraries (<digest>.so, .sha256, .c), laid out as a compile cache
    report.json        the optimizer's report (when there is one)

Loading checks every file against the manifest first: a missing, truncated or edited file fails with
one line naming it (:class:`ArtifactError`), never with a crash later. The kernels directory is used as
the compile cache, so on the machine (and compiler) that saved the artifact nothing is recompiled;
elsewhere the kernels are rebuilt from the graph and traces into that directory.

``program.pkl`` is a Python pickle: load artifacts you trust (as with ``torch.load``).

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

from superopt.ir.graph import Graph
from superopt.runtime.compiler import CompilerConfig
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.primitives import trace_from_json, trace_to_json
from superopt.target import Target

FORMAT = "superopt-artifact/1"


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
        with open(tmp / "program.pkl", "wb") as f:
            pickle.dump({"graph": graph, "compiler": compiler, "target": executor.target}, f,
                        protocol=pickle.HIGHEST_PROTOCOL)
        (tmp / "schedules.json").write_text(json.dumps(
            {name: json.loads(trace_to_json(t)) for name, t in sorted(executor.traces.items())}, indent=1))
        if report is not None:
            (tmp / "report.json").write_text(json.dumps(report, indent=1, default=str))
        for name, data in (extra_files or {}).items():
            p = tmp / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        files = {str(p.relative_to(tmp)): _sha(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
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
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
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
    try:
        with open(root / "program.pkl", "rb") as f:
            program = pickle.load(f)
        graph: Graph = program["graph"]
        compiler: CompilerConfig = program["compiler"]
        target: Target = program["target"]
        schedules = {name: trace_from_json(json.dumps(t))
                     for name, t in json.loads((root / "schedules.json").read_text()).items()}
    except ArtifactError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure here means an unusable artifact
        raise ArtifactError(f"corrupt artifact {root}: {type(err).__name__}: {err}") from None
    if threads is not None and threads != target.threads:
        target = replace(target, threads=threads)
    compiler = replace(compiler, cache_dir=root / "kernels")
    executor = GraphExecutor(graph, schedules, ExecutorConfig(target.threads, compiler, target))
    report_path = root / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return executor, report


__all__ = ["ArtifactError", "FORMAT", "save_executor", "load_executor", "read_manifest"]
