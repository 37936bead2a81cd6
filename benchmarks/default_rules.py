"""A rule of the default contraction schedule, or of its printing, on and off, on seeded random contractions the
rule was not written from.

    python benchmarks/default_rules.py RULE [--seed S] [--random N] [--threads 2] [--rounds 7] [--tie 0.03]
                                            [--out benchmarks/results] [--name RULE]
    python benchmarks/default_rules.py --list

A rule is written from the cases at hand; this checks it where it was not. Each rule of :data:`RULES` names the
seam that holds it: a threshold or a function of a module of ``superopt``. Each of
``random_contractions(--random, --seed)`` (``benchmarks/contraction_cases.py``) is compiled as a user does
(``superopt.op``) twice: as it is (``this``) and with the seam replaced while that program is built (the rule off,
``before``). The contractions whose programs differ (their schedules, or their printed C for a printer rule, or
their pack routines) are run on the same seeded inputs, checked against each other, and timed as whole calls, run-time
packs inside, in alternating blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up
(the time with the rule off over the time with it on), their geomean, and the wins and losses beyond ``--tie`` apart.

Writes ``benchmarks/results/RULE.md`` and ``.json``. Each rule's default seed and count are those of its table in
``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.contraction_defaults import ab_arguments, ab_summary  # noqa: E402


def traces_differ(a, b) -> bool:
    """Whether two programs' kernels have different schedules (a schedule rule's test of change)."""
    return [t for _, t in sorted(a.executor.traces.items())] != [t for _, t in sorted(b.executor.traces.items())]


def sources_differ(a, b) -> bool:
    """Whether two programs' kernels were printed as different C (a printer rule's: the same schedules, printed
    otherwise)."""
    return [k.source.code for k in a.executor.kernels] != [k.source.code for k in b.executor.kernels]


def _pack_code(program) -> str:
    code = "\n".join(k.source.code for k in program.executor.kernels)
    return "\n".join(re.findall(r"void \w+_pack_\w+\(.*?\n}", code, re.S))


def packs_differ(a, b) -> bool:
    """Whether two programs' pack routines were printed differently (a pack rule's)."""
    return _pack_code(a) != _pack_code(b)


@dataclass(frozen=True)
class Rule:
    """One rule and how to turn it off: ``module.seam`` set to ``off`` while the ``before`` program is built.

    ``what`` says what the rule does, for ``--list`` and the docs; ``title`` and ``intro`` head its table, whose
    columns are ``before`` (the rule off) and ``this``; ``differ(before, this)`` says whether a case changed;
    ``seed`` and ``count`` are the random contractions its table was measured on."""

    name: str
    module: str
    seam: str
    off: object
    differ: Callable
    before: str
    this: str
    seed: int
    count: int
    what: str
    title: str
    intro: str


def _return_arg(index: int) -> Callable:
    """A seam function that hands back its ``index``-th argument unchanged (a cut or count left as it came)."""
    return lambda *args, **kwargs: args[index]


def _loop_alone(outer, extents, threads, fusable) -> int:
    return extents.get(outer[1], 1)


def _returns(value) -> Callable:
    """A seam function that answers ``value`` whatever it is asked (the rule never applies)."""
    return lambda *args, **kwargs: value


_CONTRACTION = "superopt.schedule.contraction"

RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("pack_order", "superopt.loopnest.build_packs", "PACK_RUN_LINES", 0, packs_differ, "plain", "this", 17, 300,
         "the pack routines' loop order against the plain packed order (`PACK_RUN_LINES = 0`: no source run counts "
         "as short)",
         "Pack loop order against the plain packed order",
         "with this checkout's pack loop order and with the plain packed order (`PACK_RUN_LINES = 0`); each "
         "contraction whose pack routines differ (its run-time packs inside the call). Speed-up: the plain order's "
         "time over this one's"),
    Rule("pack_merged_runs", "superopt.loopnest.build_packs", "merge_shared_runs", lambda loops, src, shape:
         (loops, src, shape), packs_differ, "axis by axis", "merged", 71, 300,
         "where a transposed pack's blocks would be slivers (an axis under a quarter of a block), the axes that lie "
         "next to each other in both the source and the packed layout merged into one loop (`merge_shared_runs`), "
         "against every axis a loop of its own",
         "Pack axes adjacent in both layouts merged where the transposed blocks would be slivers",
         "with the axes of the pack routines whose transposed blocks would be slivers merged where they lie next to "
         "each other, in the same order, in the source and the packed layout, and with every axis a loop of its "
         "own; each contraction whose pack routines differ (its run-time packs inside the call). Speed-up: the time "
         "axis by axis over the time merged"),
    Rule("pack_at", "superopt.schedule.panel_packing", "PANEL_L2_SHARE", 0.0, traces_differ, "whole", "panels", 29,
         120,
         "the column panels packed inside the kernel (`PackAt`) against the whole operand packed before the call "
         "(`PANEL_L2_SHARE = 0`: no box fits)",
         "Column panels packed inside the kernel against the whole operand packed before it",
         "with the default's panel packing (`PackAt`) and without it (`PANEL_L2_SHARE = 0`); each contraction whose "
         "schedules differ. Speed-up: the whole pack's time over the panels'"),
    Rule("reduction_blocks", "superopt.schedule.reduction_blocks", "PANEL_L1_SHARE", float("inf"), traces_differ,
         "unblocked", "blocked", 31, 300,
         "reduction blocks outside the row loops (GotoBLAS' kc) for a column panel read in place, against the whole "
         "reduction under each tile (`PANEL_L1_SHARE` unbounded: every panel fits)",
         "Reduction blocks outside the row loops against the whole reduction under each tile",
         "with the default's reduction blocks and without them (`PANEL_L1_SHARE` unbounded); each contraction whose "
         "schedules differ. Speed-up: the unblocked time over the blocked"),
    Rule("reduction_collapse", "superopt.codegen.c_emit", "collapse_reductions", _return_arg(0), sources_differ,
         "nested", "collapsed", 53, 150,
         "the C printer's collapse of reduction loops that every access walks as one, against the nested loops "
         "(the schedules are the same)",
         "Reduction loops printed as one loop against the nested loops",
         "by the C printer as it is and with the collapse of reduction loops left out; each contraction whose "
         "printed kernels differ (the schedules are the same). Speed-up: the nested loops' time over the "
         "collapsed"),
    Rule("overlap_added_once", "superopt.codegen.c_vector_tile", "OVERLAP_ADDED_ONCE", False, sources_differ,
         "float array", "vectors", 137, 300,
         "a register tile added into the output once per reduction block, its columns no whole number of vectors, "
         "held as vectors with the last overlapping the one before and adding only the lanes past it "
         "(`OVERLAP_ADDED_ONCE`), against the float array (the schedules are the same)",
         "A tile added into the output per reduction block held as vectors, its last vector overlapping",
         "by the C printer as it is (a tile added into the output once per reduction block, its columns no whole "
         "number of vectors, held as vectors with the last overlapping the one before and adding only the lanes "
         "past it) and with such a tile left a float array; each contraction whose printed kernels differ (the "
         "schedules are the same). Speed-up: the float array's time over the vectors'"),
    Rule("scattering_pack", _CONTRACTION, "scattering_pack", _returns(False), traces_differ, "smaller pack",
         "runs kept", 139, 300,
         "the columns kept on the bigger operand where the smaller operand's (the cheaper per-call pack) would lie "
         "more than a cache line apart in the output while the chosen ones lie within one, over at most 1024 "
         "reduction steps between write-backs (`scattering_pack`), against the smaller pack taken",
         "Columns kept where the smaller operand's pack would scatter a short reduction's write-back",
         "with the columns kept on the bigger operand where the smaller operand's would lie more than a cache line "
         "apart in the output while the chosen ones lie within one, over at most 1024 reduction steps between "
         "write-backs, and with the smaller operand's pack taken; each contraction whose schedules differ. "
         "Speed-up: the time with the smaller pack over the time with the runs kept"),
    Rule("parallel_inside", _CONTRACTION, "BLOCKER_OUT_SPREAD", float("inf"), traces_differ, "outermost", "inside",
         61, 300,
         "an unevenly shared outermost parallel loop moved inside the tailed loop that blocked its fusion and fused "
         "with the loop after it, against the loop left outermost (`BLOCKER_OUT_SPREAD` unbounded)",
         "A parallel loop shared unevenly moved inside the loop that blocked its fusion",
         "with the default's move of an unevenly shared parallel loop inside the tailed loop after it and without "
         "it (`BLOCKER_OUT_SPREAD` unbounded); each contraction whose schedules differ. Speed-up: the time with "
         "the parallel loop outermost over the time with it moved inside"),
    Rule("row_refetch_panels", _CONTRACTION, "refetch_blocks", _returns({}), traces_differ, "one column", "panel",
         23, 300,
         "the row pack's count of what is read between two iterations of an outer loop with whole column panels "
         "(`refetch_blocks`), against one column of them",
         "A row operand read again per outer loop, with the column panel read in between",
         "with what is read between two iterations of an outer loop counted with whole column panels and with "
         "one column of them; each contraction whose schedules differ. Speed-up: the time with one column "
         "counted over the time with the panel"),
    Rule("row_repick", _CONTRACTION, "rows_to_repick", _returns(False), traces_differ, "kept", "chosen", 29, 300,
         "the rows chosen again among the dims the column operand does not read, where the innermost row dim is one "
         "it reads or is short while another runs along the row operand's unit stride (`rows_to_repick`), against "
         "the innermost row dim kept",
         "The register tile's rows chosen again where the innermost row dim is read by the column operand or short",
         "with the rows chosen again among the dims the column operand does not read (where the innermost row "
         "dim is one it reads, or is short while another runs along the row operand's unit stride) and with the "
         "innermost row dim kept; each contraction whose schedules differ. Speed-up: the time with the rows kept "
         "over the time with them chosen again"),
    Rule("few_rows_fit_16", _CONTRACTION, "FEW_ROWS_FIT_16", False, traces_differ, "one row", "fitted", 181, 300,
         "on a 16-register file (AVX2), a register tile over an innermost row dim of at most 4 rows given a second "
         "row dim and a width that fits the registers (`FEW_ROWS_FIT_16`), against the 32-register file's tile of "
         "4 rows x 8 vectors, which leaves one row",
         "Few-row register tiles fitted to a 16-register file",
         "on a 16-register file (AVX2) with few-row tiles fitted to it (a second row dim where the row dim has at "
         "most 3 rows; at most 4 vectors whose accumulators fit the registers with a column row and a broadcast) "
         "and with the 32-register file's tile of 8 vectors, which leaves one row; each contraction whose schedules "
         "differ. Speed-up: the one-row tile's time over the fitted one's"),
    Rule("long_row_repick", _CONTRACTION, "LONG_ROWS_REPICKED", False, traces_differ, "up to 8", "any length",
         161, 300,
         "the rows chosen again over an innermost row dim of more than 8 rows too, where another runs along the row "
         "operand's unit stride (`LONG_ROWS_REPICKED`), against such a dim kept whenever it has more than 8 rows",
         "The register tile's rows chosen again over a long innermost row dim off the row operand's unit stride",
         "with the rows chosen again over an innermost row dim of any length (where another runs along the row "
         "operand's unit stride and the tile's lanes lie within a cache line in the output) and only over one of "
         "5 to 8 rows; each contraction whose schedules differ. Speed-up: the time with only 5 to 8 rows chosen "
         "again over the time with any length"),
    Rule("fused_vector_step", _CONTRACTION, "fused_vector_step", _return_arg(2), traces_differ, "cut", "whole", 41,
         300,
         "tiles of few rows over fused columns as wide as a multiple of both the vector width and the fused pair's "
         "inner extent (`fused_vector_step`), against the widths cut to the inner extent alone",
         "Tiles of few rows over fused columns in whole vectors",
         "with the widths of tiles of few rows over fused columns multiples of both the vector width and the "
         "fused pair's inner extent, and cut to the inner extent alone; each contraction whose schedules differ. "
         "Speed-up: the time with the widths cut over the time with whole vectors"),
    Rule("output_run_rows", _CONTRACTION, "output_run_rows", _returns(()), traces_differ, "any rows", "output runs",
         53, 300,
         "the rows chosen again preferring the output's unit stride, where the tile's lanes lie more than a cache "
         "line apart in the output and the reduction between write-backs is 1024 steps or fewer "
         "(`output_run_rows`), against rows chosen by fill and the row operand's contiguity alone",
         "The register tile's rows along the output's unit stride where its lanes lie lines apart there",
         "with the rows chosen again preferring the output's unit stride (where the tile's lanes lie more than a "
         "cache line apart in the output and the tile is written back every 1024 reduction steps or fewer) and "
         "without that preference; each contraction whose schedules differ. Speed-up: the time without the "
         "preference over the time with it"),
    Rule("one_parallel_region", "superopt.loopnest.versioning", "one_parallel_region", _returns(False),
         sources_differ, "two regions", "one region", 61, 300,
         "a peeled parallel loop of register tiles printed as one parallel region, its iterations running the full "
         "tiles or the rest, where two regions would take the threads 1.1 times the rounds or more "
         "(`one_parallel_region`), against two regions",
         "A peeled parallel loop of register tiles printed as one parallel region",
         "with each peeled parallel loop of register tiles printed as one parallel region (its iterations running "
         "the full tiles or the rest) where two would take the threads 1.1 times the rounds or more, and as two "
         "(the full tiles', then the rest's); each contraction whose C differs. Speed-up: the time with two "
         "regions over the time with one"),
    Rule("row_tile_width", _CONTRACTION, "row_tile_width", _return_arg(0), traces_differ, "unnarrowed", "narrowed",
         19, 300,
         "the row dim chosen for the tile as wide as its column panels will be (`row_tile_width`), against one "
         "chosen for the columns' unnarrowed width",
         "The register tile's rows chosen for the width of its narrowed column panels",
         "with the row dim chosen for the tile as wide as its column panels will be and for the columns' "
         "unnarrowed width; each contraction whose schedules differ. Speed-up: the time with the unnarrowed "
         "width over the time with the narrowed one"),
    Rule("uneven_panels", _CONTRACTION, "shared_inside", _loop_alone, traces_differ, "alone", "fused", 13, 80,
         "the count of the loops inside unevenly shared column panels, the next loop fused in where that evens the "
         "threads out (`shared_inside`), against the loop counted alone",
         "Uneven column panels shared by the threads through the next loops fused",
         "with the default's count of the loops inside unevenly shared panels (the next loop fused in where that "
         "evens the threads out) and with the loop alone; each contraction whose schedules differ. Speed-up: the "
         "time with the loop counted alone over the time with the fused loops"),
    Rule("whole_row_tile", _CONTRACTION, "whole_row_tile", _returns(0), traces_differ, "fewer rows", "whole rows",
         131, 300,
         "the innermost row dim along the row operand's unit stride taken whole in a tile of 3 vectors where the "
         "planned tile holds fewer rows and a 3-vector tile fits them (`whole_row_tile`), against the planned tile",
         "A row dim along the row operand's unit stride in one tile of 3 vectors",
         "with the innermost row dim along the row operand's unit stride taken whole in a tile of 3 vectors (where "
         "the planned tile holds fewer of its rows and a 3-vector tile fits them all) and with the planned tile; "
         "each contraction whose schedules differ. Speed-up: the time with the planned tile over the time with "
         "the whole rows"),
    Rule("uneven_panels_outermost", _CONTRACTION, "rows_shared_under_panels", _returns(False), traces_differ,
         "rows outermost", "panels outermost", 107, 300,
         "column panels too few to share evenly kept outermost where the rules put them there and the loops inside "
         "share evenly (`rows_shared_under_panels`), against the rows moved outermost",
         "Uneven column panels kept outermost where the loops inside them share evenly",
         "with uneven column panels kept outermost (one after the other, the threads sharing each one's rows) where "
         "the loops inside them share evenly, and with the rows moved outermost for the threads' balance; each "
         "contraction whose schedules differ. Speed-up: the time with the rows outermost over the time with the "
         "panels outermost"),
)}


@contextmanager
def rule_off(rule: Rule) -> Iterator[None]:
    """Inside the block, ``rule``'s seam holds its ``off`` value: programs built there are built without the rule."""
    module = importlib.import_module(rule.module)
    old = getattr(module, rule.seam)
    setattr(module, rule.seam, rule.off)
    try:
        yield
    finally:
        setattr(module, rule.seam, old)


def ab_rule(args: argparse.Namespace, rule: Rule) -> dict:
    """``rule`` on and off, on ``random_contractions(args.random, args.seed)``: each compiled as a user does
    (``superopt.op``) as it is (``this``) and inside :func:`rule_off` (``rule.before``); the contractions whose
    programs differ run on the same seeded inputs, are checked equal, and are timed as whole calls in alternating
    blocks (medians). Each changed case's speed-up is the ``before`` time over this one."""
    import numpy as np

    import superopt
    from benchmarks.contraction_cases import random_contractions
    from benchmarks.machine import cpu_model
    from superopt.measure.timing import TimingConfig, time_alternating

    before = rule.before
    result: dict = {"cpu": cpu_model(), "threads": args.threads, "seed": args.seed, "random": args.random,
                    "rounds": args.rounds, "tie": args.tie, "changed": {}}
    for case in random_contractions(args.random, args.seed):
        rng = np.random.default_rng(args.seed)
        inputs = [rng.standard_normal(s).astype(np.float32) for s in case.shapes]
        programs = {"this": superopt.op(case.text, threads=args.threads, verify=False).program(*inputs)}
        with rule_off(rule):
            programs[before] = superopt.op(case.text, threads=args.threads, verify=False).program(*inputs)
        if not rule.differ(programs[before], programs["this"]):
            continue
        outs = {w: np.asarray(p(*inputs)) for w, p in programs.items()}
        scale = max(float(np.abs(outs[before]).max()), 1e-30)
        if not np.abs(outs[before] - outs["this"]).max() <= 1e-5 * scale:
            raise SystemExit(f"{case.name}: the two programs give different outputs")
        timed = time_alternating({w: (lambda p=p, x=inputs: p(*x)) for w, p in programs.items()},
                                 TimingConfig(warmup_calls=2, rounds=args.rounds))
        r = {"text": case.text, "shapes": [list(s) for s in case.shapes], f"{before}_s": timed[before].median_s,
             "this_s": timed["this"].median_s}
        r["speedup"] = r[f"{before}_s"] / r["this_s"]
        result["changed"][case.name] = r
        print(f"{case.name:12s} {case.text:48s} {r['speedup']:.2f}x", flush=True)
    result["summary"] = ab_summary([r["speedup"] for r in result["changed"].values()], args.tie)
    return result


def ab_render(result: dict, rule: Rule) -> str:
    """The markdown of an :func:`ab_rule` result: the rule's title (the machine appended) and intro, a row per
    changed case and the summary."""
    s, before = result["summary"], rule.before
    lines = [f"# {rule.title} ({result['cpu']}, {result['threads']} threads)", "",
             f"`random_contractions({result['random']}, {result['seed']})` of `benchmarks/contraction_cases.py`, each "
             f"compiled as `superopt.op` does, {rule.intro}, timed as whole calls in {result['rounds']} alternating "
             "rounds of blocks (medians).", "", f"{len(result['changed'])} of {result['random']} contractions differ.",
             "", f"| case | contraction | {before} ms | {rule.this} ms | speed-up |", "|---|---|---:|---:|---:|"]
    for name, r in result["changed"].items():
        shapes = " x ".join("x".join(map(str, sh)) for sh in r["shapes"])
        lines.append(f"| {name} | `{r['text']}` {shapes} | {r[f'{before}_s'] * 1e3:.3f} | {r['this_s'] * 1e3:.3f} | "
                     f"{r['speedup']:.2f}x |")
    lines += ["", f"Geomean {s['geomean']:.2f}x over the changed cases: {s['wins']} faster by more than "
              f"{result['tie']:.0%}, {s['losses']} slower by more than that, {s['ties']} within it. Every pair's "
              "outputs agreed within 1e-5 of the largest output.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rule", nargs="?", help="the rule to turn off (--list names them)")
    ap.add_argument("--list", action="store_true", help="name the rules, their seeds and what each does")
    ab_arguments(ap, seed=None, random=None, name=None)  # (None: the rule's own)
    args = ap.parse_args(argv)
    if args.list:
        for rule in RULES.values():
            print(f"{rule.name:20s} --seed {rule.seed} --random {rule.count}: {rule.what}")
        return
    if args.rule not in RULES:
        said = f"no rule named {args.rule!r}" if args.rule else "no rule given"
        raise SystemExit(f"{said}; the rules: {', '.join(RULES)}")
    rule = RULES[args.rule]
    args.seed = rule.seed if args.seed is None else args.seed
    args.random = rule.count if args.random is None else args.random
    args.name = args.name or rule.name
    from benchmarks.machine import write_result

    result = ab_rule(args, rule)
    markdown = ab_render(result, rule)
    write_result(args.out, args.name, result, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
