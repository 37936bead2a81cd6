"""Walking and rebuilding a loop nest (a tree of frozen dataclasses and tuples), where a function replaces some of its
nodes: what the passes over a built nest (index-set splitting, reduction collapsing) share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace

_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # a dataclass -> (its fields, its init fields)

GONE = object()  # what a replacement function returns for a node to drop from its tuple


def node_fields(x: object) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The field names of ``x``'s dataclass and those its constructor takes (None: not a dataclass instance);
    looked up once per class: the walks visit every node of a loop nest, for every candidate schedule the cost
    model scores."""
    t = type(x)
    got = _FIELDS.get(t)
    if got is None:
        if not is_dataclass(t):
            return None
        got = _FIELDS[t] = (tuple(f.name for f in fields(t)), tuple(f.name for f in fields(t) if f.init))
    return got


def node_children(x: object) -> tuple[object, ...]:
    """The members of a tuple, or the field values of a dataclass instance (every field); () for anything else."""
    if isinstance(x, tuple):
        return x
    names = node_fields(x)
    return () if names is None else tuple(getattr(x, n) for n in names[0])


def map_nodes(x: object, fn: Callable[[object], object | None]) -> object:
    """``x`` rebuilt bottom-up where ``fn`` returns a replacement for a node (None: keep walking into it;
    :data:`GONE`: drop it from its tuple)."""
    got = fn(x)
    if got is not None:
        return got
    if isinstance(x, tuple):
        out = tuple(m for c in x if (m := map_nodes(c, fn)) is not GONE)
        return x if len(out) == len(x) and all(a is b for a, b in zip(out, x)) else out
    names = node_fields(x)
    if names is not None:
        old = {n: getattr(x, n) for n in names[1]}
        new = {n: map_nodes(v, fn) for n, v in old.items()}
        # (a subtree nothing changed in is kept as it is: no copy, and a memo keyed by its id still knows it)
        return x if all(new[n] is old[n] for n in old) else replace(x, **new)
    return x
