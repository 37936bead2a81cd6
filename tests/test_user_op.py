"""superopt.op: user ops from index notation, compiled per shape, verified on the call's own inputs,
usable on numpy arrays and torch tensors, and one op under torch.fx and torch.compile."""

import numpy as np
import pytest
import torch

import superopt
from superopt.lang import OpLangError
from superopt.user_op import UserOpVerificationError


def test_inputs_in_order_of_first_appearance_and_outputs_not_read_later():
    u = superopt.op("H[i,j] += B[k,j] * A[i,k]; S[i] += H[i,j]\nY[i,j] = H[i,j] / S[i] + C[j]")
    assert u.inputs == ["B", "A", "C"] and u.outputs == ["Y"]
    both = superopt.op("H[i,j] += A[i,k] * B[k,j]; Y[i,j] = max(H[i,j], 0.0)", outputs=["H", "Y"])
    assert both.outputs == ["H", "Y"]
    with pytest.raises(OpLangError, match="output 'Z' is never written"):
        superopt.op("Y[i] = X[i] * 2.0", outputs=["Z"])


def test_numpy_calls_compile_once_per_shape_and_match_numpy():
    u = superopt.op("H[i,j] += A[i,k] * B[k,j]; Y[i,j] = max(H[i,j], 0.0)", outputs=["H", "Y"], threads=1)
    rng = np.random.default_rng(0)
    for m in (3, 5, 3):
        a, b = rng.standard_normal((m, 4)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)
        h, y = u(a, b)
        np.testing.assert_allclose(h, a @ b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
    assert sorted(u.compiled_shapes) == [((3, 4), (4, 6)), ((5, 4), (4, 6))]
    with pytest.raises(TypeError, match="takes 2 inputs"):
        u(a)


def test_division_by_a_sum_of_inputs_verifies_on_real_inputs():
    # near-cancelling sums: float32 itself is far from float64 here, so the compiled op is judged against that
    u = superopt.op("S[i] += X[i,j]\nY[i,j] = X[i,j] / S[i]", threads=1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 33)).astype(np.float32)
    x[:, -1] = -x[:, :-1].sum(1) + np.float32(1e-3)  # rows summing to about 1e-3
    y = u(x)
    np.testing.assert_allclose(y * x.astype(np.float64).sum(1, keepdims=True), x, rtol=0.05, atol=0.05)
    assert np.isfinite(list(u.max_error.values())[0])


def test_a_wrong_kernel_is_caught_on_the_first_call(monkeypatch):
    from superopt.runtime.executor import GraphExecutor

    real = GraphExecutor.__call__
    monkeypatch.setattr(GraphExecutor, "__call__", lambda self, feed: {k: v * 1.01 for k, v in real(self, feed).items()})
    u = superopt.op("Y[i] = X[i] * 3.0", threads=1)
    with pytest.raises(UserOpVerificationError, match="relative error"):
        u(np.ones(4, np.float32))


def test_torch_tensors_in_torch_tensors_out_and_one_op_under_fx_and_compile():
    u = superopt.op("S[i] += X[i,j] * X[i,j]\nY[i,j] = X[i,j] / sqrt(S[i] + 1.0)", name="rownorm_test", threads=1)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 6)

        def forward(self, x):
            return torch.relu(u(self.fc(x)))

    def reference(m, x):
        h = m.fc(x)
        return torch.relu(h / torch.sqrt((h * h).sum(1, keepdim=True) + 1))

    m = M().eval()
    x = torch.randn(5, 6)
    with torch.no_grad():
        out = m(x)
        assert isinstance(out, torch.Tensor)
        torch.testing.assert_close(out, reference(m, x), rtol=1e-5, atol=1e-5)
        targets = [n.target for n in torch.fx.symbolic_trace(m).graph.nodes if n.op == "call_function"]
        assert torch.ops.superopt.rownorm_test in targets or torch.ops.superopt.rownorm_test.default in targets
        compiled = torch.compile(m, backend="superopt")
        torch.testing.assert_close(compiled(x), reference(m, x), rtol=1e-4, atol=1e-4)
