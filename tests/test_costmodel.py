"""The learned cost model: features read off the loop nest, the XGBoost ranker, its files, and the
search driven by it. Ranking is checked on synthetic records with a known cost function."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from costmodel.base import Candidate, candidate_group
from costmodel.features import FEATURE_NAMES, FEATURE_VERSION, FeatureExtractor, FeatureVersionError, extract
from costmodel.metrics import pairwise_accuracy, relative_speed, top_k_score
from costmodel.xgb import XGBConfig, XGBModel
from search.schedule.model_guided import PICK_MARGIN, evolve, pick_schedule, thread_partition, tile_chains
from superopt.lang import compile_op
from superopt.schedule.primitives import CacheWrite, Parallel, Reorder, Split, Unroll, Vectorize, trace_to_json
from superopt.schedule.space import ScheduleSpace
from superopt.target import avx512_target

TARGET = avx512_target(2)
SGEMM = "C[i,j] += A[i,k] * B[k,j]"
F = {n: i for i, n in enumerate(FEATURE_NAMES)}


def _log(x: float) -> float:
    return math.log2(1 + x)


def sgemm(m: int, n: int, k: int):
    return compile_op(SGEMM, {"A": (m, k), "B": (k, n)})


def _candidates(compute, n: int, seed: int, consts=frozenset({"B"})) -> list[Candidate]:
    space = ScheduleSpace(compute, TARGET, consts)
    rng = random.Random(seed)
    out: dict[str, Candidate] = {}
    for _ in range(20 * n):
        try:
            trace = space.trace(space.sample(rng))
        except Exception:  # noqa: BLE001 (an illegal sample is just skipped)
            continue
        out.setdefault(repr(trace), Candidate(compute, trace, TARGET, consts))
        if len(out) == n:
            break
    return list(out.values())


# -- features --------------------------------------------------------------------------------------

def test_features_of_a_naive_and_a_tiled_matmul():
    c = sgemm(256, 256, 256)
    naive = extract(Candidate(c, (), TARGET, frozenset({"B"})))
    assert naive.shape == (len(FEATURE_NAMES),)
    assert naive[F["ops.fma"]] == pytest.approx(_log(256 ** 3))
    assert naive[F["ops.vector_fraction"]] == 0
    assert naive[F["loop.no_parallel"]] == 1 and naive[F["loop.parallel.balance"]] == pytest.approx(0.5)
    assert naive[F["target.vector_bits"]] == 512 and naive[F["target.threads"]] == 2
    tiled_trace = (Reorder("C", ("i", "j", "k")), Split("C", "j", 16), Split("C", "i", 8),
                   Reorder("C", ("j_o", "i_o", "k", "i_i", "j_i")), CacheWrite("C", "k"), Unroll("C", "i_i"),
                   Vectorize("C", "j_i"), Parallel("C", "j_o"))
    tiled = extract(Candidate(c, tiled_trace, TARGET, frozenset({"B"})))
    assert tiled[F["ops.fma"]] == naive[F["ops.fma"]]  # the same arithmetic
    assert tiled[F["ops.vector_fraction"]] == 1.0
    assert tiled[F["loop.parallel.extent"]] == pytest.approx(_log(16))
    assert tiled[F["loop.vector.extent"]] == 16 and tiled[F["loop.vector.efficiency"]] == 1.0
    # an 8x16 tile is 128 floats: 8 zmm registers, no spill
    assert tiled[F["alloc.tile_registers"]] == 8 and tiled[F["alloc.tile_spill"]] == 0
    # the register tile reuses A and B: far less traffic into L1 than the element-at-a-time loop
    assert tiled[F["mem.traffic_l1"]] < naive[F["mem.traffic_l1"]] - 2
    assert tiled[F["mem.intensity_l2"]] > naive[F["mem.intensity_l2"]]


def test_illegal_trace_gives_missing_features_and_the_cache_is_keyed_by_trace():
    c = sgemm(32, 32, 32)
    bad = extract(Candidate(c, (Split("C", "nope", 4),), TARGET, frozenset({"B"})))
    assert np.isnan(bad).all()
    fx = FeatureExtractor()
    cands = _candidates(c, 6, seed=1)
    x1 = fx(cands)
    x2 = fx(list(reversed(cands)))
    assert np.array_equal(x1, x2[::-1])
    assert len({row.tobytes() for row in x1}) > 1


# -- the model ranks ---------------------------------------------------------------------------------

SHAPES = [(64, 64, 64), (128, 256, 64), (256, 128, 512), (96, 200, 48), (300, 64, 128), (512, 512, 64),
          (32, 1024, 256), (128, 128, 128), (200, 96, 96), (64, 512, 32)]


def _known_cost(x: np.ndarray) -> float:
    """A cost with a known answer: work over a speed that rewards vectorizing, balancing the threads and
    a big register tile that does not spill."""
    work = 2 ** x[F["ops.total"]]
    speed = ((0.2 + x[F["loop.vector.efficiency"]]) * x[F["loop.parallel.balance"]]
             * (1 + min(x[F["alloc.tile_registers"]], 12)) / (1 + x[F["alloc.tile_spill"]]))
    return float(work / speed * 1e-9)


@pytest.fixture(scope="module")
def synthetic():
    fx = FeatureExtractor()
    sets = [_candidates(sgemm(*s), 30, seed=i) for i, s in enumerate(SHAPES)]
    train = [c for w in sets[:7] for c in w]
    test = [c for w in sets[7:] for c in w]
    return (train, [_known_cost(x) for x in fx(train)]), (test, [_known_cost(x) for x in fx(test)])


def _quality(model, test, seconds) -> tuple[float, float]:
    pred = model.predict(test)
    groups = [candidate_group(c) for c in test]
    return pairwise_accuracy(groups, pred, seconds), top_k_score(groups, pred, seconds, k=5)


def test_model_learns_a_known_cost_and_shuffled_labels_do_not(synthetic):
    (train, ys), (test, yt) = synthetic
    model = XGBModel(XGBConfig(rounds=150))
    model.fit(train, ys)
    acc, top5 = _quality(model, test, yt)
    assert acc >= 0.85 and top5 >= 0.9, (acc, top5)
    # labels shuffled within each workload carry no ranking (shuffled across workloads they would still tell
    # the workloads' scales apart); one shuffle of 7 x 30 labels can rank by chance, three on average cannot
    groups: dict = {}
    for k, c in enumerate(train):
        groups.setdefault(candidate_group(c), []).append(k)
    noise_accs = []
    for seed in range(3):
        rng, shuffled = random.Random(seed), list(ys)
        for ks in groups.values():
            values = [ys[k] for k in ks]
            rng.shuffle(values)
            for k, v in zip(ks, values):
                shuffled[k] = v
        noise = XGBModel(XGBConfig(rounds=150))
        noise.fit(train, shuffled)
        noise_accs.append(_quality(noise, test, yt)[0])
    acc_noise = sum(noise_accs) / len(noise_accs)
    assert acc_noise < 0.65 < acc, (noise_accs, acc)
    assert model.summary["records"] == len(train) and model.summary["workloads"] == 7


def test_save_load_round_trip_and_online_refinement(synthetic, tmp_path):
    (train, ys), (test, yt) = synthetic
    model = XGBModel(XGBConfig(rounds=60))
    model.fit(train, ys)
    path = tmp_path / "model.json"
    model.save(path)
    loaded = XGBModel.load(path)
    assert np.allclose(loaded.predict(test), model.predict(test))
    assert loaded.summary == model.summary and loaded.targets == [TARGET.to_dict()]
    # online: more trees boosted on the held-out workloads' measurements on top of the loaded ones
    before, _ = _quality(loaded, test, yt)
    loaded.update(test, yt)
    after, _ = _quality(loaded, test, yt)
    assert after >= before and after > 0.9
    assert loaded.booster.num_boosted_rounds() == 60 + loaded.config.online_rounds


def test_model_files_refuse_other_feature_versions_and_garbage(synthetic, tmp_path):
    (train, ys), _ = synthetic
    model = XGBModel(XGBConfig(rounds=5))
    model.fit(train[:40], ys[:40])
    path = tmp_path / "m.json"
    model.save(path)
    doc = json.loads(path.read_text())
    doc["feature_version"] = FEATURE_VERSION + 1
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(FeatureVersionError, match="features version"):
        XGBModel.load(tmp_path / "old.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a superopt cost model"):
        XGBModel.load(tmp_path / "junk.json")
    doc["feature_version"] = FEATURE_VERSION
    doc["booster"] = "AAAA"
    (tmp_path / "cut.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="corrupt booster"):
        XGBModel.load(tmp_path / "cut.json")
    with pytest.raises(ValueError, match="untrained"):
        XGBModel().save(tmp_path / "none.json")


def test_training_labels_are_speed_relative_to_the_workload_best():
    y = relative_speed(["a", "a", "b", "b", "b"], [2.0, 1.0, 10.0, float("inf"), 5.0], failed=0.0)
    assert y.tolist() == [0.5, 1.0, 0.5, 0.0, 1.0]


# -- search driven by a model -------------------------------------------------------------------------

class _Oracle:
    """A 'model' that knows the synthetic cost exactly."""

    trained = True

    def __init__(self) -> None:
        self.fx = FeatureExtractor()

    def update(self, candidates, seconds) -> None:
        return None

    def predict(self, candidates) -> np.ndarray:
        return np.array([-_known_cost(x) for x in self.fx(candidates)])


def test_evolution_in_the_model_returns_best_scored_first_and_skips_excluded():
    c = sgemm(128, 128, 128)
    space = ScheduleSpace(c, TARGET, frozenset({"B"}))
    oracle = _Oracle()
    default = space.trace(space.default_point())
    excluded = {trace_to_json(default)}
    out = evolve(space, oracle, lambda tr: Candidate(c, tr, TARGET, frozenset({"B"})), random.Random(0),
                 [space.default_point()], population=64, generations=2, exclude=excluded)
    assert len(out) >= 64
    assert [s.score for s in out] == sorted((s.score for s in out), reverse=True)
    assert all(trace_to_json(s.trace) not in excluded for s in out)
    # evolving in the oracle finds better points than random samples of the same size
    sampled = _candidates(c, 64, seed=5)
    assert out[0].score >= max(oracle.predict(sampled))


def test_a_pick_under_way_at_the_deadline_stops_breeding_and_picks_among_what_it_scored():
    """The picks' allowance is kept inside a pick too: at its deadline a pick breeds no more candidates (a
    pick lowers and featurizes a hundred or more, seconds for a large kernel) and chooses among those scored."""
    import time

    c = sgemm(96, 160, 64)
    consts = frozenset({"B"})
    free = pick_schedule(c, TARGET, _Oracle(), constant_inputs=consts, population=64, generations=2)
    late = pick_schedule(c, TARGET, _Oracle(), constant_inputs=consts, population=64, generations=2,
                         deadline=time.perf_counter())
    assert free.candidates > 8 and late.candidates <= 1 and late.is_default, (free.candidates, late.candidates)


def test_zero_measurement_pick_keeps_the_default_unless_the_model_prefers_another():
    c = sgemm(96, 160, 64)
    consts = frozenset({"B"})
    default = ScheduleSpace(c, TARGET, consts).trace(ScheduleSpace(c, TARGET, consts).default_point())

    class PrefersDefault:
        trained = True

        def update(self, *_):
            return None

        def predict(self, cands):
            return np.array([1.0 if cand.trace == default else 0.0 for cand in cands])

    keep = pick_schedule(c, TARGET, PrefersDefault(), constant_inputs=consts, population=32, generations=1)
    assert keep.is_default and keep.trace == default and keep.predicted_gain == 0
    pick = pick_schedule(c, TARGET, _Oracle(), constant_inputs=consts, population=64, generations=2)
    fx = FeatureExtractor()
    cost = {False: _known_cost(fx([Candidate(c, pick.trace, TARGET, consts)])[0]),
            True: _known_cost(fx([Candidate(c, default, TARGET, consts)])[0])}
    assert pick.is_default or cost[False] < cost[True]


def test_a_zero_measurement_pick_keeps_enough_fma_chains():
    """A model that scores smaller register tiles higher (it has not learned the FMA latency) does not get
    its favourite: the pick holds at least as many accumulators as the default's tile or the core's
    fma_chains, whichever is fewer."""
    c = sgemm(96, 160, 64)
    consts = frozenset({"B"})
    space = ScheduleSpace(c, TARGET, consts)
    default = space.trace(space.default_point())
    floor = min(tile_chains(c, default, TARGET), TARGET.fma_chains)
    assert floor == TARGET.fma_chains == 8

    class SmallTiles:
        trained = True

        def update(self, *_):
            return None

        def predict(self, cands):
            return np.array([10.0 - 0.1 * tile_chains(c, x.trace, TARGET) for x in cands])

    scored = evolve(space, SmallTiles(), lambda t: Candidate(c, t, TARGET, consts), random.Random(0),
                    [space.default_point()], population=64, generations=2)
    assert tile_chains(c, scored[0].trace, TARGET) < floor  # the model's favourite is latency-bound
    pick = pick_schedule(c, TARGET, SmallTiles(), constant_inputs=consts, population=64, generations=2)
    assert not pick.is_default and tile_chains(c, pick.trace, TARGET) >= floor


def test_a_zero_measurement_pick_needs_a_predicted_gain_above_the_margin():
    """The model's error is larger than its smallest predicted gains: another schedule scored a little above
    the default (less than ``PICK_MARGIN``) does not replace it; one scored well above it does."""
    c = sgemm(96, 160, 64)
    consts = frozenset({"B"})
    space = ScheduleSpace(c, TARGET, consts)
    default = space.trace(space.default_point())

    def model_with_gain(gain: float):
        class Slightly:
            trained = True

            def update(self, *_):
                return None

            def predict(self, cands):  # every other schedule `gain` above the default
                return np.array([0.5 if x.trace == default else 0.5 + gain for x in cands])
        return Slightly()

    small = pick_schedule(c, TARGET, model_with_gain(PICK_MARGIN / 2), constant_inputs=consts, population=16,
                          generations=1)
    assert small.is_default and small.trace == default
    large = pick_schedule(c, TARGET, model_with_gain(2 * PICK_MARGIN), constant_inputs=consts, population=16,
                          generations=1)
    assert not large.is_default and large.trace != default and large.predicted_gain == pytest.approx(2 * PICK_MARGIN)
    # no margin: the smallest predicted gain switches
    assert not pick_schedule(c, TARGET, model_with_gain(PICK_MARGIN / 2), constant_inputs=consts, population=16,
                             generations=1, margin=0.0).is_default


def test_zero_measurement_picks_split_the_work_among_threads_as_the_default_does():
    """Kernels of a graph read what their producers' threads wrote: a pick keeps the default's parallel
    loop and the loops fused into it, however much the model prefers another split."""
    c = sgemm(256, 256, 128)
    consts = frozenset({"B"})
    space = ScheduleSpace(c, TARGET, consts)
    split = thread_partition(space.trace(space.default_point()))
    assert split and any(isinstance(p, Parallel) for p in split)

    class PrefersOtherSplits:
        trained = True

        def update(self, *_):
            return None

        def predict(self, cands):  # other splits first, then longer traces (so that a pick is made)
            return np.array([(thread_partition(x.trace) != split) * 10.0 + len(x.trace) for x in cands])

    free = pick_schedule(c, TARGET, PrefersOtherSplits(), constant_inputs=consts, population=64, generations=1,
                         keep_partition=False)
    assert not free.is_default and thread_partition(free.trace) != split
    kept = pick_schedule(c, TARGET, PrefersOtherSplits(), constant_inputs=consts, population=64, generations=1)
    assert thread_partition(kept.trace) == split


def test_a_model_knows_only_the_vector_isa_classes_it_was_trained_on(synthetic, tmp_path):
    """A ranking learned on one vector ISA is not trusted on another: the zero-measurement schedule pass
    keeps the default heuristic there and the optimize report says why."""
    from dataclasses import replace

    from superopt.api import OptimizeConfig, model_knows, optimize_op

    (train, ys), _ = synthetic
    model = XGBModel(XGBConfig(rounds=20))
    model.fit(train, ys)
    avx512 = avx512_target(2)
    assert model.knows(avx512) and model_knows(model, avx512)  # trained on avx512_target candidates
    avx2 = replace(avx512, vector_bits=256, vector_registers=16)
    assert not model.knows(avx2) and not model_knows(model, avx2)
    assert XGBModel().knows(avx2)  # an untrained (online) model records no target: it may learn any
    path = tmp_path / "m.json"
    model.save(path)
    assert not XGBModel.load(path).knows(avx2)  # the training targets survive a round trip

    prog = optimize_op("C[i,j] += A[i,k] * B[k,j]", {"A": (64, 64), "B": (64, 64)},
                       OptimizeConfig(target=avx2, cost_model=path))
    assert prog.report.from_model == 0
    assert "no cost-model picks (the model was trained on 512-bit x 32 registers machines" in prog.report.stop_reason
