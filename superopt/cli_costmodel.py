"""Command line: ``superopt costmodel train`` and ``superopt costmodel eval``.

``superopt costmodel train --data DIR [--data DIR2 ..] --out model.json`` trains the XGBoost cost
model on measurement records (dataset directories holding ``measurements.jsonl``, or JSON-lines
files of measurement or tuning records), holding out a fraction of the workloads, and writes the
model plus ``<out stem>.eval.json`` (the training report: data summary, train and held-out metrics).

``superopt costmodel eval [--model PATH] [--data DIR ..] [--plot out.png]`` scores a model (default:
the shipped pretrained one) on a dataset; without ``--data`` it prints the model's training summary
and the evaluation saved next to it, if any.

Exit status: 0 on success, 2 for bad input (a missing or empty dataset, an unreadable model file,
bad options), 1 for a failure while running. Errors are one line on stderr; ``--json`` prints one
JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "register"]


class UsageError(ValueError):
    """Bad command-line input (exit status 2)."""


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _guarded(name: str, fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``fn`` with errors turned into one line on stderr and an exit status (2 usage, 1 runtime)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except UsageError as err:
            print(f"superopt costmodel {name}: error: {_one_line(err)}", file=sys.stderr)
            return 2
        except (ValueError, RuntimeError, OSError, ImportError) as err:
            print(f"superopt costmodel {name}: error: {_one_line(err)}", file=sys.stderr)
            return 1

    return run


# ---- helpers ---------------------------------------------------------------------------------------


def _load_data(paths: Sequence[str]):
    """The dataset at ``paths``; a missing path or a dataset without verified records is a UsageError."""
    from costmodel.dataset import load_dataset

    try:
        data = load_dataset(*paths)
    except FileNotFoundError as err:
        raise UsageError(_one_line(err)) from None
    if not len(data):
        raise UsageError(f"no readable records in {', '.join(paths)}")
    if not math.isfinite(float(data.seconds.min())):
        raise UsageError(f"no verified, timed records in {', '.join(paths)} ({len(data)} failed ones)")
    return data


def _load_model(path: Path):
    """The model at ``path``; a missing or unreadable file is a UsageError."""
    from costmodel.xgb import XGBModel

    if not path.is_file():
        raise UsageError(f"no cost model file {path}")
    try:
        return XGBModel.load(path)
    except Exception as err:  # noqa: BLE001 - whatever is wrong with the file, say so in one line
        raise UsageError(f"cannot read cost model {path}: {_one_line(err)}") from None


def eval_path(model_path: Path) -> Path:
    """Where ``train`` saves the evaluation of a model: ``model.json`` -> ``model.eval.json``."""
    return model_path.with_name(model_path.stem + ".eval.json")


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))


# ---- train -----------------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from costmodel.train import TrainConfig, train

    if not 0 <= args.test_fraction < 1:
        raise UsageError(f"bad --test-fraction {args.test_fraction}: give a fraction in [0, 1)")
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give the model's file name (e.g. model.json)")
    data = _load_data(args.data)
    try:
        train_set, _ = data.split_by_workload(args.test_fraction, args.seed)
    except ValueError as err:  # one workload only: nothing to hold out
        raise UsageError(_one_line(err)) from None
    if not math.isfinite(float(train_set.seconds.min())):
        raise UsageError("the training workloads have no verified, timed record (try another --seed)")
    cv = None
    if args.folds:
        from costmodel.train import cross_validate

        try:
            cv = cross_validate(data, args.folds, TrainConfig(seed=args.seed))
        except ValueError as err:
            raise UsageError(_one_line(err)) from None
    model, report = train(data, TrainConfig(test_fraction=args.test_fraction, seed=args.seed))
    model.save(out)
    doc = {"model": str(out), "eval": str(eval_path(out)), "sources": list(args.data), **report.to_dict()}
    if cv is not None:
        doc["cross_validation"] = cv.summary()
    eval_path(out).write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")
    if args.json:
        _print_json(doc)
    else:
        if cv is not None:
            print(cv.describe())
        print(report.describe())
        print(f"wrote {out} and {eval_path(out)}")
    return 0


# ---- eval ------------------------------------------------------------------------------------------


def _model_path(arg: str | None) -> Path:
    if arg is not None:
        return Path(arg)
    from costmodel.xgb import pretrained_path

    return Path(pretrained_path())


def _unseen_targets(model: Any, data: Any) -> list[str]:
    """Targets in the data that the model's training summary does not list (empty if it lists none)."""
    summary = getattr(model, "summary", None)
    known = summary.get("targets") if isinstance(summary, dict) else None
    if not isinstance(known, (list, dict)) or not known:
        return []
    return [k for k in data.target_keys() if k not in known]


def _stored_eval(path: Path) -> dict | None:
    p = eval_path(path)
    if not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def cmd_eval(args: argparse.Namespace) -> int:
    path = _model_path(args.model)
    if args.plot and not args.data:
        raise UsageError("--plot needs --data (the records to plot)")
    model = _load_model(path)
    doc: dict[str, Any] = {"model": str(path), "model_summary": getattr(model, "summary", {})}
    if not args.data:
        doc["stored_eval"] = _stored_eval(path)
        if args.json:
            _print_json(doc)
        else:
            print(f"model {path}: trained on {json.dumps(doc['model_summary'], sort_keys=True)}")
            test = (doc["stored_eval"] or {}).get("test")
            print(f"held-out evaluation saved with it: {json.dumps(test, sort_keys=True) if test else 'none'}")
        return 0
    from costmodel.metrics import evaluate_scores
    from costmodel.train import predict_scores, scatter_plot

    data = _load_data(args.data)
    scores = predict_scores(model, data)
    report = evaluate_scores(data.groups, scores, data.seconds)
    if args.plot:
        scatter_plot(model, data, args.plot, scores=scores)
    doc.update({"sources": list(args.data), "data": data.summary(), "unseen_targets": _unseen_targets(model, data),
                "eval": report.to_dict(), "plot": args.plot})
    if args.json:
        _print_json(doc)
    else:
        print(f"model {path} on {len(data)} records: {report.describe()}")
        if doc["unseen_targets"]:
            print(f"note: the model was not trained on target(s) {', '.join(doc['unseen_targets'])} of this data")
        if args.plot:
            print(f"wrote {args.plot}")
    return 0


# ---- parser ----------------------------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``costmodel train`` and ``costmodel eval`` to ``superopt``'s subcommands. Each leaf sets
    ``fn``, which handles its own errors and returns the exit status."""
    cm = subparsers.add_parser("costmodel", help="train and evaluate the learned cost model",
                               description="train and evaluate the learned cost model")
    sub = cm.add_subparsers(dest="costmodel_command", required=True)
    t = sub.add_parser("train", help="train the XGBoost cost model on measurement records",
                       description="superopt costmodel train --data DIR [--data DIR2 ..] --out model.json")
    t.add_argument("--data", action="append", required=True, metavar="DIR",
                   help="a dataset directory (with measurements.jsonl) or a records/tuning-database file (repeat)")
    t.add_argument("--out", required=True, help="the model file to write; <stem>.eval.json is written next to it")
    t.add_argument("--test-fraction", type=float, default=0.2, help="fraction of workloads held out (default 0.2)")
    t.add_argument("--seed", type=int, default=0, help="seed of the held-out split (default 0)")
    t.add_argument("--folds", type=int, default=0, metavar="K",
                   help="also K-fold cross-validation by workload (the model written is still trained as "
                        "--test-fraction says; with --test-fraction 0, on all the data)")
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    t.set_defaults(fn=_guarded("train", cmd_train))
    e = sub.add_parser("eval", help="score a cost model on measurement records",
                       description="superopt costmodel eval [--model PATH] [--data DIR ..] [--plot out.png]")
    e.add_argument("--model", default=None, help="the model file (default: the shipped pretrained model)")
    e.add_argument("--data", action="append", default=None, metavar="DIR",
                   help="dataset directory or records file (repeat); without it, print the model's saved summary")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    e.add_argument("--plot", default=None, metavar="PNG", help="write predicted vs measured relative speed here")
    e.set_defaults(fn=_guarded("eval", cmd_eval))
    return cm


def main(argv: list[str] | None = None) -> int:
    """``superopt costmodel ...`` on its own (for tests; ``superopt.cli`` registers the same parser)."""
    parser = argparse.ArgumentParser(prog="superopt")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
