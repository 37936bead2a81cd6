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

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def main() -> None:
    import superopt.schedule.panel_packing as panel_packing

    # (whole packs: no box fits)
    ab_main(__doc__, "pack_at", 29, 120, panel_packing, "PANEL_L2_SHARE", 0.0, traces_differ, "whole",
            "Column panels packed inside the kernel against the whole operand packed before it",
            "with the default's panel packing (`PackAt`) and without it (`PANEL_L2_SHARE = 0`); each contraction "
            "whose schedules differ. Speed-up: the whole pack's time over the panels'", "panels")


if __name__ == "__main__":
    main()
