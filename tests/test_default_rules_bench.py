"""The registry of default-schedule rules that ``benchmarks/default_rules.py`` turns off: each names a seam that
exists, turning it off is undone, its table in ``benchmarks/results`` was measured on the seed it names, a rule
run end to end on one small contraction times a changed program that agrees with the default, and an unknown rule
is refused with the names of the known ones."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import pytest

from benchmarks import contraction_cases, default_rules
from benchmarks.contraction_cases import Case
from benchmarks.default_rules import RULES, ab_render, ab_rule, rule_off

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_rule_names_a_seam_and_turning_it_off_is_undone(name):
    rule = RULES[name]
    module = importlib.import_module(rule.module)
    seam = getattr(module, rule.seam)
    assert callable(seam) == callable(rule.off), f"{rule.module}.{rule.seam} and its off value differ in kind"
    with pytest.raises(RuntimeError), rule_off(rule):
        assert getattr(module, rule.seam) is rule.off
        raise RuntimeError
    assert getattr(module, rule.seam) is seam


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_rules_table_was_measured_on_the_seed_the_registry_names(name):
    rule = RULES[name]
    result = json.loads((RESULTS / f"{name}.json").read_text())
    assert (result["seed"], result["random"]) == (rule.seed, rule.count)
    assert (RESULTS / f"{name}.md").read_text().startswith(f"# {rule.title} (")


def test_a_rule_run_on_a_small_contraction_times_the_changed_program(monkeypatch):
    """The collapse of reduction loops changes how ``C[i,k] += A[i,j,l] * B[l,k,j]`` is printed (``j`` and ``l``
    walk B as one run); the rule off prints them nested, and both programs give the same result."""
    case = Case("small_0", "contraction", (("i", "j", "l"), ("l", "k", "j")), ("i", "k"),
                (("i", 30), ("j", 17), ("l", 20), ("k", 50)))
    monkeypatch.setattr(contraction_cases, "random_contractions", lambda n, seed: [case])
    args = argparse.Namespace(seed=0, random=1, threads=2, rounds=1, tie=0.03)
    result = ab_rule(args, RULES["reduction_collapse"])
    assert list(result["changed"]) == ["small_0"]
    row = result["changed"]["small_0"]
    assert row["nested_s"] > 0 and row["this_s"] > 0 and row["speedup"] == row["nested_s"] / row["this_s"]
    assert result["summary"]["wins"] + result["summary"]["losses"] + result["summary"]["ties"] == 1
    assert "| small_0 | `C[i,k] += A[i,j,l] * B[l,k,j]`" in ab_render(result, RULES["reduction_collapse"])


def test_an_unknown_rule_is_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="no rule named 'no_such_rule'; the rules: pack_order, "):
        default_rules.main(["no_such_rule"])


def test_the_benchmarks_page_lists_every_rule():
    page = (Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md").read_text()
    assert [n for n in RULES if f"| `{n}` | `" not in page] == []
