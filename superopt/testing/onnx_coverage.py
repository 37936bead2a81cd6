"""How many ONNX node tests of plain element types superopt passes, and why the others fail.

``python -m superopt.testing.onnx_coverage [--mode compiled|reference] [-j N] [--only REGEX] [--json out.json]``

Runs every node test of ``onnx.backend.test`` (the test cases the installed onnx generates) whose graph
inputs and outputs are all tensors of float32, float64, int32, int64 or bool, through
:mod:`superopt.backend` exactly as ``onnx.backend.test.BackendTest`` does (prepare, run every data set,
compare with the test's rtol/atol), each in a worker process with a time limit. It prints the pass
count and the failures grouped by op type and by a short reason. It ignores the suite's exclusion list:
this is the whole picture, not the CI selection.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass

PLAIN = {"float32", "float64", "int32", "int64", "bool"}


@dataclass
class Outcome:
    name: str
    ops: str  # op types of the test's nodes, joined by "+"
    opset: int
    ok: bool
    reason: str  # "" when ok
    seconds: float


def _plain(model) -> bool:
    import onnx

    names = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
             onnx.TensorProto.BOOL}
    g = model.graph
    return all(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in names for v in [*g.input, *g.output])


def plain_node_tests(only: str | None = None) -> list:
    """The node test cases with plain element types (optionally those whose name matches ``only``)."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    pat = re.compile(only) if only else None
    return [t for t in cases if _plain(t.model) and (pat is None or pat.search(t.name))]


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _short(err: BaseException) -> str:
    """A one-line reason with the test-specific details (numbers, names) blurred, for grouping."""
    text = str(err).strip().splitlines()
    first = next((ln for ln in text if ln.strip()), "")
    if isinstance(err, AssertionError):
        if "Mismatched elements" in str(err) or "Not equal to tolerance" in str(err):
            return "AssertionError: wrong values"
        if "incorrect shape" in str(err) or "shapes" in str(err):
            return "AssertionError: wrong shape"
        if "dtype" in str(err) or "Items are not equal" in str(err):
            return "AssertionError: wrong dtype or count"
    first = re.sub(r"""(at )?node ("[^"]*"|'[^']*'|\S+)""", "", first)
    first = re.sub(r"unsupported ONNX op '(\w+)'", r"unsupported ONNX op \1", first)
    first = re.sub(r"'[^']*'", "'?'", first)
    first = re.sub(r"\(\d+(, \d+)*,?\)|\[\d+(, \d+)*\]", "(shape)", first)
    first = re.sub(r"\d+(\.\d+)?", "#", first)
    return f"{type(err).__name__}: {first[:160]}"


class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise _Timeout("timed out")


def run_one(case, mode: str, timeout: float) -> Outcome:
    """Run one node test the way BackendTest does; never raises."""
    import numpy as np
    from onnx.backend.test.runner import Runner, _normalize_tensor

    import superopt.backend as backend

    ops = "+".join(sorted({n.op_type for n in case.model.graph.node}))
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = backend.prepare(case.model, "CPU", mode=mode)
            for inputs, refs in case.data_sets:
                outs = rep.run([_normalize_tensor(x) for x in inputs])
                Runner.assert_similar_outputs([_normalize_tensor(r) for r in refs], outs, case.rtol, case.atol)
        ok, reason = True, ""
    except BaseException as err:  # noqa: BLE001  (a survey: every failure is a data point)
        if isinstance(err, KeyboardInterrupt):
            raise
        ok, reason = False, _short(err)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return Outcome(case.name, ops, _opset(case.model), ok, reason, time.perf_counter() - t0)


def _serve() -> None:
    """Worker loop: a test name per stdin line, an Outcome as one JSON line on stdout."""
    mode, timeout, only = sys.argv[2], float(sys.argv[3]), (sys.argv[4] or None)
    cases = {t.name: t for t in plain_node_tests(only)}
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the code under test prints stays out of the protocol
    for line in sys.stdin:
        o = run_one(cases[line.strip()], mode, timeout)
        out.write(json.dumps(asdict(o)) + "\n")
        out.flush()


class _Worker:
    """One worker process; a test that kills it (a crash) or outlives ``timeout`` is a failure, and the
    worker is started afresh."""

    def __init__(self, mode: str, timeout: float, only: str | None) -> None:
        self.args = [sys.executable, "-m", "superopt.testing.onnx_coverage", "--serve", mode, str(timeout), only or ""]
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    def run(self, name: str, ops: str, opset: int) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
        t0 = time.perf_counter()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout + 60.0)  # + start-up time
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return Outcome(**json.loads(line))
        reason = "worker timed out" if not ready else f"worker crashed (exit {self.proc.poll()})"
        self.close()
        return Outcome(name, ops, opset, False, reason, time.perf_counter() - t0)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def survey(mode: str = "compiled", jobs: int = 2, timeout: float = 120.0, only: str | None = None) -> list[Outcome]:
    cases = plain_node_tests(only)
    todo = list(reversed(cases))
    results: dict[str, Outcome] = {}
    lock = threading.Lock()

    def drive() -> None:
        w = _Worker(mode, timeout, only)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    t = todo.pop()
                ops = "+".join(sorted({n.op_type for n in t.model.graph.node}))
                results[t.name] = w.run(t.name, ops, _opset(t.model))
        finally:
            w.close()

    threads = [threading.Thread(target=drive) for _ in range(max(1, jobs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [results[t.name] for t in cases]


def summarize(outcomes: list[Outcome]) -> str:
    n_ok = sum(o.ok for o in outcomes)
    lines = [f"passed {n_ok} / {len(outcomes)} ({100.0 * n_ok / max(len(outcomes), 1):.1f}%)"]
    by_reason = collections.Counter(o.reason for o in outcomes if not o.ok)
    lines.append("\nfailures by reason:")
    lines += [f"  {k:4d}  {r}" for r, k in by_reason.most_common()]
    by_op: dict[str, list[Outcome]] = collections.defaultdict(list)
    for o in outcomes:
        if not o.ok:
            by_op[o.ops].append(o)
    lines.append("\nfailures by op:")
    for op, fails in sorted(by_op.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        reasons = collections.Counter(f.reason for f in fails).most_common(2)
        lines.append(f"  {len(fails):4d}  {op}: " + " | ".join(f"{k}x {r}" for r, k in reasons))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if (argv or sys.argv[1:])[:1] == ["--serve"]:
        _serve()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="compiled", choices=["compiled", "reference"])
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per test")
    ap.add_argument("--only", default=None, help="regex over test names")
    ap.add_argument("--json", default=None, help="write every outcome here")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every failing test")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    outcomes = survey(a.mode, a.jobs, a.timeout, a.only)
    print(summarize(outcomes))
    if a.verbose:
        for o in outcomes:
            if not o.ok:
                print(f"FAIL {o.name} [{o.ops}, opset {o.opset}]: {o.reason}")
    print(f"\n{len(outcomes)} tests in {time.perf_counter() - t0:.0f} s ({a.mode} mode, {a.jobs} jobs)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(o) for o in outcomes], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
