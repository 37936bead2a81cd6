"""Tiles of few rows over fused columns split by whole vectors, against the same tiles cut to the fused pair's inner
extent, on random contractions.

Where the tile's rows are few (4 or fewer), the default widens it to 4 or 8 vectors (each broadcast feeds more FMAs),
or takes a second row dim with a tile of 4 vectors. Over a fused pair of column dims, which splits only by multiples
of its inner extent, that width was then cut down to such a multiple: 63 or 126 columns for an inner extent of 7, a
tile that is no whole number of vectors and is printed as scalars. The width is now a multiple of both (112 for 7),
and the second row dim is left out where its tile of 4 vectors is no such multiple (``fused_vector_step`` in
``superopt/schedule/contraction.py``). Each of ``random_contractions(--random, --seed)``
(``benchmarks/contraction_cases.py``) is compiled as a user does (``superopt.op``) twice: with the default as it is
and with the widths cut as before. The contractions whose schedules differ are run on the same seeded inputs, checked
against each other, and timed as whole calls in alternating blocks (``superopt.measure.timing``, medians). Reports
each changed case's speed-up (the time with the widths cut over the time with whole vectors), their geomean, and
wins and losses beyond ``--tie``.

Writes ``benchmarks/results/fused_vector_step.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def _vector(n_dims, ext, lanes, linear) -> int:
    return lanes


def main() -> None:
    import superopt.schedule.contraction as contraction

    ab_main(__doc__, "fused_vector_step", 41, 300, contraction, "fused_vector_step", _vector, traces_differ, "cut",
            "Tiles of few rows over fused columns in whole vectors",
            "with the widths of tiles of few rows over fused columns multiples of both the vector width and the "
            "fused pair's inner extent, and cut to the inner extent alone; each contraction whose schedules differ. "
            "Speed-up: the time with the widths cut over the time with whole vectors", "whole")


if __name__ == "__main__":
    main()
