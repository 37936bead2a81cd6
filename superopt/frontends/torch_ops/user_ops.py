"""User ops (``superopt.op(text)``, run by torch as ``torch.ops.superopt.<name>``) lowered natively: their index
notation becomes a compute node of the graph, so the optimizer sees inside them and fuses around them."""

from __future__ import annotations

from typing import Any

import torch

from superopt.frontends.torch_ops.context import Ctx, Handler, T

# torch op name -> its user op (``superopt.user_op.UserOp``, which registers itself here): anything with the op's
# ``text`` and ``compute(shapes, dtypes) -> Compute``; the frontend lowers these natively
REGISTERED: dict[str, Any] = {}


def user_op_handler(target: Any) -> Handler | None:
    """The handler for ``torch.ops.superopt.<name>`` (packet or overload) of a registered user op, else None."""
    if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return None
    qual = target.name() if isinstance(target, torch._ops.OpOverload) else target._qualified_op_name
    ns, _, name = qual.partition("::")
    if ns != "superopt":
        return None
    op = REGISTERED.get(name.split(".")[0])
    if op is None:
        return None

    def lower(cx: Ctx, *tensors: Any) -> Any:
        ts = [cx.tensor(t) for t in tensors]
        compute = op.compute([cx.shape(t) for t in ts], [cx.dtype(t) for t in ts])
        outs = cx.b.add_compute(compute, ts, name, out_names=list(compute.outputs))
        outs = [T(o) for o in ([outs] if isinstance(outs, str) else outs)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return lower
