"""The optimization report: one JSON-able dict, rendered as ``report.md`` and ``report.png``.

``build_report`` gathers what a user asks after an optimization: per-kernel times and their share of the
total, the end-to-end latency of superopt next to its peers measured in the same run, the max error
against the reference, search time and trials, rewrites applied, where every schedule came from, and the
nodes that fell back. ``write_report`` renders it (``report.json``, ``report.md``, ``report.png``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def build_report(model: str, optimize_report: Any, profile: Sequence[Any], latency_s: Mapping[str, float],
                 *, rewrites: Sequence[str] = (), schedule_source: Mapping[str, str] | None = None,
                 target: str = "", trials: int = 0, search_s: float = 0.0) -> dict[str, Any]:
    """``profile``: the executor's ``NodeTime`` list; ``latency_s``: system -> median seconds per run
    (superopt first); ``schedule_source``: node -> "database" | "cost model" | "default"."""
    total = sum(t.seconds for t in profile) or 1e-30
    kernels = [{
        "node": t.node,
        "ms": t.seconds * 1e3,
        "share": t.seconds / total,
        "what": t.what,
        "schedule": "; ".join(repr(p) for p in t.trace),
        "schedule_source": (schedule_source or {}).get(t.node, "extern" if not t.trace else "default"),
    } for t in profile]
    opt = dataclasses.asdict(optimize_report) if dataclasses.is_dataclass(optimize_report) else dict(optimize_report)
    return {
        "model": model,
        "target": target,
        "latency_ms": {k: v * 1e3 for k, v in latency_s.items()},
        "max_error": opt.get("max_error"),
        "search": {"seconds": search_s, "trials": trials},
        "optimize": opt,
        "rewrites": list(rewrites),
        "kernels": kernels,
    }


def render_markdown(report: Mapping[str, Any]) -> str:
    lat = report["latency_ms"]
    base = lat.get("superopt")
    lines = [f"# superopt report: {report['model']}", ""]
    if report.get("target"):
        lines += [f"Target: {report['target']}", ""]
    lines += ["| system | latency (ms) | vs superopt |", "|---|---:|---:|"]
    for k, v in lat.items():
        ratio = f"{v / base:.2f}x" if base else "-"
        lines.append(f"| {k} | {v:.3f} | {ratio} |")
    err = report.get("max_error")
    lines += ["", f"Max relative error vs the reference: {'not verified' if err is None else f'{err:.2e}'}",
              f"Search: {report['search']['trials']} trials, {report['search']['seconds']:.1f} s"]
    if report.get("rewrites"):
        lines.append(f"Rewrites applied ({len(report['rewrites'])}): {', '.join(report['rewrites'])}")
    phases = report.get("optimize", {}).get("phases") or {}
    if phases:
        opt = report["optimize"]
        lines += ["", f"Optimized in {opt.get('total_s', 0.0):.2f} s, {opt.get('kernels_compiled', 0)} kernels compiled "
                  f"(of {opt.get('kernels', 0)} distinct):", "", "| phase | seconds |", "|---|---:|"]
        lines += [f"| {p} | {t:.2f} |" for p, t in phases.items()]
        lines.append("")
    fallbacks = report.get("optimize", {}).get("fallbacks") or []
    if fallbacks:
        lines.append(f"Not optimized (fallback): {len(fallbacks)} node(s)")
        lines += [f"- {f}" for f in fallbacks]
    lines += ["", "| kernel | ms | share | schedule from | computes |", "|---|---:|---:|---|---|"]
    for k in report["kernels"]:
        what = k["what"].replace("|", "\\|")[:80]
        lines.append(f"| {k['node']} | {k['ms']:.3f} | {100 * k['share']:.1f}% | {k['schedule_source']} | `{what}` |")
    return "\n".join(lines) + "\n"


def render_png(report: Mapping[str, Any], path: Path, top: int = 15) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    lat = report["latency_ms"]
    a.bar(list(lat), list(lat.values()), color=["tab:green"] + ["tab:gray"] * (len(lat) - 1))
    a.set_ylabel("latency (ms, median)")
    a.set_title("end to end")
    a.tick_params(axis="x", rotation=20)
    ks = report["kernels"][:top][::-1]
    b.barh([k["node"][:28] for k in ks], [k["ms"] for k in ks], color="tab:blue")
    b.set_xlabel("ms per run")
    b.set_title(f"slowest {len(ks)} of {len(report['kernels'])} nodes")
    fig.suptitle(f"superopt: {report['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(report: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    paths = [out / "report.json", out / "report.md", out / "report.png"]
    paths[0].write_text(json.dumps(report, indent=1, default=str))
    paths[1].write_text(render_markdown(report))
    render_png(report, paths[2])
    return paths


__all__ = ["build_report", "render_markdown", "render_png", "write_report"]
