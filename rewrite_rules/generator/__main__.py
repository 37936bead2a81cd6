"""``python -m rewrite_rules.generator --out rewrite_rules/generated.json``: regenerate the generated rules."""

from __future__ import annotations

import argparse
import sys

from rewrite_rules.generator import generate, write_rules
from rewrite_rules.generator.enumerate import WORLDS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rewrite_rules.generator", description=__doc__)
    p.add_argument("--out", default="rewrite_rules/generated.json", help="where to write the rules (JSON)")
    p.add_argument("--max-ops", type=int, default=None, help="ops per enumerated program (default: 3)")
    p.add_argument("--worlds", default=",".join(w.name for w in WORLDS),
                   help=f"comma-separated worlds to enumerate (default: all of {[w.name for w in WORLDS]})")
    p.add_argument("--show-failed", action="store_true", help="print the candidates that failed verification")
    args = p.parse_args(argv)
    names = args.worlds.split(",")
    unknown = sorted(set(names) - {w.name for w in WORLDS})
    if unknown:
        p.error(f"unknown world(s) {unknown}")
    report = generate(tuple(w for w in WORLDS if w.name in names), max_ops=args.max_ops)
    write_rules(report.rules, args.out)
    print(report.summary())
    if args.show_failed:
        for math, why in report.failed:
            print(f"  failed: {math}: {why}")
    print(f"wrote {len(report.rules)} rules to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
