"""Built-in ops, expressed in index notation wherever possible so the optimizer can see inside them.

Every op is a function ``op(b: GraphBuilder, *tensors: str, **attrs) -> str | list[str]`` that adds
nodes to ``b`` and returns graph tensor names. Frontends (ONNX, torch.fx) are thin maps onto these.
"""
