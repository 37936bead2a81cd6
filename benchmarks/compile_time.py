"""Compile time and peak memory of the nine light models of the onnx wheel: superopt cold and warm, beside
onnxruntime's session creation and OpenVINO's compile_model.

    python -m benchmarks.compile_time [model ...] [--threads 2] [--rounds 1] [--out benchmarks/results]

Every measurement runs in a fresh process (``--child``), so the import, the caches in memory and the peak
RSS are each measurement's own. superopt: ``superopt.optimize`` (load, rewrite and graph search, schedule,
code generation, C compilation, build, verification against the float64 reference) then three runs; cold
with an empty kernel cache (a fresh ``CompilerConfig.cache_dir``; the machine's ceilings, measured once per
machine, are copied into it, and the time of measuring them is reported on its own), warm with the cache
the cold run filled. onnxruntime: ``InferenceSession`` then three runs; OpenVINO: ``compile_model`` then
three runs. Peak RSS is the process's ``ru_maxrss`` after the three runs, its largest child's beside it
(superopt computes its reference in a forked child, and runs the C compiler), and the peak of the process's
resident set plus its children's private pages, sampled every 0.2 s by this driver (a page shared
copy-on-write by a forked child counted once; a C compiler's memory counted). The models carry seeded random
weights (superopt.frontends.light_models). Writes ``compile_time.md`` and ``compile_time.json`` to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from superopt.phases import PHASES  # (a leaf of the standard library only: the parent stays light)

REPO = Path(__file__).resolve().parent.parent
RUNS = 3


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: of its own address space; ``ru_maxrss`` would carry the
    parent's peak over the exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # (Linux: kilobytes)


def _kb(pid: int | str, fields: tuple[str, ...]) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in text.splitlines() if line.split(":")[0] in fields)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def memory_with_children_kb(pid: int) -> int:
    """``pid``'s resident set plus its descendants' private pages: a forked child's pages shared copy-on-write
    with ``pid`` are counted once (in ``pid``), a C compiler's own memory is counted. 0 where /proc says nothing."""
    return _kb(pid, ("Rss",)) + sum(_kb(c, ("Private_Clean", "Private_Dirty")) for c in _descendants(pid))


def write_feed(model, path: Path) -> None:
    """Seeded random inputs of ``model`` as an .npz (the children read them without parsing the model)."""
    import numpy as np

    init = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    feed = {}
    for vi in model.graph.input:
        if vi.name not in init:
            shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
            feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
    np.savez(path, **feed)


def _feed(path: str) -> dict:
    import numpy as np

    with np.load(str(path)[: -len(".onnx")] + ".npz") as f:
        return {k: f[k] for k in f.files}


def child(system: str, path: str, cache: str, threads: int) -> dict:
    """One measurement in this (fresh) process; returns what it measured."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    t_imp = time.perf_counter()
    feed = _feed(path)
    out: dict = {}
    if system == "superopt":
        from superopt.api import OptimizeConfig, optimize
        from superopt.runtime.compiler import CompilerConfig

        # (a generous per-unit compiler timeout: on a machine shared by many, a unit can wait minutes)
        cfg = OptimizeConfig(threads=threads, compiler=CompilerConfig(cache_dir=Path(cache), timeout_s=900.0))
        t0 = time.perf_counter()
        prog = optimize(path, cfg)
        t1 = time.perf_counter()
        rep = prog.report  # (an older checkout, --code, has no phases)
        out.update(phases=getattr(rep, "phases", {}), kernels=rep.kernels, max_error=rep.max_error,
                   kernels_compiled=getattr(rep, "kernels_compiled", None))

        def run():
            return prog(**feed)
    elif system == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        t0 = time.perf_counter()
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        t1 = time.perf_counter()

        def run():
            return sess.run(None, feed)
    elif system == "openvino":
        import openvino as ov

        core = ov.Core()
        t0 = time.perf_counter()
        compiled = core.compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads})
        t1 = time.perf_counter()

        def run():
            return compiled(feed)
    else:
        raise SystemExit(f"unknown system {system!r}")
    runs = []
    for _ in range(RUNS):
        r0 = time.perf_counter()
        run()
        runs.append(time.perf_counter() - r0)
    import resource

    # (the largest child: the reference's forked process or a C compiler; Linux gives kilobytes)
    child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    out.update(system=system, compile_s=t1 - t0, import_s=t0 - t_imp, first_run_s=runs[0], runs_s=runs,
               peak_rss_mb=_peak_rss_mb(), peak_rss_child_mb=child_mb)
    return out


def measure(system: str, path: Path, cache: Path, threads: int, code: Path = REPO) -> dict:
    """One measurement in a fresh process importing superopt from ``code`` (a checkout)."""
    env = dict(os.environ, PYTHONPATH=f"{code}{os.pathsep}{REPO}", OMP_NUM_THREADS=str(threads))
    # (this file run by path, from the checkout's root: benchmarks/search.py must not shadow the search package)
    argv = ["compile_time", "--child", system, str(path), str(cache), "--threads", str(threads)]
    run = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"
    cmd = [sys.executable, "-c", run]
    # the memory of the measured process and its children, sampled from here (a thread in the measured process
    # would take turns at its interpreter lock with the compile it measures)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=code)
    peak_kb = 0
    while True:
        peak_kb = max(peak_kb, memory_with_children_kb(p.pid))
        try:
            stdout, stderr = p.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            continue
    if p.returncode != 0:
        return {"system": system, "error": (stderr.strip().splitlines() or ["failed"])[-1][:300]}
    out = json.loads(stdout.strip().splitlines()[-1])
    # (at least the process's own peak, which sampling can miss: a short-lived process may end between samples)
    out["peak_with_children_mb"] = max(peak_kb / 1024.0, out.get("peak_rss_mb") or 0.0)
    return out


def ceilings_cache(root: Path, threads: int) -> tuple[Path, float]:
    """A cache directory holding only this machine's measured ceilings (the rewrite search's roofline), and
    the seconds measuring them took: copied into each cold cache, as a machine measures them once."""
    seed = root / "seed"
    code = ("import time; from pathlib import Path; from superopt.api import OptimizeConfig; "
            "from search.graph.cost import Ceilings; from superopt.runtime.compiler import CompilerConfig; "
            f"c = OptimizeConfig(threads={threads}, compiler=CompilerConfig(cache_dir=Path({str(seed)!r}))); "
            "t = time.perf_counter(); Ceilings.measured(c.resolved_target(), c.compiler); "
            "print(time.perf_counter() - t)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    return seed, float(p.stdout.strip().splitlines()[-1])


def fresh_cache(root: Path, seed: Path, name: str) -> Path:
    cache = root / name
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(seed, cache)
    return cache


def median_of(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else None


def summarize(rows: list[dict]) -> dict:
    """The median over rounds of each number (phases included); errors kept."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return {"error": rows[0].get("error", "failed") if rows else NOT_MEASURED}
    out = {k: median_of(ok, k) for k in ("compile_s", "first_run_s", "peak_rss_mb", "peak_rss_child_mb",
                                         "peak_with_children_mb", "import_s", "kernels",
                                         "kernels_compiled", "max_error") if any(k in r for r in ok)}
    phases = sorted({p for r in ok for p in r.get("phases", {})}, key=lambda p: _PHASE_ORDER.get(p, 99))
    if phases:
        out["phases"] = {p: statistics.median(r["phases"].get(p, 0.0) for r in ok) for p in phases}
    return out


_PHASE_ORDER = {p: i for i, p in enumerate(PHASES)}
NOT_MEASURED = "not measured"  # (a system left out by --systems)


def render(result: dict) -> str:
    cols = ("load", "rewrite", "schedule", "codegen", "compile", "build", "verify", "cache")
    lines = ["# Compile time and peak memory: the light models of the onnx wheel", "",
             f"CPU: {result['cpu']}; {result['threads']} threads; median of {result['rounds']} round(s), each "
             f"measurement in a fresh process. superopt: `superopt.optimize` (verified against the float64 "
             f"reference) with an empty kernel cache (cold) and again with the cache it filled (warm); "
             f"onnxruntime: `InferenceSession`; OpenVINO: `compile_model`. Peak RSS: load + compile + {RUNS} runs, of "
             f"the process; its largest child process (superopt's reference, computed in a forked child, or a C "
             f"compiler) apart, the pages it shares with the parent (the weights, copy-on-write) counted in both; "
             f"and, sampled every 0.2 s from outside, the peak of the process's resident set plus its children's "
             f"private pages (each page counted once). "
             f"This machine's ceilings (the rewrite search's roofline, measured once per machine) took "
             f"{result['ceilings_s']:.1f} s and are not in the cold times.", "",
             "| model | superopt cold (s) | warm (s) | onnxruntime (s) | OpenVINO (s) | kernels (compiled cold) | "
             "RSS superopt cold / warm (MB) | RSS its largest child, cold (MB) | "
             "with children's private pages: superopt cold / onnxruntime (MB) | RSS onnxruntime (MB) | "
             "RSS OpenVINO (MB) | first run superopt / ort (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(d: dict, k: str, scale: float = 1.0, fmt: str = ".2f") -> str:
        if "error" in d:
            return "-" if d["error"] == NOT_MEASURED else "error"
        return f"{d[k] * scale:{fmt}}" if d.get(k) is not None else "-"

    if result.get("baseline"):
        lines[-2] += " before: cold / warm (s), RSS cold (MB) |"
        lines[-1] += "---:|"
    for name, r in result["models"].items():
        c, w, o, v = r["cold"], r["warm"], r["onnxruntime"], r["openvino"]
        lines.append(f"| {name} | {f(c, 'compile_s')} | {f(w, 'compile_s')} | {f(o, 'compile_s')} | "
                     f"{f(v, 'compile_s')} | {f(c, 'kernels', fmt='.0f')} ({f(c, 'kernels_compiled', fmt='.0f')}) | "
                     f"{f(c, 'peak_rss_mb', fmt='.0f')} / {f(w, 'peak_rss_mb', fmt='.0f')} | "
                     f"{f(c, 'peak_rss_child_mb', fmt='.0f')} | {f(c, 'peak_with_children_mb', fmt='.0f')} / "
                     f"{f(o, 'peak_with_children_mb', fmt='.0f')} | {f(o, 'peak_rss_mb', fmt='.0f')} | "
                     f"{f(v, 'peak_rss_mb', fmt='.0f')} | "
                     f"{f(c, 'first_run_s', 1e3, '.1f')} / {f(o, 'first_run_s', 1e3, '.1f')} |")
        if "before_cold" in r:
            bc, bw = r["before_cold"], r["before_warm"]
            lines[-1] += f" {f(bc, 'compile_s')} / {f(bw, 'compile_s')}, {f(bc, 'peak_rss_mb', fmt='.0f')} |"
    for which in ("cold", "warm", "before_cold", "before_warm"):
        rows = {name: r[which] for name, r in result["models"].items() if which in r}
        if not rows or all(d.get("error") == NOT_MEASURED for d in rows.values()):
            continue
        title = f"superopt {which.removeprefix('before_')}" + (" before" if which.startswith("before") else "")
        lines += ["", f"## {title}: seconds per phase", "",
                  "| model | " + " | ".join(cols) + " | total |", "|---|" + "---:|" * (len(cols) + 1)]
        for name, d in rows.items():
            if "error" in d:
                lines.append(f"| {name} | {d['error']} |")
                continue
            ph = d.get("phases", {})
            cells = [f"{ph[p]:.2f}" if p in ph else "-" for p in cols]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {d['compile_s']:.2f} |")
    errors = [(n, s, r[s]["error"]) for n, r in result["models"].items() for s in r
              if "error" in r[s] and r[s]["error"] != NOT_MEASURED]
    if errors:
        lines += ["", "Errors:", *[f"- {n} {s}: {e}" for n, s, e in errors]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--name", default="compile_time")
    ap.add_argument("--code", default=str(REPO), help="the checkout whose superopt is measured (default: this one)")
    ap.add_argument("--baseline", default=None,
                    help="another checkout measured cold and warm in the same rounds (the before of a change)")
    ap.add_argument("--systems", default="cold,warm,onnxruntime,openvino", help="which columns to measure")
    ap.add_argument("--child", nargs=3, metavar=("SYSTEM", "MODEL", "CACHE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.threads), default=float))
        return
    sys.path.insert(0, str(REPO))
    import onnx

    from benchmarks.machine import cpu_model
    from superopt.frontends.light_models import LIGHT_MODELS, randomized_light_model

    models = args.models or list(LIGHT_MODELS)
    systems = set(args.systems.split(","))
    code = Path(args.code).resolve()
    baseline = Path(args.baseline).resolve() if args.baseline else None
    result: dict = {"cpu": cpu_model(), "threads": args.threads, "rounds": args.rounds, "code": str(code),
                    "baseline": str(baseline) if baseline else None, "models": {}}
    with tempfile.TemporaryDirectory(prefix="superopt-compile-time-") as tmp:
        root = Path(tmp)
        seed, result["ceilings_s"] = ceilings_cache(root, args.threads)
        print(f"{result['cpu']}: ceilings measured in {result['ceilings_s']:.1f} s", flush=True)
        for name in models:
            path = root / f"{name}.onnx"
            model = randomized_light_model(name)
            onnx.save(model, str(path))
            write_feed(model, path.with_suffix(".npz"))
            del model
            cols = ["cold", "onnxruntime", "warm", "openvino"] + (["before_cold", "before_warm"] if baseline else [])
            rows: dict[str, list[dict]] = {k: [] for k in cols}
            for rnd in range(args.rounds):  # the systems alternate within each round
                cache = fresh_cache(root, seed, f"cache-{name}-{rnd}")
                before = fresh_cache(root, seed, f"before-{name}-{rnd}")
                for col in cols:
                    if col.removeprefix("before_") in systems:
                        system = "superopt" if col.endswith(("cold", "warm")) else col
                        rows[col].append(measure(system, path, before if col.startswith("before") else cache,
                                                 args.threads, baseline if col.startswith("before") else code))
                shutil.rmtree(cache, ignore_errors=True)
                shutil.rmtree(before, ignore_errors=True)
            result["models"][name] = {k: summarize(v) for k, v in rows.items()}
            r = result["models"][name]
            print(f"{name:14s} cold {r['cold'].get('compile_s', float('nan')):7.2f}s  "
                  f"warm {r['warm'].get('compile_s', float('nan')):6.2f}s  "
                  f"ort {r['onnxruntime'].get('compile_s', float('nan')):5.2f}s  "
                  f"ov {r['openvino'].get('compile_s', float('nan')):5.2f}s  "
                  f"rss {r['cold'].get('peak_rss_mb', float('nan')):5.0f}/"
                  f"{r['onnxruntime'].get('peak_rss_mb', float('nan')):5.0f} MB"
                  f"  {r['cold'].get('phases', r['cold'].get('error'))}", flush=True)
            path.unlink()
            path.with_suffix(".npz").unlink()
            write(result, Path(args.out), args.name)  # (after each model: a long run keeps what it measured)
    print(render(result))


def write(result: dict, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=float))
    (out / f"{name}.md").write_text(render(result))


if __name__ == "__main__":
    main()
