"""Column panels packed inside the kernel (``PackAt``) against the whole operand packed before it, on random
contractions.

Each of ``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the default's panel packing (``superopt/schedule/panel_packing.py``) and without it
(its ``PANEL_L2_SHARE`` set to 0 while that program is built: no box fits). The contractions whose schedules
differ are run on the same seeded inputs, checked against each other, and timed as whole calls in alternating
blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up (the whole pack's time over
the panels'), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/pack_at.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _traces(program) -> list:
    return [t for _, t in sorted(program.executor.traces.items())]


def render(result: dict) -> str:
    s = result["summary"]
    lines = [f"# Column panels packed inside the kernel against the whole operand packed before it "
             f"({result['cpu']}, {result['threads']} threads)", "",
             f"`random_contractions({result['random']}, {result['seed']})` of `benchmarks/contraction_cases.py`, each "
             "compiled as `superopt.op` does, with the default's panel packing (`PackAt`) and without it "
             "(`PANEL_L2_SHARE = 0`); each contraction whose schedules differ timed as whole calls in "
             f"{result['rounds']} alternating rounds of blocks (medians). Speed-up: the whole pack's time over the "
             "panels'.", "",
             f"{len(result['changed'])} of {result['random']} contractions differ.", "",
             "| case | contraction | whole ms | panels ms | speed-up |", "|---|---|---:|---:|---:|"]
    for name, r in result["changed"].items():
        shapes = " x ".join("x".join(map(str, sh)) for sh in r["shapes"])
        lines.append(f"| {name} | `{r['text']}` {shapes} | {r['whole_s'] * 1e3:.3f} | {r['this_s'] * 1e3:.3f} | "
                     f"{r['speedup']:.2f}x |")
    lines += ["", f"Geomean {s['geomean']:.2f}x over the changed cases: {s['wins']} faster by more than "
              f"{result['tie']:.0%}, {s['losses']} slower by more than that, {s['ties']} within it. Every pair's "
              "outputs agreed within 1e-5 of the largest output.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.path.insert(0, str(REPO))
    from benchmarks.contraction_defaults import ab_arguments, ab_rule

    ab_arguments(ap, seed=29, random=120, name="pack_at")
    args = ap.parse_args()
    import superopt.schedule.panel_packing as panel_packing
    from benchmarks.machine import write_result

    @contextmanager
    def whole_packs():
        share, panel_packing.PANEL_L2_SHARE = panel_packing.PANEL_L2_SHARE, 0.0
        try:
            yield
        finally:
            panel_packing.PANEL_L2_SHARE = share

    result = ab_rule(args, whole_packs, lambda a, b: _traces(a) != _traces(b), "whole")
    write_result(args.out, args.name, result, render(result))
    print(render(result))


if __name__ == "__main__":
    main()
