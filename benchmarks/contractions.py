"""Tensor contractions as einsum users write them: superopt (default and tuned) against torch.einsum,
numpy.einsum(optimize=True) and TBLIS, in GFLOP/s and as fractions of each case's roofline.

    python benchmarks/contractions.py [--quick] [--cases NAME,...] [--memory-bound] [--trials 64] [--tune-seconds 60]
                                      [--seed 2024] [--random 24] [--threads 2] [--rounds 5] [--no-tiles]

Cases (``benchmarks/contraction_cases.py``): the named permuted contractions and a GEMM, ``--random`` seeded random
contractions (2- to 6-dimensional operands, indices in random orders, extents not all multiples of the vector width,
both operands 1 MiB or more), and memory-bound cases (transpositions, sums over axes that are not innermost).

Per case, every system is first checked against a float64 reference (and flagged where its output is constant),
then all are timed in alternation (``superopt.measure.timing``: warm-up calls, then per round one block of calls
of each system, the order rotated; medians), with a probe of the machine's ceiling timed as one more system
(the FMA chains for a contraction, a streaming copy for a memory-bound case), so that every figure also has a
ceiling measured under the same load. superopt's default is ``superopt.op`` as a user calls it; "tuned" is the same
op's graph through ``superopt.optimize`` with the schedule search on (``OptimizeConfig.tune_trials``: ``--trials``
measurements and at most ``--tune-seconds`` a case; ``superopt.op(tune=...)`` takes one of the two). Where the search
keeps the default's schedules the tuned row is a tie: it is the default's time, not a second timing of the same code,
and the summary counts the search's wins, ties and losses against the default apart.

The roofline of a contraction is ``min(compute ceiling, bandwidth x flops / compulsory bytes)`` with the ceilings
of ``benchmarks/peak.py`` (``superopt.measure.roofline``); the compute ceiling is the register tile written back
every N reduction steps (``peak.py --tiles``) at the N nearest the case's reduction length, or the FMA chains with
``--no-tiles``; each row names its limit. A memory-bound case is given as its bytes per second over the bandwidth.

Writes ``benchmarks/results/contractions.md`` and ``.json`` (``--out``, ``--stem``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.contraction_cases import DEFAULT_RANDOM, DEFAULT_SEED, Case, default_cases, quick_cases  # noqa: E402
from benchmarks.machine import cpu_model  # noqa: E402
from superopt.measure.roofline import Ceilings, bandwidth_fraction, geomean, is_constant, roofline  # noqa: E402
from superopt.measure.timing import TimingConfig, time_alternating  # noqa: E402

SYSTEMS = ("superopt", "superopt_tuned", "torch", "numpy", "tblis")
PEERS = ("torch", "numpy", "tblis")
PROBE = "ceiling_probe"

# the goals the table is judged against
GOAL_DEFAULT = 0.65  # of the roofline, superopt's default schedule
GOAL_TUNED = 0.75  # after the schedule search
GOAL_PEER = 1.0  # each case against each peer
GOAL_GEOMEAN_TORCH = 1.3
GOAL_BANDWIDTH = 0.70  # memory-bound cases, of the bandwidth


def tolerance(case: Case) -> float:
    """The largest relative error (max |got - ref| / max |ref|) accepted: float32 rounding over a reduction of K
    steps stays near 6e-8 x sqrt(K), and a kernel that drops one of K terms is off by about 1 / (4 sqrt(K))."""
    return min(1e-3, 0.05 / math.sqrt(max(case.reduction_steps, 1)))


def reference(case: Case, inputs: list[np.ndarray]) -> np.ndarray:
    return np.einsum(case.equation, *[a.astype(np.float64) for a in inputs], optimize=True)


def check(out, ref: np.ndarray, case: Case) -> dict:
    """The output's error against the float64 reference, whether that passes, and whether it is constant."""
    got = np.asarray(out)
    if got.shape != ref.shape:
        return {"ok": False, "error": f"shape {got.shape}, expected {ref.shape}", "rel_err": math.inf,
                "constant": False}
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    err = float(np.abs(got.astype(np.float64) - ref).max(initial=0.0)) / scale
    ok = bool(np.isfinite(got).all()) and err <= tolerance(case)
    res = {"ok": ok, "rel_err": err, "constant": is_constant(got)}
    if not ok:
        res["error"] = f"relative error {err:.3g} > {tolerance(case):.3g}"
    return res


# -- the systems ------------------------------------------------------------------------------------------------


def set_threads(threads: int) -> None:
    """Every library's thread count: torch's pool, numpy's BLAS (threadpoolctl), TBLIS."""
    import pytblis
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(threads)
    pytblis.set_num_threads(threads)


def superopt_default(case: Case, threads: int):
    """``superopt.op`` as a user calls it (the default schedule; verified below against float64 like the peers)."""
    import superopt

    return superopt.op(case.text, threads=threads, verify=False)


def superopt_tuned(case: Case, threads: int, trials: int, tune_seconds: float | None, database: Path, seed: int):
    """The same op's graph through the pipeline with the schedule search on: (program, the search's summary)."""
    from superopt.api import OptimizeConfig, optimize
    from superopt.builder import GraphBuilder

    u = superopt_default(case, threads)
    c = u.compute(case.shapes)
    b = GraphBuilder(u.name)
    ins = [b.input(n, c.type_of[n].shape, c.type_of[n].dtype) for n in c.inputs]
    graph = b.build(b.add_compute(c, ins, u.name, out_names=list(c.outputs)))
    # the pipeline gives the search half of budget_s
    cfg = OptimizeConfig(threads=threads, verify=False, cost_model=None, tune_trials=trials, seed=seed,
                         budget_s=None if not tune_seconds else 2 * tune_seconds, database=database)
    prog = optimize(graph, cfg)
    return prog, {"tune": prog.report.tune, "schedule_source": prog.report.schedule_source}


def schedules_of(prog) -> list[str]:
    """The program's kernel schedules, in a form two programs compare by: every compute node's trace, sorted."""
    return sorted(repr(tuple(t)) for t in prog.executor.traces.values())


def peer_calls(case: Case, inputs: list[np.ndarray]) -> dict[str, Callable[[], object]]:
    """torch.einsum, numpy.einsum(optimize=True) and TBLIS on the case. A transposition's output is made
    contiguous (an einsum view is not a transposition)."""
    import pytblis
    import torch

    eq = case.equation
    tin = [torch.from_numpy(a) for a in inputs]
    if case.kind == "contraction":
        a, b = inputs
        return {"torch": lambda: torch.einsum(eq, *tin),
                "numpy": lambda: np.einsum(eq, a, b, optimize=True),
                "tblis": lambda: pytblis.contract(eq, a, b)}
    (a,) = inputs
    return {"torch": lambda: torch.einsum(eq, *tin).contiguous(),
            "numpy": lambda: np.ascontiguousarray(np.einsum(eq, a, optimize=True)),
            "tblis": lambda: np.ascontiguousarray(pytblis.einsum(eq, a))}


@dataclass
class Probes:
    """The ceilings timed beside each case: the FMA chains (GFLOP/s) and a streaming copy (GB/s)."""

    fma_call: Callable[[], object]
    fma_flops: int
    copy_call: Callable[[], object]
    copy_bytes: int


def make_probes(target, seconds: float = 0.05, copy_bytes: int = 64 << 20) -> Probes:
    """The FMA chains calibrated to about ``seconds`` a call; a copy of ``copy_bytes`` (beyond the caches by
    default)."""
    from superopt.measure.peak import CopyKernel, FmaKernel

    fma = FmaKernel(target)
    iters, dt, ran = fma.calibrate(target.threads, 0.01)
    iters = max(1, int(iters * seconds / max(dt, 1e-6)))
    copy = CopyKernel(target, copy_bytes)
    return Probes(lambda: fma.run(iters, target.threads), fma.flops(iters, target.threads), copy.run, copy.bytes_moved)


# -- one case -------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: dict
    checks: dict = field(default_factory=dict)  # system -> check()
    ms: dict = field(default_factory=dict)  # system -> median ms
    gflops: dict = field(default_factory=dict)
    gbs: dict = field(default_factory=dict)
    roofline: dict = field(default_factory=dict)
    fraction: dict = field(default_factory=dict)  # system -> of the roofline (contractions) or bandwidth (memory)
    fraction_probe: dict = field(default_factory=dict)  # system -> of the ceiling probe timed in the same rounds
    probe: dict = field(default_factory=dict)
    tune: dict = field(default_factory=dict)
    compile_s: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # system -> why it has no time

    def ratio(self, system: str, peer: str) -> float:
        a, b = self.ms.get(system), self.ms.get(peer)
        return b / a if a and b else math.nan

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["ratios"] = {f"{s}/{p}": self.ratio(s, p) for s in ("superopt", "superopt_tuned") for p in PEERS}
        return d


def run_case(case: Case, ceilings: Ceilings, probes: Probes, args, database: Path) -> CaseResult:
    res = CaseResult(case.to_dict())
    inputs = case.inputs(args.seed)
    ref = reference(case, inputs)
    res.checks["reference"] = {"constant": is_constant(ref)}
    calls: dict[str, Callable[[], object]] = {}
    t0 = time.perf_counter()
    op = superopt_default(case, args.threads)
    out = op(*inputs)
    res.compile_s["superopt"] = time.perf_counter() - t0
    calls["superopt"] = lambda: op.run_numpy(*inputs)
    if args.trials > 0:
        t0 = time.perf_counter()
        prog, res.tune = superopt_tuned(case, args.threads, args.trials, args.tune_seconds, database, args.seed)
        res.compile_s["superopt_tuned"] = time.perf_counter() - t0
        feed = dict(zip(prog.graph.inputs, inputs, strict=True))
        out_name = prog.graph.outputs[0]
        res.tune["same_schedules_as_default"] = schedules_of(prog) == schedules_of(op.program(*inputs))
        if not res.tune["same_schedules_as_default"]:
            calls["superopt_tuned"] = lambda: prog.executor(feed)[out_name]
    calls |= peer_calls(case, inputs)
    timed: dict[str, Callable[[], object]] = {}
    for name, fn in calls.items():
        try:
            got = out if name == "superopt" else fn()
        except Exception as e:  # a peer that cannot run the case is reported, not timed
            res.errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            continue
        res.checks[name] = check(got, ref, case)
        if res.checks[name]["ok"]:
            timed[name] = fn
        else:
            res.errors[name] = res.checks[name]["error"]
    timed[PROBE] = probes.copy_call if case.memory_bound else probes.fma_call
    cfg = TimingConfig(warmup_calls=args.warmup, rounds=args.rounds, min_sample_s=args.min_sample_s,
                       settle_s=args.settle_s)
    times = time_alternating(timed, cfg)
    probe_s = times.pop(PROBE).median_s
    if case.memory_bound:
        res.probe = {"kind": "copy", "gbs": probes.copy_bytes / probe_s / 1e9}
    else:
        res.probe = {"kind": "fma chains", "gflops": probes.fma_flops / probe_s / 1e9}
    res.ms = {name: t.median_s * 1e3 for name, t in times.items()}
    if res.tune.get("same_schedules_as_default") and "superopt" in res.ms:
        res.ms["superopt_tuned"] = res.ms["superopt"]
    derive(res, ceilings)
    return res


def derive(res: CaseResult, ceilings: Ceilings) -> None:
    """The rates, the rooflines and the fractions of a case from its median times (``res.ms``) and probe."""
    c = res.case
    flops, nbytes, steps = c["flops"], c["bytes"], c["reduction_steps"]
    line = roofline(flops, nbytes, ceilings, steps) if c["kind"] == "contraction" else None
    if line is not None:
        same_round = roofline(flops, nbytes, Ceilings(res.probe["gflops"], ceilings.bandwidth_gbs, ceilings.write_back),
                              steps)
        fma_only = roofline(flops, nbytes, Ceilings(ceilings.fma_gflops, ceilings.bandwidth_gbs))
        res.roofline = {"gflops": line.gflops, "limit": line.limit, "intensity": line.intensity,
                        "fma_only_gflops": fma_only.gflops, "same_round_gflops": same_round.gflops}
    else:
        res.roofline = {"gbs": ceilings.bandwidth_gbs, "limit": "bandwidth"}
    res.gflops, res.gbs, res.fraction, res.fraction_probe = {}, {}, {}, {}
    for name, ms in res.ms.items():
        sec = ms / 1e3
        res.gbs[name] = nbytes / sec / 1e9
        if line is not None:
            res.gflops[name] = flops / sec / 1e9
            res.fraction[name] = line.fraction(res.gflops[name])
            res.fraction_probe[name] = res.gflops[name] / res.roofline["same_round_gflops"]
        else:
            res.fraction[name] = bandwidth_fraction(nbytes, sec, ceilings.bandwidth_gbs)
            res.fraction_probe[name] = res.gbs[name] / res.probe["gbs"]


# -- the report -------------------------------------------------------------------------------------------------


def summary(results: list[CaseResult]) -> dict:
    """Geomeans and the goals, over the contractions (compute) and the memory-bound cases apart."""
    comp = [r for r in results if r.case["kind"] == "contraction"]
    mem = [r for r in results if r.case["kind"] != "contraction"]
    s: dict = {"contractions": len(comp), "memory_bound": len(mem)}
    for sys_ in ("superopt", "superopt_tuned"):
        for p in PEERS:
            s[f"geomean {sys_}/{p}"] = geomean([r.ratio(sys_, p) for r in comp])
            s[f"geomean {sys_}/{p} (memory-bound)"] = geomean([r.ratio(sys_, p) for r in mem])
        s[f"geomean {sys_} of roofline"] = geomean([r.fraction.get(sys_, math.nan) for r in comp])
        s[f"geomean {sys_} of bandwidth (memory-bound)"] = geomean([r.fraction.get(sys_, math.nan) for r in mem])
        s[f"geomean {sys_} of the same-round probe roofline"] = geomean([r.fraction_probe.get(sys_, math.nan)
                                                                        for r in comp])
        s[f"geomean {sys_} of the same-round copy probe (memory-bound)"] = geomean(
            [r.fraction_probe.get(sys_, math.nan) for r in mem])
    for p in PEERS:
        s[f"geomean {p} of roofline"] = geomean([r.fraction.get(p, math.nan) for r in comp])

    def count(rows, pred) -> str:
        return f"{sum(1 for r in rows if pred(r))}/{len(rows)}"

    goals = {
        f"default >= {GOAL_DEFAULT:.0%} of roofline": count(comp, lambda r: r.fraction.get("superopt", 0) >= GOAL_DEFAULT),
        f"tuned >= {GOAL_TUNED:.0%} of roofline": count(comp, lambda r: r.fraction.get("superopt_tuned", 0) >= GOAL_TUNED),
        f"memory-bound default >= {GOAL_BANDWIDTH:.0%} of bandwidth":
            count(mem, lambda r: r.fraction.get("superopt", 0) >= GOAL_BANDWIDTH),
        f"memory-bound tuned >= {GOAL_BANDWIDTH:.0%} of bandwidth":
            count(mem, lambda r: r.fraction.get("superopt_tuned", 0) >= GOAL_BANDWIDTH),
    }
    for sys_ in ("superopt", "superopt_tuned"):
        for p in PEERS:
            goals[f"{sys_} >= {GOAL_PEER:.1f}x {p}"] = count(results, lambda r, a=sys_, b=p: r.ratio(a, b) >= GOAL_PEER)
        g = s[f"geomean {sys_}/torch"]
        goals[f"{sys_} geomean >= {GOAL_GEOMEAN_TORCH}x torch (contractions)"] = \
            f"{'met' if g >= GOAL_GEOMEAN_TORCH else 'missed'} ({g:.2f}x)"
    s["goals"] = goals
    s["search against the default"] = search_outcomes(results)
    s["wrong"] = {r.case["name"]: {k: v for k, v in r.errors.items()} for r in results if r.errors}
    s["constant"] = sorted(f"{r.case['name']}:{k}" for r in results for k, c in r.checks.items() if c.get("constant"))
    return s


def search_outcomes(results: list[CaseResult]) -> str:
    """The tuned rows against the default: a tie where the search kept the default's schedules, else a win or a
    loss by the two programs' median times."""
    rows = [r for r in results if "superopt_tuned" in r.ms and "superopt" in r.ms]
    ties = sum(1 for r in rows if r.tune.get("same_schedules_as_default"))
    wins = sum(1 for r in rows if not r.tune.get("same_schedules_as_default")
               and r.ms["superopt_tuned"] < r.ms["superopt"])
    return f"{wins} wins, {ties} ties (the default's schedules kept), {len(rows) - wins - ties} losses"


def _f(x: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:{fmt}}{suffix}"


def markdown(results: list[CaseResult], meta: dict, s: dict) -> str:
    lines = ["# Tensor contractions: superopt against torch.einsum, numpy.einsum and TBLIS", "",
             f"- CPU: {meta['cpu']}; {meta['threads']} threads for every system; {meta['versions']}",
             f"- ceilings (benchmarks/peak.py): FMA chains {meta['ceilings']['fma_gflops']:.1f} GFLOP/s, bandwidth "
             f"{meta['ceilings']['bandwidth_gbs']:.1f} GB/s (triad); written-back tile / FMA chains: "
             + (", ".join(f"N={n} {f:.2f}" for n, f in meta['ceilings']['write_back']) or "not measured (--no-tiles)"),
             f"- timing: {meta['timing']}; OMP_WAIT_POLICY {meta['omp_wait_policy']}; superopt tuned: {meta['tuning']}",
             f"- load average at start {meta['load_start']}, at end {meta.get('load_end')} (under load only "
             "ratios within a row are comparable; the probe column is the ceiling timed in the same rounds)",
             f"- command: `{meta['command']}`", "",
             "## Contractions (GFLOP/s; fraction of the roofline; speed ratio of superopt to each peer)", "",
             "| case | equation | GFLOP | limit | roofline | default | tuned | torch | numpy | TBLIS | "
             "default/torch | tuned/torch | tuned/numpy | tuned/TBLIS | probe GFLOP/s | default of probe roofline | "
             "tuned of probe roofline |",
             "|---|---|---:|---|---:|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(r: CaseResult, k: str, unit: str) -> str:
        if k not in r.ms:
            return f"fails: {r.errors.get(k, 'not run')}"[:60]
        v = r.gflops[k] if unit == "gflops" else r.gbs[k]
        flag = " (constant)" if r.checks.get(k, {}).get("constant") else ""
        same = "=" if k == "superopt_tuned" and r.tune.get("same_schedules_as_default") else ""
        return f"{v:.1f}{same} ({r.fraction[k]:.0%}){flag}"

    def ratios_and_probe(r: CaseResult, unit: str) -> str:
        """The row's tail: superopt over each peer, the probe's rate and superopt's fractions of it."""
        ratios = (("superopt", "torch"), ("superopt_tuned", "torch"), ("superopt_tuned", "numpy"),
                  ("superopt_tuned", "tblis"))
        return (" | ".join(_f(r.ratio(a, b), ".2f", "x") for a, b in ratios)
                + f" | {r.probe[unit]:.1f} | {_f(r.fraction_probe.get('superopt'), '.0%')} | "
                  f"{_f(r.fraction_probe.get('superopt_tuned'), '.0%')} |")

    for r in results:
        if r.case["kind"] != "contraction":
            continue
        c = r.case
        lines.append(f"| {c['name']} | `{c['equation']}` {'x'.join(map(str, c['shapes'][0]))}, "
                     f"{'x'.join(map(str, c['shapes'][1]))} | {c['flops'] / 1e9:.2f} | {r.roofline['limit']} | "
                     f"{r.roofline['gflops']:.1f} | " + " | ".join(cell(r, k, "gflops") for k in SYSTEMS) + " | "
                     + ratios_and_probe(r, "gflops"))
    lines += ["", "## Memory-bound cases (GB/s of compulsory traffic; fraction of the bandwidth)", "",
              "| case | equation | MiB moved | default | tuned | torch | numpy | TBLIS | default/torch | tuned/torch | "
              "tuned/numpy | tuned/TBLIS | copy probe GB/s | default of probe | tuned of probe |",
              "|---|---|---:|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if r.case["kind"] == "contraction":
            continue
        c = r.case
        lines.append(f"| {c['name']} | `{c['equation']}` {'x'.join(map(str, c['shapes'][0]))} | "
                     f"{c['bytes'] / (1 << 20):.0f} | " + " | ".join(cell(r, k, "gbs") for k in SYSTEMS) + " | "
                     + ratios_and_probe(r, "gbs"))
    lines += ["", "## Summary", ""]
    lines += [f"- {k}: {_f(v, '.2f') if isinstance(v, float) else v}" for k, v in s.items()
              if k not in ("goals", "wrong", "constant", "search against the default")]
    lines += ["", "## Goals", ""] + [f"- {k}: {v}" for k, v in s["goals"].items()]
    lines += ["", f"Search against the default (`=` in a tuned cell: the default's schedules kept, timed once): "
                  f"{s['search against the default']}."]
    tuned = ", ".join(f"{r.case['name']} {(r.tune.get('tune') or {}).get('measured', 0)}" for r in results)
    lines += ["", f"- outputs that failed the float64 check: {s['wrong'] or 'none'}",
              f"- constant outputs (flagged): {', '.join(s['constant']) or 'none'}", "",
              f"Schedule-search measurements per case: {tuned} (stop reasons in the JSON)."]
    return "\n".join(lines) + "\n"


def versions() -> str:
    from importlib.metadata import version

    import pytblis
    import torch

    return (f"torch {torch.__version__}, numpy {np.__version__}, pytblis {version('pytblis')}, "
            f"python {platform.python_version()}; TBLIS threads {pytblis.get_num_threads()}")


def ceilings_of(target, tiles: bool) -> Ceilings:
    from superopt.measure.peak import fma_peak_gflops, measure_bandwidth, tile_write_back_sweep

    wb = tuple((n, w) for n, _, w in tile_write_back_sweep(target)) if tiles else ()
    return Ceilings(fma_peak_gflops(target).ceiling_gflops, measure_bandwidth(target).triad_gbs, wb)


def select(args) -> list[Case]:
    cases = quick_cases(args.seed) if args.quick else default_cases(args.seed, args.random)
    if args.cases:
        want = args.cases.split(",")
        by_name = {c.name: c for c in cases}
        unknown = [w for w in want if w not in by_name]
        if unknown:
            raise SystemExit(f"unknown case(s) {', '.join(unknown)}; the set has: {', '.join(by_name)}")
        cases = [by_name[w] for w in want]
    if args.memory_bound:
        cases = [c for c in cases if c.memory_bound]
    return cases


def render(path: Path, out: Path, stem: str) -> None:
    """The rooflines, fractions, summary and markdown of a results JSON again from its times and ceilings."""
    d = json.loads(path.read_text())
    cl = d["meta"]["ceilings"]
    ceilings = Ceilings(cl["fma_gflops"], cl["bandwidth_gbs"], tuple(tuple(p) for p in cl["write_back"]))
    results = [CaseResult(**{k: v for k, v in c.items() if k != "ratios"}) for c in d["cases"]]
    for r in results:
        derive(r, ceilings)
    s = summary(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": d["meta"], "summary": s,
                                                  "cases": [x.to_dict() for x in results]}, indent=1, default=str))
    (out / f"{stem}.md").write_text(markdown(results, d["meta"], s))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few small cases (a smoke test)")
    ap.add_argument("--cases", default="", help="comma-separated case names of the set")
    ap.add_argument("--memory-bound", action="store_true",
                    help="only the memory-bound cases (transpositions, sums over axes that are not innermost)")
    ap.add_argument("--trials", type=int, default=64, help="schedule-search measurements per case (0: no tuning)")
    ap.add_argument("--tune-seconds", type=float, default=60.0, help="at most this long a case's search (0: no cap)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the random cases' seed (and the inputs')")
    ap.add_argument("--random", type=int, default=DEFAULT_RANDOM, help="random contractions in the default set")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-sample-s", type=float, default=0.1)
    ap.add_argument("--settle-s", type=float, default=0.1,
                    help="a pause before every block, so that the last system's waiting threads stop spinning")
    ap.add_argument("--no-tiles", action="store_true", help="the FMA chains as the compute ceiling (no tile sweep)")
    ap.add_argument("--omp-wait", choices=("passive", "active"), default=None,
                    help="OMP_WAIT_POLICY for every OpenMP runtime in the process (torch's, the kernels'): passive "
                         "keeps a waiting pool from spinning on a core another system needs, on a loaded machine")
    ap.add_argument("--database", default=None, help="a tuning database to keep (default: a fresh one per run)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--stem", default="contractions")
    ap.add_argument("--render", default=None, help="write the markdown again from a results JSON (no run)")
    args = ap.parse_args(argv)
    if args.render:
        render(Path(args.render), Path(args.out), args.stem)
        return 0
    if args.threads < 1:
        raise SystemExit(f"--threads must be at least 1, got {args.threads}")
    cases = select(args)
    if args.omp_wait:  # read by each OpenMP runtime when it loads: before torch, TBLIS and the first kernel
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait.upper()
    from superopt.target import host_target

    set_threads(args.threads)
    target = host_target(args.threads)
    ceilings = ceilings_of(target, not args.no_tiles)
    probes = make_probes(target)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": cpu_model(), "threads": args.threads,
            "target": target.describe(), "versions": versions(),
            "ceilings": {"fma_gflops": ceilings.fma_gflops, "bandwidth_gbs": ceilings.bandwidth_gbs,
                         "write_back": [list(p) for p in ceilings.write_back]},
            "timing": f"{args.warmup} warm-up calls, {args.rounds} alternating rounds of blocks of at least "
                      f"{args.min_sample_s}s per system, each after a {args.settle_s}s pause and one untimed call, "
                      "medians",
            "tuning": "none" if args.trials <= 0 else
                      f"{args.trials} trials, at most {args.tune_seconds:g}s a case" if args.tune_seconds else
                      f"{args.trials} trials",
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "runtime default"),
            "seed": args.seed, "load_start": [round(v, 2) for v in os.getloadavg()],
            "command": "python benchmarks/contractions.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[CaseResult] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="superopt-contractions-") as scratch:
        database = Path(args.database) if args.database else Path(scratch) / "tuning.jsonl"
        for i, case in enumerate(cases):
            r = run_case(case, ceilings, probes, args, database)
            results.append(r)
            print(f"[{i + 1}/{len(cases)} {time.perf_counter() - started:.0f}s] {case.name}: "
                  + ", ".join(f"{k} {r.fraction[k]:.0%}" for k in r.fraction)
                  + (f"; errors {r.errors}" if r.errors else ""), flush=True)
            meta["load_end"] = [round(v, 2) for v in os.getloadavg()]
            meta["elapsed_s"] = time.perf_counter() - started
            s = summary(results)
            (out / f"{args.stem}.json").write_text(json.dumps(
                {"meta": meta, "summary": s, "cases": [x.to_dict() for x in results]}, indent=1, default=str))
            (out / f"{args.stem}.md").write_text(markdown(results, meta, s))
    s = summary(results)
    print(json.dumps(s, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
