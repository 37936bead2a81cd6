"""System registry.  Each entry maps a system name to the module that defines ``SYSTEM``.

A system whose module is missing (e.g. ``superopt_system`` before it is written)
is skipped by the runner with a printed note.
"""

from __future__ import annotations

import importlib

SYSTEM_MODULES: dict[str, str] = {
    "eager": "benchmarks.systems.torch_eager",
    "torch.compile": "benchmarks.systems.torch_compile",
    "onnxruntime": "benchmarks.systems.onnxruntime_system",
    "openvino": "benchmarks.systems.openvino_system",
    "superopt": "benchmarks.systems.superopt_system",
}


def load_system(name: str):
    """Return (system or None, note)."""
    modname = SYSTEM_MODULES[name]
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name in (modname, modname.rsplit(".", 1)[0]) or modname.endswith(str(e.name)):
            return None, f"module {modname} not found (system not plugged in yet)"
        return None, f"module {modname} failed to import: {e!r}"
    except Exception as e:  # noqa: BLE001 - a broken plug-in must not stop the suite
        return None, f"module {modname} failed to import: {e!r}"
    system = getattr(mod, "SYSTEM", None)
    if system is None:
        return None, f"module {modname} defines no SYSTEM"
    ok, note = system.available()
    if not ok:
        return None, note
    return system, ""
