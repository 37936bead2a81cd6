"""The contraction benchmark's cases: a seeded generator of random tensor contractions, named cases, and
memory-bound cases (transpositions, reductions over non-contiguous axes).

A :class:`Case` is an index-notation statement ``C[...] += A[...] * B[...]`` (or ``B[...] = A[...]``,
``B[...] += A[...]``) with an extent per index; it gives superopt's text, the einsum equation the peers run,
the operand shapes, its flops and compulsory bytes.

:func:`random_contraction` draws 2- to 6-dimensional operands, a random order of the indices in every operand
and in the output, extents of which at least one is not a multiple of the vector width, and operand sizes in a
given byte range. :func:`default_cases` is the fixed-seed set the benchmark reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LETTERS = "ijklmnopqrstuvw"  # index names (single letters, so the einsum equation is the same names)
BYTES = 4  # float32
MIB = 1 << 20
LANES = 16  # float32 lanes of an AVX-512 vector: the width extents avoid being all multiples of


@dataclass(frozen=True)
class Case:
    """One benchmark case: ``kind`` is "contraction" (two operands), "transpose" or "reduction" (one)."""

    name: str
    kind: str
    operands: tuple[tuple[str, ...], ...]  # index names of every operand, in memory order (row-major)
    output: tuple[str, ...]
    extents: tuple[tuple[str, int], ...]  # (index, extent), in first-use order

    @property
    def extent(self) -> dict[str, int]:
        return dict(self.extents)

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        e = self.extent
        return [tuple(e[i] for i in op) for op in self.operands]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return tuple(self.extent[i] for i in self.output)

    @property
    def reduced(self) -> tuple[str, ...]:
        """Indices summed over: in an operand, not in the output."""
        seen = [i for op in self.operands for i in op]
        return tuple(dict.fromkeys(i for i in seen if i not in self.output))

    @property
    def reduction_steps(self) -> int:
        e = self.extent
        return math.prod(e[i] for i in self.reduced)

    @property
    def equation(self) -> str:
        """The einsum equation (``kil,lkj->ij``)."""
        return ",".join("".join(op) for op in self.operands) + "->" + "".join(self.output)

    @property
    def text(self) -> str:
        """superopt's index notation."""
        def acc(t: str, idx: tuple[str, ...]) -> str:
            return f"{t}[{','.join(idx)}]"

        names = "AB" if len(self.operands) == 2 else "A"
        out = "C" if len(self.operands) == 2 else "B"
        rhs = " * ".join(acc(t, op) for t, op in zip(names, self.operands, strict=True))
        op = "+=" if self.reduced else "="
        return f"{acc(out, self.output)} {op} {rhs}"

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 for a contraction; one add per input element for a reduction; 0 for a transposition."""
        e = self.extent
        every = math.prod(e.values())
        if self.kind == "contraction":
            return 2 * every
        return every if self.kind == "reduction" else 0

    @property
    def operand_bytes(self) -> list[int]:
        return [BYTES * math.prod(s) for s in self.shapes]

    @property
    def output_bytes(self) -> int:
        return BYTES * math.prod(self.output_shape)

    @property
    def bytes_moved(self) -> int:
        """Compulsory traffic: every operand read once, the output written once."""
        return sum(self.operand_bytes) + self.output_bytes

    @property
    def memory_bound(self) -> bool:
        return self.kind != "contraction"

    def inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s, dtype=np.float32) for s in self.shapes]

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "text": self.text, "equation": self.equation,
                "shapes": [list(s) for s in self.shapes], "output_shape": list(self.output_shape),
                "flops": self.flops, "bytes": self.bytes_moved, "reduction_steps": self.reduction_steps,
                "largest_operand_mib": max(self.operand_bytes) / MIB}


def contraction(name: str, text_like: str, extents: dict[str, int]) -> Case:
    """A case from an einsum equation (``"kil,lkj->ij"``) and its extents."""
    lhs, out = text_like.split("->")
    ops = tuple(tuple(op) for op in lhs.split(","))
    order = list(dict.fromkeys(i for op in ops for i in op))
    missing = [i for i in order if i not in extents]
    if missing:
        raise ValueError(f"case {name}: no extent for index {', '.join(missing)}")
    kind = "contraction" if len(ops) == 2 else ("reduction" if set(order) - set(out) else "transpose")
    return Case(name, kind, ops, tuple(out), tuple((i, int(extents[i])) for i in order))


def _split(rng: np.random.Generator, total: float, n: int, lo: int = 3) -> list[int]:
    """``n`` integer extents (each >= ``lo``) whose product is about ``total``, with random shares (a Dirichlet of
    concentration 3: uneven, but seldom leaving an index of extent 2 or 3 beside one of thousands)."""
    if n == 0:
        return []
    w = rng.dirichlet(np.full(n, 3.0))
    return [max(lo, round(total ** float(x))) for x in w]


def _off_lanes(rng: np.random.Generator, e: int) -> int:
    """A multiple of the vector width moved off it half the time (a few elements up or down)."""
    if e % LANES == 0 and rng.random() < 0.5:
        return max(2, e + int(rng.choice([-3, -1, 1, 3])))
    return e


def random_contraction(rng: np.random.Generator, name: str, *, min_bytes: int = MIB, max_bytes: int = 64 * MIB,
                       max_flops: float = 4e9, max_dims: int = 6, tries: int = 200) -> Case:
    """A random contraction ``C[out] += A[..] * B[..]``: each operand 2 to ``max_dims`` dimensional, its indices in a
    random order; A's and B's sizes drawn log-uniformly in ``[min_bytes, max_bytes]``, the flops at most
    ``max_flops``; at least one extent is not a multiple of the vector width. Deterministic in ``rng``'s state."""
    if not 2 <= max_dims <= 6:
        raise ValueError(f"max_dims must be 2 to 6, got {max_dims}")
    if not 0 < min_bytes <= max_bytes:
        raise ValueError(f"need 0 < min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    for _ in range(tries):
        n_a, n_b = (int(x) for x in rng.integers(2, max_dims + 1, size=2))
        k = int(rng.integers(1, min(n_a, n_b)))  # contracted indices: each operand keeps a free one
        fa, fb = n_a - k, n_b - k
        if fa + fb > max_dims:
            continue
        names = list(LETTERS[: fa + fb + k])
        free_a, free_b, red = names[:fa], names[fa:fa + fb], names[fa + fb:]
        log_lo, log_hi = math.log(min_bytes / BYTES), math.log(max_bytes / BYTES)
        size_a, size_b = (math.exp(rng.uniform(log_lo, log_hi)) for _ in range(2))
        # the reduction's length: long enough to be a contraction, short enough to leave each free index >= 2
        k_hi = min(4096.0, size_a / 8 ** fa, size_b / 8 ** fb)
        if k_hi < 16 * 3 ** (k - 1):
            continue
        k_total = math.exp(rng.uniform(math.log(16 * 3 ** (k - 1)), math.log(k_hi)))
        ext = dict(zip(red, _split(rng, k_total, k), strict=True))
        kk = math.prod(ext.values())
        ext |= dict(zip(free_a, _split(rng, size_a / kk, fa), strict=True))
        ext |= dict(zip(free_b, _split(rng, size_b / kk, fb), strict=True))
        ext = {i: _off_lanes(rng, e) for i, e in ext.items()}
        if all(e % LANES == 0 for e in ext.values()):
            i = names[int(rng.integers(len(names)))]
            ext[i] += 1
        a_idx = tuple(rng.permutation(free_a + red).tolist())
        b_idx = tuple(rng.permutation(free_b + red).tolist())
        out = tuple(rng.permutation(free_a + free_b).tolist())
        case = Case(name, "contraction", (a_idx, b_idx), out,
                    tuple((i, ext[i]) for i in dict.fromkeys(a_idx + b_idx)))
        sizes = case.operand_bytes
        if min(sizes) >= min_bytes and max(sizes) <= max_bytes and case.flops <= max_flops:
            return case
    raise ValueError(f"no random contraction within {min_bytes} to {max_bytes} bytes and {max_flops:g} flops "
                     f"after {tries} draws")


def random_contractions(n: int, seed: int, **kw) -> list[Case]:
    """``n`` random contractions from one seed (``rand{seed}_{i}``)."""
    rng = np.random.default_rng(seed)
    return [random_contraction(rng, f"rand{seed}_{i}", **kw) for i in range(n)]


def named_cases() -> list[Case]:
    """The permuted contractions that fall off the GEMM path, with operands of about 8 MiB, and a plain GEMM."""
    return [
        contraction("kil_lkj", "kil,lkj->ij", {"k": 64, "i": 250, "l": 130, "j": 250}),
        contraction("imkn_jnlm", "imkn,jnlm->ijkl", {"i": 40, "m": 40, "k": 40, "n": 33, "j": 40, "l": 40}),
        contraction("gemm", "ik,kj->ij", {"i": 1000, "k": 1000, "j": 1000}),
    ]


def memory_bound_cases() -> list[Case]:
    """Transpositions and sums over axes that are not the innermost, operands of 8 to 16 MiB."""
    return [
        contraction("transpose_ji", "ij->ji", {"i": 2000, "j": 1500}),
        contraction("transpose_kji", "ijk->kji", {"i": 100, "j": 150, "k": 170}),
        contraction("transpose_ljik", "ijkl->ljik", {"i": 30, "j": 40, "k": 50, "l": 60}),
        contraction("sum_i_of_ij", "ij->j", {"i": 3000, "j": 1000}),
        contraction("sum_j_of_ijk", "ijk->ik", {"i": 120, "j": 200, "k": 150}),
        contraction("sum_ik_of_ijkl", "ijkl->jl", {"i": 30, "j": 50, "k": 40, "l": 70}),
    ]


DEFAULT_SEED = 2024
DEFAULT_RANDOM = 24


def default_cases(seed: int = DEFAULT_SEED, n_random: int = DEFAULT_RANDOM, max_bytes: int = 16 * MIB,
                  max_flops: float = 3e9) -> list[Case]:
    """The benchmark's default set: the named cases, ``n_random`` random contractions with both operands of 1 MiB or
    more (the largest up to ``max_bytes``), and the memory-bound cases."""
    return named_cases() + random_contractions(n_random, seed, max_bytes=max_bytes, max_flops=max_flops) \
        + memory_bound_cases()


def quick_cases(seed: int = DEFAULT_SEED) -> list[Case]:
    """A few small cases for a smoke test (seconds per system)."""
    return [contraction("kil_lkj_small", "kil,lkj->ij", {"k": 24, "i": 70, "l": 20, "j": 90}),
            *random_contractions(2, seed, min_bytes=64 << 10, max_bytes=MIB, max_flops=1e8),
            contraction("transpose_kji_small", "ijk->kji", {"i": 40, "j": 50, "k": 70}),
            contraction("sum_j_of_ijk_small", "ijk->ik", {"i": 40, "j": 50, "k": 70})]


__all__ = ["Case", "contraction", "random_contraction", "random_contractions", "named_cases", "memory_bound_cases",
           "default_cases", "quick_cases", "DEFAULT_SEED", "LANES"]
