"""One rule for whether a compiled output matches the float64 reference, used by every verifier.

An element passes when ``|got - ref| <= atol + rtol * (max|ref| + M / 256)``. ``max|ref|`` is the largest
reference magnitude of that output (the rule for well-conditioned outputs); ``M`` is the magnitude of what the
element is computed from (``superopt.interp.magnitude``: the sum of |terms| of a sum, first-order bounds
through products, quotients and smooth functions). A float32 kernel's rounding error is at most about
``n * u * M`` for chains of ``n`` roundings in any order (``u = 2**-24``), and about ``sqrt(n) * u * M`` in
practice, and ``M`` already counts every product and every statement's rounding once; at the default
``rtol = 1e-3`` the second term allows 64 units of ``u * M``, so an ill-conditioned output (a division by a
nearly cancelling sum) is not failed for rounding it cannot avoid. (A larger allowance would let through
errors no correct kernel makes: on inputs so ill-conditioned that ``M`` is 10^4 times the largest output,
500 units would pass a 50% error.) The second term stays far below the
first wherever the output is well conditioned, so a wrong kernel (a wrong index, a perturbed output) fails
as it did before. Where no magnitude bounds the rounding (a branch on computed data, ``floor``, an extern
op), only the first term applies. Non-float outputs must be equal; NaNs and infinities must sit where the
reference has them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

_TINY = 1e-30  # a scale floor: an all-zero output may only be matched by zeros (up to flushed denormals)
CONDITIONING_WEIGHT = 1.0 / 256  # of the magnitude M, beside the largest reference magnitude (at rtol 1e-3: 64 u)


@dataclass(frozen=True)
class OutputCheck:
    """One output's comparison: ``error`` is the largest ``(|got - ref| - atol) / scale`` with ``scale =
    max|ref| + CONDITIONING_WEIGHT * M``, the relative error widened by the conditioning; it passes when
    ``error <= rtol``."""

    name: str
    error: float
    ok: bool
    message: str = ""
    conditioned: bool = True  # False: no magnitude bound, judged against the largest reference magnitude


def check_output(name: str, got, ref, magnitude: np.ndarray | None, rtol: float, atol: float = 0.0) -> OutputCheck:
    """Compare one compiled output with its float64 reference (see the module docstring)."""
    g, r = np.asarray(got), np.asarray(ref)
    if g.shape != r.shape:
        return OutputCheck(name, float("inf"), False, f"output {name}: shape {g.shape} != reference {r.shape}")
    if not (np.issubdtype(r.dtype, np.floating) and np.issubdtype(g.dtype, np.floating)):
        same = g == r.astype(g.dtype)
        if not np.all(same):
            idx = tuple(int(i) for i in np.unravel_index(int(np.argmin(np.ravel(same))), g.shape))
            return OutputCheck(name, float("inf"), False, f"output {name}: {int((~same).sum())}/{g.size} elements "
                               f"differ; first at {idx}: got {g[idx]!r}, expected {r[idx]!r}")
        return OutputCheck(name, 0.0, True)
    g, r = g.astype(np.float64), r.astype(np.float64)
    finite = np.isfinite(r)
    if not np.array_equal(np.isfinite(g), finite) or not np.array_equal(g[~finite], r[~finite], equal_nan=True):
        return OutputCheck(name, float("inf"), False,
                           f"output {name}: NaNs or infinities differ from the reference")
    fallback = max(float(np.abs(r[finite]).max(initial=0.0)), _TINY)
    conditioned = magnitude is not None and np.shape(magnitude) == r.shape
    scale = np.full(r.shape, fallback)
    if conditioned:
        m = np.asarray(magnitude, np.float64)
        scale = scale + CONDITIONING_WEIGHT * np.where(np.isnan(m), 0.0, m)
    with np.errstate(invalid="ignore"):
        ratio = np.where(finite, np.maximum(np.abs(g - r) - atol, 0.0) / scale, 0.0)
    error = float(ratio.max(initial=0.0))
    if error <= rtol:
        return OutputCheck(name, error, True, conditioned=conditioned)
    bad = int((ratio > rtol).sum())
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), r.shape))
    what = "the largest reference magnitude widened by its terms' magnitude" if conditioned else \
        "the largest reference magnitude"
    return OutputCheck(name, error, False,
                       f"output {name}: {bad}/{r.size} elements differ; worst at {idx}: got {g[idx]!r}, expected "
                       f"{r[idx]!r}: relative error {error:.3g} of {what} ({scale[idx]:.3g}) > {rtol}", conditioned)


def check_outputs(names: Sequence[str], got: Sequence | Mapping, refs: Sequence | Mapping,
                  magnitudes: Sequence | Mapping | None, rtol: float, atol: float = 0.0) -> list[OutputCheck]:
    """``check_output`` for each name; ``got``, ``refs`` and ``magnitudes`` by name or in the order of ``names``
    (``magnitudes`` None: no bound for any)."""
    def pick(xs, k: int, n: str):
        if xs is None:
            return None
        return xs[n] if isinstance(xs, Mapping) else xs[k]

    return [check_output(n, pick(got, k, n), pick(refs, k, n), pick(magnitudes, k, n), rtol, atol)
            for k, n in enumerate(names)]


__all__ = ["OutputCheck", "check_output", "check_outputs"]
