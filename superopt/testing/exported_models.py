"""Small real-world-shaped PyTorch models exported to ONNX in process (no downloads), for the exported-
model tests and ``benchmarks/exported_models.py``:

- ``unet``: a small U-Net with GroupNorm, a strided-conv downsample, ConvTranspose and bilinear Resize
  upsamples and skip concatenations;
- ``gpt_block``: a GPT-style decoder block with RMSNorm, rotary embedding, a KV-cache update (Concat of
  the past keys/values), a causal mask (Trilu + Where) and a SiLU-gated MLP;
- ``detection_head``: conv features -> per-anchor scores, TopK of the best anchors, ArgMax over classes
  and GatherElements of their boxes;
- ``lstm_tagger``: token embedding (Gather) -> LSTM -> per-token log-softmax tags;
- ``bert_encoder``: a BERT-style encoder layer: separate Q/K/V Linear projections, 4-head softmax attention,
  output projection, residual + LayerNorm, a bias + GELU FFN, residual + LayerNorm.

``export_model(name)`` returns the ONNX ModelProto (exported with ``torch.onnx.export(dynamo=True)`` at
:data:`EXPORT_OPSET`, the legacy exporter when the dynamo one fails) and its example inputs.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable

import numpy as np

# The newest opset onnxruntime 1.2x runs (the torch exporter writes any opset asked; onnxruntime is what the
# exported models are checked against). superopt itself accepts up to onnx.defs.onnx_opset_version().
EXPORT_OPSET = 25


def _torch():
    import torch

    return torch


def _unet():
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU())

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc1, self.enc2 = block(3, 8), block(8, 16)
            self.down1 = nn.Conv2d(8, 8, 2, stride=2)
            self.down2 = nn.Conv2d(16, 16, 2, stride=2)
            self.mid = block(16, 16)
            self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2)
            self.dec2 = block(32, 8)
            self.dec1 = block(16, 8)
            self.head = nn.Conv2d(8, 2, 1)

        def forward(self, x):
            e1 = self.enc1(x)  # 16x16
            e2 = self.enc2(self.down1(e1))  # 8x8
            m = self.mid(self.down2(e2))  # 4x4
            d2 = self.dec2(torch.cat([self.up2(m), e2], 1))  # ConvTranspose up to 8x8
            up = F.interpolate(d2, scale_factor=2.0, mode="bilinear", align_corners=False)  # Resize up to 16x16
            return self.head(self.dec1(torch.cat([up, e1], 1)))

    return UNet(), (torch.randn(1, 3, 16, 16),)


def _gpt_block():
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional
    d, heads, t, past = 32, 4, 8, 8
    hd = d // heads

    class RMSNorm(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(n))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def rotate_half(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([-x2, x1], -1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.gate, self.up = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
            self.down = nn.Linear(2 * d, d, bias=False)
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            ang = torch.outer(torch.arange(past + t).float(), inv)
            self.register_buffer("cos", torch.cat([ang, ang], -1).cos()[past:])
            self.register_buffer("sin", torch.cat([ang, ang], -1).sin()[past:])

        def forward(self, x, past_k, past_v):
            b = x.shape[0]
            q, k, v = self.qkv(self.n1(x)).split(d, -1)
            q, k, v = (z.reshape(b, t, heads, hd).transpose(1, 2) for z in (q, k, v))
            q = q * self.cos + rotate_half(q) * self.sin  # rotary embedding
            k = k * self.cos + rotate_half(k) * self.sin
            k_all, v_all = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)  # KV-cache update
            s = q @ k_all.transpose(-1, -2) / hd ** 0.5
            causal = torch.tril(torch.ones(t, past + t, dtype=torch.bool), diagonal=past)  # Trilu
            s = s.masked_fill(~causal, float("-inf"))  # Where
            a = (F.softmax(s, -1) @ v_all).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(a)
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h)), k_all, v_all

    return Block(), (torch.randn(1, t, d), torch.randn(1, heads, past, hd), torch.randn(1, heads, past, hd))


def _detection_head():
    torch = _torch()
    nn = torch.nn
    classes, anchors, k = 5, 3, 10

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
            self.cls = nn.Conv2d(16, anchors * classes, 1)
            self.box = nn.Conv2d(16, anchors * 4, 1)

        def forward(self, feats):
            f = self.stem(feats)
            n = f.shape[0]
            logits = self.cls(f).reshape(n, anchors, classes, -1).permute(0, 1, 3, 2).reshape(n, -1, classes)
            boxes = self.box(f).reshape(n, anchors, 4, -1).permute(0, 1, 3, 2).reshape(n, -1, 4)
            probs = logits.sigmoid()
            best, label = probs.max(-1)  # ArgMax over classes
            score, idx = best.topk(k, dim=1)  # TopK anchors
            chosen = torch.gather(boxes, 1, idx.unsqueeze(-1).expand(n, k, 4))  # GatherElements
            labels = torch.gather(label, 1, idx)
            return score, chosen, labels

    return Head(), (torch.randn(1, 16, 8, 8),)


def _lstm_tagger():
    torch = _torch()
    nn = torch.nn
    vocab, emb, hidden, tags, t = 50, 16, 24, 7, 12

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, emb)
            self.lstm = nn.LSTM(emb, hidden, batch_first=True)
            self.out = nn.Linear(hidden, tags)

        def forward(self, tokens):
            h, _ = self.lstm(self.emb(tokens))
            return torch.log_softmax(self.out(h), -1)

    return Tagger(), (torch.randint(0, vocab, (1, t)),)


def _bert_encoder():
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional
    batch, seq, d, heads, ffn = 2, 16, 64, 4, 128
    hd = d // heads

    class EncoderLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)  # separate Q/K/V projections
            self.out = nn.Linear(d, d)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff1, self.ff2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
            with torch.no_grad():  # LayerNorm starts at scale 1, shift 0: make them matter
                for ln in (self.ln1, self.ln2):
                    ln.weight.add_(0.1 * torch.randn(d))
                    ln.bias.add_(0.1 * torch.randn(d))

        def forward(self, x):
            b = x.shape[0]
            q, k, v = (z(x).reshape(b, seq, heads, hd).transpose(1, 2) for z in (self.q, self.k, self.v))
            a = F.softmax(q @ k.transpose(-1, -2) / hd ** 0.5, -1) @ v
            x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, seq, d)))  # residual + LayerNorm
            return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))  # FFN with bias + GELU, residual + LayerNorm

    return EncoderLayer(), (torch.randn(batch, seq, d),)


MODELS: dict[str, Callable] = {"unet": _unet, "gpt_block": _gpt_block, "detection_head": _detection_head,
                               "lstm_tagger": _lstm_tagger, "bert_encoder": _bert_encoder}


def export_model(name: str, seed: int = 0, opset: int = EXPORT_OPSET, dynamic_batch: bool = False):
    """(ONNX ModelProto, example inputs as numpy arrays by ONNX input name) for one of :data:`MODELS`;
    ``dynamic_batch``: axis 0 of every input is the symbolic dimension ``batch`` (dynamo exporter only)."""
    import onnx

    torch = _torch()
    if name not in MODELS:
        raise ValueError(f"unknown exported model {name!r}; known: {sorted(MODELS)}")
    torch.manual_seed(seed)
    module, args = MODELS[name]()
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)  # the exporter's chatter (torchvision ops, ...)
        try:
            dyn = tuple({0: torch.export.Dim("batch", max=1024)} for _ in args) if dynamic_batch else None
            proto = torch.onnx.export(module, args, dynamo=True, opset_version=opset, verbose=False,
                                      dynamic_shapes=dyn).model_proto
        except Exception:  # noqa: BLE001 - the legacy TorchScript exporter writes up to opset 20
            if dynamic_batch:
                raise
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, dynamo=False, opset_version=min(opset, 20))
            proto = onnx.load_from_string(buf.getvalue())
        finally:
            logging.disable(previous)
    inits = {t.name for t in proto.graph.initializer}
    names = [vi.name for vi in proto.graph.input if vi.name not in inits]
    return proto, {n: a.detach().numpy() for n, a in zip(names, args)}


def ort_session(model, threads: int = 1):
    """An onnxruntime session of ``model`` (a ModelProto) set up as every side-by-side comparison sets it."""
    from superopt.cli_artifact import _ort_session

    return _ort_session(model.SerializeToString(), threads)


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (integers compared exactly: 0 or 1)."""
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind in "iub":
        return float(not np.array_equal(got, want))
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0.0)) / scale


__all__ = ["MODELS", "EXPORT_OPSET", "export_model", "ort_session", "max_rel_error"]
