"""A table of diverse modules under ``torch.compile(backend="superopt")``: each matches eager PyTorch, and the
fallback report names exactly the functions that were not lowered."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from superopt.frontends.torch_backend import clear_compiled, compiled_graphs
from superopt.frontends.torch_ops.context import contract_op

RTOL, ATOL = 1e-4, 1e-4


# ---- modules ---------------------------------------------------------------------------------------------
class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class BasicBlock(nn.Module):
    """A ResNet basic block with a strided projection shortcut."""

    def __init__(self, cin: int = 8, cout: int = 16) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.proj(x))


class MobileBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(8, 16, 1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), nn.ReLU(), nn.Conv2d(4, 16, 1),
                                nn.Hardsigmoid())
        self.project = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        y = F.hardswish(self.dw(F.hardswish(self.expand(x))))
        return x + self.project(y * self.se(y))


class UNetStep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(4, 8, 3, 2, 1)
        self.up = nn.ConvTranspose2d(8, 4, 2, 2)
        self.mix = nn.Conv2d(12, 4, 3, padding=1)

    def forward(self, x):
        d = F.relu(self.down(x))
        up_nearest = F.interpolate(d, scale_factor=2, mode="nearest")
        up_linear = F.interpolate(d, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.mix(torch.cat([self.up(d) + x, up_nearest[:, :4], up_linear[:, 4:]], 1))


class GroupNormBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, 8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.inorm = nn.InstanceNorm2d(8, affine=True)

    def forward(self, x):
        return self.inorm(self.conv(F.silu(self.norm(x)))) + x


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)

    def forward(self, x, mask):
        return self.layer(x, src_mask=mask)


class MaskedAttention(nn.Module):
    """Attention written out: key padding mask through masked_fill, softmax, dropout (eval)."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, pad):
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, n, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(d // self.h)
        s = s.masked_fill(pad[:, None, None, :], float("-inf"))
        a = self.drop(torch.softmax(s, dim=-1))
        return self.out((a @ v).transpose(1, 2).reshape(b, n, d))


class CausalSDPA(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd)
        self.o = nn.Linear(d, d)

    def forward(self, x, bias):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kvh, self.hd).permute(2, 0, 3, 1, 4).unbind(0)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        masked = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                attn_mask=bias)
        return self.o((causal + masked).transpose(1, 2).reshape(b, n, -1))


class GPTBlockKV(nn.Module):
    """One decoder block with a KV cache held in buffers, updated in place at a position."""

    def __init__(self, d: int = 32, heads: int = 4, max_len: int = 16) -> None:
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.register_buffer("k_cache", torch.zeros(1, heads, max_len, self.hd))
        self.register_buffer("v_cache", torch.zeros(1, heads, max_len, self.hd))

    def forward(self, x, pos: int):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.h, self.hd).transpose(1, 2) for t in (q, k, v))
        self.k_cache[:, :, pos:pos + n] = k
        self.v_cache[:, :, pos:pos + n] = v
        keys, values = self.k_cache[:, :, :pos + n], self.v_cache[:, :, :pos + n]
        mask = torch.ones(n, pos + n, dtype=torch.bool).tril(diagonal=pos)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class LSTMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


class StackedRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(24, 6)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        z, hz = self.gru(y.transpose(0, 1))
        return z, hz, h, c


class GRUCellLoop(nn.Module):
    """A GRU cell written out and unrolled over a short sequence."""

    def __init__(self, d: int = 8, h: int = 12) -> None:
        super().__init__()
        self.x2h, self.h2h = nn.Linear(d, 3 * h), nn.Linear(h, 3 * h)
        self.hsize = h

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hsize)
        for t in range(x.shape[1]):
            xr, xz, xn = self.x2h(x[:, t]).chunk(3, 1)
            hr, hz, hn = self.h2h(h).chunk(3, 1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            h = (1 - z) * torch.tanh(xn + r * hn) + z * h
        return h


class DataDependentBranch(nn.Module):
    """``if`` on a tensor value: a graph break, two graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        y = torch.tanh(self.a(x))
        if y.sum() > 0:
            return self.b(y) * 2
        return self.b(-y)


class InPlaceOps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, mask):
        y = self.fc(x)
        y.add_(1.0)
        y = self.act(y)
        y.mul_(2).clamp_(max=3.0)
        y.masked_fill_(mask, -1.0)
        z = y.clone()
        z[:, 0] = 5.0
        x.sub_(y)  # a mutated input is written back
        return y, z


class IndexArithmetic(nn.Module):
    """Integer index arithmetic: arange, %, //, comparison masks, gather and index_select with computed indices."""

    def forward(self, x, idx):
        n = x.shape[-1]
        shifted = (idx * 3 + 1) % n
        half = idx // 2
        rows = torch.arange(x.shape[0]).unsqueeze(1).expand(-1, idx.shape[1])
        mask = (rows + shifted) % 2 == 0
        g = torch.gather(x, 1, shifted)
        s = torch.index_select(x, 1, half[0])
        return torch.where(mask, g, -g) + s, shifted * 2 - half


class TopkCumsum(nn.Module):
    """Linear, ReLU, topk and cumsum: a contraction followed by sorting and scan ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        v, i = torch.topk(torch.relu(self.fc(x)), 4, dim=-1)
        return torch.cumsum(v, dim=-1), i


class SortArg(nn.Module):
    def forward(self, x):
        v, i = torch.sort(x, dim=-1, descending=True)
        m, am = x.max(dim=1)
        return v * 2, i, m, am, torch.argmin(x, dim=-1, keepdim=True), torch.cumprod(x, 1)


class ArgSort(nn.Module):
    def forward(self, x):
        return x.argsort(dim=0), torch.argsort(x, dim=-1, descending=True)


class ScatterOneHot(nn.Module):
    def forward(self, x, labels):
        one_hot = torch.zeros(labels.shape[0], 6).scatter(1, labels.unsqueeze(1), 1.0)
        counts = torch.zeros(6).scatter_add(0, labels, torch.ones(labels.shape[0]))
        return one_hot * x, counts


class EmbeddingLM(nn.Module):
    def __init__(self, vocab: int = 20, d: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(8, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        h = self.ln(self.tok(ids) + self.pos(pos))
        att = (h @ h.transpose(1, 2)).tril() + torch.triu(torch.full((ids.shape[1],) * 2, -1e4), diagonal=1)
        return self.head(torch.softmax(att, -1) @ h)


class BilinearEinsum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8, 8) * 0.1)

    def forward(self, a, b):
        scores = torch.einsum("bid,hde,bje->bhij", a, self.w, b)
        return torch.einsum("bhij->bi", scores.softmax(-1))


class LlamaMLP(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        gate, up = self.up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class StackSplit(nn.Module):
    def forward(self, x):
        a, b, c = torch.split(x, [2, 3, 3], dim=1)
        parts = torch.stack([a.sum(1), b.mean(1), c.amax(1)], dim=-1)
        first, second = x.chunk(2, dim=0)
        return torch.cat([parts, parts * 2], 0), torch.cat([second, first], 0)


class MaskOps(nn.Module):
    def forward(self, x, y):
        m = torch.triu(torch.ones_like(x), diagonal=1).bool()
        z = torch.where(m, x, y).masked_fill(x > 1.0, 0.0)
        return z.tril(-1) + x.triu()


class TemporalConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(6, 12, 3, padding=1)
        self.c2 = nn.Conv1d(12, 6, 5, padding=2, dilation=1)
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        y = self.c2(F.gelu(self.c1(x)))
        return self.ln((x + y).transpose(1, 2))


class StatsAndShuffles(nn.Module):
    def forward(self, x):
        z = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5)
        return torch.var(z, 0, unbiased=False) + torch.roll(z, 2, 1).flip(0)[:, [3, 1, 0]].sum(1).mean()


class MixedUnsupported(nn.Module):
    """A function superopt does not lower in the middle: it runs in eager PyTorch between two regions."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.special.bessel_j0(self.a(x)))


class UpsampleSegHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 3, 1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)

    def forward(self, x):
        return torch.log_softmax(self.up(self.conv(x)), dim=1).argmax(1)


class MultiheadAttn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x, pad):
        out, w = self.mha(x, x, x, key_padding_mask=pad)
        return out, w


# ---- the table ---------------------------------------------------------------------------------------
def _have(module: str, name: str) -> bool:
    return contract_op(module, name) is not None


@dataclass
class Case:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple]
    fallbacks: set[str] = field(default_factory=set)  # functions that run in eager PyTorch
    lowered: set[str] = field(default_factory=set)  # functions that must be lowered natively
    config: dict = field(default_factory=dict)  # torch._dynamo.config patches


def _needs(fns: dict[str, tuple[str, str]]) -> tuple[set[str], set[str]]:
    """Split ``function -> contract op`` into (lowered, fallbacks) by what this checkout has."""
    have = {f for f, (m, n) in fns.items() if _have(m, n)}
    return have, set(fns) - have


def _case(name, make, inputs, fallbacks=(), needs=None, config=None, lowered=()) -> Case:
    have, missing = _needs(needs or {})
    return Case(name, make, inputs, set(fallbacks) | missing, have | set(lowered), config or {})


def _bool(*shape, p=0.3):
    return torch.rand(*shape) < p


def _pad_mask():
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True
    return pad


CASES = [
    _case("convnet", ConvNet, lambda: (torch.randn(2, 3, 12, 12),)),
    _case("resnet_block", BasicBlock, lambda: (torch.randn(2, 8, 10, 10),)),
    _case("mobile_block", MobileBlock, lambda: (torch.randn(2, 8, 8, 8),),
          needs={"torch.nn.functional.hardswish": ("activations", "hardswish"),
                 "torch.nn.functional.hardsigmoid": ("activations", "hardsigmoid")}),
    _case("unet_step", UNetStep, lambda: (torch.randn(2, 4, 8, 8),),
          needs={"torch.nn.functional.interpolate": ("resize", "resize"),
                 "torch.conv_transpose2d": ("conv_transpose", "conv_transpose")}),
    _case("group_instance_norm", GroupNormBlock, lambda: (torch.randn(2, 8, 6, 6),),
          needs={"torch.nn.functional.group_norm": ("normalization", "group_norm"),
                 "torch.nn.functional.instance_norm": ("normalization", "instance_norm")}),
    _case("encoder_layer_causal_mask", EncoderLayer,
          lambda: (torch.randn(2, 6, 32), torch.triu(torch.ones(6, 6, dtype=torch.bool), 1))),
    _case("masked_attention", MaskedAttention, lambda: (torch.randn(2, 6, 32), _pad_mask())),
    _case("causal_gqa_sdpa", CausalSDPA, lambda: (torch.randn(2, 6, 32), torch.randn(6, 6))),
    _case("gpt_block_kv_cache", GPTBlockKV, lambda: (torch.randn(1, 3, 32), 2)),
    _case("lstm", LSTMHead, lambda: (torch.randn(2, 5, 8),), lowered={"torch.lstm"}, config={"allow_rnn": True}),
    _case("stacked_bidirectional_lstm_gru", StackedRNN, lambda: (torch.randn(2, 4, 8),),
          lowered={"torch.lstm", "torch.gru"}, config={"allow_rnn": True}),
    _case("gru_cell_unrolled", GRUCellLoop, lambda: (torch.randn(2, 4, 8),)),
    _case("data_dependent_branch", DataDependentBranch, lambda: (torch.randn(2, 8),)),
    _case("in_place_ops", InPlaceOps, lambda: (torch.randn(3, 8), _bool(3, 8))),
    _case("integer_index_arithmetic", IndexArithmetic,
          lambda: (torch.randn(3, 10), torch.randint(0, 10, (3, 4))),
          needs={"torch.gather": ("indexing", "gather_elements"), "_operator.mod": ("elementwise", "mod"),
                 "_operator.floordiv": ("elementwise", "mod")}),
    _case("topk_cumsum", TopkCumsum, lambda: (torch.randn(3, 16),),
          needs={"torch.topk": ("sorting", "topk"), "torch.cumsum": ("scan", "cumsum")}),
    _case("sort_argmax_cumprod", SortArg, lambda: (torch.randn(4, 7),),
          needs={"torch.sort": ("sorting", "sort"), "Tensor.max": ("sorting", "argmax"),
                 "torch.argmin": ("sorting", "argmin"),
                 "torch.cumprod": ("scan", "cumprod")}),
    _case("argsort", ArgSort, lambda: (torch.randn(4, 7),),
          needs={"Tensor.argsort": ("sorting", "argsort"), "torch.argsort": ("sorting", "argsort")}),
    _case("scatter_one_hot", ScatterOneHot, lambda: (torch.randn(5, 6), torch.randint(0, 6, (5,))),
          needs={"Tensor.scatter": ("indexing", "scatter_elements"),
                 "Tensor.scatter_add": ("indexing", "scatter_elements")}),
    _case("embedding_lm", EmbeddingLM, lambda: (torch.randint(0, 20, (2, 8)),),
          needs={"Tensor.tril": ("triangular", "trilu"), "torch.triu": ("triangular", "trilu")}),
    _case("einsum_bilinear", BilinearEinsum, lambda: (torch.randn(2, 5, 8), torch.randn(2, 6, 8)),
          needs={"torch.functional.einsum": ("einsum", "einsum")}),
    _case("llama_mlp_rmsnorm", LlamaMLP, lambda: (torch.randn(2, 5, 16),)),
    _case("stack_split_chunk", StackSplit, lambda: (torch.randn(4, 8, 3),)),
    _case("where_tril_triu", MaskOps, lambda: (torch.randn(5, 5) * 2, torch.randn(5, 5)),
          needs={"torch.triu": ("triangular", "trilu"), "Tensor.tril": ("triangular", "trilu"),
                 "Tensor.triu": ("triangular", "trilu")}),
    _case("temporal_conv1d", TemporalConv, lambda: (torch.randn(2, 6, 10),)),
    _case("stats_and_shuffles", StatsAndShuffles, lambda: (torch.randn(4, 6),),
          lowered={"Tensor.std", "torch.var", "torch.roll", "Tensor.flip"}),
    _case("mixed_unsupported", MixedUnsupported, lambda: (torch.randn(3, 8),),
          fallbacks={"torch.special.bessel_j0"}),
    _case("upsample_seg_head", UpsampleSegHead, lambda: (torch.randn(2, 4, 5, 5),),
          needs={"torch.nn.functional.interpolate": ("resize", "resize"), "Tensor.argmax": ("sorting", "argmax")}),
    _case("multihead_attention", MultiheadAttn, lambda: (torch.randn(2, 6, 16), _pad_mask())),
]


def _clone(xs):
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in xs)


def _assert_close(got, ref):
    if not isinstance(ref, torch.Tensor) and not isinstance(ref, (tuple, list)):
        assert got == ref
        return
    if isinstance(ref, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(ref)
        for g, r in zip(got, ref, strict=True):
            _assert_close(g, r)
        return
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if ref.is_floating_point():
        torch.testing.assert_close(got, ref, rtol=RTOL, atol=ATOL)
    else:
        assert torch.equal(got, ref)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_module_matches_eager(case: Case):
    torch.manual_seed(0)
    model = case.make().eval()
    inputs = case.inputs()
    torch._dynamo.reset()
    clear_compiled()
    eager_model = __import__("copy").deepcopy(model)
    with torch._dynamo.config.patch(**case.config), torch.no_grad():
        ref_inputs, got_inputs = _clone(inputs), _clone(inputs)
        ref = eager_model(*ref_inputs)
        got = torch.compile(model, backend="superopt")(*got_inputs)
    _assert_close(got, ref)
    _assert_close(got_inputs, ref_inputs)  # in-place updates of inputs happen as in eager
    for (name, buf), (_, ref_buf) in zip(model.named_buffers(), eager_model.named_buffers(), strict=True):
        torch.testing.assert_close(buf, ref_buf, rtol=RTOL, atol=ATOL, msg=f"buffer {name}")
    reports = [g.report for g in compiled_graphs()]
    assert reports, "Dynamo handed the backend no graph"
    fell_back = set().union(*(r.fallback_functions for r in reports))
    assert fell_back == case.fallbacks, "\n".join(map(str, reports))
    lowered = set().union(*(r.lowered_functions for r in reports))
    assert case.lowered <= lowered, "\n".join(map(str, reports))
    for r in reports:  # every compiled region ran through superopt (none failed or differed from eager)
        for region in r.regions:
            assert all(v == "superopt" for v in region.signatures.values()), str(r)
    assert any(region.compiled for r in reports for region in r.regions), "\n".join(map(str, reports))
