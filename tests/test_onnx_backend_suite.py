"""ONNX's own backend conformance node tests, run on compiled C kernels (the backend's default mode).

The op list and the commented exclusion list live in superopt/testing/onnx_suite.py; the same tests
run in reference-interpreter mode in test_onnx_backend_suite_reference.py.
"""

import re

import superopt.backend
from superopt.testing.onnx_suite import OPS, make_backend_test

assert superopt.backend.DEFAULT_MODE == "compiled"
globals().update(make_backend_test(superopt.backend, __name__).enable_report().test_cases)


def test_include_patterns_are_sane():
    assert all(re.fullmatch(r"[a-z_0-9]+", op) for op in OPS)
