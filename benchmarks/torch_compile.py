"""torch.compile backends side by side: superopt vs Inductor (torch.compile's default) vs eager PyTorch.

    python benchmarks/torch_compile.py [--threads 2] [--quick] [--models encoder,resnet]

Two models, inference under ``torch.no_grad()``: a transformer encoder layer (``nn.TransformerEncoderLayer``,
batch-first, with a causal mask) and a ResNet-style convnet (a stem and three of the tests' BasicBlocks,
``tests/test_torch_modules.py``). Each is compiled with ``backend="superopt"`` (no tuning database: default
schedules, the shipped cost model's zero-measurement picks) and with Inductor; both are checked against eager
before timing, then the three are timed in alternation (medians). Prints the table and the superopt/Inductor
ratio, and writes ``benchmarks/results/torch_compile.md`` and ``.json`` (not with ``--quick``, a sanity run
on small shapes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO / "tests"), str(REPO)):  # the root first: this folder's search.py would hide the search package
    if sys.path[0] != p:
        sys.path.insert(0, p)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.machine import describe_machine, machine_line  # noqa: E402
from benchmarks.timing import FULL, QUICK, time_alternating  # noqa: E402

RESULTS = Path(__file__).parent / "results"


class ResNetStyle(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        from test_torch_modules import BasicBlock

        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(width, width), BasicBlock(width, 2 * width), BasicBlock(2 * width, 4 * width))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


class Encoder(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)

    def forward(self, x, mask):
        return self.layer(x, src_mask=mask)


def workloads(quick: bool) -> dict[str, tuple[nn.Module, tuple]]:
    torch.manual_seed(0)
    seq, d, batch, hw = (16, 64, 2, 16) if quick else (64, 256, 8, 32)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    resnet = ResNetStyle(16 if quick else 32).eval()
    for m in resnet.modules():  # non-trivial batch-norm statistics
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return {"encoder": (Encoder(d, 4, 4 * d).eval(), (torch.randn(batch, seq, d), mask)),
            "resnet": (resnet, (torch.randn(batch, 3, hw, hw),))}


def compare(name: str, model: nn.Module, inputs: tuple, quick: bool) -> dict:
    from superopt.frontends.torch_backend import clear_compiled, compiled_graphs

    torch._dynamo.reset()
    clear_compiled()
    with torch.no_grad():
        ref = model(*inputs)
        t0 = time.perf_counter()
        so = torch.compile(model, backend="superopt")
        got = so(*inputs)
        t_so = time.perf_counter() - t0
        t0 = time.perf_counter()
        ind = torch.compile(model)
        got_ind = ind(*inputs)
        t_ind = time.perf_counter() - t0
    err = float((got - ref).abs().max())
    err_ind = float((got_ind - ref).abs().max())
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
    reports = [g.report for g in compiled_graphs()]
    fallbacks = sorted({f.function for r in reports for f in r.fallbacks})

    def run(fn):
        def call():
            with torch.no_grad():
                fn(*inputs)
        return call

    times = time_alternating({"superopt": run(so), "inductor": run(ind), "eager": run(model)}, QUICK if quick else FULL)
    med = {k: v.median_s for k, v in times.items()}
    return {"model": name, "shapes": [list(t.shape) for t in inputs], "median_ms": {k: v * 1e3 for k, v in med.items()},
            "inductor_over_superopt": med["inductor"] / med["superopt"], "eager_over_superopt": med["eager"] / med["superopt"],
            "compile_s": {"superopt": t_so, "inductor": t_ind}, "max_abs_err": {"superopt": err, "inductor": err_ind},
            "fallbacks": fallbacks, "graphs": len(reports)}


def markdown(rows: list[dict], threads: int) -> str:
    lines = [f"# torch.compile backends ({threads} threads, inference, medians of alternating samples)", "",
             machine_line(describe_machine(threads)), "",
             "| model | eager ms | Inductor ms | superopt ms | superopt speed vs Inductor | vs eager | fallbacks |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median_ms"]
        lines.append(f"| {r['model']} {r['shapes']} | {m['eager']:.3f} | {m['inductor']:.3f} | {m['superopt']:.3f} | "
                     f"{r['inductor_over_superopt']:.2f}x | {r['eager_over_superopt']:.2f}x | "
                     f"{', '.join(r['fallbacks']) or 'none'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small shapes, short timing, nothing written")
    ap.add_argument("--models", default="encoder,resnet")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, (model, inputs) in workloads(args.quick).items():
        if name not in args.models.split(","):
            continue
        row = compare(name, model, inputs, args.quick)
        rows.append(row)
        print(f"{name}: eager {row['median_ms']['eager']:.3f} ms, inductor {row['median_ms']['inductor']:.3f} ms, "
              f"superopt {row['median_ms']['superopt']:.3f} ms -> superopt is {row['inductor_over_superopt']:.2f}x "
              f"Inductor's speed; fallbacks: {row['fallbacks'] or 'none'}", flush=True)
    md = markdown(rows, args.threads)
    print(md)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "torch_compile.md").write_text(md)
        (RESULTS / "torch_compile.json").write_text(json.dumps({"machine": describe_machine(args.threads), "models": rows},
                                                               indent=2))


if __name__ == "__main__":
    main()
