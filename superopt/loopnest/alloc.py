"""Storage a loop nest allocates, and fills of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal as KindOf

import numpy as np

from superopt.ir.types import DTYPES
from superopt.loopnest.values import Literal

AllocKind = KindOf["register", "register_tile", "flag", "local", "workspace"]


@dataclass(frozen=True)
class Alloc:
    """Storage for ``size`` elements of ``dtype``.

    kinds: ``register`` (a scalar accumulator, starting at ``init``), ``register_tile`` (an
    accumulator tile, filled by a following :class:`Fill`), ``flag`` (an int NaN flag, starting at
    0; dtype int32), ``local`` (the buffer of a stage computed inside its consumer's loop), ``workspace`` (a
    temporary tensor in caller-owned scratch memory, kernel argument ``arg_index``). ``lanes``: a register tile's
    vector width on the target (its elements per vector register), where a printer may hold the tile as that
    many-lane vectors."""

    kind: AllocKind
    name: str
    dtype: str
    size: int
    init: Literal | None = None
    arg_index: int | None = None
    lanes: int | None = None

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(DTYPES[self.dtype][0]).itemsize


@dataclass(frozen=True)
class Fill:
    """Set ``buffer[var]`` to ``value`` for every ``var`` in [0, size); ``parallel``: across threads."""

    buffer: str
    size: int
    value: Literal
    var: str
    parallel: bool = False
