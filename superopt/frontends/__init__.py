"""Frontends: import models from other formats into a superopt Graph."""

from superopt.frontends.onnx_frontend import OnnxImportError, import_onnx

__all__ = ["OnnxImportError", "import_onnx"]
