"""``superopt dataset collect``: measure schedules of many workloads into a cost-model dataset.

    superopt dataset collect --target cpu --workloads 200 --per-workload 16 --out datasets/cpu-v1
        [--seed S] [--threads T] [--ray auto|ADDRESS] [--ray-workers W] [--json] [--no-progress]
    superopt dataset collect --target cuda --workloads 40 --per-workload 8 --out datasets/cuda-v1
        [--gpu-binding auto|pycuda|cuda-bindings|cupy|emulator] [--max-seconds S] ...

``--target cuda`` measures on this machine's GPU (device 0, through the binding named or the first
that works); without one it fails with one line naming the missing piece (driver, device, binding,
nvcc). ``--gpu-binding emulator`` runs the whole GPU path on the CPU (tiny workloads; its times mean
nothing: for dry runs and tests).

:func:`register` adds the ``dataset`` command to the ``superopt`` parser; :func:`main` runs it on its
own. A bad argument is one line on stderr and exit status 2; a failure during collection is one line
and exit status 1. ``--json`` prints the report as one JSON document on stdout (logs go to stderr).
Rerunning the same command resumes: what is already recorded is not measured again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, NoReturn

TARGETS = ("cpu", "cuda")
GPU_BINDINGS = ("auto", "pycuda", "cuda-bindings", "cupy", "emulator")


class DatasetUsageError(ValueError):
    """Bad command-line input (exit status 2)."""


class _OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``dataset`` (with its ``collect`` subcommand) to a ``superopt`` subparsers object."""
    d = subparsers.add_parser("dataset", help="collect measurement datasets for the learned cost model",
                              description="superopt dataset collect --target cpu --workloads N --per-workload K "
                                          "--out DIR")
    d.error = _OneLineParser.error.__get__(d)  # the parent's parser class is not ours: errors one line anyway
    sub = d.add_subparsers(dest="dataset_command", metavar="collect", required=True, parser_class=_OneLineParser)
    c = sub.add_parser("collect", help="measure the default and random schedules of generated workloads",
                       description="Measure the default and random schedules of N generated workloads (built-in "
                                   "ops, light ONNX model kernels, random index-notation ops) into DIR/measurements."
                                   "jsonl; a rerun resumes.")
    c.add_argument("--target", required=True, help="what to measure on: cpu (this machine) or cuda (its GPU)")
    c.add_argument("--workloads", required=True, metavar="N", help="number of workloads to generate")
    c.add_argument("--per-workload", required=True, metavar="K", help="schedules to measure per workload")
    c.add_argument("--out", required=True, metavar="DIR", help="dataset directory (e.g. datasets/NAME)")
    c.add_argument("--seed", default="0", help="workload and schedule sampling seed (default 0)")
    c.add_argument("--threads", default="2", help="threads each kernel runs with (default 2)")
    c.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="measure on a Ray cluster ('auto': the running one, or a local one)")
    c.add_argument("--ray-workers", default=None, metavar="W", help="Ray actors (default: cluster CPUs / threads)")
    c.add_argument("--models", default=None, metavar="NAME,..",
                   help="light ONNX models to draw kernels from (default: all of them; '' for none)")
    c.add_argument("--mix", default=None, metavar="SOURCE=W,..",
                   help="workload sources and their weights (default op=0.25,model=0.25,random=0.35,transformer=0.15; "
                        "e.g. transformer=1 for transformer projections only, conv=1 for convs of every kind)")
    c.add_argument("--batch-size", default="16", metavar="B", help="schedules measured and saved at a time")
    c.add_argument("--gpu-binding", default=None, metavar="|".join(GPU_BINDINGS),
                   help="with --target cuda: the GPU binding (default auto: pycuda, cuda-bindings, then CuPy; "
                        "emulator: the CPU stand-in)")
    c.add_argument("--max-seconds", default=None, metavar="S",
                   help="stop after the batch that passes S seconds (a rerun resumes)")
    c.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.set_defaults(fn=cmd_collect)
    return d


def _int(args: argparse.Namespace, name: str, low: int) -> int:
    flag = "--" + name.replace("_", "-")
    text = getattr(args, name)
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise DatasetUsageError(f"bad {flag} {text!r}: expected an integer") from None
    if value < low:
        raise DatasetUsageError(f"bad {flag} {value}: at least {low}")
    return value


def _config(args: argparse.Namespace):
    """The CollectConfig the arguments describe (DatasetUsageError for a bad one)."""
    from costmodel.collect import CollectConfig
    from superopt.target import host_target

    if args.target not in TARGETS:
        raise DatasetUsageError(f"bad --target {args.target!r}: only {' and '.join(TARGETS)} are supported")
    if args.gpu_binding is not None and args.target != "cuda":
        raise DatasetUsageError("--gpu-binding goes with --target cuda")
    if args.gpu_binding is not None and args.gpu_binding not in GPU_BINDINGS:
        raise DatasetUsageError(f"bad --gpu-binding {args.gpu_binding!r}: give one of {', '.join(GPU_BINDINGS)}")
    if args.target == "cuda" and args.ray is not None:
        raise DatasetUsageError("--ray goes with --target cpu (GPU collection measures on this machine's GPU)")
    max_seconds = None
    if args.max_seconds is not None:
        try:
            max_seconds = float(args.max_seconds)
        except ValueError:
            raise DatasetUsageError(f"bad --max-seconds {args.max_seconds!r}: expected a number") from None
        if not max_seconds > 0:
            raise DatasetUsageError(f"bad --max-seconds {args.max_seconds}: must be positive")
    workloads = _int(args, "workloads", 1)
    per_workload = _int(args, "per_workload", 1)
    seed = _int(args, "seed", 0)
    threads = _int(args, "threads", 1)
    batch_size = _int(args, "batch_size", 1)
    ray_workers = _int(args, "ray_workers", 1) if args.ray_workers is not None else None
    if args.ray is not None and not args.ray.strip():
        raise DatasetUsageError("bad --ray '': give 'auto' or a Ray address (host:port, ray://host:port)")
    if ray_workers is not None and args.ray is None:
        raise DatasetUsageError("--ray-workers goes with --ray")
    if not args.out.strip():
        raise DatasetUsageError("bad --out '': give a dataset directory")
    models = _models(args.models)
    mix = _mix(args.mix)
    binding = None if args.gpu_binding in (None, "auto") else args.gpu_binding
    target, sizes = host_target(threads), None
    if args.target == "cuda":
        target, sizes = _gpu_target(binding)
    return CollectConfig(workloads=workloads, per_workload=per_workload, seed=seed, out=args.out,
                         target=target, runner=args.ray.strip() if args.ray else "local",
                         ray_workers=ray_workers, progress=not args.no_progress, batch_size=batch_size,
                         models=models, mix=mix, gpu_binding=binding, sizes=sizes, max_seconds=max_seconds)


def _gpu_target(binding: str | None):
    """(the GPU's target, the workload sizes for it); ``GpuUnavailable`` (one line) without a GPU or nvcc."""
    from costmodel.workloads import EMULATOR_SIZES, GPU_SIZES
    from superopt.runtime.gpu import GpuUnavailable, require_gpu
    from superopt.runtime.gpu.nvcc import find_nvcc

    device = require_gpu(binding)
    if binding == "emulator":
        return device.target, EMULATOR_SIZES
    if find_nvcc() is None:
        raise GpuUnavailable("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): the GPU kernels cannot "
                             "be compiled")
    return device.target, GPU_SIZES


def _models(text: str | None) -> tuple[str, ...]:
    from costmodel.workloads import DEFAULT_MODELS

    if text is None:
        return DEFAULT_MODELS
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in DEFAULT_MODELS]
    if unknown:
        raise DatasetUsageError(f"bad --models: unknown model(s) {', '.join(unknown)}; known: {', '.join(DEFAULT_MODELS)}")
    return names


def _mix(text: str | None) -> tuple[tuple[str, float], ...]:
    from costmodel.workloads import DEFAULT_MIX, SOURCES

    if text is None:
        return DEFAULT_MIX
    out = []
    for part in (p.strip() for p in text.split(",")):
        name, eq, weight = part.partition("=")
        name = name.strip()
        if name not in SOURCES:
            raise DatasetUsageError(f"bad --mix {text!r}: unknown source {name!r}; known: {', '.join(SOURCES)}")
        try:
            w = float(weight) if eq else 1.0
        except ValueError:
            raise DatasetUsageError(f"bad --mix {text!r}: weight of {name!r} is not a number") from None
        if not w >= 0:
            raise DatasetUsageError(f"bad --mix {text!r}: weight of {name!r} must be at least 0")
        out.append((name, w))
    if not any(w > 0 for _, w in out):
        raise DatasetUsageError(f"bad --mix {text!r}: give at least one source a positive weight")
    return tuple(out)


def _print_summary(report: dict, out) -> None:
    fails = ", ".join(f"{k} {v}" for k, v in report["failures"].items()) or "none"
    print(f"{report['records_written']} records written to {report['out']} in {report['elapsed_s']:.1f}s "
          f"({report['ok']} OK; failures: {fails}); {report['skipped']} schedules and {report['workloads_done']} of "
          f"{report['workloads']} workloads already recorded; stop: {report['stop_reason']}", file=out)


def cmd_collect(args: argparse.Namespace) -> int:
    """Run ``dataset collect``; returns the exit status (errors are one line on stderr)."""
    from superopt.runtime.gpu import GpuUnavailable

    prog = "superopt dataset collect"
    try:
        config = _config(args)
    except DatasetUsageError as err:
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except GpuUnavailable as err:
        print(f"{prog}: error: --target cuda: no usable GPU: {_one_line(err)}", file=sys.stderr)
        return 1
    from costmodel.collect import collect

    try:
        # with --json, stdout carries the report alone: anything else printed goes to stderr
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            report = collect(config).to_dict()
    except (ValueError, RuntimeError, OSError) as err:
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"target": config.target.to_dict(), "target_key": config.target.key(), **report}, indent=2))
    else:
        _print_summary(report, sys.stdout)
    return 0 if not report["stop_reason"].startswith("interrupted") else 130


def main(argv: list[str] | None = None) -> int:
    """``superopt dataset ...`` on its own (what ``superopt`` runs once ``register`` is wired in)."""
    parser = _OneLineParser(prog="superopt")
    register(parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else 2
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
