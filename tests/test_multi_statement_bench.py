"""The multi-statement benchmark's EM row on a tiny shape: the three ways and both peers run, every one is
checked against the float64 reference inside the row (a wrong result ends the run), superopt's own pick is
the one-pass merge, and materialize holds a buffer the size of V (that the others never store it is
tests/test_chained_reductions.py's, through the memory plan)."""

from benchmarks import multi_statement as bench
from benchmarks.timing import QUICK


def test_the_em_row_times_three_ways_and_both_peers():
    row = bench.em_row("tiny", bench.EM_QUICK["small"], 2, QUICK)
    systems = {s["system"]: s for s in row["systems"]}
    assert set(systems) == {"superopt (recompute)", "superopt (materialize)", "superopt (merge)", "eager",
                            "torch.compile"}
    assert row["superopt_default"] == "superopt (merge)"
    v = row["intermediate_bytes"]
    assert systems["superopt (materialize)"]["largest_buffer_bytes"] >= v
    assert all(s["median_ms"] > 0 for s in row["systems"])
    # the recompute way executes the contraction twice: its executed flops exceed the useful ones
    rec = systems["superopt (recompute)"]
    assert rec["gflops_executed"] > 1.5 * rec["gflops_useful"]
