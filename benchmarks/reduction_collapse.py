"""Chains of reduction loops printed as one loop where every access walks them as one, against the nested loops,
on random contractions.

Each of ``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: by the C printer as it is, which collapses such chains (``superopt/loopnest/collapse.py``),
and by the printer with the collapse left out (``c_emit.collapse_reductions`` made the identity while that program
is built). The schedules are the same; the contractions whose printed kernels differ are run on the same seeded
inputs, checked against each other, and timed as whole calls in alternating blocks (``superopt.measure.timing``,
medians). Reports each changed case's speed-up (the nested loops' time over the collapsed), their geomean, and wins
and losses beyond ``--tie``.

Writes ``benchmarks/results/reduction_collapse.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, sources_differ  # noqa: E402


def _nested(nest):
    return nest


def main() -> None:
    import superopt.codegen.c_emit as c_emit

    ab_main(__doc__, "reduction_collapse", 53, 150, c_emit, "collapse_reductions", _nested, sources_differ, "nested",
            "Reduction loops printed as one loop against the nested loops",
            "by the C printer as it is and with the collapse of reduction loops left out; each contraction whose "
            "printed kernels differ (the schedules are the same). Speed-up: the nested loops' time over the "
            "collapsed", "collapsed")


if __name__ == "__main__":
    main()
