"""The learned cost model: gradient-boosted trees (XGBoost) over the loop-nest features.

Behind the search's interface: :meth:`XGBModel.update` learns from measured candidates,
:meth:`XGBModel.predict` scores new ones (higher = expected faster). Labels are normalized per
workload and target (:func:`costmodel.base.candidate_group`): ``best time / time`` in (0, 1], 0 for
a failed candidate, so workloads of very different sizes share one model and the model learns
which schedule of a workload is fast, not how big the workload is.

Two ways to learn:
- :meth:`fit` trains from scratch on a dataset (the offline job, ``superopt costmodel train``);
- :meth:`update` (online, during a search) adds the measurements and retrains. When the model was
  loaded from a file (the shipped pretrained model), the loaded trees stay and a few more trees are
  boosted on the local measurements (XGBoost's continued training): the pretrained ranking is
  refined by this machine's and this workload's timings, not forgotten.

A loaded model scores without xgboost (:mod:`costmodel.tree_ensemble` walks the saved booster's trees in
numpy, to the same scores): ``superopt.optimize`` picks schedules with the shipped model and never imports
xgboost, whose import alone holds about 100 MB. Training and online updates import it.

A saved model (JSON) carries the booster, the config, the feature version and names, the target(s)
it was trained on and a summary of its training data. Loading a model of another feature version
raises :class:`~costmodel.features.FeatureVersionError`.

A model is of one kind of target: :class:`XGBModel` scores CPU kernels over the CPU features;
:class:`costmodel.gpu_model.GpuXGBModel` (``kind = "cuda"``) the same way over the GPU features of
:mod:`costmodel.gpu_features`. The file records the kind, and :meth:`XGBModel.load` returns that class.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from costmodel.base import Candidate, candidate_group
from costmodel.features import FEATURE_NAMES, FEATURE_VERSION, FeatureExtractor, check_feature_version
from costmodel.metrics import relative_speed
from costmodel.tree_ensemble import TreeEnsemble

if TYPE_CHECKING:
    import xgboost as xgb

    from superopt.target import Target

MODEL_FORMAT = "superopt-costmodel-xgb"
MODEL_FORMAT_VERSION = 1
OBJECTIVES = ("reg:squarederror", "rank:pairwise", "rank:ndcg")


@dataclass(frozen=True)
class XGBConfig:
    objective: str = "reg:squarederror"  # on the normalized speed (best / time); or a ranking objective
    rounds: int = 600  # boosting rounds of a full fit
    online_rounds: int = 40  # rounds added on top of a loaded model per online update
    max_depth: int = 6
    eta: float = 0.05
    subsample: float = 0.9
    colsample_bytree: float = 0.9
    min_child_weight: float = 1.0
    seed: int = 0
    nthread: int = 1  # training threads (the machine measures on the others)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r} (known: {', '.join(OBJECTIVES)})")

    def params(self) -> dict:
        p = {"objective": self.objective, "max_depth": self.max_depth, "eta": self.eta, "subsample": self.subsample,
             "colsample_bytree": self.colsample_bytree, "min_child_weight": self.min_child_weight,
             "seed": self.seed, "nthread": self.nthread, "verbosity": 0}
        if self.objective.startswith("rank:"):
            p["lambdarank_pair_method"] = "topk" if self.objective == "rank:ndcg" else "mean"
        return p


@dataclass
class _Data:
    features: list[np.ndarray] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, x: np.ndarray, groups: Sequence[str], seconds: Sequence[float]) -> None:
        self.features.append(x)
        self.groups += list(groups)
        self.seconds += [float(s) for s in seconds]

    def __len__(self) -> int:
        return len(self.groups)


def _xgb():
    """xgboost, imported when first needed: a loaded model scores without it (costmodel.tree_ensemble), and
    the import costs about 100 MB of resident memory."""
    import xgboost

    return xgboost


def _dmatrix(x: np.ndarray, groups: Sequence[str], seconds: Sequence[float], objective: str,
             names: Sequence[str] = FEATURE_NAMES) -> xgb.DMatrix:
    """Training matrix; ranking objectives want rows sorted by query id (the group)."""
    y = relative_speed(groups, seconds, failed=0.0)
    order = np.argsort(np.asarray(groups), kind="stable")
    ids = {g: i for i, g in enumerate(sorted(set(groups)))}
    qid = np.array([ids[groups[i]] for i in order])
    d = _xgb().DMatrix(x[order], label=y[order], missing=np.nan, feature_names=list(names))
    if objective.startswith("rank:"):
        d.set_group(np.bincount(qid))
    return d


class XGBModel:
    """An XGBoost ranker of schedule candidates; see the module docstring."""

    kind = "cpu"  # the kind of target whose features it reads
    feature_version = FEATURE_VERSION
    feature_names: tuple[str, ...] = FEATURE_NAMES
    check_features = staticmethod(check_feature_version)

    @staticmethod
    def _extractor():
        return FeatureExtractor()

    def __init__(self, config: XGBConfig | None = None) -> None:
        self.config = config or XGBConfig()
        self._booster: xgb.Booster | None = None
        self._ensemble: TreeEnsemble | None = None  # a loaded booster's trees, scored in numpy
        self.base: bytes | None = None  # the loaded (pretrained) booster, raw: online updates boost on a copy
        self.summary: dict = {}
        self.targets: list[dict] = []
        self.features = self._extractor()
        self._online = _Data()
        self._rng = np.random.default_rng(self.config.seed)

    @property
    def trained(self) -> bool:
        return self._booster is not None or self._ensemble is not None

    @property
    def booster(self) -> xgb.Booster | None:
        """The XGBoost booster (a loaded model's is read into xgboost when first asked for)."""
        if self._booster is None and self._ensemble is not None and self.base is not None:
            b = _xgb().Booster()
            b.load_model(bytearray(self.base))
            self._booster = b
        return self._booster

    @booster.setter
    def booster(self, value: xgb.Booster | None) -> None:
        self._booster = value
        self._ensemble = None  # (trained anew: the booster is the model now)

    def knows(self, target: Target) -> bool:
        """Whether the training data holds a machine of ``target``'s class (kind, vector width, register
        file): a ranking learned on one vector ISA does not transfer to another (a model trained on AVX2
        alone picked tiles sized for 16 registers on a 32-register core, slower than the default heuristic).
        A model with no recorded targets (learning online) knows every target."""
        if not self.targets:
            return True
        return any(t.get("kind", "cpu") == target.kind and t.get("vector_bits") == target.vector_bits
                   and t.get("vector_registers") == target.vector_registers for t in self.targets)

    # -- learning -------------------------------------------------------------------------------

    def fit(self, candidates: Sequence[Candidate], seconds: Sequence[float]) -> None:
        """Train from scratch (any loaded trees are dropped)."""
        if len(candidates) != len(seconds):
            raise ValueError(f"{len(candidates)} candidates but {len(seconds)} times")
        groups = [candidate_group(c) for c in candidates]
        x = self.features(candidates)
        self.booster = self._train(x, groups, seconds, self.config.rounds, None)
        self.base = None
        self._online = _Data()
        self.summary = _summary(candidates, groups, seconds)
        self.targets = _targets(candidates)

    def update(self, candidates: Sequence[Candidate], seconds: Sequence[float]) -> None:
        """Online: add measurements and retrain (from scratch, or on top of the loaded model)."""
        if not candidates:
            return
        self._online.add(self.features(candidates), [candidate_group(c) for c in candidates], seconds)
        groups, t = self._online.groups, self._online.seconds
        if len({g for g, s in zip(groups, t) if np.isfinite(s)}) == 0:
            return
        x = np.concatenate(self._online.features)
        if self.base is not None:
            base = _xgb().Booster()
            base.load_model(bytearray(self.base))
            self.booster = self._train(x, groups, t, self.config.online_rounds, base)
        elif len(self._online) >= 8:  # too few points to learn a ranking from
            self.booster = self._train(x, groups, t, self.config.rounds, None)

    def _train(self, x: np.ndarray, groups: Sequence[str], seconds: Sequence[float], rounds: int,
               base: xgb.Booster | None) -> xgb.Booster:
        d = _dmatrix(x, groups, seconds, self.config.objective, self.feature_names)
        return _xgb().train(self.config.params(), d, num_boost_round=rounds, xgb_model=base)

    # -- scoring --------------------------------------------------------------------------------

    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """Scores (higher = expected faster); comparable within one workload and target. Untrained:
        random scores (the search then explores at random)."""
        if not candidates:
            return np.zeros(0)
        if not self.trained:
            return self._rng.random(len(candidates))
        x = self.features(candidates)
        if self._booster is None:  # a loaded model: its trees in numpy (the same scores, xgboost not imported)
            return self._ensemble.predict(x)
        # one thread: a batch is a few hundred rows, which xgboost's thread team costs more to start and join
        # than to score (5 ms on one thread against 50-100 ms on two when the machine has other work)
        self.booster.set_param({"nthread": 1})
        xgb = _xgb()
        return self.booster.predict(xgb.DMatrix(x, missing=np.nan, feature_names=list(self.feature_names), nthread=1))

    # -- files ----------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the model atomically (a temporary file renamed over ``path``)."""
        if not self.trained:
            raise ValueError("cannot save an untrained cost model")
        doc = {"format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "kind": self.kind,
               "feature_version": self.feature_version, "feature_names": list(self.feature_names),
               "config": asdict(self.config), "targets": self.targets,
               "summary": self.summary,
               "booster": base64.b64encode(bytes(self.booster.save_raw("ubj"))).decode("ascii")}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a model is a file to share
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, config: XGBConfig | None = None) -> XGBModel:
        """Read a saved model; ``config`` overrides the saved one for online updates."""
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"cost model file {path} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"cost model file {path} is not a superopt cost model ({err})") from None
        if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
            raise ValueError(f"cost model file {path} is not a superopt cost model (format {MODEL_FORMAT!r})")
        if doc.get("kind", "cpu") != cls.kind:  # a model of another kind of target: its own class reads it
            cls = model_class(str(doc.get("kind")))
        cls.check_features(doc.get("feature_version", -1), doc.get("feature_names", ()))
        saved = XGBConfig(**doc.get("config", {}))
        m = cls(config or saved)
        try:
            raw = base64.b64decode(doc["booster"])
            try:
                m._ensemble = TreeEnsemble.from_ubjson(raw)
            except ValueError:  # a booster the numpy scorer does not read (or a corrupt one): xgboost's own
                xgb = _xgb()
                try:
                    b = xgb.Booster()
                    b.load_model(bytearray(raw))
                except xgb.core.XGBoostError as err:
                    raise ValueError(str(err)) from None
                m.booster = b
        except (KeyError, ValueError) as err:
            raise ValueError(f"cost model file {path} has a corrupt booster ({str(err).splitlines()[0]})") from None
        m.base = raw
        m.summary = doc.get("summary", {})
        m.targets = doc.get("targets", [])
        return m


def _summary(candidates: Sequence[Candidate], groups: Sequence[str], seconds: Sequence[float]) -> dict:
    ok = [np.isfinite(s) for s in seconds]
    return {"records": len(candidates), "ok_records": int(sum(ok)), "workloads": len(set(groups)),
            "targets": sorted({c.target.key() for c in candidates})}


def _targets(candidates: Sequence[Candidate]) -> list[dict]:
    seen: dict[str, dict] = {}
    for c in candidates:
        seen.setdefault(c.target.key(), c.target.to_dict())
    return list(seen.values())


def model_class(kind: str) -> type[XGBModel]:
    """The model class for targets of ``kind`` (``cpu`` or ``cuda``)."""
    if kind == "cpu":
        return XGBModel
    if kind == "cuda":
        from costmodel.gpu_model import GpuXGBModel

        return GpuXGBModel
    raise ValueError(f"no cost model for targets of kind {kind!r} (kinds: cpu, cuda)")


def pretrained_path(kind: str = "cpu") -> Path:
    """The cost model shipped in the package for ``kind`` (``cpu``)."""
    return Path(__file__).parent / "pretrained" / f"{kind}.json"


def load_pretrained(kind: str = "cpu", config: XGBConfig | None = None) -> XGBModel | None:
    """The shipped model, or None when the package has none for ``kind`` (no ``cuda`` model ships yet)."""
    p = pretrained_path(kind)
    return model_class(kind).load(p, config) if p.exists() else None
