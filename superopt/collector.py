"""Fewer passes of Python's cyclic garbage collector while a pipeline runs.

The passes build and drop graphs of thousands of nodes one step at a time (the layout pass blocks DenseNet-121's
nodes one by one, the graph search applies a rule at a thousand sites, the schedule picks lower hundreds of
candidate loop nests), and each step allocates many small objects. With the default threshold (a young
collection every 700 allocations, an older one every tenth of those) the collector walks the pipeline's live
objects over and over: most of the rewrite pass's time went to it. Almost nothing the passes make is a
reference cycle (frozen records and tuples, freed by reference counting), so collecting rarely keeps the
same memory. A leaf module (the standard library only).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# allocations between young collections while a pipeline runs (the default is 700), and young collections
# per older one (the default is 10)
YOUNG = 100_000
OLDER = 50


@contextmanager
def fewer_collections(young: int = YOUNG, older: int = OLDER) -> Iterator[None]:
    """Raise the collector's thresholds (never lower them) for the duration, then restore them."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], young), max(before[1], older), *before[2:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
