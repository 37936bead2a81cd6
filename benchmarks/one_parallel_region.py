"""A parallel loop of register tiles peeled into full tiles and the rest, printed as one parallel region whose
iterations each run one or the other where two regions would take the threads more rounds, against two parallel
regions (the full tiles', then the rest's), on random contractions.

The loop nest peels the loop that walks register tiles into the iterations whose tiles are full (constant trip
counts, kept in registers) and the rest (``superopt/loopnest/versioning.py``). Printed as two loops, a parallel one
becomes two parallel regions, and each whose iterations the threads share unevenly leaves one idle: 188 columns in
panels of 48 are 3 full panels and a last one, on 2 threads 2 + 1 panels and then 1, three panels' time where two
would do. Where two regions take ``ONE_REGION_GAIN`` times the rounds of one or more, the loop stays one
(``one_parallel_region``). Each of ``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is
compiled as a user does (``superopt.op``) twice: as it is and with every peeled parallel loop printed as two
regions. The contractions whose C differs are run on the same seeded inputs, checked against each other, and timed
as whole calls in alternating blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up
(the time with two regions over the time with one), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/one_parallel_region.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, sources_differ  # noqa: E402


def _two_regions(extent: int, split: int, threads: int) -> bool:
    return False


def main() -> None:
    import superopt.loopnest.versioning as versioning

    ab_main(__doc__, "one_parallel_region", 61, 300, versioning, "one_parallel_region", _two_regions, sources_differ,
            "two regions", "A peeled parallel loop of register tiles printed as one parallel region",
            "with each peeled parallel loop of register tiles printed as one parallel region (its iterations running "
            "the full tiles or the rest) where two would take the threads 1.1 times the rounds or more, and as two "
            "(the full tiles', then the rest's); each contraction whose C differs. Speed-up: the time with two "
            "regions over the time with one", "one region")


if __name__ == "__main__":
    main()
