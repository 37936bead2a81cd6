"""Every graph the fuzzer once got wrong (shrunk; tests/fuzz_regressions/*.onnx) stays right."""

import json
from pathlib import Path

import onnx
import pytest

from superopt.testing.fuzz import REGRESSIONS, FuzzConfig, run_case

CASES = sorted(REGRESSIONS.glob("*.onnx"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fuzz_regression(path: Path):
    model = onnx.load(str(path))
    meta = json.loads({p.key: p.value for p in model.metadata_props}["superopt_fuzz"])
    r = run_case(model, meta["seed"], FuzzConfig(schedules=meta["schedules"], threads=1))
    assert r.outcome == "pass", f"{path.name} (was: {meta['detail']}): {r.outcome}: {r.detail}"


def test_regressions_directory_exists():
    assert REGRESSIONS.is_dir()
