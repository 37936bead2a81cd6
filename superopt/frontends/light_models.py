"""The nine "light" model zoo graphs shipped in the onnx wheel, with seeded random weights.

The shipped models fill every weight with one constant (ConstantOfShape 0.02), which hides most bugs. Here
each weight becomes a seeded random initializer scaled so activations stay O(1): He-normal conv / gemm
weights, small biases, batch-norm scales near 1 and positive variances.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_model_path(name: str) -> Path:
    p = light_model_dir() / f"light_{name}.onnx"
    if not p.exists():
        raise FileNotFoundError(f"no light model {name!r} at {p}; known: {LIGHT_MODELS}")
    return p


def _consumer_role(graph: onnx.GraphProto, name: str) -> tuple[str, int]:
    """(op type, input position) of the first real consumer, looking through Unsqueeze/Reshape."""
    for _ in range(4):
        for n in graph.node:
            if name in n.input:
                if n.op_type in ("Unsqueeze", "Reshape", "Identity") and n.input[0] == name:
                    name = n.output[0]
                    break
                return n.op_type, list(n.input).index(name)
        else:
            return "", -1
    return "", -1


def _random_weight(
    rng: np.random.Generator, role: tuple[str, int], shape: tuple[int, ...], node_attrs: dict
) -> np.ndarray:
    op, pos = role
    if op == "Conv" and pos == 1:
        fan_in = int(np.prod(shape[1:]))
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    if op == "Gemm" and pos == 1:
        fan_in = shape[1] if node_attrs.get("transB", 0) else shape[0]
        return rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)
    if op == "BatchNormalization":
        if pos == 1:  # scale
            return rng.uniform(0.5, 1.0, shape)
        if pos == 4:  # variance
            return rng.uniform(0.5, 1.5, shape)
        return rng.standard_normal(shape) * 0.1  # bias, mean
    if op == "Mul":
        return rng.uniform(0.5, 1.0, shape)
    return rng.standard_normal(shape) * 0.1  # biases and anything else


def randomized_light_model(name: str, seed: int = 0, calibrate: bool = True) -> onnx.ModelProto:
    """The light model with every float weight (initializer or constant ConstantOfShape) seeded random.

    ``calibrate``: scale the classifier so that the logits in front of a final Softmax have a standard
    deviation near 1 on the seeded inputs (:func:`calibrate_logits`)."""
    m = onnx.load(str(light_model_path(name)))
    g = m.graph
    rng = np.random.default_rng(seed)
    init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    attrs_of = {}
    for n in g.node:
        attrs_of.update({o: None for o in n.output})
    new_init: dict[str, np.ndarray] = {}
    keep_nodes = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in init:
            new_init[n.output[0]] = np.zeros(tuple(int(s) for s in init[n.input[0]]), np.float32)
        else:
            keep_nodes.append(n)
    for k, v in init.items():
        if v.dtype == np.float32:
            new_init[k] = v
    consumers_attrs = {}
    for n in keep_nodes:
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        for i in n.input:
            consumers_attrs.setdefault(i, a)
    for k in sorted(new_init):
        role = _consumer_role(g, k)
        new_init[k] = _random_weight(rng, role, new_init[k].shape, consumers_attrs.get(k, {})).astype(
            np.float32
        )
    int_init = {
        k: v
        for k, v in init.items()
        if v.dtype != np.float32 and k not in {n.input[0] for n in g.node if n.op_type == "ConstantOfShape"}
    }
    inits = [numpy_helper.from_array(v, k) for k, v in {**int_init, **new_init}.items()]
    del g.node[:]
    g.node.extend(keep_nodes)
    del g.initializer[:]
    g.initializer.extend(inits)
    init_names = {t.name for t in inits}
    inputs = [vi for vi in g.input if vi.name not in init_names and vi.name not in init]
    del g.input[:]
    g.input.extend(inputs)
    if m.ir_version < 4:
        m.ir_version = 4  # initializers need not be graph inputs from IR 4 on
    return calibrate_logits(m, light_model_inputs(m, seed)) if calibrate else m


_PASS_THROUGH = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")
# f(s * x) = s * f(x) for s > 0: a positive scale of the classifier passes through these unchanged
_POSITIVE_HOMOGENEOUS = (*_PASS_THROUGH, "Relu", "GlobalAveragePool", "AveragePool", "MaxPool")


def _classifier(graph: onnx.GraphProto) -> tuple[str, set[str]] | None:
    """(the logits in front of the final Softmax, the initializers holding the weight and bias of the Gemm or
    Conv that produces them through ops a positive scale passes), or None where the graph has no such layer."""
    producer = {o: n for n in graph.node for o in n.output}

    def source(name: str, through: tuple[str, ...]) -> tuple[str, onnx.NodeProto | None]:
        while name in producer and producer[name].op_type in through:
            name = producer[name].input[0]
        return name, producer.get(name)

    outputs = {o.name for o in graph.output}
    softmax = [n for n in graph.node if n.op_type == "Softmax" and n.output[0] in outputs]
    if not softmax:
        return None
    _, layer = source(softmax[-1].input[0], _POSITIVE_HOMOGENEOUS)
    if layer is None or layer.op_type not in ("Gemm", "Conv"):
        return None
    # the weight may reach the layer through a Reshape
    return softmax[-1].input[0], {source(name, _PASS_THROUGH)[0] for name in layer.input[1:3]}


def calibrate_logits(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Scale the weight and bias of the layer in front of a final Softmax by a power of two (exact in float)
    that brings the logits' standard deviation on ``feed`` into [1, 2).

    Random weights let activations grow through a deep network without trained normalization: Inception v1's
    logits reach a standard deviation near 100 and ShuffleNet's near 20, so their softmax is one-hot, a
    near-constant output against which any program agrees. The classifier is linear in its weight and bias,
    so scaling both scales the logits and changes nothing else. Models without such a classifier are
    returned unchanged."""
    found = _classifier(model.graph)
    if found is None:
        return model
    logits_name, weights = found
    outputs = [onnx.ValueInfoProto() for _ in model.graph.output]  # the model itself is probed for its logits
    for kept, o in zip(outputs, model.graph.output):  # (copies of its outputs only, not of its weights)
        kept.CopyFrom(o)
    del model.graph.output[:]
    model.graph.output.extend([onnx.helper.make_tensor_value_info(logits_name, onnx.TensorProto.FLOAT, None)])
    try:
        logits = _run_float32(model, feed)[0]
    finally:
        del model.graph.output[:]
        model.graph.output.extend(outputs)
    std = float(np.std(logits))
    if not np.isfinite(std) or std == 0.0:
        return model
    scale = 2.0 ** -np.floor(np.log2(std))
    if scale == 1.0:
        return model
    for i, t in enumerate(model.graph.initializer):
        if t.name in weights:
            scaled = (numpy_helper.to_array(t) * scale).astype(np.float32)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(scaled, t.name))
    return model


def _run_float32(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime where installed, else the reference interpreter (the power-of-two scale of
    :func:`calibrate_logits` does not depend on which)."""
    try:
        return [np.asarray(o) for o in run_onnxruntime(model, feed)]
    except ImportError:
        return run_superopt(model, feed, dtype=np.float32)


def light_model_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    feed = {}
    init = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def run_onnxruntime(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3  # no warnings about unused initializers and the like
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return s.run(None, feed)


def run_superopt(model: onnx.ModelProto, feed: dict[str, np.ndarray], dtype=np.float64) -> list[np.ndarray]:
    """The reference interpreter on the imported model (float64 by default, for verification)."""
    from superopt.frontends.onnx_frontend import import_onnx_model
    from superopt.interp.reference import evaluate

    im = import_onnx_model(model)
    out = evaluate(
        im.graph, {g: feed[n] for g, n in zip(im.graph.inputs, im.input_names, strict=False)}, dtype=dtype
    )
    return [out[o] for o in im.graph.outputs]


def compare(name: str, seed: int = 0, dtype=np.float64) -> dict[str, float]:
    """Max abs / rel error of superopt vs onnxruntime (float32) on the randomized light model."""
    m = randomized_light_model(name, seed)
    feed = light_model_inputs(m, seed)
    want = run_onnxruntime(m, feed)
    got = run_superopt(m, feed, dtype)
    abs_err = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=False))
    rel_err = max(float(np.max(np.abs(g - w) / (np.abs(w) + 1e-12))) for g, w in zip(got, want, strict=False))
    scale = max(float(np.max(np.abs(w))) for w in want)
    ok = all(np.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want, strict=False))
    return {"max_abs": abs_err, "max_rel": rel_err, "max_out": scale, "allclose": ok}
