"""The import graph of superopt/, search/, costmodel/ and rewrite_rules/: arrows point down only.

``LAYERS`` is the one statement of which part may import which (docs/architecture.md explains it): a module
belongs to the longest entry that is its name or a package above it; it may import its own entry, entries of
its own layer and entries of the layers below; the entries import each other without a cycle. A test here
fails on an upward arrow, on a cycle between entries, and on a module that no entry holds (place it).
Imports inside functions and under ``TYPE_CHECKING`` count too: a late import is still an arrow.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("superopt", "search", "costmodel", "rewrite_rules")

# bottom first; an entry names a package or a module
LAYERS: tuple[tuple[str, ...], ...] = (
    # leaves and loaders: the IR, the index-notation language, the reference interpreter, the ops and the
    # graph builder, the ONNX / torch.fx importers, the description of the machine, the phase timer, the collector's
    # thresholds, the heap trim
    ("superopt.target", "superopt.phases", "superopt.collector", "superopt.ir", "superopt.lang", "superopt.interp",
     "superopt.builder", "superopt.ops", "superopt.frontends", "superopt.onnx_export", "superopt.report", "superopt.heap"),
    # what a choice means: schedules (space, knobs, default heuristics, plan and its check), rewrite rules
    ("superopt.schedule", "rewrite_rules"),
    # the tree a plan lowers to
    ("superopt.loopnest",),
    # printers of a loop nest (C, CUDA) and the features read off it
    ("superopt.codegen",),
    # build and run: compile, load, execute graphs; measure kernels; saved programs; check a program against the
    # reference
    ("superopt.runtime", "superopt.measure", "superopt.artifact", "superopt.verification"),
    # the cost model
    ("costmodel",),
    # choose: the graph search and the schedule search; the cost model's datasets, drawn through the rewrite pass
    ("search", "costmodel.workloads", "costmodel.collect"),
    # front doors: the Python API, the CLI, the torch and ONNX-backend front doors, user ops, the test tools
    ("superopt.api", "superopt.cli", "superopt.cli_artifact", "superopt.cli_costmodel", "superopt.cli_dataset",
     "superopt.backend", "superopt.user_op", "superopt.frontends.torch_backend", "superopt.testing",
     "superopt.program_cache", "superopt"),
)
ROOT_ONLY = frozenset({"superopt"})  # entries that hold only the package's own __init__, not its subpackages


def layer_of() -> dict[str, int]:
    return {entry: i for i, entries in enumerate(LAYERS) for entry in entries}


def entry_of(module: str) -> str | None:
    best = None
    for entry in layer_of():
        inside = module == entry or (entry not in ROOT_ONLY and module.startswith(entry + "."))
        if inside and (best is None or len(entry) > len(best)):
            best = entry
    return best


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported module of ours, line) for every import statement in the file, wherever it sits."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # ``from superopt import ops`` imports the module superopt.ops
                sub = f"{target}.{a.name}"
                out.append((sub if sub in known else target, node.lineno))
    return [(m, line) for m, line in out if m.split(".")[0] in PACKAGES]


def import_graph() -> dict[tuple[str, str], list[str]]:
    """(importing entry, imported entry) -> the import sites ("path:line imported.module")."""
    files = source_files()
    known = set(files)
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in files.items():
        src = entry_of(module)
        for target, line in imports_of(module, path, known):
            dst = entry_of(target)
            if dst is not None and src is not None and dst != src:
                edges[(src, dst)].append(f"{path.relative_to(ROOT)}:{line} {target}")
    return dict(edges)


def upward_arrows(edges) -> list[str]:
    layer = layer_of()
    return [f"{a} (layer {layer[a]}) -> {b} (layer {layer[b]}): {sites[0]}"
            for (a, b), sites in sorted(edges.items()) if layer[b] > layer[a]]


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one entry (Tarjan)."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted({x for e in edges for x in e}):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_place_in_the_layering():
    unplaced = sorted(m for m in source_files() if entry_of(m) is None)
    assert not unplaced, f"modules no entry of LAYERS holds (add them to tests/test_architecture.py): {unplaced}"


def test_every_entry_names_a_module():
    modules = set(source_files())
    stale = sorted(e for e in layer_of() if e not in modules)
    assert not stale, f"entries of LAYERS that name no module: {stale}"


def test_no_import_points_up():
    up = upward_arrows(import_graph())
    assert not up, "imports that point up the layering:\n" + "\n".join(up)


def test_no_import_cycle_between_parts():
    found = cycles(import_graph())
    assert not found, f"import cycles between parts: {found}"


def test_the_checks_see_a_planted_upward_arrow_and_cycle():
    edges = {("superopt.schedule", "superopt.codegen"): ["x.py:1 superopt.codegen.c_emit"],
             ("superopt.codegen", "superopt.loopnest"): ["y.py:1 superopt.loopnest"],
             ("superopt.loopnest", "superopt.schedule"): ["z.py:1 superopt.schedule.plan"]}
    assert upward_arrows(edges) == ["superopt.schedule (layer 1) -> superopt.codegen (layer 3): x.py:1 superopt.codegen.c_emit"]
    assert cycles(edges) == [["superopt.codegen", "superopt.loopnest", "superopt.schedule"]]
    assert entry_of("superopt.frontends.torch_backend") == "superopt.frontends.torch_backend"
    assert entry_of("superopt.frontends.onnx_frontend") == "superopt.frontends"
    assert entry_of("superopt.nonexistent") is None  # the root entry holds only the package's __init__


def _top_level_functions(name: str) -> list[str]:
    sites = []
    for module, path in source_files().items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
                sites.append(module)
    return sites


def test_one_definition_of_random_inputs():
    assert _top_level_functions("random_inputs") == ["superopt.interp.inputs"]


def test_one_budget_and_one_stop_reason():
    assert _top_level_functions("Budget") == ["search.budget"]
    assert _top_level_functions("StopReason") == ["search.budget"]


UNBOUNDED = re.compile(r"\b10\s*\*\*\s*\d+\b|sys\.maxsize")


def test_no_magic_number_stands_for_no_limit():
    """``10**9`` trials or seconds is not "no limit": a budget says none (``Budget``). A quantity in units
    (``141 * 10**9`` bytes) is fine."""
    hits = []
    for path in source_files().values():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for m in UNBOUNDED.finditer(code):
                if not re.search(r"\*\s*$", code[: m.start()]):  # not a factor of a quantity
                    hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "magic numbers for 'unbounded':\n" + "\n".join(hits)
