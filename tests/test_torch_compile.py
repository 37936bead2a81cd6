"""The PyTorch front door: partitioning with an eager fallback, strict mode, the fallback report, per-shape
specialization under dynamic shapes, and torch.export input."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_torch_modules import TopkCumsum  # Linear, ReLU, topk and cumsum, defined once with the table
from torch import nn

import superopt
from superopt.frontends.torch_backend import clear_compiled, compiled_graphs, interpreter_runner, make_backend
from superopt.frontends.torch_export import import_torch_program
from superopt.frontends.torch_fx import FxImportError
from superopt.frontends.torch_ops.context import contract_op
from superopt.interp import evaluate

HAVE_TOPK_CUMSUM = contract_op("sorting", "topk") is not None and contract_op("scan", "cumsum") is not None


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        y = torch.special.bessel_j0(self.a(x)).view(-1, 2, 4).transpose(1, 2).flatten(1)
        return self.b(torch.special.bessel_j0(y))


def _distinct(*shape: int) -> torch.Tensor:
    """Inputs without ties (topk/sort order among equal values is implementation-defined in torch)."""
    return torch.randn(*shape) + torch.arange(shape[-1], dtype=torch.float32) * 1e-3


def _fresh():
    torch._dynamo.reset()
    clear_compiled()


def test_issue_module_compiles_and_lowers_topk_and_cumsum_natively():
    torch.manual_seed(0)
    model, x = TopkCumsum().eval(), _distinct(3, 16)
    _fresh()
    with torch.no_grad():
        got = torch.compile(model, backend="superopt", options={"strict": HAVE_TOPK_CUMSUM})(x)
        ref = model(x)
    torch.testing.assert_close(got[0], ref[0])
    assert torch.equal(got[1], ref[1])
    (graph,) = compiled_graphs()
    if HAVE_TOPK_CUMSUM:
        assert graph.report.fallbacks == []
        assert {"torch.topk", "torch.cumsum"} <= graph.report.lowered_functions
    else:  # the extern ops have not landed in this checkout: they run in eager PyTorch
        assert {"torch.topk", "torch.cumsum"} <= graph.report.fallback_functions


def test_fallback_report_and_log_name_node_function_and_reason(caplog):
    torch.manual_seed(0)
    model, x = Unsupported().eval(), torch.randn(3, 8)
    _fresh()
    with caplog.at_level(logging.INFO, logger="superopt.torch"), torch.no_grad():
        compiled = torch.compile(model, backend="superopt")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        compiled(x)  # a second call does not log again
    (graph,) = compiled_graphs()
    fbs = graph.report.fallbacks
    assert len(fbs) == 2 and {f.function for f in fbs} == {"torch.special.bessel_j0"}
    assert all("unsupported function" in f.reason and f.node in str(graph.report) for f in fbs)
    logged = [r.getMessage() for r in caplog.records if "eager PyTorch" in r.getMessage()]
    assert len(logged) == 1 and all(f.node in logged[0] for f in fbs)
    # the two Linear layers are compiled regions; the views between the two eager calls stay in eager
    compiled_regions = [r for r in graph.report.regions if r.compiled]
    assert {"torch.nn.functional.linear"} <= graph.report.lowered_functions
    assert len(compiled_regions) == 2
    assert any(not r.compiled and "views" in r.why_eager for r in graph.report.regions)


def test_strict_mode_turns_a_fallback_into_an_error_naming_the_node():
    _fresh()
    compiled = torch.compile(Unsupported().eval(), backend="superopt", options={"strict": True})
    with pytest.raises(Exception, match=r"strict: node 'special_bessel_j0' \(torch.special.bessel_j0\)"), torch.no_grad():
        compiled(torch.randn(3, 8))


def test_unknown_backend_option_is_an_error():
    _fresh()
    compiled = torch.compile(TopkCumsum().eval(), backend="superopt", options={"stritc": True})
    with pytest.raises(Exception, match="unknown superopt backend option"), torch.no_grad():
        compiled(torch.randn(3, 16))


def test_a_region_that_differs_from_eager_runs_in_eager():
    def wrong(graph):  # a runner that is off by one: verification must catch it
        run = interpreter_runner(graph)
        return lambda args: [o + 1 for o in run(args)]

    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), torch.randn(2, 8)
    _fresh()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=make_backend(wrong))(x), model(x))
        (graph,) = compiled_graphs()
        (region,) = graph.report.regions
        assert list(region.signatures.values())[0].startswith("eager: output 0 differs from eager")
        _fresh()
        strict = torch.compile(model, backend=make_backend(wrong, strict=True))
        with pytest.raises(Exception, match="differs from eager"):
            strict(x)


class DynamicNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        b = x.shape[0]
        h = torch.relu(self.fc1(x)).view(b, 2, 4).sum(1)
        v, i = torch.topk(h + x[:, :4], 2)
        return self.fc2(torch.softmax(x, -1)) * b, torch.cumsum(v, 0), i


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic"])
def test_dynamic_shapes_compile_once_per_size(how):
    torch.manual_seed(0)
    model = DynamicNet().eval()
    _fresh()
    compiled = torch.compile(model, backend="superopt", dynamic=True if how == "dynamic" else None)
    with torch.no_grad():
        for batch in (2, 3, 5, 3, 2):
            x = _distinct(batch, 8)
            if how == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            got, ref = compiled(x), model(x)
            for g, r in zip(got, ref, strict=True):
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    graphs = compiled_graphs()
    assert len(graphs) == 1, "Dynamo recompiled the graph for a new size (a guard on the shape symbol)"
    report = graphs[0].report
    compiled_regions = [r for r in report.regions if r.compiled]
    assert compiled_regions
    for r in compiled_regions:  # each region compiled (and verified against eager) once per batch size
        assert r.compiles == 3 and len(r.signatures) == 3


# ---- torch.export input ------------------------------------------------------------------------------------
class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 5))

    def forward(self, x):
        y = F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1)
        return self.fc(y) * self.scale


def _check_graph(graph, model, *xs):
    out = evaluate(graph, [x.numpy() for x in xs])
    with torch.no_grad():
        ref = model(*xs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(graph.outputs) == len(ref)
    for name, r in zip(graph.outputs, ref, strict=True):
        np.testing.assert_allclose(out[name], r.numpy(), rtol=1e-4, atol=1e-5)


def test_export_module_and_exported_program():
    torch.manual_seed(0)
    model, x = SmallConvNet().eval(), torch.randn(2, 3, 6, 6)
    graph = import_torch_program(model, (x,))
    assert len(graph.inputs) == 1  # parameters and buffers are constants
    _check_graph(graph, model, x)
    ep = torch.export.export(TopkCumsum().eval(), (_distinct(3, 16),))
    x2 = _distinct(3, 16)
    _check_graph(import_torch_program(ep, (x2,)), ep.module(), x2)
    _check_graph(import_torch_program(ep), ep.module(), *ep.example_inputs[0])  # the program's own examples


def test_export_kv_cache_block_functionalized():
    import copy

    from test_torch_modules import GPTBlockKV

    torch.manual_seed(0)
    model, x = GPTBlockKV().eval(), torch.randn(1, 3, 32)
    reference = copy.deepcopy(model)  # export does not run the model; the eager copy updates its own cache
    graph = import_torch_program(model, (x, 2))
    assert len(graph.inputs) == 1  # the position is specialized, the cache buffers are constants
    _check_graph(graph, lambda t: reference(t, 2), x)


def test_export_errors_name_the_node():
    with pytest.raises(FxImportError, match=r"node 'special_bessel_j0'.*bessel_j0"):
        import_torch_program(Unsupported().eval(), (torch.randn(3, 8),))

    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(FxImportError, match="torch.export failed on Branchy"):
        import_torch_program(Branchy(), (torch.randn(3),))
    with pytest.raises(ValueError, match="needs example_inputs"):
        import_torch_program(SmallConvNet())


def test_optimize_takes_a_module_through_torch_export():
    torch.manual_seed(0)
    model, x = SmallConvNet().eval(), torch.randn(2, 3, 6, 6)
    program = superopt.optimize(model, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(program(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_an_internal_error_in_the_passes_runs_the_graph_in_eager(monkeypatch):
    import superopt.frontends.torch_backend as backend

    def broken(gm, refused):
        raise RuntimeError("partitioner bug")

    monkeypatch.setattr(backend, "partition", broken)
    model, x = TopkCumsum().eval(), _distinct(3, 16)
    _fresh()
    with torch.no_grad():
        got, ref = torch.compile(model, backend="superopt")(x), model(x)
    torch.testing.assert_close(got[0], ref[0])
    (graph,) = compiled_graphs()
    (fb,) = graph.report.fallbacks
    assert fb.function == "the whole graph" and "partitioner bug" in fb.reason


def test_user_ops_are_lowered_into_the_graph():
    rownorm = superopt.op("S[i] += X[i,j] * X[i,j]\nY[i,j] = X[i,j] / sqrt(S[i] + 1.0)", name="rownorm_frontdoor")

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return torch.relu(rownorm(self.fc(x)))

    torch.manual_seed(0)
    model, x = M().eval(), torch.randn(5, 6)
    with torch.no_grad():
        ref = model(x)  # (the first call registers torch.ops.superopt.rownorm_frontdoor)
        _fresh()
        torch.testing.assert_close(torch.compile(model, backend="superopt", options={"strict": True})(x), ref,
                                   rtol=1e-4, atol=1e-5)
    (graph,) = compiled_graphs()
    assert "superopt.rownorm_frontdoor" in graph.report.lowered_functions
    _check_graph(import_torch_program(model, (x,)), model, x)
