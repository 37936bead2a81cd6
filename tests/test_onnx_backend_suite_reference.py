"""The ONNX backend node tests in reference mode: the numpy interpreter as the living spec."""

import superopt.backend
from superopt.testing.onnx_suite import make_backend_test


class ReferenceBackend(superopt.backend.SuperoptBackend):
    @classmethod
    def prepare(cls, model, device="CPU", mode="reference", **kwargs):
        return super().prepare(model, device, mode, **kwargs)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", mode="reference", **kwargs):
        return super().run_model(model, inputs, device, mode, **kwargs)


globals().update(make_backend_test(ReferenceBackend, __name__).enable_report().test_cases)
