"""Many arrays in one file, each on a cache-line boundary, read back as read-only views of a memory map.

A saved program's weights (the graph's constants and the kernels' packed copies of them) are written raw, not
pickled: loading maps the file instead of reading it, so a second ``optimize`` of a large model neither copies
its weights nor packs them again, and the pages a run never touches (a weight only its packed copy is read
from) never become resident. The map is read-only (``mmap.ACCESS_READ``): a view cannot be written through, so
:class:`superopt.ir.graph.Constant` takes it as its private copy. A file is written once and replaced only by
renaming a new one into place, never rewritten in place: a map stays valid while a program uses it, even after
its cache entry is evicted.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from superopt.runtime.buffers import ALIGN


def write_arrays(path: Path, arrays: Sequence[np.ndarray]) -> tuple[list[dict[str, Any]], str]:
    """Write ``arrays`` (C order) to ``path``, each starting on an ``ALIGN``-byte offset; returns the index
    :func:`map_arrays` reads them back with (offset, dtype, shape per array) and the file's sha256 (computed
    as it is written: the file is not read back)."""
    from concurrent.futures import ThreadPoolExecutor

    index = []
    h = hashlib.sha256()
    # the hash runs on a thread of its own, in the order the bytes are written, while the file is written: both
    # release the interpreter on large buffers, so a model's weights are hashed in the write's shadow
    with open(path, "wb") as f, ThreadPoolExecutor(1, thread_name_prefix="superopt-hash") as hasher:
        at = 0
        for a in arrays:
            pad = -at % ALIGN
            f.write(b"\0" * pad)
            hasher.submit(h.update, b"\0" * pad)
            at += pad
            a = np.ascontiguousarray(a)
            index.append({"offset": at, "dtype": a.dtype.str, "shape": list(a.shape)})
            if a.nbytes:
                data = memoryview(a.reshape(-1)).cast("B")
                f.write(data)
                hasher.submit(h.update, data)
            at += a.nbytes
    return index, h.hexdigest()


def map_arrays(path: Path, index: Sequence[dict[str, Any]]) -> list[np.ndarray]:
    """The arrays :func:`write_arrays` wrote, as read-only views of one map of ``path`` (the map stays open as
    long as any view does). Raises ``ValueError`` when the file is shorter than the index says."""
    size = Path(path).stat().st_size
    if size == 0:
        mm = b""
    else:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    out = []
    for e in index:
        dtype, shape = np.dtype(e["dtype"]), tuple(int(d) for d in e["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if e["offset"] + count * dtype.itemsize > size:
            raise ValueError(f"{path} is shorter than its index says")
        out.append(np.frombuffer(mm, dtype, count, e["offset"]).reshape(shape) if count else np.empty(shape, dtype))
    return out


__all__ = ["write_arrays", "map_arrays"]
