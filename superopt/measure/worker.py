"""Measurement worker: a separate process that loads compiled kernels, checks and times them.

Run as ``python -c "from superopt.measure.worker import main; main()"`` (what the service does).
The parent talks to it over stdin/stdout with length-prefixed pickle frames (:func:`send_frame`,
:func:`recv_frame`); the worker moves its own fd 1 onto stderr first, so a kernel that prints
cannot corrupt the protocol. A kernel that
crashes kills only this process, and one that hangs is killed by the parent after its run timeout.

Inputs are prepared as the graph executor prepares them: the task's ``constants`` (graph constants)
are packed once before timing, a run-time input the kernel packs is packed again inside every
timed call (a fresh buffer each time, as ``GraphExecutor`` does), other inputs are passed as copies on a
cache line (as the executor's buffers and constants are).

Protocol: the worker sends ``{"ready": True}`` once imported, then answers each task dict with one
reply dict ``{"code": <ErrorCode name>, "times_s": [...], "msg": str}``.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import struct
import sys
import time
import traceback
from typing import BinaryIO

import numpy as np

_HEADER = struct.Struct("<Q")


def send_frame(f: BinaryIO, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:  # a raw (unbuffered) file may write only part
        n = f.write(view)
        view = view[n if n is not None else 0:]
    f.flush()


def _read_exact(f: BinaryIO, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError("peer closed the pipe")
        buf += chunk
    return bytes(buf)


def recv_frame(f: BinaryIO):
    (n,) = _HEADER.unpack(_read_exact(f, _HEADER.size))
    return pickle.loads(_read_exact(f, n))


def outputs_match(outs, refs, rtol: float, atol: float, magnitudes=None) -> tuple[bool, str]:
    """Compare kernel outputs with float64 reference outputs by the one rule every verifier uses
    (``superopt.interp.tolerance``): floats within ``atol + rtol *`` the magnitude of their terms
    (``magnitudes``, per output, None where unknown: the largest reference magnitude); others exact."""
    from superopt.interp.tolerance import check_outputs

    if len(outs) != len(refs):
        return False, f"{len(outs)} outputs, the reference has {len(refs)}"
    for check in check_outputs([str(k) for k in range(len(refs))], outs, refs, magnitudes, rtol, atol):
        if not check.ok:
            return False, check.message
    return True, ""


def _fresh_outputs(compute) -> list[np.ndarray]:
    outs = []
    for name in compute.outputs:
        t = compute.type_of[name]
        a = np.empty(t.shape, t.np_dtype)
        # poison, so that a kernel that leaves part of its output unwritten is caught
        if np.issubdtype(a.dtype, np.floating):
            a.fill(np.nan)
        elif a.dtype == np.bool_:
            a.fill(True)
        else:
            a.fill(np.iinfo(a.dtype).min // 3)
        outs.append(a)
    return outs


def time_kernel(run, warmup: int, min_repeat_s: float, repeats: int) -> list[float]:
    """Warm up, pick a call count per repeat so one repeat lasts ``min_repeat_s``, time ``repeats``.

    Returns seconds per call for each repeat.
    """
    for _ in range(warmup):
        run()
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            run()
        dt = time.perf_counter() - t0
        if dt >= min_repeat_s or number >= 1 << 20:
            break
        # aim a bit above the target; grow at most 10x per step, at least 2x
        number = max(number * 2, min(number * 10, int(number * min_repeat_s * 1.2 / max(dt, 1e-9)) + 1))
    times = [dt / number]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            run()
        times.append((time.perf_counter() - t0) / number)
    return times


class Worker:
    def __init__(self) -> None:
        self.libs: dict[str, ctypes.CDLL] = {}
        self.data: dict[str, tuple] = {}  # digest -> (inputs, refs[, magnitudes])

    def handle(self, task: dict) -> dict:
        from superopt.runtime.buffers import aligned_copy
        from superopt.runtime.kernel import CompiledKernel

        if task.get("data") is not None:
            self.data[task["digest"]] = task["data"]
        if task.get("forget"):
            for d in task["forget"]:
                self.data.pop(d, None)
        inputs, refs, *rest = self.data[task["digest"]]
        magnitudes = rest[0] if rest else None
        compute = task["compute"]
        try:
            lib = self.libs.get(task["lib"])
            if lib is None:
                lib = self.libs[task["lib"]] = ctypes.CDLL(task["lib"])
            kernel = CompiledKernel(lib, task["source"], compute)
            kernel.set_threads(task["threads"])
            # copies: a kernel that writes its inputs must not corrupt the cached ones; on a cache line, as
            # the executor's buffers and constants are
            copies = [aligned_copy(x) for x in inputs]
            ins = kernel.prepare_inputs(copies)  # packs every packed input once
            consts = set(compute.inputs) if task.get("constants") is None else set(task["constants"])
            per_call = [(k, name, copies[k]) for k, name in enumerate(compute.inputs)
                        if name in kernel.pack_fns and name not in consts]
            outs = _fresh_outputs(compute)
        except MemoryError:
            return {"code": "OUT_OF_MEMORY", "times_s": [], "msg": "kernel buffers exceed the worker's memory cap"}
        except Exception as e:  # noqa: BLE001 - any failure to set up is this candidate's runtime error
            return {"code": "RUNTIME_ERROR", "times_s": [], "msg": f"kernel setup failed: {e!r}"}
        args = ins + outs
        run = _runner(kernel, args, per_call)
        t0 = time.perf_counter()
        run()
        first = time.perf_counter() - t0
        ok, msg = outputs_match(outs, refs, task["rtol"], task["atol"], magnitudes)
        if not ok:
            return {"code": "WRONG_ANSWER", "times_s": [], "msg": msg}
        if task.get("slow_call_s") is not None and first > task["slow_call_s"]:
            return {"code": "OK", "times_s": [first], "msg": f"slow: one call timed ({first:.3g}s)"}
        if task.get("cold_bytes"):
            try:
                run = _cold_runner(kernel, ins, outs, per_call, consts, list(compute.inputs), task["cold_bytes"])
            except MemoryError:
                return {"code": "OUT_OF_MEMORY", "times_s": [], "msg": "cold copies of the constants exceed the cap"}
        times = time_kernel(run, task["warmup"], task["min_repeat_s"], task["repeats"])
        return {"code": "OK", "times_s": times, "msg": ""}


def _runner(kernel, args: list[np.ndarray], per_call: list[tuple[int, str, np.ndarray]]):
    """One call of the kernel as the executor makes it: run-time inputs in ``per_call`` (argument
    slot, local name, unpacked array) are packed first, every call, into the buffer that ``args`` holds at their
    slot, as the executor packs into its planned buffers (a fresh buffer per call also timed its first-touch page
    faults: 2-8% of the calls of contractions whose packs take 10-50% of them)."""
    if not per_call:
        return lambda: kernel.run_raw(args)

    def run() -> None:
        for slot, name, src in per_call:
            kernel.pack_into(name, src, args[slot])
        kernel.run_raw(args)

    return run


MAX_COLD_COPIES = 64


def cold_copies(const_bytes: int, cold_bytes: int) -> int:
    """Copies of the constants that a cold measurement cycles through: enough to span ``cold_bytes``, at least
    one, at most ``MAX_COLD_COPIES``."""
    if const_bytes <= 0:
        return 1
    return max(1, min(MAX_COLD_COPIES, -(-cold_bytes // const_bytes)))


def _cold_runner(kernel, ins: list[np.ndarray], outs: list[np.ndarray], per_call, consts: set[str],
                 names: list[str], cold_bytes: int):
    """Calls that take the constant inputs from a different copy each time (``cold_copies`` of them, the
    first being ``ins``' own), so that a call finds them where the calls before it left them: out of the
    core's caches once the copies span more than they hold, as inside a graph."""
    from superopt.runtime.buffers import aligned_copy

    slots = [k for k, n in enumerate(names) if n in consts]
    n = cold_copies(sum(ins[k].nbytes for k in slots), cold_bytes)
    if n == 1:
        return _runner(kernel, ins + outs, per_call)
    sets = [ins + outs]
    for _ in range(n - 1):
        args = list(ins) + outs
        for k in slots:
            args[k] = aligned_copy(ins[k])
        sets.append(args)
    runs = [_runner(kernel, a, per_call) for a in sets]
    state = [0]

    def run() -> None:
        i = state[0]
        state[0] = (i + 1) % n
        runs[i]()

    return run


def main() -> None:
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed (by Python or C) now goes to stderr
    sys.stdout = sys.stderr
    proto_in = os.fdopen(os.dup(0), "rb")
    worker = Worker()
    send_frame(proto_out, {"ready": True, "pid": os.getpid()})
    while True:
        try:
            task = recv_frame(proto_in)
        except EOFError:
            return
        if task is None:
            return
        try:
            reply = worker.handle(task)
        except MemoryError:
            reply = {"code": "OUT_OF_MEMORY", "times_s": [], "msg": "the run exceeded the worker's memory cap"}
        except Exception:  # noqa: BLE001 - report, keep serving
            msg = "worker error: " + traceback.format_exc(limit=5)
            reply = {"code": "RUNTIME_ERROR", "times_s": [], "msg": msg}
        send_frame(proto_out, reply)


if __name__ == "__main__":
    main()
