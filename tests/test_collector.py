"""The collector's thresholds while a pipeline runs: raised for the duration, restored after, never lowered."""

import gc

import numpy as np

from superopt import api
from superopt.builder import GraphBuilder
from superopt.collector import OLDER, YOUNG, fewer_collections


def test_the_thresholds_are_raised_inside_and_restored_after_even_on_an_error():
    before = gc.get_threshold()
    try:
        with fewer_collections():
            inside = gc.get_threshold()
            raise KeyError("boom")
    except KeyError:
        pass
    assert inside[0] == max(before[0], YOUNG) and inside[1] == max(before[1], OLDER) and inside[2] == before[2]
    assert gc.get_threshold() == before


def test_a_higher_threshold_set_by_the_user_is_kept():
    before = gc.get_threshold()
    gc.set_threshold(10 * YOUNG, before[1], before[2])
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 10 * YOUNG
    finally:
        gc.set_threshold(*before)


def test_optimize_runs_under_the_raised_thresholds_and_restores_them(monkeypatch):
    seen = []
    real = api._optimize

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "_optimize", spy)
    b = GraphBuilder("scale")
    x = b.input("x", (4, 8))
    y = b.compute1("O[i,j] = X[i,j] * 2.0", {"X": x}, "double")
    before = gc.get_threshold()
    prog = api.optimize(b.build([y]), api.OptimizeConfig(threads=1, cost_model=None))
    assert seen and seen[0][0] >= YOUNG and gc.get_threshold() == before
    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert np.allclose(prog(a)[0], 2 * a)
