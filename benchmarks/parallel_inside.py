"""A parallel loop that the threads share unevenly, moved inside the tailed loop that blocked its fusion and fused with
the loop after it, against the parallel loop left outermost, on random contractions.

Each of ``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the default's move (``superopt/schedule/contraction.py``, knob ``C.par_inside``) and
without it (its ``BLOCKER_OUT_SPREAD`` made unbounded while that program is built). The contractions whose schedules
differ are run on the same seeded inputs, checked against each other, and timed as whole calls in alternating
blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up (the time without the move over
the time with it), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/parallel_inside.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def main() -> None:
    import superopt.schedule.contraction as contraction

    ab_main(__doc__, "parallel_inside", 61, 300, contraction, "BLOCKER_OUT_SPREAD", float("inf"), traces_differ,
            "outermost", "A parallel loop shared unevenly moved inside the loop that blocked its fusion",
            "with the default's move of an unevenly shared parallel loop inside the tailed loop after it and without "
            "it (`BLOCKER_OUT_SPREAD` unbounded); each contraction whose schedules differ. Speed-up: the time with "
            "the parallel loop outermost over the time with it moved inside", "inside")


if __name__ == "__main__":
    main()
