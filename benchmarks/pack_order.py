"""The pack routines' loop order against the plain packed order, on random contractions.

Each of ``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: with the pack loop order of ``superopt/loopnest/build_packs.py`` and with the plain
packed order (its ``PACK_RUN_LINES`` set to 0 while that program is built: no run counts as short). The
contractions whose pack routines differ are run on the same seeded inputs, checked equal, and timed as whole calls
(run-time inputs packed inside) in alternating blocks (``superopt.measure.timing``, medians). Reports each changed
case's speed-up (the plain order's time over this order's), their geomean, and wins and losses beyond ``--tie``.

Writes ``benchmarks/results/pack_order.md`` and ``.json``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_main  # noqa: E402


def _pack_code(program) -> str:
    code = "\n".join(k.source.code for k in program.executor.kernels)
    return "\n".join(re.findall(r"void \w+_pack_\w+\(.*?\n}", code, re.S))



def main() -> None:
    import superopt.loopnest.build_packs as build_packs

    # (the plain packed order: no source run counts as short)
    ab_main(__doc__, "pack_order", 17, 300, build_packs, "PACK_RUN_LINES", 0,
            lambda a, b: _pack_code(a) != _pack_code(b), "plain",
            "Pack loop order against the plain packed order",
            "with this checkout's pack loop order and with the plain packed order (`PACK_RUN_LINES = 0`); each "
            "contraction whose pack routines differ (its run-time packs inside the call). Speed-up: the plain "
            "order's time over this one's", "this")


if __name__ == "__main__":
    main()
