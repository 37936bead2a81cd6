"""Workloads of the benchmark suite, ``benchmarks/run.py`` (float32).

Each workload builds a :class:`WorkloadInstance` with
  * ``module``: the PyTorch eager module (for capsule_votes: the fastest torch formulation found),
  * ``inputs``: tuple of input tensors (seeded),
  * ``onnx_bytes()``: a serialized ONNX model with the same inputs (in the same order) and one output,
  * ``reference``: float64 output (numpy) where cheap, else None,
  * ``flops``: useful flop count (for GFLOP/s columns) or None,
  * ``variants``: extra torch eager formulations (only capsule_votes), timed as ``eager[<name>]``,
  * ``meta``: free-form description (e.g. the einsum spec) for other systems such as superopt.
"""

from __future__ import annotations

import copy
import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SEED = 0


@dataclass
class WorkloadInstance:
    name: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    onnx_bytes: Callable[[], bytes]
    reference: np.ndarray | None = None
    flops: float | None = None
    variants: dict[str, nn.Module] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    is_model: bool = False


@dataclass
class Workload:
    name: str
    build: Callable[[], WorkloadInstance]
    is_model: bool = False
    description: str = ""


def export_onnx(module: nn.Module, inputs: tuple[torch.Tensor, ...], opset: int = 17) -> bytes:
    """Legacy (TorchScript) exporter: works offline in torch 2.13 without onnxscript."""
    buf = io.BytesIO()
    names = [f"x{i}" for i in range(len(inputs))]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, buf, dynamo=False, opset_version=opset,
                          input_names=names, output_names=["y"], do_constant_folding=True)
    return buf.getvalue()


def float64_reference(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    m = copy.deepcopy(module).double().eval()
    with torch.no_grad():
        return m(*[x.double() for x in inputs]).numpy()


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, scale: float = 1.0, g: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _block(name: str, module: nn.Module, inputs: tuple[torch.Tensor, ...], flops: float | None,
           meta: dict | None = None) -> WorkloadInstance:
    module = module.eval()
    return WorkloadInstance(name, module, inputs, lambda: export_onnx(module, inputs),
                            float64_reference(module, inputs), flops, meta=meta or {})


# ----------------------------------------------------------------------------------------
# capsule_votes: V[n,y,x,o,p,q] = sum_{kh,kw,i,r} P[n,2y+kh,2x+kw,i,p,r] * W[kh,kw,i,o,r,q]
# ----------------------------------------------------------------------------------------

CAPS = dict(N=8, H=15, W=15, I=32, O=32, K=3, S=2, OH=7, OW=7)
CAPSULE_FLOPS = 2 * 8 * 7 * 7 * 32 * 4 * 4 * 3 * 3 * 32 * 4


class _CapsBase(nn.Module):
    """Holds the raw weight W[kh,kw,i,o,r,q]; subclasses pre-pack it at construction (as a layer would)."""

    def __init__(self, W: torch.Tensor):
        super().__init__()
        self.register_buffer("W", W.clone())
        self.N, self.H, self.Wd, self.I, self.O = CAPS["N"], CAPS["H"], CAPS["W"], CAPS["I"], CAPS["O"]


class CapsEinsumLoop(_CapsBase):
    """9 einsums over strided slices (one per kernel tap)."""

    def forward(self, P):
        V = None
        for kh in range(3):
            for kw in range(3):
                t = torch.einsum("nyxipr,iorq->nyxopq", P[:, kh:kh + 13:2, kw:kw + 13:2], self.W[kh, kw])
                V = t if V is None else V + t
        return V


class CapsEinsumPatches(_CapsBase):
    """One einsum over an as_strided patch view (naive single-expression form)."""

    def forward(self, P):
        s = P.stride()
        pt = P.as_strided((P.shape[0], 7, 7, 3, 3, self.I, 4, 4),
                          (s[0], 2 * s[1], 2 * s[2], s[1], s[2], s[3], s[4], s[5]))
        return torch.einsum("nyxhwipr,hwiorq->nyxopq", pt, self.W)


class CapsUnfoldMatmul(_CapsBase):
    """im2col (patch gather, p as a row index) + one GEMM [N*49*4, 1152] x [1152, 128]."""

    def __init__(self, W):
        super().__init__(W)
        wm = W.permute(0, 1, 2, 4, 3, 5).reshape(9 * self.I * 4, self.O * 4)
        self.register_buffer("Wm", wm.contiguous())

    def forward(self, P):
        n, s = P.shape[0], P.stride()
        pt = P.as_strided((n, 7, 7, 4, 3, 3, self.I, 4),
                          (s[0], 2 * s[1], 2 * s[2], s[4], s[1], s[2], s[3], s[5]))
        C = pt.reshape(n * 49 * 4, 9 * self.I * 4) @ self.Wm
        return C.view(n, 7, 7, 4, self.O, 4).permute(0, 1, 2, 4, 3, 5).contiguous()


def _conv_weight(W: torch.Tensor) -> torch.Tensor:
    """W[kh,kw,i,o,r,q] -> conv weight [(o,q), (i,r), kh, kw]."""
    O, I = W.shape[3], W.shape[2]
    return W.permute(3, 5, 2, 4, 0, 1).reshape(O * 4, I * 4, 3, 3).contiguous()


class CapsConvGroups(_CapsBase):
    """p as conv groups (groups=4, weight replicated), NCHW."""

    channels_last = False

    def __init__(self, W):
        super().__init__(W)
        w = _conv_weight(W).repeat(4, 1, 1, 1)
        if self.channels_last:
            w = w.contiguous(memory_format=torch.channels_last)
        self.register_buffer("Wc", w)

    def forward(self, P):
        n = P.shape[0]
        if self.channels_last:  # memory [n,H,W,p,i,r]
            x = P.permute(0, 1, 2, 4, 3, 5).contiguous().view(n, self.H, self.Wd, 16 * self.I)
            x = x.permute(0, 3, 1, 2)
        else:
            x = P.permute(0, 4, 3, 5, 1, 2).reshape(n, 16 * self.I, self.H, self.Wd)
        y = F.conv2d(x, self.Wc, stride=2, groups=4)
        return y.view(n, 4, self.O, 4, 7, 7).permute(0, 4, 5, 2, 1, 3).contiguous()


class CapsConvGroupsCL(CapsConvGroups):
    """p as conv groups, channels-last (oneDNN nhwc)."""

    channels_last = True


class CapsConvBatch(_CapsBase):
    """p folded into the batch: conv2d over [N*4, (i,r), H, W] with weight [(o,q),(i,r),3,3], NCHW."""

    channels_last = False

    def __init__(self, W):
        super().__init__(W)
        w = _conv_weight(W)
        if self.channels_last:
            w = w.contiguous(memory_format=torch.channels_last)
        self.register_buffer("Wc", w)

    def forward(self, P):
        n = P.shape[0]
        if self.channels_last:  # memory [n,p,H,W,i,r] == NHWC of [n*4, (i,r), H, W]
            x = P.permute(0, 4, 1, 2, 3, 5).contiguous().view(n * 4, self.H, self.Wd, 4 * self.I)
            x = x.permute(0, 3, 1, 2)
        else:
            x = P.permute(0, 4, 3, 5, 1, 2).reshape(n * 4, 4 * self.I, self.H, self.Wd)
        y = F.conv2d(x, self.Wc, stride=2)  # [n*4, (o,q), 7, 7]
        return y.view(n, 4, self.O, 4, 7, 7).permute(0, 4, 5, 2, 1, 3).contiguous()


class CapsConvBatchCL(CapsConvBatch):
    """EXPERT: p folded into the batch, channels-last conv2d through oneDNN."""

    channels_last = True


CAPSULE_FORMULATIONS: dict[str, type[_CapsBase]] = {
    "conv_batch_cl": CapsConvBatchCL,
    "conv_batch": CapsConvBatch,
    "conv_groups_cl": CapsConvGroupsCL,
    "conv_groups": CapsConvGroups,
    "unfold_matmul": CapsUnfoldMatmul,
    "einsum_loop": CapsEinsumLoop,
    "einsum_patches": CapsEinsumPatches,
}
CAPSULE_EXPERT = "conv_batch_cl"  # fastest in our measurements; see results.md


def capsule_reference(P: torch.Tensor, W: torch.Tensor) -> np.ndarray:
    """Naive float64 reference (loop over taps, direct sum)."""
    Pd, Wd = P.double(), W.double()
    V = torch.zeros(P.shape[0], 7, 7, W.shape[3], 4, 4, dtype=torch.float64)
    for kh in range(3):
        for kw in range(3):
            patch = Pd[:, kh:kh + 13:2, kw:kw + 13:2]
            for r in range(4):
                # sum over i and r written out explicitly on r
                V += torch.einsum("nyxip,ioq->nyxopq", patch[..., r], Wd[kh, kw, :, :, r, :])
    return V.numpy()


def build_capsule() -> WorkloadInstance:
    g = _gen()
    c = CAPS
    P = _randn(c["N"], c["H"], c["W"], c["I"], 4, 4, g=g)
    W = _randn(3, 3, c["I"], c["O"], 4, 4, scale=1.0 / math.sqrt(9 * c["I"] * 4), g=g)
    variants = {k: cls(W).eval() for k, cls in CAPSULE_FORMULATIONS.items()}
    expert = variants.pop(CAPSULE_EXPERT)
    meta = {
        "einsum": "V[n,y,x,o,p,q] = sum_{kh,kw,i,r} P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]",
        "P": list(P.shape), "W": list(W.shape), "V": [c["N"], 7, 7, c["O"], 4, 4], "stride": 2,
        "expert_formulation": CAPSULE_EXPERT,
        "note": "W is a layer parameter: formulations pre-pack it once at construction (not timed).",
        "W_tensor": W,
    }
    return WorkloadInstance("capsule_votes", expert, (P,), lambda: export_onnx(expert, (P,)),
                            capsule_reference(P, W), CAPSULE_FLOPS, variants=variants, meta=meta)


class CapsConvWeightInput(nn.Module):
    """Capsule votes as an exported model would carry them with the weight as a RUNTIME input (not an
    initializer): a channels-last image, the conv weight given OHWI and transposed in the graph, a strided
    Conv between reshapes and transposes. No formulation pre-packs anything: every call sees a new weight."""

    def forward(self, P, Wo):
        n, h, w, i, p, r = P.shape
        x = P.permute(0, 4, 1, 2, 3, 5).reshape(n * p, h, w, i * r).permute(0, 3, 1, 2)
        y = F.conv2d(x, Wo.permute(0, 3, 1, 2), stride=2)
        o = Wo.shape[0] // 4
        return y.reshape(n, p, o, 4, y.shape[2], y.shape[3]).permute(0, 4, 5, 2, 1, 3)


def capsule_weight_input_onnx(P: torch.Tensor, W: torch.Tensor) -> bytes:
    """The ONNX form of :class:`CapsConvWeightInput` for P[n,h,w,i,p,r] and W[kh,kw,i,o,r,q], the weight an input."""
    return export_onnx(CapsConvWeightInput().eval(), (P, _conv_weight(W).permute(0, 2, 3, 1).contiguous()))


def build_capsule_weight_input() -> WorkloadInstance:
    """capsule_votes from ONNX with W as a run-time input (inputs P and the OHWI conv weight)."""
    g = _gen()
    c = CAPS
    P = _randn(c["N"], c["H"], c["W"], c["I"], 4, 4, g=g)
    W = _randn(3, 3, c["I"], c["O"], 4, 4, scale=1.0 / math.sqrt(9 * c["I"] * 4), g=g)
    Wo = _conv_weight(W).permute(0, 2, 3, 1).contiguous()
    module = CapsConvWeightInput().eval()
    meta = {"einsum": "V[n,y,x,o,p,q] = sum_{kh,kw,i,r} P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]",
            "P": list(P.shape), "Wo": list(Wo.shape), "V": [c["N"], 7, 7, c["O"], 4, 4], "stride": 2,
            "note": "the conv weight (OHWI) is a run-time input: no system can pre-pack it"}
    return WorkloadInstance("capsule_votes_weight_input", module, (P, Wo), lambda: export_onnx(module, (P, Wo)),
                            capsule_reference(P, W), CAPSULE_FLOPS, meta=meta)


# ----------------------------------------------------------------------------------------
# transformer / CNN blocks
# ----------------------------------------------------------------------------------------


class FFNBlock(nn.Module):
    def __init__(self, d=768, h=3072):
        super().__init__()
        self.fc1, self.fc2, self.ln = nn.Linear(d, h), nn.Linear(h, d), nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(self.fc2(F.gelu(self.fc1(x))) + x)


class Attention(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v


class ConvBnRelu(nn.Module):
    def __init__(self, c=64):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaMLP(nn.Module):
    def __init__(self, d=1024, h=2816):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False), \
            nn.Linear(h, d, bias=False)

    def forward(self, x):
        x = self.norm(x)
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class MatMul(nn.Module):
    def forward(self, a, b):
        return a @ b


def build_ffn() -> WorkloadInstance:
    torch.manual_seed(SEED)
    m = FFNBlock()
    x = _randn(128, 768, g=_gen())
    return _block("ffn_block", m, (x,), 2 * 2 * 128 * 768 * 3072)


def build_attention() -> WorkloadInstance:
    g = _gen()
    q, k, v = (_randn(1, 12, 256, 64, g=g) for _ in range(3))
    return _block("attention", Attention(), (q, k, v), 2 * 2 * 12 * 256 * 256 * 64)


def build_conv_bn_relu() -> WorkloadInstance:
    torch.manual_seed(SEED)
    m = ConvBnRelu()
    g = _gen(1)
    with torch.no_grad():
        m.bn.running_mean.copy_(0.1 * torch.randn(64, generator=g))
        m.bn.running_var.copy_(torch.rand(64, generator=g) + 0.5)
        m.bn.weight.copy_(torch.rand(64, generator=g) + 0.5)
        m.bn.bias.copy_(0.1 * torch.randn(64, generator=g))
    x = _randn(1, 64, 56, 56, g=_gen())
    return _block("conv_bn_relu", m, (x,), 2 * 64 * 56 * 56 * 64 * 9)


def build_llama_mlp() -> WorkloadInstance:
    torch.manual_seed(SEED)
    m = LlamaMLP()
    with torch.no_grad():
        m.norm.weight.copy_(1 + 0.1 * torch.randn(1024))
    x = _randn(64, 1024, g=_gen())
    return _block("llama_mlp", m, (x,), 2 * 3 * 64 * 1024 * 2816)


def build_layernorm() -> WorkloadInstance:
    torch.manual_seed(SEED)
    m = nn.LayerNorm(1024)
    with torch.no_grad():
        m.weight.copy_(1 + 0.1 * torch.randn(1024))
        m.bias.copy_(0.1 * torch.randn(1024))
    return _block("layernorm", m, (_randn(4096, 1024, g=_gen()),), None)


def build_softmax() -> WorkloadInstance:
    return _block("softmax", Softmax(), (_randn(4096, 1024, g=_gen()),), None)


def build_sgemm() -> WorkloadInstance:
    g = _gen()
    a, b = _randn(1024, 1024, g=g), _randn(1024, 1024, g=g)
    return _block("sgemm", MatMul(), (a, b), 2 * 1024 ** 3)


def build_ffn_batched(batch: int = 16) -> Callable[[], WorkloadInstance]:
    def build() -> WorkloadInstance:
        torch.manual_seed(SEED)
        m = FFNBlock()
        x = _randn(batch, 128, 768, g=_gen())
        return _block(f"ffn_block_b{batch}", m, (x,), 2 * 2 * batch * 128 * 768 * 3072, meta={"batch": batch})

    return build


def build_model(name: str, batch: int = 1) -> Callable[[], WorkloadInstance]:
    def build() -> WorkloadInstance:
        from benchmarks.light_models_local import OnnxTorchModule, input_shape, load_light_model

        model = load_light_model(name, seed=SEED, batch=batch)
        module = OnnxTorchModule(model).eval()
        x = _randn(*input_shape(model), g=_gen())
        data = model.SerializeToString()
        ref = float64_reference(module, (x,))
        label = name if batch == 1 else f"{name}_b{batch}"
        return WorkloadInstance(label, module, (x,), lambda: data, ref, None, is_model=True,
                                meta={"source": f"onnx light_{name}.onnx, seeded random weights", "batch": batch})

    return build


LIGHT_MODELS = {
    "bvlc_alexnet": "AlexNet", "densenet121": "DenseNet-121", "inception_v1": "Inception v1",
    "inception_v2": "Inception v2", "resnet50": "ResNet-50", "shufflenet": "ShuffleNet", "squeezenet": "SqueezeNet",
    "vgg19": "VGG-19", "zfnet512": "ZFNet-512",
}
BATCHED = 16

WORKLOADS: list[Workload] = [
    Workload("capsule_votes", build_capsule, description="matrix-capsule conv votes, stride 2"),
    Workload("capsule_votes_weight_input", build_capsule_weight_input,
             description="capsule votes from ONNX, the weight a run-time input"),
    Workload("ffn_block", build_ffn, description="x[128,768] Linear-GELU-Linear +x LayerNorm"),
    Workload("attention", build_attention, description="softmax(q k^T/8) v, [1,12,256,64]"),
    Workload("conv_bn_relu", build_conv_bn_relu, description="3x3 conv 64->64 + BN(eval) + ReLU, 56x56"),
    Workload("llama_mlp", build_llama_mlp, description="RMSNorm + SwiGLU 1024->2816->1024, 64 rows"),
    Workload("layernorm", build_layernorm, description="LayerNorm [4096,1024]"),
    Workload("softmax", build_softmax, description="softmax [4096,1024]"),
    Workload("sgemm", build_sgemm, description="1024^3 matmul"),
    *(Workload(name, build_model(name), is_model=True, description=f"onnx light_{name} ({label}), batch 1")
      for name, label in LIGHT_MODELS.items()),
    Workload(f"resnet50_b{BATCHED}", build_model("resnet50", BATCHED), is_model=True,
             description=f"onnx light_resnet50, batch {BATCHED}"),
    Workload(f"squeezenet_b{BATCHED}", build_model("squeezenet", BATCHED), is_model=True,
             description=f"onnx light_squeezenet, batch {BATCHED}"),
    Workload(f"ffn_block_b{BATCHED}", build_ffn_batched(BATCHED),
             description=f"transformer FFN block, {BATCHED} sequences of x[128,768]"),
]
WORKLOADS_BY_NAME = {w.name: w for w in WORKLOADS}
