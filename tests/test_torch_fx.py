"""torch.fx frontend and torch.compile backend: imported graphs match eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from superopt.frontends.torch_backend import make_backend, superopt_backend
from superopt.frontends.torch_fx import FxImportError, import_fx, import_fx_full
from superopt.interp import evaluate

RTOL, ATOL = 1e-4, 1e-5


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _check_traced(model: nn.Module, *xs: torch.Tensor):
    gm = torch.fx.symbolic_trace(model)
    graph = import_fx(gm, xs)
    out = evaluate(graph, [x.numpy() for x in xs])
    with torch.no_grad():
        ref = [r for r in _as_tuple(model(*xs)) if isinstance(r, torch.Tensor)]
    assert len(graph.outputs) == len(ref)
    for name, r in zip(graph.outputs, ref, strict=True):
        np.testing.assert_allclose(out[name], r.numpy(), rtol=RTOL, atol=ATOL)
    return graph


def _check_compiled(model: nn.Module, *xs: torch.Tensor, backend=superopt_backend):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        ref = _as_tuple(model(*xs))
    got = _as_tuple(compiled(*xs))
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g.detach().numpy(), r.detach().numpy(), rtol=RTOL, atol=ATOL)
    return compiled


# ---- models ----------------------------------------------------------------------------------------
class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        with torch.no_grad():  # non-trivial running statistics and affine parameters
            self.bn.running_mean.uniform_(-1.0, 1.0)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class EncoderLayer(nn.Module):
    """Post-norm transformer encoder layer written out by hand (symbolic_trace cannot trace
    nn.TransformerEncoderLayer: its fast-path checks need concrete tensors)."""

    def __init__(self, d_model: int = 64, nhead: int = 4, dim_feedforward: int = 128) -> None:
        super().__init__()
        self.nhead = nhead
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.act = nn.GELU()
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, n, self.nhead, d // self.nhead).transpose(1, 2)
        k = k.reshape(b, n, self.nhead, -1).transpose(1, 2)
        v = v.view(b, n, self.nhead, d // self.nhead).permute(0, 2, 1, 3)
        a = F.scaled_dot_product_attention(q, k, v)
        a = a.transpose(1, 2).contiguous().view(b, n, d)
        x = self.norm1(x + self.dropout(self.out_proj(a)))
        return self.norm2(x + self.linear2(self.dropout(self.act(self.linear1(x)))))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.silu(self.fc2(x)) * 0.5 + x
        return F.softmax(self.fc3(x), dim=-1)


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = F.max_pool2d(torch.relu(self.conv2(x)), kernel_size=2, stride=1, padding=1)
        x = torch.flatten(self.gap(x), 1)
        return self.fc(x)


# ---- symbolic_trace -> import_fx -> reference interpreter ------------------------------------------
def test_conv_bn_relu_traced():
    torch.manual_seed(0)
    g = _check_traced(ConvBnRelu().eval(), torch.randn(2, 3, 10, 10))
    assert len(g.inputs) == 1 and len(g.constants) >= 6  # conv w/b, bn mean/var/scale/bias


def test_encoder_layer_traced():
    torch.manual_seed(0)
    _check_traced(EncoderLayer().eval(), torch.randn(2, 7, 64))


def test_multihead_attention_module_traced():
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x, y):
            out, w = self.mha(x, y, y)
            return out, w

    _check_traced(M().eval(), torch.randn(2, 5, 32), torch.randn(2, 6, 32))


def test_python_values_slices_and_methods():
    class M(nn.Module):
        def forward(self, x):
            y = x[:, 1:3, ..., None] * 2.0 + 1
            z = torch.cat([x, x.sum(dim=1, keepdim=True)], dim=1)
            a, b = x.split(2, dim=1)
            return (y.squeeze(-1).mean(-1), F.softmax(z, -1), x.size(0) * x, torch.flatten(x, 1), 1 - x,
                    a.unsqueeze(0).expand(3, -1, -1, -1), b.relu() / 2, x[0], x.permute(2, 0, 1))

    torch.manual_seed(0)
    _check_traced(M(), torch.randn(2, 4, 5))


def test_unsupported_op_is_a_clear_error():
    class M(nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real

    gm = torch.fx.symbolic_trace(M())
    with pytest.raises(FxImportError, match=r"unsupported function .*fft.*node 'fft_fft'") as e:
        import_fx(gm, [torch.randn(8)])
    assert "\n" not in str(e.value)


def test_training_mode_batch_norm_is_rejected():
    gm = torch.fx.symbolic_trace(ConvBnRelu())  # train mode
    with pytest.raises(FxImportError, match="training mode"):
        import_fx(gm, [torch.randn(1, 3, 4, 4)])


# ---- torch.compile(backend=superopt_backend) -------------------------------------------------------
def test_mlp_compiled():
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = _check_compiled(model, torch.randn(3, 16))
    x = torch.randn(5, 16)  # a new batch size: Dynamo recompiles (possibly with a symbolic size)
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=RTOL, atol=ATOL)


def test_tiny_cnn_compiled():
    torch.manual_seed(0)
    _check_compiled(TinyCNN().eval(), torch.randn(2, 3, 16, 16))


def test_conv_bn_relu_compiled_by_name():
    torch.manual_seed(0)
    _check_compiled(ConvBnRelu().eval(), torch.randn(2, 3, 8, 8), backend="superopt")


@pytest.mark.parametrize("grad", [True, False])
def test_torch_transformer_encoder_layer_compiled(grad):
    # with grad: Dynamo sees F.multi_head_attention_forward; under no_grad: the fused fast path
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True,
                                       dropout=0.0).eval()
    x = torch.randn(2, 5, 64)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=superopt_backend)
    with torch.set_grad_enabled(grad):
        for kw in ({}, {"src_mask": mask}):
            got = compiled(x, **kw)
            ref = layer(x, **kw)
            np.testing.assert_allclose(got.detach().numpy(), ref.detach().numpy(), rtol=RTOL, atol=ATOL)


def test_runner_factory_is_swappable_and_params_are_baked():
    torch.manual_seed(0)
    calls = []

    def factory(graph):
        from superopt.frontends.torch_backend import interpreter_runner

        calls.append(graph)
        return interpreter_runner(graph)

    model = MLP().eval()
    compiled = _check_compiled(model, torch.randn(2, 16), backend=make_backend(factory))
    assert calls and all(len(g.inputs) == 1 for g in calls)  # parameters became constants
    with torch.no_grad():  # an in-place parameter update re-imports rather than using stale constants
        model.fc1.weight.mul_(2.0)
    x = torch.randn(2, 16)
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=RTOL, atol=ATOL)


def test_dynamo_graph_output_structure():
    torch.manual_seed(0)
    seen = {}

    def backend(gm, example_inputs):
        seen["imp"] = import_fx_full(gm, example_inputs)
        return superopt_backend(gm, example_inputs)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y, (y.relu(), x.shape[0])

    model = M().eval()
    torch._dynamo.reset()
    got = torch.compile(model, backend=backend)(torch.ones(3, 4))
    ref = model(torch.ones(3, 4))
    assert got[1][1] == 3
    np.testing.assert_allclose(got[1][0].detach().numpy(), ref[1][0].detach().numpy(), rtol=RTOL, atol=ATOL)
    assert len(seen["imp"].baked) == 2  # fc.weight, fc.bias


# ---- ATen-level graphs (aot_autograd forward graphs, FakeTensor examples) ---------------------------
class CnnLn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cbr = ConvBnRelu()
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8, 10)
        self.ln = nn.LayerNorm(10)

    def forward(self, x):
        x = torch.flatten(self.gap(self.pool(self.cbr(x))), 1)
        return torch.softmax(self.ln(self.fc(x)), -1)


def test_aten_graphs_via_aot_autograd():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True,
                                       dropout=0.0).eval()
    with torch.no_grad():
        _check_compiled(CnnLn().eval(), torch.randn(2, 3, 8, 8), backend="superopt_aot")
        _check_compiled(layer, torch.randn(2, 5, 64), backend="superopt_aot")


def test_aot_autograd_with_grad_is_a_clear_error():
    torch._dynamo.reset()
    compiled = torch.compile(CnnLn().eval(), backend="superopt_aot")
    with pytest.raises(Exception, match="inference only"):
        compiled(torch.randn(2, 3, 8, 8))


def test_compiled_executor_runner():
    from superopt.frontends.torch_backend import executor_runner

    torch.manual_seed(0)
    with torch.no_grad():
        _check_compiled(TinyCNN().eval(), torch.randn(2, 3, 16, 16), backend=make_backend(executor_runner))


class TracedLeaves(nn.Module):
    """Leaf modules symbolic_trace keeps as call_module: conv1d/transposed conv, norms, resampling, recurrences."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.c1 = nn.Conv1d(6, 4, 3, padding=1)
        self.lstm = nn.LSTM(4, 5, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(10, 3, num_layers=2)
        self.up = nn.ConvTranspose2d(1, 2, 2, 2)
        self.gn = nn.GroupNorm(2, 2)
        self.inorm = nn.InstanceNorm2d(2)
        self.resize = nn.Upsample(scale_factor=2, mode="nearest")
        self.act = nn.Hardswish()

    def forward(self, ids):
        h = self.act(self.c1(self.emb(ids).transpose(1, 2))).transpose(1, 2)  # (N, L, 4)
        seq = self.lstm(h)[0]  # (N, L, 10)
        g = self.gru(seq.transpose(0, 1))[1]  # (2, N, 3)
        img = self.up(seq.unsqueeze(1))  # (N, 2, 2L, 20)
        return self.resize(self.inorm(self.gn(img))), g


def test_traced_leaf_modules():
    torch.manual_seed(0)
    _check_traced(TracedLeaves().eval(), torch.randint(0, 10, (2, 5)))
