"""The pack routines' loop order against the plain packed order, on random contractions.

Each of ``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the pack loop order of ``superopt/loopnest/build_packs.py`` and with the plain
packed order (its ``PACK_RUN_LINES`` set to 0 while that program is built: no run counts as short). The
contractions whose pack routines differ are run on the same seeded inputs, checked equal, and timed as whole calls
(run-time inputs packed inside) in alternating blocks (``superopt.measure.timing``, medians). Reports each changed
case's speed-up (the plain order's time over this order's), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/pack_order.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import re
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _pack_code(program) -> str:
    code = "\n".join(k.source.code for k in program.executor.kernels)
    return "\n".join(re.findall(r"void \w+_pack_\w+\(.*?\n}", code, re.S))


def render(result: dict) -> str:
    s = result["summary"]
    lines = [f"# Pack loop order against the plain packed order ({result['cpu']}, {result['threads']} threads)", "",
             f"`random_contractions({result['random']}, {result['seed']})` of `benchmarks/contraction_cases.py`, each "
             "compiled as `superopt.op` does, with this checkout's pack loop order and with the plain packed order "
             "(`PACK_RUN_LINES = 0`); each contraction whose pack routines differ timed as whole calls (its run-time "
             f"packs inside) in {result['rounds']} alternating rounds of blocks (medians). Speed-up: the plain "
             "order's time over this one's.", "",
             f"{len(result['changed'])} of {result['random']} contractions differ.", "",
             "| case | contraction | plain ms | this ms | speed-up |", "|---|---|---:|---:|---:|"]
    for name, r in result["changed"].items():
        shapes = " x ".join("x".join(map(str, sh)) for sh in r["shapes"])
        lines.append(f"| {name} | `{r['text']}` {shapes} | {r['plain_s'] * 1e3:.3f} | {r['this_s'] * 1e3:.3f} | "
                     f"{r['speedup']:.2f}x |")
    lines += ["", f"Geomean {s['geomean']:.2f}x over the changed cases: {s['wins']} faster by more than "
              f"{result['tie']:.0%}, {s['losses']} slower by more than that, {s['ties']} within it. Every pair's "
              "outputs agreed within 1e-5 of the largest output.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.path.insert(0, str(REPO))
    from benchmarks.contraction_defaults import ab_arguments, ab_rule

    ab_arguments(ap, seed=17, random=300, name="pack_order")
    args = ap.parse_args()
    import superopt.loopnest.build_packs as build_packs
    from benchmarks.machine import write_result

    @contextmanager
    def plain_order():  # (no source run counts as short)
        run_lines, build_packs.PACK_RUN_LINES = build_packs.PACK_RUN_LINES, 0
        try:
            yield
        finally:
            build_packs.PACK_RUN_LINES = run_lines

    result = ab_rule(args, plain_order, lambda a, b: _pack_code(a) != _pack_code(b), "plain")
    write_result(args.out, args.name, result, render(result))
    print(render(result))


if __name__ == "__main__":
    main()
