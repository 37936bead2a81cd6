"""The register tile's rows chosen again among the dims the column operand does not read, where the innermost row dim
is one it reads or is short and another runs along the row operand's unit stride, against the innermost row dim kept,
on random contractions.

The default's rows are the innermost output dim that is not a column, and are chosen again by fill and contiguity only
where the columns moved or that dim splits badly. Kept, a row dim that the column operand also reads makes every FMA
load its own column vector, and a short one (5 to 8 rows, too many to pair with a second row dim) fills the tile less
than a dim along the row operand's unit stride, whose broadcasts come from one cache line a step
(``rows_to_repick`` in ``superopt/schedule/contraction.py``; not where the tile's lanes lie more than a line apart in
the output, which the innermost rows then write back as a few runs). Each of ``random_contractions(--random,
--seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does (``superopt.op``) twice: with the default
as it is and with the innermost row dim kept. The contractions whose schedules differ are run on the same seeded
inputs, checked against each other, and timed as whole calls in alternating blocks (``superopt.measure.timing``,
medians). Reports each changed case's speed-up (the time with the rows kept over the time with them chosen again),
their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/row_repick.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def _kept(inner, shared, along, ext, lane_stride, line_bytes=64) -> bool:
    return False


def main() -> None:
    import superopt.schedule.contraction as contraction

    ab_main(__doc__, "row_repick", 29, 300, contraction, "rows_to_repick", _kept, traces_differ, "kept",
            "The register tile's rows chosen again where the innermost row dim is read by the column operand or short",
            "with the rows chosen again among the dims the column operand does not read (where the innermost row "
            "dim is one it reads, or is short while another runs along the row operand's unit stride) and with the "
            "innermost row dim kept; each contraction whose schedules differ. Speed-up: the time with the rows kept "
            "over the time with them chosen again", "chosen")


if __name__ == "__main__":
    main()
