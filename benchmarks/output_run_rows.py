"""The register tile's rows chosen along the output's unit stride where the tile's lanes lie more than a cache line
apart in the output and the reduction between write-backs is short, against rows chosen by fill and the row
operand's contiguity alone, on random contractions.

Where the columns are not the output's innermost dims, each lane of the tile lies lines away from the next in the
output. Rows along any other dim then write every accumulator lane to a line of its own at each write-back, 16 lines
per vector of FMAs; rows along the output's unit stride write each lane's rows as one run. Over a reduction of at
most ``SHORT_REDUCTION`` steps between write-backs this traffic is worth choosing the rows by (``output_run_rows`` in
``superopt/schedule/contraction.py``, weighed by ``OUTPUT_RUN_ROWS`` in ``row_dim``). Each of
``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the default as it is and with no rows preferred for the output's runs. The
contractions whose schedules differ are run on the same seeded inputs, checked against each other, and timed as
whole calls in alternating blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up (the
time with no preference over the time with it), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/output_run_rows.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main, traces_differ  # noqa: E402


def _none(out_dims, lane_stride, steps, line_bytes=64) -> tuple[str, ...]:
    return ()


def main() -> None:
    import superopt.schedule.contraction as contraction

    ab_main(__doc__, "output_run_rows", 53, 300, contraction, "output_run_rows", _none, traces_differ, "any rows",
            "The register tile's rows along the output's unit stride where its lanes lie lines apart there",
            "with the rows chosen again preferring the output's unit stride (where the tile's lanes lie more than a "
            "cache line apart in the output and the tile is written back every 1024 reduction steps or fewer) and "
            "without that preference; each contraction whose schedules differ. Speed-up: the time without the "
            "preference over the time with it", "output runs")


if __name__ == "__main__":
    main()
