"""The machine a benchmark ran on, for its results file: a figure means nothing without it."""

from __future__ import annotations

import os
import platform
import time


def cpu_model() -> str:
    """The CPU's model name as the OS reports it (``Target.cpu_model``)."""
    from superopt.target import host_target

    return host_target(1).cpu_model


def describe_machine(threads: int) -> dict:
    """CPU model, vector ISA and registers, cores and threads (``Target.describe``), logical CPUs, platform,
    the date and the load average (1 minute) when it is called."""
    from superopt.target import host_target

    target = host_target(threads)
    return {"cpu_model": target.cpu_model, "target": target.describe(), "logical_cpus": os.cpu_count(),
            "threads": threads, "platform": platform.platform(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg": [round(v, 2) for v in os.getloadavg()]}


def machine_line(machine: dict) -> str:
    """One line for a results file's header."""
    return (f"Machine: {machine['target']}; {machine['logical_cpus']} logical CPUs; {machine['platform']}; "
            f"{machine['date_utc']}, load average {machine['loadavg'][0]:.2f}.")


def write_result(out_dir: str | os.PathLike, name: str, result: dict, markdown: str) -> None:
    """``NAME.json`` (the result) and ``NAME.md`` (its rendering) in ``out_dir``, written after each model, so
    that a run cut short keeps what it measured."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text(markdown)
