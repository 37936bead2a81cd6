"""Tensor types: shape, element type and (optional) dimension names."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Element types the IR knows, mapped to numpy and C spellings.
DTYPES: dict[str, tuple[type, str]] = {
    "float32": (np.float32, "float"),
    "float64": (np.float64, "double"),
    "int64": (np.int64, "int64_t"),
    "int32": (np.int32, "int32_t"),
    "bool": (np.bool_, "bool"),
}


def dtype_name(dt) -> str:
    """Canonical IR dtype name of a numpy dtype (or name)."""
    name = np.dtype(dt).name
    if name not in DTYPES:
        raise TypeError(f"unsupported element type {name!r}; superopt supports {sorted(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in ("float32", "float64")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str = "float32"
    dims: tuple[str, ...] | None = None  # optional dimension names, one per axis

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 0 for s in self.shape):
            raise ValueError(f"negative extent in shape {self.shape}")
        if self.dtype not in DTYPES:
            raise TypeError(f"unsupported element type {self.dtype!r}")
        if self.dims is not None and len(self.dims) != len(self.shape):
            raise ValueError(f"dims {self.dims} do not match rank of shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.dtype][0])

    @property
    def nbytes(self) -> int:
        return self.size * self.np_dtype.itemsize

    def __str__(self) -> str:
        dims = "" if self.dims is None else " (" + ",".join(self.dims) + ")"
        return f"{self.dtype}[{','.join(map(str, self.shape))}]{dims}"
