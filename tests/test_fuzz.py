"""Differential fuzzing (superopt.testing.fuzz): random ONNX graphs, random legal schedules, onnxruntime as
the oracle. The seeded run here is bounded (100 graphs); ``python -m superopt.testing.fuzz --count N`` runs
thousands."""

import numpy as np
import onnx
import pytest

from superopt.testing import fuzz
from superopt.testing.fuzz import FuzzConfig, fuzz_seed, judge, random_feed, run_case, shrink, sub_model
from superopt.testing.fuzz_graphs import random_model

CHUNKS = 4
SEEDS_PER_CHUNK = 25  # 100 graphs in all


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeded_fuzz_run_matches_onnxruntime(chunk):
    config = FuzzConfig(schedules="random", threads=1)
    results = [fuzz_seed(s, config) for s in range(chunk, CHUNKS * SEEDS_PER_CHUNK, CHUNKS)]
    bad = [f"seed {r.seed}: {r.outcome}: {r.detail}" for r in results if r.outcome != "pass"]
    assert not bad, "\n".join(bad)
    assert sum(r.kernels for r in results) >= SEEDS_PER_CHUNK  # the graphs really compile kernels


def test_generator_is_deterministic_and_valid():
    for seed in range(40):
        m = random_model(seed)
        assert m.SerializeToString() == random_model(seed).SerializeToString()
        onnx.checker.check_model(m, full_check=True)
        assert 2 <= len(m.graph.node) and 1 <= len(m.graph.output) <= 3
    ops = {n.op_type for s in range(200) for n in random_model(s).graph.node}
    assert {"Conv", "MatMul", "Gemm", "Concat", "Split", "Softmax", "LayerNormalization", "Where"} <= ops


def test_a_planted_miscompilation_is_caught_and_blamed_on_code_generation(monkeypatch):
    from superopt.runtime.executor import GraphExecutor

    real = GraphExecutor.__call__

    def wrong(self, feed):
        out = real(self, feed)
        first = self.graph.outputs[0]
        return out | {first: out[first] + np.float32(0.5)}

    monkeypatch.setattr(GraphExecutor, "__call__", wrong)
    r = fuzz_seed(3, FuzzConfig(schedules="default", threads=1))
    assert r.outcome == "mismatch"
    assert "reference interpreter agrees with onnxruntime" in r.detail


def test_a_wrong_oracle_is_blamed_on_the_importer(monkeypatch):
    real = fuzz.run_onnxruntime
    monkeypatch.setattr(fuzz, "run_onnxruntime", lambda m, f: [o * 2 + 1 for o in real(m, f)])
    r = fuzz_seed(5, FuzzConfig(schedules="default", threads=1))
    assert r.outcome == "mismatch" and "reference interpreter differs too" in r.detail


def test_shrink_finds_the_smallest_failing_subgraph():
    model = random_model(11, min_ops=8, max_ops=12)
    culprit = model.graph.node[len(model.graph.node) // 2]

    def fails(m):  # "fails" whenever the culprit node is in the graph
        return any(n.name == culprit.name for n in m.graph.node)

    small = shrink(model, fails)
    assert fails(small) and len(small.graph.node) <= len(model.graph.node)
    assert len(small.graph.node) == min(len(sub_model(model, t).graph.node)
                                        for n in model.graph.node for t in n.output
                                        if fails(sub_model(model, t)))
    onnx.checker.check_model(small, full_check=True)
    # the shrunk model still runs through the pipeline and agrees with onnxruntime
    assert run_case(small, 0, FuzzConfig(schedules="default", threads=1)).outcome == "pass"


def test_random_feed_covers_every_graph_input():
    m = random_model(7)
    feed = random_feed(m, 0)
    assert set(feed) == {i.name for i in m.graph.input} - {t.name for t in m.graph.initializer}


def test_unknown_schedule_mode_is_refused():
    with pytest.raises(ValueError, match="unknown schedule mode 'fast'"):
        FuzzConfig(schedules="fast")


def test_an_ill_conditioned_output_is_judged_against_onnxruntimes_own_float32_error():
    ref = np.linspace(-2.0, 2.0, 64)
    ort_f32 = ref + 2e-4  # onnxruntime's own float32 result strays 1e-4 (relative) from float64 here
    bad = [(0, "relative error 1.2e-3")]
    near = ref + 2.4e-3  # superopt: 12x onnxruntime's error -> within the allowance
    assert judge(bad, [near], [ort_f32], [ref], 1e-3, ["y"])[0] == "pass"
    far = ref + 0.05  # 250x: a real difference, blamed on code generation
    outcome, detail = judge(bad, [far], [ort_f32], [ref], 1e-3, ["y"])
    assert outcome == "mismatch" and "code generation" in detail and "output y" in detail
    # onnxruntime and the float64 reference disagree: the import (or the op's meaning) is wrong
    outcome, detail = judge(bad, [ref], [ref + 0.5], [ref], 1e-3, ["y"])
    assert outcome == "mismatch" and "importer" in detail
