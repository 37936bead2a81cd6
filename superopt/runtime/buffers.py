"""Cache-line aligned numpy buffers, and data addresses taken fast.

numpy only guarantees 16-byte alignment. A 64-byte AVX-512 load from an address that is not a
multiple of 64 straddles two cache lines; a register-tiled kernel whose packed weights are
misaligned runs about 2x slower (measured on the capsule votes kernel). Every buffer superopt
owns (packed weights, intermediates, outputs) is therefore allocated on a 64-byte boundary.

``arr.ctypes.data`` builds a ctypes helper object on every access (about 3 us on the test machine, more
than a small kernel runs); :func:`data_address` reads a writable array's address through the buffer
protocol instead (about 0.6 us). The executor takes a few addresses on every call.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import numpy as np

ALIGN = 64

_char = ctypes.c_char
_addressof = ctypes.addressof


def data_address(a: np.ndarray) -> int:
    """The address of ``a``'s first element (``a.ctypes.data``, faster for writable non-empty arrays)."""
    try:
        return _addressof(_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):  # read-only, empty or not contiguous
        return a.ctypes.data


def aligned_empty_at(shape: tuple[int, ...], dtype: np.dtype, align: int = ALIGN,
                     nbytes: int | None = None) -> tuple[np.ndarray, int]:
    """An uninitialized C-contiguous array whose data starts on an ``align``-byte boundary, and that address
    (``nbytes``: the array's size in bytes when the caller knows it)."""
    if nbytes is None:
        nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    addr = data_address(raw)
    offset = -addr % align
    return np.ndarray(shape, dtype, raw, offset), addr + offset


def aligned_empty(shape: int | Sequence[int], dtype=np.float32, align: int = ALIGN) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an ``align``-byte boundary."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    return aligned_empty_at(shape, np.dtype(dtype), align)[0]


def aligned_copy(a: np.ndarray, align: int = ALIGN) -> np.ndarray:
    """A C-contiguous copy of ``a`` on an ``align``-byte boundary."""
    out = aligned_empty(a.shape, a.dtype, align)
    out[...] = a
    return out


def is_aligned(a: np.ndarray, align: int = ALIGN) -> bool:
    return a.ctypes.data % align == 0
