"""The C compiler's CPU time on a cold compile of the light models of the onnx wheel, summed over the
translation units, beside another checkout's (the before of a change).

    python benchmarks/gcc_time.py [model ...] [--baseline CHECKOUT] [--rounds 2] [--out benchmarks/results]

For each model and checkout, a fresh process runs ``superopt.optimize`` with an empty kernel cache and keeps
the translation units its library builds asked for (``compiler.object_units`` and the merged kernels' bodies);
then each unit is compiled alone, one at a time, with the flags ``compile_library`` gives it
(``CompilerConfig.flags`` and the target's), and the compiler processes' user + system CPU seconds are summed
(``RUSAGE_CHILDREN``): on a loaded machine the CPU time moves far less than the wall time. The two checkouts'
unit sets are compiled in alternating blocks, ``--rounds`` times, and the medians are reported with their
ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (run in a fresh process with the checkout on the path: argv = model path, units directory, cache directory)
_CHILD = r"""
import sys
from pathlib import Path
import superopt.runtime.compiler as compiler
from search.graph.cost import Ceilings
from superopt.api import OptimizeConfig, optimize

model, out, cache = sys.argv[1:4]
config = compiler.CompilerConfig(cache_dir=Path(cache), timeout_s=900.0)
opt = OptimizeConfig(threads=2, compiler=config)
Ceilings.measured(opt.resolved_target(), config)  # (measured once per machine: not the model's compile)
units = {}
plain = compiler.object_units
merge = getattr(compiler, "merge_sources", None)  # (a checkout from before kernels were merged has none)

def kept(sources):
    got = plain(sources)
    for unit, _ in got:
        units.setdefault(unit, None)
    return got

def merged(sources, *args):  # (the merged bodies are units of their own, outside object_units)
    bodies, wrapped = merge(sources, *args)
    for body in bodies:
        units.setdefault(compiler.PRELUDE + "\n" + body, None)
    return bodies, wrapped

compiler.object_units = kept
if merge is not None:
    compiler.merge_sources = merged
optimize(model, opt)
flags = [*config.flags, *opt.resolved_target().compile_flags()]
for k, unit in enumerate(units):
    (Path(out) / f"unit{k:04d}.c").write_text(unit)
(Path(out) / "flags.txt").write_text("\n".join([config.cc, *flags]))
"""


def dump_units(code: Path, model: Path, out: Path) -> None:
    """The translation units a cold ``optimize`` of ``model`` with ``code``'s superopt compiles, into ``out``."""
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="superopt-gcc-time-") as cache:
        env = dict(os.environ, PYTHONPATH=str(code))
        subprocess.run([sys.executable, "-c", _CHILD, str(model), str(out), cache], env=env, cwd=code, check=True,
                       capture_output=True, text=True)


def compile_seconds(units: Path) -> float:
    """The compiler's CPU seconds (user + system, its child processes included) over every unit of ``units``."""
    cc, *flags = (units / "flags.txt").read_text().split("\n")
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for src in sorted(units.glob("unit*.c")):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([cc, *flags, "-c", str(src), "-o", str(Path(tmp) / "unit.o")], check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            total += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return total


def render(result: dict) -> str:
    lines = ["# The C compiler's CPU time on a cold compile: the light models of the onnx wheel", "",
             f"CPU: {result['cpu']}; gcc: {result['compiler']}. The translation units of a cold `superopt.optimize` "
             "(empty kernel cache), each compiled alone with the library's flags, their compiler processes' user + "
             f"system CPU seconds summed; before and after compiled in alternating blocks, median of "
             f"{result['rounds']} round(s). Before: {result['baseline_name']}; after: {result['code_name']}.", "",
             "| model | units before | units after | gcc CPU before (s) | gcc CPU after (s) | after / before |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in result["models"].items():
        lines.append(f"| {name} | {r['units_before']} | {r['units_after']} | {r['before_s']:.2f} | {r['after_s']:.2f} "
                     f"| {r['after_s'] / r['before_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--baseline", required=True, help="the checkout measured as the before")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--name", default="gcc_time")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import onnx

    from benchmarks.machine import cpu_model, write_result
    from superopt.frontends.light_models import LIGHT_MODELS, randomized_light_model
    from superopt.target import compiler_version

    baseline = Path(args.baseline).resolve()
    result: dict = {"cpu": cpu_model(), "compiler": compiler_version("gcc"), "rounds": args.rounds,
                    "code_name": "this checkout", "baseline_name": "the --baseline checkout", "models": {}}
    with tempfile.TemporaryDirectory(prefix="superopt-gcc-time-") as tmp:
        root = Path(tmp)
        for name in args.models or list(LIGHT_MODELS):
            path = root / f"{name}.onnx"
            onnx.save(randomized_light_model(name), str(path))
            sets = {"before": root / f"{name}-before", "after": root / f"{name}-after"}
            dump_units(baseline, path, sets["before"])
            dump_units(REPO, path, sets["after"])
            times: dict[str, list[float]] = {"before": [], "after": []}
            for rnd in range(args.rounds):  # (the blocks alternate: each round starts with the other one)
                for key in (("before", "after") if rnd % 2 == 0 else ("after", "before")):
                    times[key].append(compile_seconds(sets[key]))
            r = {"before_s": statistics.median(times["before"]), "after_s": statistics.median(times["after"]),
                 "rounds_s": times, "units_before": len(list(sets["before"].glob("unit*.c"))),
                 "units_after": len(list(sets["after"].glob("unit*.c")))}
            result["models"][name] = r
            print(f"{name:14s} gcc CPU {r['before_s']:6.2f} s -> {r['after_s']:6.2f} s "
                  f"({r['after_s'] / r['before_s']:.2f})", flush=True)
            write_result(args.out, args.name, result, render(result))
            path.unlink()
    print(render(result))


if __name__ == "__main__":
    main()
