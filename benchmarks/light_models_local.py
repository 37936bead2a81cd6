"""Minimal local loader/randomizer for the onnx "light" models + ONNX->torch converter.

:func:`load_light_model` uses the shared loader ``superopt.frontends.light_models``
when it is importable, and falls back to the local randomizer below.

The light models replace every weight by a ``ConstantOfShape`` node.  We
replace those (and all float initializers) by seeded random initializers chosen
by role: conv weights He-normal, Gemm weights 1/sqrt(fan_in), BatchNorm with
positive variances, small biases.
"""

from __future__ import annotations

import copy
import glob
import math
import os
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

MODEL_NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
               "squeezenet", "vgg19", "zfnet512")


def light_model_path(name: str) -> str:
    base = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    paths = glob.glob(os.path.join(base, f"light_{name}.onnx"))
    if not paths:
        raise FileNotFoundError(f"light_{name}.onnx not found under {base}")
    return paths[0]


def _randomize(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    g = model.graph
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, tuple[onnx.NodeProto, int]] = {}
    for n in g.node:
        for idx, name in enumerate(n.input):
            consumers.setdefault(name, (n, idx))

    # shapes of all float parameters
    shapes: dict[str, list[int]] = {}
    for n in g.node:
        if n.op_type == "ConstantOfShape":
            shapes[n.output[0]] = [int(v) for v in numpy_helper.to_array(inits[n.input[0]])]
    for i in g.initializer:
        if i.data_type == onnx.TensorProto.FLOAT:
            shapes[i.name] = list(i.dims)

    def attr(node: onnx.NodeProto, key: str, default: Any) -> Any:
        for a in node.attribute:
            if a.name == key:
                return helper.get_attribute_value(a)
        return default

    new_vals: dict[str, np.ndarray] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        node, idx = consumers.get(name, (None, -1))
        op = node.op_type if node is not None else ""
        if op == "Conv" and idx == 1:
            fan_in = int(np.prod(shape[1:]))
            v = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif op == "BatchNormalization":
            if idx == 1:  # scale (0.2..0.5 keeps the resnet residual sums bounded)
                v = rng.uniform(0.2, 0.5, shape)
            elif idx == 4:  # running variance > 0
                v = rng.uniform(0.5, 1.5, shape)
            else:  # bias, running mean
                v = 0.1 * rng.standard_normal(shape)
        elif op == "Gemm" and idx == 1:
            fan_in = shape[1] if attr(node, "transB", 0) else shape[0]
            v = rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)
        else:  # biases and anything else
            v = 0.01 * rng.standard_normal(shape)
        new_vals[name] = v.astype(np.float32)

    nodes = [n for n in g.node if n.op_type != "ConstantOfShape"]
    used = {x for n in nodes for x in n.input}
    keep_inits = [
        i for i in g.initializer
        if i.name not in new_vals and i.name in used and not i.name.endswith("__SHAPE")
    ]
    new_inits = keep_inits + [numpy_helper.from_array(v, name) for name, v in new_vals.items()]
    init_names = {i.name for i in new_inits}
    inputs = [i for i in g.input if i.name not in init_names and i.name in used]
    graph = helper.make_graph(nodes, g.name, inputs, list(g.output), new_inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="superopt-bench")
    out.ir_version = max(model.ir_version, 7)  # IR>=4: initializers need not be graph inputs
    onnx.checker.check_model(out)
    return out


def load_light_model(name: str, seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """Randomized light model (ModelProto) taking ``batch`` images.

    The shared loader (``superopt.frontends.light_models``) sees through the Unsqueeze in front of the
    batch-norm scales of DenseNet and Inception v2; the local randomizer is the fallback. For a batch
    other than 1, the input's leading axis becomes ``batch`` and a Reshape to a leading 1 (the flatten
    before the classifier) reshapes to -1 instead, so the model takes any batch."""
    try:  # prefer the shared loader when it exists
        from superopt.frontends.light_models import randomized_light_model

        model = randomized_light_model(name, seed=seed)
    except ImportError:
        model = _randomize(onnx.load(light_model_path(name)), seed)
    return model if batch == 1 else with_batch(model, batch)


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    g = model.graph
    g.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    reshape_shapes = {n.input[1] for n in g.node if n.op_type == "Reshape"}
    for i, t in enumerate(g.initializer):
        if t.name in reshape_shapes:
            v = numpy_helper.to_array(t).copy()
            if v.ndim == 1 and v.size and v[0] == 1:
                v[0] = -1
                g.initializer[i].CopyFrom(numpy_helper.from_array(v, t.name))
    for o in g.output:
        if o.type.tensor_type.shape.dim:
            o.type.tensor_type.shape.dim[0].dim_value = batch
    del g.value_info[:]
    onnx.checker.check_model(model)
    return model


# --------------------------------------------------------------------------------------
# ONNX -> torch (eager interpreter module) for the op subset used by the light models
# --------------------------------------------------------------------------------------


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pad_arg(pads: list[int]) -> tuple[bool, Any]:
    """ONNX pads [t, l, b, r] -> (symmetric, torch arg)."""
    n = len(pads) // 2
    begin, end = pads[:n], pads[n:]
    if begin == end:
        return True, tuple(begin)
    pad = []
    for b, e in zip(reversed(begin), reversed(end), strict=True):
        pad += [b, e]
    return False, tuple(pad)


class OnnxTorchModule(torch.nn.Module):
    """Interprets an ONNX graph with torch ops (eager); traceable by dynamo."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__()
        g = model.graph
        self.opset = model.opset_import[0].version
        self.params: dict[str, torch.Tensor] = {}
        for k, i in enumerate(g.initializer):
            t = torch.from_numpy(numpy_helper.to_array(i).copy())
            if t.is_floating_point():
                self.register_buffer(f"p{k}", t)
            self.params[i.name] = t
        self._param_attr = {i.name: f"p{k}" for k, i in enumerate(g.initializer)}
        self.inputs = [i.name for i in g.input]
        self.outputs = [o.name for o in g.output]
        self.const_shapes = {
            n.input[1]: [int(v) for v in self.params[n.input[1]].tolist()]
            for n in g.node if n.op_type == "Reshape" and n.input[1] in self.params
        }
        self.nodes = [(n.op_type, list(n.input), list(n.output), _attrs(n)) for n in g.node]

    def _get(self, env: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        if name in env:
            return env[name]
        attr = self._param_attr.get(name)
        if attr is not None and hasattr(self, attr):
            return getattr(self, attr)
        return self.params[name]

    def forward(self, *xs: torch.Tensor):  # noqa: C901 - a flat op switch
        env: dict[str, torch.Tensor] = dict(zip(self.inputs, xs, strict=True))
        for op, ins, outs, a in self.nodes:
            x = [self._get(env, n) for n in ins if n]
            if op == "Conv":
                sym, pad = _pad_arg(a.get("pads", [0, 0, 0, 0]))
                inp = x[0] if sym else F.pad(x[0], pad)
                y = F.conv2d(
                    inp, x[1], x[2] if len(x) > 2 else None, stride=tuple(a.get("strides", [1, 1])),
                    padding=pad if sym else 0, dilation=tuple(a.get("dilations", [1, 1])),
                    groups=a.get("group", 1),
                )
            elif op == "BatchNormalization":
                y = F.batch_norm(x[0], x[3], x[4], x[1], x[2], False, 0.0, a.get("epsilon", 1e-5))
            elif op == "Relu":
                y = F.relu(x[0])
            elif op in ("Sum", "Add"):
                y = x[0]
                for t in x[1:]:
                    y = y + t
            elif op == "MaxPool":
                sym, pad = _pad_arg(a.get("pads", [0, 0, 0, 0]))
                inp = x[0] if sym else F.pad(x[0], pad, value=float("-inf"))
                y = F.max_pool2d(inp, tuple(a["kernel_shape"]), tuple(a.get("strides", [1, 1])),
                                 padding=pad if sym else 0, ceil_mode=bool(a.get("ceil_mode", 0)))
            elif op == "AveragePool":
                k, s = tuple(a["kernel_shape"]), tuple(a.get("strides", [1, 1]))
                pads = a.get("pads", [0, 0, 0, 0])
                sym, pad = _pad_arg(pads)
                if not any(pads):
                    y = F.avg_pool2d(x[0], k, s)
                elif sym:  # symmetric pads: torch takes them as (ph, pw)
                    y = F.avg_pool2d(x[0], k, s, padding=pad, count_include_pad=bool(a.get("count_include_pad", 0)))
                elif a.get("count_include_pad", 0):
                    y = F.avg_pool2d(F.pad(x[0], _pad_arg(pads)[1]), k, s)
                else:
                    pad = _pad_arg(pads)[1]
                    ones = torch.ones_like(x[0][:1, :1])
                    y = F.avg_pool2d(F.pad(x[0], pad), k, s) / F.avg_pool2d(F.pad(ones, pad), k, s)
            elif op == "GlobalAveragePool":
                y = x[0].mean(dim=(2, 3), keepdim=True)
            elif op == "Concat":
                y = torch.cat(x, dim=a["axis"])
            elif op == "Reshape":
                shape = self.const_shapes[ins[1]]  # static shapes only (light models)
                shape = [x[0].shape[i] if v == 0 else v for i, v in enumerate(shape)]
                y = x[0].reshape(shape)
            elif op == "Flatten":
                ax = a.get("axis", 1)
                y = x[0].reshape(math.prod(x[0].shape[:ax]), -1)
            elif op == "Gemm":
                A = x[0].t() if a.get("transA", 0) else x[0]
                B = x[1].t() if a.get("transB", 0) else x[1]
                y = a.get("alpha", 1.0) * (A @ B)
                if len(x) > 2:
                    y = y + a.get("beta", 1.0) * x[2]
            elif op == "Softmax":
                ax = a.get("axis", 1 if self.opset < 13 else -1)
                if self.opset < 13:
                    shp = x[0].shape
                    y = x[0].reshape(math.prod(shp[:ax]), -1).softmax(-1).reshape(shp)
                else:
                    y = x[0].softmax(ax)
            elif op == "Mul":
                y = x[0] * x[1]
            elif op == "Unsqueeze":
                y = x[0]
                for ax in sorted(a["axes"]):
                    y = y.unsqueeze(ax)
            elif op == "Transpose":
                y = x[0].permute(*a["perm"])
            elif op in ("Dropout", "Identity"):
                y = x[0]
            elif op == "LRN":
                y = F.local_response_norm(x[0], a["size"], a.get("alpha", 1e-4), a.get("beta", 0.75),
                                          a.get("bias", 1.0))
            else:
                raise NotImplementedError(f"ONNX op {op} not supported by the local converter")
            env[outs[0]] = y
        res = [env[o] for o in self.outputs]
        return res[0] if len(res) == 1 else tuple(res)


def input_shape(model: onnx.ModelProto) -> list[int]:
    i = model.graph.input[0]
    return [d.dim_value for d in i.type.tensor_type.shape.dim]
