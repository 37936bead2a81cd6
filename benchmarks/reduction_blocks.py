"""Reduction blocks outside the row loops (GotoBLAS' kc) for a column panel read in place, against the whole
reduction under each row tile, on random contractions.

Each of ``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the default's reduction blocks (``superopt/schedule/reduction_blocks.py``) and without
them (its ``PANEL_L1_SHARE`` made unbounded while that program is built: every panel fits). The contractions whose
schedules differ are run on the same seeded inputs, checked against each other, and timed as whole calls in
alternating blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up (the unblocked
time over the blocked), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/reduction_blocks.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def main() -> None:
    import superopt.schedule.reduction_blocks as reduction_blocks

    # (every panel fits: no block)
    ab_main(__doc__, "reduction_blocks", 31, 300, reduction_blocks, "PANEL_L1_SHARE", float("inf"),
            traces_differ, "unblocked",
            "Reduction blocks outside the row loops against the whole reduction under each tile",
            "with the default's reduction blocks and without them (`PANEL_L1_SHARE` unbounded); each contraction "
            "whose schedules differ. Speed-up: the unblocked time over the blocked", "blocked")


if __name__ == "__main__":
    main()
