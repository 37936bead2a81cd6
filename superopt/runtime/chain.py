"""Run a chain of compiled functions with ONE call from Python.

Every compiled kernel (and native extern, runtime/native_externs.py) has the signature ``void f(void **args)``
with its argument array fixed once by the executor (planned buffers, packed weights, workspace). A chain
is two arrays, the functions' addresses and their argument arrays; :data:`RUNNER_SOURCE` is the C loop that
calls them in order, compiled into the executor's kernel library. One ctypes call per chain replaces one per
kernel (a ctypes call with its argument conversion costs about a microsecond; the small kernels of real
models often run for less). The loop stops at the first function that sets the shared status flag.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

RUNNER_NAME = "so_run_chain"
RUNNER_SOURCE = f"""typedef void (*so_chain_fn)(void **);
void {RUNNER_NAME}(int n, so_chain_fn *fns, void ***args, int *status) {{
    for (int i = 0; i < n; ++i) {{
        fns[i](args[i]);
        if (*status) return;
    }}
}}
"""


def function_address(fn: ctypes._CFuncPtr) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


class Chain:
    """The functions (addresses) and argument arrays of consecutive calls, run by ``runner`` in one call."""

    def __init__(self, runner: ctypes._CFuncPtr, fns: Sequence[int], args: Sequence[ctypes.Array],
                 status: ctypes.c_int) -> None:
        self.n = len(fns)
        self.args_keep = list(args)  # the argument arrays must outlive the chain
        self._fns = (ctypes.c_void_p * self.n)(*fns)
        self._args = (ctypes.c_void_p * self.n)(*[ctypes.addressof(a) for a in args])
        self._call = runner
        self._n = ctypes.c_int(self.n)
        self._status = ctypes.byref(status)

    def __call__(self) -> None:
        self._call(self._n, self._fns, self._args, self._status)


def load_runner(lib: ctypes.CDLL) -> ctypes._CFuncPtr | None:
    """The chain runner of a kernel library, or None (a library built without it, e.g. an older artifact)."""
    try:
        fn = getattr(lib, RUNNER_NAME)
    except AttributeError:
        return None
    fn.restype = None
    fn.argtypes = None  # arguments are passed as prepared ctypes objects: no per-call conversion
    return fn
