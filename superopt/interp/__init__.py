"""The numpy reference interpreter: the living spec every backend, rewrite and frontend is checked against."""

from superopt.interp.reference import evaluate, evaluate_compute

__all__ = ["evaluate", "evaluate_compute"]
