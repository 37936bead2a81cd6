"""Column panels that the threads share unevenly, run one after the other with the threads sharing each panel's next
loops fused, against the panels left the parallel loop, on random contractions.

Where the last panel of columns is partial (209 columns in panels of 48: 5 panels, 3 and 2 on two threads), the
default makes the loop inside the panels the parallel one when the threads share it evenly. Before, that loop had to
share evenly on its own (9 iterations: 5 and 4, so no); now it may with the next loop fused in (9 x 19, within 1%):
``shared_inside`` in ``superopt/schedule/contraction.py``. Each of ``random_contractions(--random, --seed)``
(``benchmarks/contraction_cases.py``) is compiled as a user does (``superopt.op``) twice: with the default as it is
and with ``shared_inside`` counting the loop alone. The contractions whose schedules differ are run on the same
seeded inputs, checked against each other, and timed as whole calls in alternating blocks
(``superopt.measure.timing``, medians). Reports each changed case's speed-up (the time with the loop alone over the
time with the fused loops), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/uneven_panels.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def _loop_alone(outer, extents, threads, fusable) -> int:
    return extents.get(outer[1], 1)


def main() -> None:
    import superopt.schedule.contraction as contraction

    ab_main(__doc__, "uneven_panels", 13, 80, contraction, "shared_inside", _loop_alone, traces_differ, "alone",
            "Uneven column panels shared by the threads through the next loops fused",
            "with the default's count of the loops inside unevenly shared panels (the next loop fused in where that "
            "evens the threads out) and with the loop alone; each contraction whose schedules differ. Speed-up: the "
            "time with the loop counted alone over the time with the fused loops", "fused")


if __name__ == "__main__":
    main()
