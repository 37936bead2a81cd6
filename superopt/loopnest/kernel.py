"""The root of a loop nest: kernel arguments, workspace, stage nests, pack routines."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from superopt.loopnest.alloc import Alloc
from superopt.loopnest.statements import StageNest
from superopt.schedule.kernel_plan import PackLayout


@dataclass(frozen=True)
class Param:
    """Kernel argument ``index``: a contiguous row-major buffer (an input is read-only)."""

    name: str
    dtype: str
    is_input: bool
    index: int


@dataclass(frozen=True)
class Joined:
    """``outer * factor + inner``: an axis index rebuilt from a split axis of a packed layout."""

    outer: str
    factor: int
    inner: str


@dataclass(frozen=True)
class PackStep:
    """One loop header of a pack routine: ``each`` element of loop ``var``, its ``runs`` (steps of a transpose's
    span) or its ``blocks`` (steps of a transpose's block, within the current run where ``runs`` came first)."""

    var: str
    how: Literal["each", "runs", "blocks"] = "each"


@dataclass(frozen=True)
class PackNest:
    """Copy input ``tensor`` into its packed layout: loops ``loops`` (var, extent) over the packed
    shape ``dst_shape``; the source element at per-axis ``src_index`` (one per source axis) lands at
    the packed per-axis index ``loops``' vars. ``in_range``: (source axis index, limit) below which the
    source is read, zero above (the padded tail of a split axis). ``parallel``: how many leading loops
    the threads share (collapsed into one parallel loop; 0: one thread packs it all). ``transpose``: where
    the packed layout's innermost axis is not the source's, (its loop, the loop of the source's innermost
    axis, the block B, the source's stride along the first, the packed stride along the second, a span): both
    loops step by B and each step copies a B x B block transposed in registers, the second in runs of the span where
    ``order`` has its runs. ``order``: the loop headers outermost first, each loop once (twice for runs and their
    blocks); the copy statement sits inside the last. ``box``: the routine packs one box of the layout (``PackAt``)
    from the source element its caller points at, each loop (of the box's extent) to a count its caller passes; a
    box its counts cut short is zeroed first."""

    tensor: str
    dtype: str
    layout: PackLayout
    loops: tuple[tuple[str, int], ...]
    src_shape: tuple[int, ...]
    src_index: tuple[str | Joined, ...]
    in_range: tuple[str | Joined, int] | None
    parallel: int = 0
    transpose: tuple[str, str, int, int, int, int] | None = None
    order: tuple[PackStep, ...] = ()
    box: bool = False


@dataclass(frozen=True)
class LoopNest:
    """One kernel as an explicit tree: every structural decision of lowering, none left to a printer.

    ``params``: inputs (packed ones in their packed layout) then outputs; ``workspace``: temporaries
    in caller-owned scratch, passed after the outputs; ``body``: the root stages in order (attached
    stages sit inside their consumer's loop, epilogue stages at their producer's write-back)."""

    params: tuple[Param, ...]
    workspace: tuple[Alloc, ...]
    body: tuple[StageNest, ...]
    packs: tuple[PackNest, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    vector_lanes: int | None = None  # the target's float32 lanes on a CPU (the widest vector a printer may spell)
    box_packs: tuple[PackNest, ...] = ()  # the routines of the inputs packed box by box inside the kernel (PackBox)
    threads: int = 0  # a kernel with box packs runs on at most this many threads (a workspace slot each)

    @property
    def layouts(self) -> dict[str, PackLayout]:
        return {p.tensor: p.layout for p in self.packs}

    @property
    def workspace_bytes(self) -> tuple[int, ...]:
        return tuple(a.nbytes for a in self.workspace)

    def walk(self) -> Iterator:
        """Every node with its enclosing loops: see :func:`superopt.loopnest.walk.walk`."""
        from superopt.loopnest.walk import walk

        return walk(self)
