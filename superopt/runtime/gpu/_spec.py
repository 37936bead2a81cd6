"""Build a GpuSpec from a device-attribute getter (the attribute names of the CUDA driver API)."""

from __future__ import annotations

from collections.abc import Callable

from superopt.target import GpuSpec

ATTRIBUTES = ("MULTIPROCESSOR_COUNT", "COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR",
              "MAX_SHARED_MEMORY_PER_BLOCK", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
              "MAX_THREADS_PER_BLOCK", "MAX_THREADS_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_BLOCK",
              "MAX_REGISTERS_PER_MULTIPROCESSOR", "WARP_SIZE", "MAX_BLOCK_DIM_X", "MAX_BLOCK_DIM_Y", "MAX_BLOCK_DIM_Z",
              "MAX_GRID_DIM_X", "MAX_GRID_DIM_Y", "MAX_GRID_DIM_Z")


def spec_from(name: str, memory_bytes: int, attr: Callable[[str], int]) -> GpuSpec:
    """``attr("MULTIPROCESSOR_COUNT")`` -> the value of ``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT``."""
    a = {k: int(attr(k)) for k in ATTRIBUTES}
    return GpuSpec(name=name, compute_capability=(a["COMPUTE_CAPABILITY_MAJOR"], a["COMPUTE_CAPABILITY_MINOR"]),
                   sm_count=a["MULTIPROCESSOR_COUNT"], memory_bytes=int(memory_bytes),
                   shared_memory_per_block=a["MAX_SHARED_MEMORY_PER_BLOCK"],
                   shared_memory_per_block_optin=a["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"],
                   shared_memory_per_sm=a["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"],
                   max_threads_per_block=a["MAX_THREADS_PER_BLOCK"], max_threads_per_sm=a["MAX_THREADS_PER_MULTIPROCESSOR"],
                   registers_per_block=a["MAX_REGISTERS_PER_BLOCK"], registers_per_sm=a["MAX_REGISTERS_PER_MULTIPROCESSOR"],
                   warp_size=a["WARP_SIZE"],
                   max_block_dims=(a["MAX_BLOCK_DIM_X"], a["MAX_BLOCK_DIM_Y"], a["MAX_BLOCK_DIM_Z"]),
                   max_grid_dims=(a["MAX_GRID_DIM_X"], a["MAX_GRID_DIM_Y"], a["MAX_GRID_DIM_Z"]))
