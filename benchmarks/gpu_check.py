"""The GPU check: tests, a small search on the GPU, torch next to it, a GPU dataset, one JSON file.

    python benchmarks/gpu_check.py [OUT.json] [--budget 8] [--deadline 420] [--binding NAME] [--no-tests] [--quick]
                                   [--in-process] [--collect-seconds 50] [--collect-workloads 24] [--collect-per-workload 6]

On a GPU machine with no network, installing nothing. Parts, each in its own try/except (an error is
recorded and the next part runs; the JSON is rewritten after every part, so a kill loses nothing done):

1. environment: python, torch, nvcc, nvidia-smi, the bindings that import, the device and binding chosen;
2. tests: ``pytest tests/test_gpu_runtime.py tests/test_cuda_codegen.py`` (rc, counts, tail);
3. workloads: capsule votes (P[8,15,15,32,4,4], W[3,3,32,32,4,4]), sgemm 4096^3 and softmax [8192,4096]:
   the GPU default schedule and up to ``budget`` other points of the GPU schedule space (random knob
   assignments of each sketch, legal on the device), built in one nvcc start, each run once and checked
   against torch on the same GPU, then timed with CUDA events; torch's formulations timed the same way
   (capsule: einsum over unfolded windows and unfold + matmul, the best kept; sgemm: torch.matmul =
   cuBLAS with TF32 off; softmax: torch.softmax);
4. dataset: one record per measured variant (workload, sketch, knobs, trace, GPU features, time), also
   written as JSON lines next to the output (``OUT.dataset.jsonl``) and as superopt MeasureRecords
   (``OUT/measurements.jsonl``, the format of ``superopt dataset collect``; target kind ``cuda``);
5. collect: ``superopt dataset collect --target cuda`` itself, for ``--collect-seconds`` (then it stops after
   its batch in flight; the time is reserved from the start): generated GPU workloads (built-in ops,
   light-model kernels when onnx is installed, random index-notation ops), the default and random points
   of their GPU schedule space, verified and timed with CUDA events into ``OUT.collect/measurements.jsonl``
   (a rerun of the same command resumes it); its report goes into the JSON.

Each workload runs in a child process (``--in-process``: not), so a kernel that corrupts the CUDA context
costs only that workload's remaining variants; what it measured before is kept.

``--quick``: tiny shapes (a dry run; with ``--binding emulator`` it runs on a machine without a GPU,
torch on the CPU, and its times mean nothing).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
SGEMM = "C[i,j] += A[i,k] * B[k,j]"
SOFTMAX = "m[i] max= X[i,j]\ne[i,j] = exp(X[i,j] - m[i])\ns[i] += e[i,j]\nY[i,j] = e[i,j] / s[i]"

FULL = {"capsule_votes": {"P": (8, 15, 15, 32, 4, 4), "W": (3, 3, 32, 32, 4, 4)},
        "sgemm_4096": {"A": (4096, 4096), "B": (4096, 4096)},
        "softmax_8192x4096": {"X": (8192, 4096)}}
QUICK = {"capsule_votes": {"P": (2, 9, 9, 8, 4, 4), "W": (3, 3, 8, 8, 4, 4)},
         "sgemm_4096": {"A": (64, 48), "B": (48, 80)},
         "softmax_8192x4096": {"X": (32, 100)}}
TEXT = {"capsule_votes": CAPSULE, "sgemm_4096": SGEMM, "softmax_8192x4096": SOFTMAX}


# points of the GPU space tried before random ones (knob roles; each stage of the sketch gets them)
CURATED = {
    "gpu-tiled": [
        {"blocked": True, "rm": 8, "rn": 8, "tm": 16, "tn": 16},  # 128x128 per block, float4 loads (A packed)
        {"blocked": True, "rm": 8, "rn": 8, "tm": 16, "tn": 16, "shared": True},
        {"blocked": True, "rm": 8, "rn": 8, "tm": 16, "tn": 16, "k_unroll": 4},
        {"blocked": True, "rm": 8, "rn": 4, "tm": 16, "tn": 32},
        {"rm": 8, "rn": 4, "tm": 16, "tn": 32},
        {"blocked": True, "rm": 4, "rn": 4, "tm": 8, "tn": 32},
    ],
    "gpu-rowwise": [{"threads": 512}, {"threads": 1024}, {"threads": 128}],
}


class Check:
    def __init__(self, out: Path, deadline_s: float) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.deadline = deadline_s
        self.records: list = []  # MeasureRecords of every variant
        self.result: dict = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(), "argv": sys.argv[1:],
                             "parts": {}, "dataset": []}

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.t0)

    def write(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.t0, 2)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        os.replace(tmp, self.out)

    def part(self, name: str, fn, *args) -> object:
        t = time.monotonic()
        if self.left() < 5:
            self.result["parts"][name] = {"ok": False, "error": "skipped: out of time"}
            self.write()
            return None
        try:
            value = fn(*args)
            self.result["parts"][name] = {"ok": True, "seconds": round(time.monotonic() - t, 2), **(value or {})}
        except BaseException as e:  # noqa: BLE001 (a part's failure is recorded; the rest still runs)
            if isinstance(e, KeyboardInterrupt):
                raise
            self.result["parts"][name] = {"ok": False, "seconds": round(time.monotonic() - t, 2),
                                          "error": f"{type(e).__name__}: {e}"[:2000],
                                          "traceback": traceback.format_exc()[-4000:]}
            value = None
        print(f"[gpu_check] {name}: {'ok' if self.result['parts'][name]['ok'] else 'FAILED'} "
              f"({time.monotonic() - t:.1f}s, {self.left():.0f}s left)", flush=True)
        self.write()
        return value


def _run(cmd: list[str], timeout: float) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"


def environment(binding: str | None) -> dict:
    from superopt.runtime.gpu import gpu_status, require_gpu
    from superopt.target import nvcc_version

    env: dict = {"python": sys.version.split()[0], "platform": platform.platform(), "nvcc": nvcc_version(),
                 "nvidia_smi": _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                     "--format=csv,noheader"], 20).strip(),
                 "importable": {m: importlib.util.find_spec(m) is not None
                                for m in ("pycuda", "cuda", "cupy", "torch", "pytest", "scipy")}}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = bool(torch.cuda.is_available())
        if torch.cuda.is_available():
            env["torch_device"] = torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        env["torch"] = f"unavailable: {e}"
    env["gpu_status"] = gpu_status() if binding is None else None
    dev = require_gpu(binding)
    env["binding"] = dev.binding
    env["device"] = dev.spec.describe()
    env["target"] = dev.target.to_dict()
    env["target_key"] = dev.target.key()
    return env


def run_tests(timeout: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:warnings", "-p", "no:cacheprovider", "-rs",
           "tests/test_gpu_runtime.py", "tests/test_cuda_codegen.py"]
    t = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"rc": None, "error": f"timed out after {timeout:.0f}s", "tail": out[-3000:]}
    tail = (res.stdout + res.stderr)[-4000:]
    summary = next((ln for ln in reversed(res.stdout.splitlines()) if " passed" in ln or " failed" in ln
                    or " skipped" in ln or " error" in ln), "")
    if res.returncode != 0:
        raise RuntimeError(f"pytest rc {res.returncode}: {summary}\n{tail}")
    return {"rc": res.returncode, "summary": summary, "seconds": round(time.monotonic() - t, 1), "tail": tail}


# ---- workloads ----------------------------------------------------------------------------------------------

def _torch_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _time_torch(fn, repeat: int = 20, warmup: int = 3) -> dict:
    import torch

    if not torch.cuda.is_available():
        ts = []
        for i in range(warmup + repeat):
            t = time.perf_counter()
            fn()
            if i >= warmup:
                ts.append((time.perf_counter() - t) * 1e3)
        return {"median_ms": float(np.median(ts)), "min_ms": float(min(ts)), "repeat": repeat, "clock": "wall"}
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return {"median_ms": float(np.median(ts)), "min_ms": float(min(ts)), "repeat": repeat, "clock": "cuda events"}


def torch_formulations(name: str, arrays: dict[str, np.ndarray]):
    """name -> (reference output as numpy, {formulation: callable on the device})."""
    import torch

    dev = _torch_device()
    t = {k: torch.from_numpy(v).to(dev) for k, v in arrays.items()}
    if name == "capsule_votes":
        P, W = t["P"], t["W"]
        kh, kw = W.shape[0], W.shape[1]

        def einsum():
            win = P.unfold(1, kh, 2).unfold(2, kw, 2)  # n, y, x, i, p, r, kh, kw
            return torch.einsum("nyxiprhw,hwiorq->nyxopq", win, W)

        def unfold_matmul():
            win = P.unfold(1, kh, 2).unfold(2, kw, 2)  # n, y, x, i, p, r, kh, kw
            n, y, x, i, p, r = win.shape[:6]
            rows = win.permute(0, 1, 2, 4, 6, 7, 3, 5).reshape(n * y * x * p, kh * kw * i * r)
            cols = W.permute(0, 1, 2, 4, 3, 5).reshape(kh * kw * i * r, -1)  # (kh kw i r) x (o q)
            out = (rows @ cols).reshape(n, y, x, p, W.shape[3], W.shape[5])
            return out.permute(0, 1, 2, 4, 3, 5).contiguous()

        forms = {"einsum": einsum, "unfold_matmul": unfold_matmul}
    elif name == "sgemm_4096":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 cuBLAS (no TF32 tensor cores): the same arithmetic
        A, B = t["A"], t["B"]
        forms = {"torch.matmul (cuBLAS)": lambda: torch.matmul(A, B)}
    else:
        X = t["X"]
        forms = {"torch.softmax": lambda: torch.softmax(X, dim=-1)}
    ref = next(iter(forms.values()))().float().cpu().numpy().astype(np.float64)
    for k, f in forms.items():  # every formulation agrees with the first
        other = f().float().cpu().numpy()
        if not np.allclose(other, ref, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(ref).max()))):
            raise AssertionError(f"torch formulation {k} disagrees with the first")
    return ref, forms


def space_points(compute, target, budget: int, seed: int) -> list[tuple[str, dict, list]]:
    """The default GPU schedule then up to ``budget`` distinct legal random points of the GPU sketches."""
    from superopt.schedule.gpu_default import build_gpu_sketch, gpu_sketch_names
    from superopt.schedule.knobs import KnobRecorder
    from superopt.schedule.plan import ScheduleError, lower
    from superopt.schedule.primitives import trace_to_json

    consts = frozenset(compute.inputs)
    rng = random.Random(seed)
    out, seen = [], set()
    domains = {}

    def add(sk: str, knobs: dict) -> KnobRecorder | None:
        """Build and check the point; keep it when legal and new. Returns its recorder (None: illegal)."""
        kn = KnobRecorder(knobs)
        try:
            trace = build_gpu_sketch(compute, target, consts, sk, kn)
            lower(compute, trace, target)
        except (ScheduleError, ValueError, KeyError):
            return None
        key = trace_to_json(trace)
        if key not in seen:
            seen.add(key)
            out.append((sk, knobs, trace))
        return kn

    for sk in gpu_sketch_names(compute, target):
        kn = add(sk, {})
        if kn is not None:
            domains[sk] = kn.domains
    for sk, dom in domains.items():  # the tiled sketch's strong candidates first, then random points
        stages = sorted({k.split(".")[0] for k in dom})
        for roles in CURATED.get(sk, []):
            if len(out) >= budget + 1:
                break
            add(sk, {f"{st}.{r}": v for st in stages for r, v in roles.items() if f"{st}.{r}" in dom})
    tries = 0
    while len(out) < budget + 1 and tries < 60 * max(budget, 1) and domains:
        tries += 1
        sk = rng.choice(list(domains))
        add(sk, {k: rng.choice(list(v)) for k, v in domains[sk].items()})
    return out


def run_workload(check: Check, name: str, shapes: dict, budget: int, binding: str | None, seed: int) -> dict:
    from costmodel.cuda_features import gpu_features
    from superopt.ir.flops import flop_count
    from superopt.lang import compile_op
    from superopt.runtime.gpu import require_gpu
    from superopt.runtime.gpu.kernel import build_gpu_kernels_each
    from superopt.schedule.plan import lower
    from superopt.schedule.primitives import trace_to_json

    dev = require_gpu(binding)
    target = dev.target
    compute = compile_op(TEXT[name], shapes)
    rng = np.random.default_rng(seed)
    arrays = {i: rng.standard_normal(compute.type_of[i].shape).astype(np.float32) for i in compute.inputs}
    if name == "capsule_votes":
        arrays["W"] *= np.float32(1.0 / math.sqrt(9 * shapes["W"][2] * shapes["W"][4]))
    flops = flop_count(compute)
    report: dict = {"workload": TEXT[name], "shapes": {k: list(v) for k, v in shapes.items()}, "flops": flops,
                    "binding": dev.binding, "torch": {}, "variants": []}
    check.result["report"] = report  # (a child process writes its partial report after every variant)
    try:
        ref, forms = torch_formulations(name, arrays)
    except Exception as e:  # noqa: BLE001 (no torch on the device: check against the reference interpreter instead)
        report["torch_error"] = f"{type(e).__name__}: {e}"[:1000]
        from superopt.interp import evaluate_compute

        ref, forms = evaluate_compute(compute, [arrays[i] for i in compute.inputs], np.float64)[0], {}
    for k, f in forms.items():
        t = _time_torch(f)
        report["torch"][k] = {**t, "gflops": flops / t["median_ms"] / 1e6}
    if report["torch"]:
        best_torch = min(report["torch"].items(), key=lambda kv: kv[1]["median_ms"])
        report["torch_best"] = {"formulation": best_torch[0], **best_torch[1]}
    check.write()
    points = space_points(compute, target, budget, seed)
    report["space_points"] = len(points)
    t = time.monotonic()
    kernels, batch_error = build_gpu_kernels_each([(compute, tr) for _, _, tr in points], dev)
    if batch_error is not None:  # one bad kernel did not cost the others: they were built one by one
        report["batch_build_error"] = batch_error[:1000]
    report["build_seconds"] = round(time.monotonic() - t, 2)
    inputs = [arrays[i] for i in compute.inputs]
    scale = max(1.0, float(np.abs(ref).max()))
    for (sk, knobs, trace), k in zip(points, kernels):
        rec: dict = {"workload": name, "sketch": sk, "knobs": knobs, "trace": trace_to_json(trace),
                     "target_key": target.key(), "binding": dev.binding}
        try:
            if isinstance(k, Exception):
                raise k
            plan = lower(compute, trace, target)
            rec["features"] = gpu_features(plan, k.source, target)
            rec["launches"] = [[ln.kernel, list(ln.grid), list(ln.block)] for ln in k.source.launches]
            if check.left() < 20:
                raise TimeoutError("out of time before this variant")
            t0 = time.monotonic()
            (got,) = k(*inputs)
            once = time.monotonic() - t0
            err = float(np.abs(got.astype(np.float64) - ref).max())
            rec["max_abs_error"] = err
            rec["correct"] = bool(err <= 1e-3 * scale and np.isfinite(got).all())
            if rec["correct"]:
                tm = k.time(repeat=3 if once > 0.3 else 10, warmup=1)
                rec.update(tm)
                rec["gflops"] = flops / tm["median_ms"] / 1e6
                if "torch_best" in report:
                    rec["vs_torch_best"] = report["torch_best"]["median_ms"] / tm["median_ms"]
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {e}"[:1000]
        report["variants"].append(rec)
        check.result["dataset"].append(rec)
        check.records.append(_measure_record(compute, trace, target, rec).to_json())
        check.result["records"] = check.records
        check.write()
    ok = [v for v in report["variants"] if v.get("correct") and "median_ms" in v]
    if ok:
        best = min(ok, key=lambda v: v["median_ms"])
        report["best"] = {k: best.get(k) for k in ("sketch", "knobs", "median_ms", "gflops", "vs_torch_best", "trace")}
        report["default"] = {k: report["variants"][0].get(k) for k in ("median_ms", "gflops", "vs_torch_best")}
    report["correct_variants"] = len(ok)
    del kernels
    return report


def run_isolated(check: Check, name: str, args) -> dict:
    """One workload in a child process: a kernel that corrupts the CUDA context (an illegal address) costs
    that workload's remaining variants only. The child rewrites its partial report after every variant."""
    part = Path(str(check.out) + f".{name}.part.json")
    part.unlink(missing_ok=True)
    left = max(10.0, check.left() - 5)
    cmd = [sys.executable, str(Path(__file__).resolve()), str(part), "--child", name, "--budget", str(args.budget),
           "--deadline", str(left), "--seed", str(args.seed)] + (["--quick"] if args.quick else []) + \
        (["--binding", args.binding] if args.binding else [])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=left + 5, cwd=REPO)
        rc, tail = res.returncode, (res.stdout + res.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = None, f"timed out after {left:.0f}s: {str(e.stderr or '')[-2000:]}"
    data = json.loads(part.read_text()) if part.exists() else {}
    part.unlink(missing_ok=True)
    check.result["dataset"] += data.get("dataset", [])
    check.records += data.get("records", [])
    report = data.get("report") or {}
    if rc != 0 or not data.get("done"):
        if not report:
            last = tail.strip().splitlines()[-1] if tail.strip() else ""
            raise RuntimeError(f"workload process exited with {rc}: {last}\n{tail}")
        report["child_error"] = {"rc": rc, "tail": tail}  # what it measured before it died is kept
    return report


def _measure_record(compute, trace, target, rec: dict):
    """The variant as a MeasureRecord (the format of ``superopt dataset collect``), for the cost model's tools."""
    from superopt.ir.canonical import workload_key
    from superopt.measure.records import MeasureRecord

    err = rec.get("error", "")
    code = ("OK" if rec.get("correct") and "median_ms" in rec else "WRONG_ANSWER" if rec.get("correct") is False
            else "TIMEOUT" if err.startswith("TimeoutError") else "COMPILE_ERROR" if "Nvcc" in err else "RUNTIME_ERROR")
    med = rec.get("median_ms")
    return MeasureRecord(str(compute), compute.digest(), tuple(trace), target.to_dict(), code, err,
                         times_s=() if med is None else (med / 1e3,), median_s=None if med is None else med / 1e3,
                         constant_inputs=(), workload_key=workload_key(compute))


def collect_dataset(out_dir: Path, binding: str | None, seconds: float, workloads: int, per_workload: int,
                    limit_s: float) -> dict:
    """``superopt dataset collect --target cuda`` for about ``seconds`` (killed with its workers, process group
    and all, at ``limit_s``): the report it prints, the command and what the records file holds."""
    import signal

    models = "squeezenet,resnet50" if importlib.util.find_spec("onnx") is not None else ""
    cmd = [sys.executable, "-m", "superopt.cli_dataset", "dataset", "collect", "--target", "cuda",
           "--workloads", str(workloads), "--per-workload", str(per_workload), "--out", str(out_dir),
           "--max-seconds", str(seconds), "--batch-size", "8", "--models", models, "--json", "--no-progress"]
    if binding:
        cmd += ["--gpu-binding", binding]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=limit_s)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its measurement workers
        stdout, stderr = proc.communicate()
        killed = True
    out: dict = {"command": " ".join(cmd[1:]), "rc": proc.returncode, "killed_at_s": limit_s if killed else None,
                 "dir": str(out_dir)}
    try:
        out["report"] = json.loads(stdout)
    except ValueError:
        out["stderr_tail"] = (stderr or "")[-3000:]
    from superopt.measure.records import load_records, records_path

    path = records_path(out_dir)
    recs = load_records(path) if path.exists() else []
    out["records_in_file"] = len(recs)
    out["ok_records"] = sum(r.error_code == "OK" for r in recs)
    out["workloads_in_file"] = len({r.workload_key for r in recs})
    if proc.returncode != 0 and not recs:
        last = (stderr or "").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"dataset collect exited with {proc.returncode}: {last[0]}")
    return out


def summarize(result: dict) -> dict:
    parts = result["parts"]
    out = {}
    for name, goal in (("capsule_votes", ("vs torch best", 1.0)), ("sgemm_4096", ("vs cuBLAS", 0.5)),
                       ("softmax_8192x4096", ("vs torch.softmax", None))):
        p = parts.get(f"workload:{name}") or {}
        best = p.get("best")
        if not best:
            out[name] = {"measured": False, "error": p.get("error")}
            continue
        if "torch_best" not in p:
            out[name] = {"measured": True, "superopt_ms": best["median_ms"], "torch": p.get("torch_error")}
            continue
        out[name] = {"measured": True, "superopt_ms": best["median_ms"], "torch_ms": p["torch_best"]["median_ms"],
                     "torch_formulation": p["torch_best"]["formulation"], "ratio": best["vs_torch_best"],
                     "ratio_meaning": goal[0] + " (torch time / superopt time; >1 is faster than torch)",
                     "goal": goal[1], "goal_met": None if goal[1] is None else best["vs_torch_best"] >= goal[1]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(REPO / "benchmarks" / "results" / "gpu_check.json"))
    ap.add_argument("--budget", type=int, default=8, help="schedule variants per workload besides the default")
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds for the whole check")
    ap.add_argument("--tests-timeout", type=float, default=200.0)
    ap.add_argument("--binding", default=None, help="pycuda | cuda-bindings | cupy | emulator (default: automatic)")
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a dry run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one workload, in a process of its own
    ap.add_argument("--in-process", action="store_true", help="run the workloads in this process (no isolation)")
    ap.add_argument("--collect-seconds", type=float, default=50.0,
                    help="superopt dataset collect --target cuda for this long (0: skip); reserved from the start")
    ap.add_argument("--collect-workloads", type=int, default=24)
    ap.add_argument("--collect-per-workload", type=int, default=6)
    args = ap.parse_args(argv)
    if args.child:
        check = Check(Path(args.out), args.deadline)
        shapes = QUICK if args.quick else FULL
        run_workload(check, args.child, shapes[args.child], args.budget, args.binding, args.seed)
        check.result["done"] = True
        check.write()
        return 0
    reserve = args.collect_seconds + 45 if args.collect_seconds > 0 else 0.0  # the collection's time, kept aside
    check = Check(Path(args.out), args.deadline - reserve)
    check.result["config"] = vars(args)
    check.part("environment", environment, args.binding)
    if not args.no_tests:
        check.part("tests", run_tests, min(args.tests_timeout, max(check.left() - 240, 30)))
    shapes = QUICK if args.quick else FULL
    for name in ("capsule_votes", "sgemm_4096", "softmax_8192x4096"):
        if args.in_process:
            check.part(f"workload:{name}", run_workload, check, name, shapes[name], args.budget, args.binding,
                       args.seed)
        else:
            check.part(f"workload:{name}", run_isolated, check, name, args)
    check.result["summary"] = summarize(check.result)
    check.write()
    if args.collect_seconds > 0:
        check.deadline += reserve
        out_dir = Path(args.out).with_suffix(".collect")
        check.part("collect", collect_dataset, out_dir, args.binding, args.collect_seconds,
                   args.collect_workloads, args.collect_per_workload, max(10.0, check.left() - 5))
    ds = Path(args.out).with_suffix(".dataset.jsonl")
    try:
        ds.write_text("".join(json.dumps(r, default=str) + "\n" for r in check.result["dataset"]))
        mdir = Path(args.out).with_suffix("")  # <out>/measurements.jsonl: superopt's dataset format
        mdir.mkdir(parents=True, exist_ok=True)
        (mdir / "measurements.jsonl").write_text("".join(line + "\n" for line in check.records))
        check.result["measure_records"] = str(mdir / "measurements.jsonl")
    except Exception as e:  # noqa: BLE001
        check.result["dataset_file_error"] = f"{type(e).__name__}: {e}"
    check.result["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    check.write()
    print(json.dumps(check.result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
