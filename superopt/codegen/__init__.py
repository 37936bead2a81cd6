"""Lowering of a scheduled Compute to a loop nest and to C (``c_emit``)."""
