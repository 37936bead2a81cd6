"""Measurement: build candidate kernels, check them against the reference, time them in workers.

See :mod:`superopt.measure.service` (``measure``, ``MeasureService``) and
:mod:`superopt.measure.records` (the JSONL dataset format, ``load_records``).
"""

from superopt.measure.records import FORMAT_VERSION, MeasureRecord, append_records, load_records, records_path
from superopt.measure.service import (
    ErrorCode,
    MeasureConfig,
    MeasureInput,
    MeasureResult,
    MeasureService,
    measure,
)

__all__ = [
    "FORMAT_VERSION", "ErrorCode", "MeasureConfig", "MeasureInput", "MeasureRecord", "MeasureResult",
    "MeasureService", "append_records", "load_records", "measure", "records_path",
]
