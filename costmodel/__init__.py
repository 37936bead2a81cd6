"""Cost models behind one interface: ``update(candidates, seconds)`` / ``predict(candidates)``."""

from costmodel.base import Candidate, CostModel, RandomModel

__all__ = ["Candidate", "CostModel", "RandomModel"]
