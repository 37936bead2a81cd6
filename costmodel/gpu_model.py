"""The learned cost model of GPU kernels: :class:`costmodel.xgb.XGBModel` over the GPU features.

Everything but the features is the CPU model's (labels normalized per workload and target, ``fit``,
``update``, ``predict``, saved files); the file says ``"kind": "cuda"`` and carries the GPU feature
version, so ``XGBModel.load`` gives back a :class:`GpuXGBModel`. Train one with
``superopt costmodel train --data DIR`` on records of a cuda target (``superopt dataset collect --target cuda``).
"""

from __future__ import annotations

from costmodel.gpu_features import (
    GPU_FEATURE_NAMES,
    GPU_FEATURE_VERSION,
    GpuFeatureExtractor,
    check_gpu_feature_version,
)
from costmodel.xgb import XGBModel


class GpuXGBModel(XGBModel):
    """An XGBoost ranker of GPU schedule candidates (targets of kind ``cuda``)."""

    kind = "cuda"
    feature_version = GPU_FEATURE_VERSION
    feature_names = GPU_FEATURE_NAMES
    check_features = staticmethod(check_gpu_feature_version)

    @staticmethod
    def _extractor():
        return GpuFeatureExtractor()


__all__ = ["GpuXGBModel"]
