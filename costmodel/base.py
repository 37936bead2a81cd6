"""The cost model interface the searches use: ``update`` with measurements, ``predict`` scores.

A higher score means a faster candidate expected. Search code only ever calls these two methods, so
the random model below, the XGBoost model (``costmodel/xgb.py``) or any other plugs in without touching it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from superopt.ir.canonical import workload_key
from superopt.ir.compute import Compute
from superopt.schedule.primitives import Primitive
from superopt.target import Target


@dataclass(frozen=True)
class Candidate:
    """One schedule of one workload for one target: what a cost model scores."""

    compute: Compute
    trace: tuple[Primitive, ...]
    target: Target
    constant_inputs: frozenset[str] = frozenset()


class CostModel(Protocol):
    def update(self, candidates: Sequence[Candidate], seconds: Sequence[float]) -> None:
        """Learn from measured candidates (``inf`` for a failed one)."""

    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """A score per candidate; higher is expected faster."""


class RandomModel:
    """Scores at random (seeded): the search then explores in random order. The baseline every
    learned model must beat."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def update(self, candidates: Sequence[Candidate], seconds: Sequence[float]) -> None:
        return None

    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        return np.array([self.rng.random() for _ in candidates])


def candidate_group(c: Candidate) -> str:
    """What a candidate's time is compared within: its workload (rename-invariant, constants
    included) on its target. Cost-model targets are normalized per group (best time / time)."""
    return workload_key(c.compute, sorted(c.constant_inputs)) + "@" + c.target.key()
