"""The schedule space of one kernel: sketches (structure) x knobs (parameters).

A :class:`Point` names a sketch and assigns its knobs; :meth:`ScheduleSpace.trace` turns it into a
replayable trace of primitives. The default heuristic is one point of the space
(:meth:`ScheduleSpace.default_point`), so a search that starts from it can only improve on it.
Knobs are named by stage and role (``C.rows``, ``C.width``), never by loop name, so changing one
never invalidates another; an assignment that does not fit is rejected with ``ScheduleError``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from superopt.ir.compute import Compute
from superopt.schedule.default import build_sketch, sketch_names
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Primitive
from superopt.target import Target


@dataclass(frozen=True)
class Point:
    """A sketch and a knob assignment (knobs not named take the heuristic's value)."""

    sketch: str
    knobs: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(sketch: str, knobs: Mapping[str, Any] | None = None) -> Point:
        return Point(sketch, tuple(sorted((knobs or {}).items())))

    @property
    def knob_map(self) -> dict[str, Any]:
        return dict(self.knobs)

    def to_json(self) -> str:
        return json.dumps({"sketch": self.sketch, "knobs": dict(self.knobs)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Point:
        d = json.loads(text)
        return Point.of(d["sketch"], d.get("knobs", {}))


def check(compute: Compute, trace: Sequence[Primitive], target: Target) -> None:
    """Raise ``ScheduleError`` (and nothing else) when ``trace`` is not a legal schedule of ``compute``:
    ``lower`` guarantees it (tests/test_loopnest.py fuzzes ill-formed traces)."""
    lower(compute, trace, target)


# knob roles that change the loop structure rather than a size (``k_tile`` is structural as on/off)
STRUCTURAL_ROLES = frozenset({"rows_outer", "swap", "col_dims", "red_order", "panel_outer", "pack", "row_window", "vectorize",
                              "inline", "k_pos", "unroll", "fold", "in_place", "next_row", "panel_pos",
                              "rows2_dim", "row_dim", "pack_panels", "par_pos", "par_inside"})


class ScheduleSpace:
    """Sketches that fit ``compute`` on ``target`` and the domains of their knobs."""

    def __init__(self, compute: Compute, target: Target, constant_inputs: frozenset[str] | None = None) -> None:
        self.compute = compute
        self.target = target
        self.consts = frozenset(compute.inputs) if constant_inputs is None else frozenset(constant_inputs)
        self.sketches: list[str] = []
        self._default: Point | None = None
        defaults: set[tuple] = set()
        for name in sketch_names(compute, target):
            try:
                trace = tuple(build_sketch(compute, target, self.consts, name))
                check(compute, trace, target)
            except (ScheduleError, ValueError, KeyError, StopIteration):
                continue
            if trace in defaults:
                continue  # the same structure as an earlier sketch here (no epilogue to apply, ...)
            defaults.add(trace)
            self.sketches.append(name)
            if self._default is None:
                self._default = Point.of(name)
        if not self.sketches:
            self.sketches = ["naive"]
            self._default = Point.of("naive")
        # each point's resolution and checked trace (or the ScheduleError that rejected it): an evolutionary
        # search proposes the same points again and again, and resolving one runs its whole sketch
        self._resolved: dict[Point, tuple | ScheduleError] = {}
        self._traces: dict[Point, tuple[Primitive, ...] | ScheduleError] = {}

    def default_point(self) -> Point:
        """The default heuristic as a point of this space."""
        assert self._default is not None
        return self._default

    def resolve(self, point: Point) -> tuple[tuple[Primitive, ...], dict[str, Any], dict[str, tuple]]:
        """(trace, knobs used with their values, their domains); raises ScheduleError if it does not fit."""
        got = self._resolved.get(point)
        if got is None:
            kn = KnobRecorder(point.knob_map)
            try:
                got = (tuple(build_sketch(self.compute, self.target, self.consts, point.sketch, kn)), kn.used,
                       kn.domains)
            except ScheduleError as e:
                got = e
            except (ValueError, KeyError, IndexError, StopIteration) as e:
                got = ScheduleError(f"sketch {point.sketch!r} does not fit with knobs {point.knob_map}: {e}")
                got.__cause__ = e
            self._resolved[point] = got
        if isinstance(got, ScheduleError):
            raise ScheduleError(str(got))  # (a fresh one: raising the stored one would grow its traceback)
        trace, used, domains = got
        return trace, dict(used), dict(domains)  # (copies: the memo's own stay as resolved)

    def trace(self, point: Point) -> tuple[Primitive, ...]:
        """The point's trace, checked legal (``ScheduleError`` otherwise)."""
        got = self._traces.get(point)
        if got is None:
            try:
                got, used, domains = self.resolve(point)
                # a knob's domain depends on the others (rows on a second row dim, which the register file
                # bounds): a mutation or crossover may combine values no single resolve offered
                outside = [f"{k}={v!r}" for k, v in used.items() if v not in domains.get(k, (v,))]
                if outside:
                    raise ScheduleError(f"knobs outside their domains with the others: {', '.join(outside)}")
                check(self.compute, got, self.target)
            except ScheduleError as e:
                got = e
            self._traces[point] = got
        if isinstance(got, ScheduleError):
            raise ScheduleError(str(got))
        return got

    def normalize(self, point: Point) -> Point:
        """The same schedule with exactly the knobs its sketch uses (unused ones dropped)."""
        _, used, _ = self.resolve(point)
        return Point.of(point.sketch, used)

    def structure(self, point: Point) -> tuple:
        """The point's structural decisions (sketch, operand roles, loop orders, packing, whether the
        reduction is blocked): the levels of the search tree above the numeric knobs."""
        try:
            _, used, _ = self.resolve(point)
        except ScheduleError:
            return (point.sketch, "illegal")
        out = [point.sketch]
        for k, v in sorted(used.items()):
            role = k.rsplit(".", 1)[-1]
            if role in STRUCTURAL_ROLES:
                out.append((k, v))
            elif role == "k_tile":
                out.append((k, v > 0))
        return tuple(out)

    def sample(self, rng: random.Random, sketch: str | None = None) -> Point:
        """A random knob assignment of ``sketch`` (random sketch if None). Structural knobs decide
        which other knobs exist and their domains, so assignment repeats until the set of knobs is stable."""
        sketch = sketch or rng.choice(self.sketches)
        chosen: dict[str, Any] = {}
        for _ in range(4):
            try:
                _, used, domains = self.resolve(Point.of(sketch, chosen))
            except ScheduleError:
                break
            # (and those whose value left their domain: a domain depends on the other knobs' values)
            new = [k for k in domains if k not in chosen or chosen[k] not in domains[k]]
            if not new:
                break
            for k in new:
                chosen[k] = rng.choice(domains[k])
        return Point.of(sketch, chosen)

    def mutate(self, point: Point, rng: random.Random, n: int = 1, structural: bool | None = None) -> Point:
        """Change ``n`` knobs to other values of their domains. ``structural``: only structural knobs
        (True), only numeric ones (False), or any (None)."""
        try:
            _, used, domains = self.resolve(point)
        except ScheduleError:
            return self.sample(rng, point.sketch)
        knobs = dict(used)
        names = [k for k in domains if len(domains[k]) > 1 and (
            structural is None or (k.rsplit(".", 1)[-1] in STRUCTURAL_ROLES | {"k_tile"}) == structural)]
        if not names:
            return self.sample(rng)
        for k in rng.sample(names, min(n, len(names))):
            knobs[k] = _neighbour(domains[k], knobs.get(k), rng)
        return Point.of(point.sketch, knobs)

    def neighbours(self, point: Point) -> list[Point]:
        """The legal points one knob away from ``point``, each trace once (not ``point``'s own): every other
        value of a structural knob, the next value up and down of a numeric one; a reduction block (``k_tile``)
        off gets two sizes, on gets off and the next size up and down.

        Knobs decide each other's domains (the rows a row dim allows): where a change takes another knob's
        value out of its domain, that knob is left to the heuristic, as the default point leaves all of them."""
        try:
            own, used, domains = self.resolve(point)
        except ScheduleError:
            return []
        changes: list[tuple[str, Any]] = []
        for k, domain in domains.items():
            if len(domain) < 2:
                continue
            role = k.rsplit(".", 1)[-1]
            value = used.get(k)
            numeric = all(isinstance(v, int) and not isinstance(v, bool) for v in domain)
            if role == "k_tile" and numeric and value == 0:
                # (off: two block sizes, a third and two thirds up its domain, not all of them)
                on = sorted(v for v in domain if v)
                changes += [(k, v) for v in dict.fromkeys((on[len(on) // 3], on[2 * len(on) // 3]))]
            elif role in STRUCTURAL_ROLES or not numeric or value not in domain:
                changes += [(k, v) for v in domain if v != value]
            else:  # (a size: the next one up and down; a reduction block on, also off)
                ordered = sorted(domain)
                i = ordered.index(value)
                near = [ordered[j] for j in (i - 1, i + 1) if 0 <= j < len(ordered)]
                changes += [(k, v) for v in dict.fromkeys(near + ([0] if role == "k_tile" else []))]
        out: list[Point] = []
        seen = {own}
        for k, v in changes:
            knobs = dict(used) | {k: v}
            for _ in range(4):  # (each pass may move another knob's domain: a few settle it)
                try:
                    _, got, doms = self.resolve(Point.of(point.sketch, knobs))
                except ScheduleError:
                    break
                outside = [o for o, x in got.items() if o != k and x not in doms.get(o, (x,))]
                if not outside:
                    break
                for o in outside:
                    knobs.pop(o, None)
            p = Point.of(point.sketch, knobs)
            try:
                trace = self.trace(p)
            except ScheduleError:
                continue
            if trace not in seen:
                seen.add(trace)
                out.append(p)
        return out

    def crossover(self, a: Point, b: Point, rng: random.Random) -> Point:
        """Each knob from one parent or the other (same sketch; otherwise a copy of ``a``)."""
        if a.sketch != b.sketch:
            return a
        ka, kb = a.knob_map, b.knob_map
        knobs = {k: (ka if rng.random() < 0.5 else kb).get(k, ka.get(k, kb.get(k))) for k in sorted(set(ka) | set(kb))}
        return Point.of(a.sketch, {k: v for k, v in knobs.items() if v is not None})


def _neighbour(domain: tuple, value: Any, rng: random.Random) -> Any:
    """Another value of the domain: for ordered numbers mostly a near one (tile sizes form smooth
    landscapes: 6 rows is a better guess than 16 when 5 was good), sometimes any."""
    others = [v for v in domain if v != value]
    numeric = all(isinstance(v, int) and not isinstance(v, bool) for v in domain)
    if not numeric or value not in domain or rng.random() < 0.3:
        return rng.choice(others)
    ordered = sorted(domain)
    i = ordered.index(value)
    near = [ordered[j] for j in (i - 2, i - 1, i + 1, i + 2) if 0 <= j < len(ordered)]
    near += [v for v in near if abs(ordered.index(v) - i) == 1]  # the closest twice as likely
    if 0 in ordered and value != 0:
        near.append(0)  # 0 means "off" (no reduction block, ...): a neighbour of every "on" value
    return rng.choice(near)
