"""What a search may spend and why it stopped: one type of each, for the graph search and the schedule search."""

from __future__ import annotations

import math
from dataclasses import dataclass

# measurements over all kernels of a graph when the user names no budget (``superopt tune``, TuneConfig)
DEFAULT_TRIALS = 200


@dataclass(frozen=True)
class Budget:
    """A search's limits: ``trials`` (the schedule search's measurements, the graph search's expansions) and
    ``seconds`` of wall clock. None is no limit on that count; with both None the search stops by itself."""

    trials: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.trials is not None and self.trials < 0:
            raise ValueError(f"a budget of {self.trials} trials: at least 0")
        if self.seconds is not None and not self.seconds >= 0:
            raise ValueError(f"a budget of {self.seconds} seconds: at least 0")

    def trials_left(self, spent: int) -> float:
        """Trials still to spend after ``spent`` (infinite without a limit on trials)."""
        return math.inf if self.trials is None else self.trials - spent

    def trials_spent(self, spent: int) -> bool:
        return self.trials is not None and spent >= self.trials

    def time_spent(self, elapsed_s: float) -> bool:
        return self.seconds is not None and elapsed_s >= self.seconds


class StopReason(str):
    """Why a search stopped: the sentence a report shows (a ``str``, so reports and JSON carry it as text) and
    its ``kind``, one of ``KINDS``, for code that acts on it."""

    KINDS = ("trials", "time", "converged", "exhausted", "caller", "nothing")
    kind: str

    def __new__(cls, kind: str, text: str) -> StopReason:
        if kind not in cls.KINDS:
            raise ValueError(f"unknown stop kind {kind!r} (known: {', '.join(cls.KINDS)})")
        self = super().__new__(cls, text)
        self.kind = kind
        return self

    def __getnewargs__(self) -> tuple[str, str]:  # copies and pickles keep the kind
        return self.kind, str(self)
