"""Give the C heap's free pages back to the system between the pipeline's passes.

A pass that makes and drops many mid-sized arrays (the layout search's candidate weights, the float64
reference's per-node tensors) leaves them freed inside glibc's heap: above a size glibc's allocator adapts
(up to 32 MB) an array is carved out of the heap rather than mapped on its own, and freed heap pages stay
resident until something trims them. The next pass's peak then stacks on the last one's garbage. A leaf module
(the standard library only); where the C library has no ``malloc_trim`` (not glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache


@lru_cache(maxsize=1)
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def return_free_memory() -> bool:
    """Release the free pages of every malloc arena (``malloc_trim(0)``); whether anything was released."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False


__all__ = ["return_free_memory"]
