"""The register tile's row dim chosen for the tile as wide as its column panels will be, against one chosen for the
columns' unnarrowed width, on random contractions.

Where the columns are chosen by contiguity, their width may narrow afterwards: a column operand past L2 in too few
panels for the threads to share evenly takes panels of 2 or 3 vectors instead of 4. The row dim was chosen for the
4-vector tile (6 rows at most: ``k``'s 5 rows fill it), then ran in a tile of 2 vectors, where 27 rows of ``m`` as
4 x 7 fill it better (``row_tile_width`` in ``superopt/schedule/contraction.py``). Each of
``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the default as it is and with the row dim chosen for the unnarrowed width. The
contractions whose schedules differ are run on the same seeded inputs, checked against each other, and timed as whole
calls in alternating blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up (the time
with the unnarrowed width over the time with the narrowed one), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/row_tile_width.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def _unnarrowed(width, ncol, inner, window, b, st, target) -> int:
    return width


def main() -> None:
    import superopt.schedule.contraction as contraction

    ab_main(__doc__, "row_tile_width", 19, 300, contraction, "row_tile_width", _unnarrowed, traces_differ,
            "unnarrowed", "The register tile's rows chosen for the width of its narrowed column panels",
            "with the row dim chosen for the tile as wide as its column panels will be and for the columns' "
            "unnarrowed width; each contraction whose schedules differ. Speed-up: the time with the unnarrowed "
            "width over the time with the narrowed one", "narrowed")


if __name__ == "__main__":
    main()
