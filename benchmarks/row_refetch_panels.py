"""A row operand read again per outer loop, counted with the whole column panel read between two iterations, against
one column's worth of it, on random contractions.

Where the row operand's unit-stride dim is a loop outside the tile, each iteration of that loop reads one element of
every cache line of it, and the lines come from memory again at the next iteration unless what is read between the
two stays in L2: the row operand's slice and the column operand's. That was counted as one column of the column
operand where the loop walks whole panels of it (48 columns: a 650 KB panel passed for 13 KB), so a 4 MB row operand
read 9 times over stayed unpacked (``refetch_blocks`` in ``superopt/schedule/contraction.py``). Each of
``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the default as it is and with the panels counted as one column. The contractions whose
schedules differ are run on the same seeded inputs, checked against each other, and timed as whole calls in
alternating blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up (the time with one
column counted over the time with the panel), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/row_refetch_panels.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def _one_column(n_dims, panels, row, row_blocks):
    return {}


def main() -> None:
    import superopt.schedule.contraction as contraction

    ab_main(__doc__, "row_refetch_panels", 23, 300, contraction, "refetch_blocks", _one_column, traces_differ,
            "one column", "A row operand read again per outer loop, with the column panel read in between",
            "with what is read between two iterations of an outer loop counted with whole column panels and with "
            "one column of them; each contraction whose schedules differ. Speed-up: the time with one column "
            "counted over the time with the panel", "panel")


if __name__ == "__main__":
    main()
