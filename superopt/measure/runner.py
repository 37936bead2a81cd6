"""Pluggable measurement runners: one local measurement service, or a pool of Ray actors.

``make_runner(spec, config, workers)`` returns an object with ``measure(inputs) -> results`` (in input
order) and ``close()``, usable as a context manager, so a dataset collection or a schedule search
(anything that takes a ``MeasureService``-like object) runs unchanged on either:

- ``"local"``: :class:`LocalRunner`, a :class:`~superopt.measure.service.MeasureService` with one run
  worker (on a small machine, timings of parallel workers would disturb each other);
- ``"auto"`` or a Ray address: :class:`RayRunner`, one Ray actor per worker, each reserving
  ``target.threads`` CPUs and owning a MeasureService with that many threads and no dataset dir.
  Inputs are split across the actors and the results come back in input order; records (when
  ``config.dataset_dir`` is set) are written by the caller's process alone, with
  :func:`~superopt.measure.service.build_records`, the same records a MeasureService writes.

Ray is imported only when a Ray runner is made.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from superopt.measure.records import append_records, records_path
from superopt.measure.service import MeasureConfig, MeasureInput, MeasureResult, MeasureService, build_records
from superopt.target import Target, host_target

RAY_MISSING = "ray is not installed: pip install 'superopt[ray]'"


class Runner(Protocol):
    """What dataset collection and tuning need of a measurement backend."""

    def measure(self, inputs: Sequence[MeasureInput], time_left_s: float | None = None) -> list[MeasureResult]: ...

    def close(self) -> None: ...


class LocalRunner:
    """A MeasureService with one run worker on this machine (it writes records if the config says so)."""

    def __init__(self, config: MeasureConfig) -> None:
        self.config = replace(config, workers=1)
        self.service = MeasureService(self.config)

    @property
    def target(self) -> Target:
        return self.service.target

    def measure(self, inputs: Sequence[MeasureInput], time_left_s: float | None = None) -> list[MeasureResult]:
        return self.service.measure(inputs, time_left_s)

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _MeasureActor:
    """The body of one Ray actor: a MeasureService that never writes records."""

    def __init__(self, config: MeasureConfig) -> None:
        self.service = MeasureService(replace(config, dataset_dir=None, workers=1))

    def host(self) -> dict:
        """The machine this actor measures on, as a target dict with the actor's threads."""
        cfg = self.service.config
        return host_target(self.service.target.threads, cfg.compiler.cc).to_dict()

    def measure(self, inputs: list[MeasureInput], time_left_s: float | None = None) -> list[MeasureResult]:
        return self.service.measure(inputs, time_left_s)

    def close(self) -> None:
        self.service.close()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError(RAY_MISSING) from None
    return ray


def _connect(ray: Any, address: str) -> bool:
    """Connect to the cluster at ``address``; for ``"auto"`` with no cluster running, start a local one.
    Returns whether this call started (and so should shut down) the connection."""
    if ray.is_initialized():
        return False
    if address != "auto":
        ray.init(address=address)
        return True
    try:
        ray.init(address="auto")
    except ConnectionError:
        ray.init()
    return True


class RayRunner:
    """Measures on Ray actors; results come back in input order for one writer (this process).

    ``workers`` actors (default: as many as the cluster's CPUs hold at ``target.threads`` each), each
    created with ``num_cpus=target.threads``. Every actor must measure on the machine ``config``'s target
    describes (records name it): a node that differs is an error at start, not a mislabeled record.
    """

    def __init__(self, config: MeasureConfig, address: str = "auto", workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"RayRunner needs workers >= 1, got {workers}")
        self.config = config
        self._target = config.resolved_target()
        ray = self._ray = _import_ray()
        self._owns_ray = _connect(ray, address)
        threads = self._target.threads
        if workers is None:
            workers = max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
        actor_cls = ray.remote(num_cpus=threads)(_MeasureActor)
        actor_config = replace(config, target=self._target, dataset_dir=None, workers=1)
        self.actors = [actor_cls.remote(actor_config) for _ in range(workers)]
        try:
            self._check_hosts()
        except BaseException:
            self.close()
            raise

    @property
    def target(self) -> Target:
        return self._target

    def _check_hosts(self) -> None:
        want = self._target.to_dict()
        for i, host in enumerate(self._ray.get([a.host.remote() for a in self.actors])):
            if host != want:
                diff = sorted(k for k in want if host.get(k) != want[k])
                raise RuntimeError(f"Ray worker {i} measures on another machine than the target "
                                   f"(differs in {', '.join(diff)}): its records would be mislabeled")

    def measure(self, inputs: Sequence[MeasureInput], time_left_s: float | None = None) -> list[MeasureResult]:
        """Measure on the actors (contiguous chunks, two per actor, handed out as actors free up); every
        chunk keeps to ``time_left_s`` counted from this call (an actor's clock is its own)."""
        inputs = list(inputs)
        if not inputs:
            return []
        for inp in inputs:
            inp.constants()  # a misnamed constant input is the caller's error, raised here as locally
        from ray.util import ActorPool

        deadline = None if time_left_s is None else time.monotonic() + time_left_s
        size = max(1, math.ceil(len(inputs) / (2 * len(self.actors))))
        chunks = [inputs[k:k + size] for k in range(0, len(inputs), size)]
        pool = ActorPool(self.actors)
        results = [r for part in pool.map(
            lambda a, chunk: a.measure.remote(chunk, None if deadline is None else deadline - time.monotonic()),
            chunks) for r in part]
        if self.config.dataset_dir is not None:
            append_records(records_path(self.config.dataset_dir), build_records(inputs, results, self._target))
        return results

    def close(self) -> None:
        ray, actors, self.actors = self._ray, self.actors, []
        if actors:
            try:
                ray.get([a.close.remote() for a in actors], timeout=30)
            except Exception:  # noqa: BLE001 - an actor already gone has nothing left to close
                pass
            for a in actors:
                ray.kill(a)
        if self._owns_ray:
            self._owns_ray = False
            ray.shutdown()

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_runner(spec: str, config: MeasureConfig, workers: int | None = None) -> LocalRunner | RayRunner:
    """``"local"``: a :class:`LocalRunner` (``workers`` must be None or 1); ``"auto"`` or a Ray address
    (``ray://host:10001``, ``host:6379``): a :class:`RayRunner` with ``workers`` actors."""
    if not spec:
        raise ValueError("runner spec is empty: use 'local', 'auto' or a Ray address")
    if spec == "local":
        if workers not in (None, 1):
            raise ValueError(f"the local runner measures with one worker (timings must not overlap), got {workers}")
        return LocalRunner(config)
    return RayRunner(config, spec, workers)


__all__ = ["RAY_MISSING", "LocalRunner", "RayRunner", "Runner", "make_runner"]
