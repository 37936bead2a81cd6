"""The ONNX backend conformance suite as superopt runs it: which node tests, and which not (and why)."""

import onnx.backend.test

OPS = [
    "abs",
    "add",
    "and",
    "averagepool",
    "batchnorm",
    "cast",
    "ceil",
    "clip",
    "concat",
    "constant",
    "constantofshape",
    "conv",
    "cos",
    "div",
    "dropout",
    "elu",
    "equal",
    "erf",
    "exp",
    "expand",
    "flatten",
    "floor",
    "gather",
    "gelu",
    "gemm",
    "globalaveragepool",
    "globalmaxpool",
    "greater",
    "greater_equal",
    "hardsigmoid",
    "identity",
    "layer_normalization",
    "leakyrelu",
    "less",
    "less_equal",
    "log",
    "logsoftmax",
    "lrn",
    "matmul",
    "max",
    "maxpool",
    "mean",
    "min",
    "mul",
    "neg",
    "not",
    "or",
    "pad",
    "pow",
    "prelu",
    "range",
    "reciprocal",
    "reduce_l2",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_prod",
    "reduce_sum",
    "reduce_sum_square",
    "relu",
    "reshape",
    "round",
    "shape",
    "sigmoid",
    "sign",
    "sin",
    "size",
    "slice",
    "softmax",
    "softplus",
    "split",
    "sqrt",
    "squeeze",
    "sub",
    "sum",
    "tanh",
    "tile",
    "transpose",
    "unsqueeze",
    "where",
    "xor",
]

# Each exclusion says why; everything else in the ops above must pass.
EXCLUDE = [
    # element types superopt does not have (float16/bfloat16/float8/int8/uint*/string)
    r"_(float16|FLOAT16|bfloat16|BFLOAT16|float8|FLOAT8|e4m3|e5m2|uint8|int8|uint16|int16|uint32|uint64|"
    r"string|STRING|int4|uint4|INT4|UINT4|float4|FLOAT4)",
    r"test_cast_.*(FLOAT_to|DOUBLE_to|to_FLOAT|to_DOUBLE)",  # Cast tables mostly cover exotic types
    r"_empty_set_",  # zero-size tensors: the IR has no empty iteration spaces
    r"test_gather_elements_",  # GatherElements is not mapped (data-dependent, no extern yet)
    r"test_batchnorm_.*_training_mode_",  # training-mode BatchNormalization (running-stat outputs)
    r"test_averagepool_.*dilations",  # AveragePool with dilations is not mapped
    r"test_maxpool_with_argmax",  # MaxPool's Indices output is not supported
    r"test_split_to_sequence|test_identity_(opt|sequence)",  # sequence / optional types
    r"test_cast_U?INT2_",  # 2-bit integer types
    r"test_range_.*_expanded_cpu$",  # the expanded Range function body is a Loop (control flow)
    # models at opsets below 9 (outside the supported 9..21 range)
    r"test_(and|or|xor)_bcast|test_not_[234]d_cpu",
    r"OnnxBackendPyTorchConverted.*|test_(log_)?softmax_(lastdim|dim3|functional_dim3)_cpu",
]



def make_backend_test(backend, module_name: str) -> onnx.backend.test.BackendTest:
    """A BackendTest restricted to the supported ops, minus the commented exclusions."""
    bt = onnx.backend.test.BackendTest(backend, module_name)
    for op in OPS:
        bt.include(rf"^test_{op}(_.*)?_cpu$")
    for pattern in EXCLUDE:
        bt.exclude(pattern)
    return bt
