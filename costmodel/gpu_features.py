"""The cost model's features of GPU kernels (a ``kind='cuda'`` target): one fixed-length vector per candidate.

The same loop nest the CUDA printer prints is walked as for the CPU (:func:`costmodel.features.nest_features`:
operation counts, loops, register tile, per-buffer bytes, reuse), without the CPU target fields; then:

- **launch** (``gpu.*``, :func:`costmodel.cuda_features.gpu_features`): launches, grid and block
  extents, threads per block, blocks, total threads, register tile and register estimate, static shared
  memory, the occupancy estimate, waves over the SMs, flops, bytes in and out and their ratio,
  workspace bytes, device-side packs; and per thread the work (operations / total threads);
- **warps** (``warp.*``, :func:`costmodel.cuda_features.access_features`): 32-byte sectors and
  warp requests of the global-memory accesses, the shares coalesced, broadcast and scattered, and
  requests issued outside any ``thread_x`` loop;
- **device** (``gpu_target.*``): SM count, compute capability, shared memory per block (and opt-in) and
  per SM, threads per block and per SM, registers per block and per SM, warp size, memory, so one model
  can serve several GPUs.

Counts and sizes enter as ``log2(1 + x)``; shares, occupancy and waves as they are. Versioned apart from
the CPU features (:data:`GPU_FEATURE_VERSION`); a model records the version and names it was trained with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from costmodel.base import Candidate
from costmodel.cuda_features import GPU_FEATURE_VERSION
from costmodel.features import FEATURE_NAMES, FeatureExtractor, FeatureVersionError, nest_features
from superopt.loopnest import build_loopnest
from superopt.schedule.plan import ScheduleError, lower
from superopt.target import Target

_NEST = tuple(n for n in FEATURE_NAMES if not n.startswith("target."))
_NEST_INDEX = [FEATURE_NAMES.index(n) for n in _NEST]
# launch features of cuda_features.gpu_features: (name, log-scaled)
_LAUNCH = (("launches", False), ("grid_x", True), ("grid_y", True), ("grid_z", True), ("block_x", True),
           ("block_y", True), ("block_z", True), ("threads_per_block", True), ("blocks", True),
           ("total_threads", True), ("register_tile", True), ("registers_estimate", True), ("shared_bytes", True),
           ("occupancy", False), ("waves", False), ("flops", True), ("io_bytes", True),
           ("arithmetic_intensity", True), ("workspace_bytes", True), ("packs", False))
_WARP = (("sectors", True), ("requests", True), ("coalesced_share", False), ("broadcast_share", False),
         ("scattered_share", False), ("bound_outside", True), ("sector_bytes", True))
_DEVICE = ("sm_count", "cc_major", "cc_minor", "shared_memory_per_block", "shared_memory_per_block_optin",
           "shared_memory_per_sm", "max_threads_per_block", "max_threads_per_sm", "registers_per_block",
           "registers_per_sm", "warp_size", "memory_bytes")

GPU_FEATURE_NAMES: tuple[str, ...] = (
    _NEST + tuple(f"gpu.{k}" for k, _ in _LAUNCH) + ("gpu.work_per_thread",) + tuple(f"warp.{k}" for k, _ in _WARP)
    + tuple(f"gpu_target.{k}" for k in _DEVICE))


def check_gpu_feature_version(version: int, names: Sequence[str]) -> None:
    """Raise :class:`~costmodel.features.FeatureVersionError` unless ``version``/``names`` are this extractor's."""
    if version != GPU_FEATURE_VERSION or tuple(names) != GPU_FEATURE_NAMES:
        raise FeatureVersionError(
            f"GPU cost model was trained on features version {version} ({len(names)} features); this superopt "
            f"extracts GPU version {GPU_FEATURE_VERSION} ({len(GPU_FEATURE_NAMES)}): retrain it "
            "(superopt costmodel train)")


def _log(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


def device_features(target: Target) -> list[float]:
    g = target.gpu
    if g is None:
        raise ValueError(f"GPU features of a {target.kind!r} target (no GPU description)")
    values = {"sm_count": g.sm_count, "cc_major": g.compute_capability[0], "cc_minor": g.compute_capability[1],
              "shared_memory_per_block": _log(g.shared_memory_per_block),
              "shared_memory_per_block_optin": _log(g.shared_memory_per_block_optin),
              "shared_memory_per_sm": _log(g.shared_memory_per_sm), "max_threads_per_block": g.max_threads_per_block,
              "max_threads_per_sm": g.max_threads_per_sm, "registers_per_block": _log(g.registers_per_block),
              "registers_per_sm": _log(g.registers_per_sm), "warp_size": g.warp_size,
              "memory_bytes": _log(g.memory_bytes)}
    return [float(values[k]) for k in _DEVICE]


def extract_gpu(candidate: Candidate) -> np.ndarray:
    """The GPU feature vector of one candidate (all NaN when its trace does not lower or print)."""
    from costmodel.cuda_features import access_features, gpu_features
    from superopt.codegen.cuda_emit import emit_cuda

    c, target = candidate, candidate.target
    try:
        plan = lower(c.compute, c.trace, target)
        nest = build_loopnest(plan)
        source = emit_cuda(plan, "k")
    except (ScheduleError, ValueError, KeyError):
        return np.full(len(GPU_FEATURE_NAMES), np.nan, dtype=np.float32)
    cpu = nest_features(plan, nest, target, c.constant_inputs)
    launch = gpu_features(plan, source, target)
    warp = access_features(plan, nest, target)
    ops = 2.0 ** float(cpu[FEATURE_NAMES.index("ops.total")]) - 1.0
    row = [float(cpu[i]) for i in _NEST_INDEX]
    row += [_log(launch[k]) if log else float(launch[k]) for k, log in _LAUNCH]
    row.append(_log(ops / max(launch["total_threads"], 1)))
    row += [_log(warp[k]) if log else float(warp[k]) for k, log in _WARP]
    row += device_features(target)
    return np.asarray(row, dtype=np.float32)


class GpuFeatureExtractor(FeatureExtractor):
    """GPU features of candidates, cached as the CPU ones are."""

    def __init__(self, cache_size: int = 200_000) -> None:
        super().__init__(cache_size, extract_gpu, GPU_FEATURE_NAMES)


__all__ = ["GPU_FEATURE_NAMES", "GPU_FEATURE_VERSION", "GpuFeatureExtractor", "check_gpu_feature_version",
           "device_features", "extract_gpu"]
