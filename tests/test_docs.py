"""The README stays a five-minute read that works, and the repository speaks of the product only.

- README.md has at most 250 lines;
- every ``superopt`` command in its code blocks parses (``superopt <command> --help`` exits 0), and the
  quickstarts cover every front door of the command line;
- every ``docs/`` link of the README, and every relative link between the pages of ``docs/``, names a file;
- no README, docs page, source file, test or results file speaks of issues, sessions, waves or numbered
  runs (process history); the product senses of those words are allowed by an explicit list.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest

from superopt.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

# the commands a new user needs from the README alone
FRONT_DOORS = {"optimize", "run", "explain", "bench", "tune", "dataset collect", "costmodel train", "costmodel eval"}
SUBCOMMANDS = {"dataset": ("collect",), "costmodel": ("train", "eval")}

_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
             "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
PROCESS_WORDS = re.compile(
    r"\bissues? ?#?\d+|\bissues?-\d+|\b(this|that|the|an?|each|every|previous|next|last|its) issue\b|issue's\b"
    r"|\bsessions?\b|session_?\d+|\bwaves?\b"
    rf"|\b({_ORDINALS})[ -](session|wave)\b|\b(run|session|wave) ?#?\d+\b(?![-.\d])",
    re.IGNORECASE)
# product senses of those words: onnxruntime's InferenceSession and its session options, pytest's session
# scope, the GPU's waves of thread blocks over the SMs, subprocess's start_new_session, an instruction that issues
ALLOWED = re.compile(
    r"InferenceSession|SessionOptions|_?ort_session|onnxruntime session|one-node session|fallback session|"
    r"session\.(force_spinning_stop|intra_op)|session[- ]creation|create sessions|live session|"
    r"(?-i:class _Session|-> _Session|_Session\()|"
    r"\bsession\(|def _?session|cached session|session is built|scope=\"session\"|per-session temp dir|"
    r"start_new_session|waves over the SMs|waves as they are|\"waves\"(: waves)?|waves = |occupancy, waves|"
    r"\"session\"|^\s*session,\s*$|"
    r"waves, coalescing|issues? (its|the|their) |\bissue\(",
    re.IGNORECASE)
SCANNED_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".cfg"}
SCANNED_ROOTS = ("README.md", "docs", "superopt", "search", "costmodel", "rewrite_rules", "tests", "benchmarks",
                 "datasets", "Makefile", "pyproject.toml")


def _readme() -> str:
    return README.read_text()


def test_readme_is_a_five_minute_read():
    lines = _readme().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines, at most {MAX_README_LINES}"


def _readme_commands() -> list[tuple[str, ...]]:
    """The subcommand (and sub-subcommand) of every ``superopt ...`` line in the README's code blocks."""
    blocks = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", _readme(), re.DOTALL) if lang in ("", "sh", "bash")]
    commands = []
    for line in "\n".join(blocks).splitlines():
        m = re.match(r"\s*(?:\.venv/bin/)?superopt\s+([a-z-]+)(?:\s+([a-z-]+))?", line)
        if m:
            cmd, sub = m.group(1), m.group(2)
            commands.append((cmd, sub) if sub in SUBCOMMANDS.get(cmd, ()) else (cmd,))
    return sorted(set(commands))


def test_readme_quickstart_covers_every_front_door():
    found = {" ".join(c) for c in _readme_commands()}
    assert FRONT_DOORS <= found, f"the README's quickstarts lack {sorted(FRONT_DOORS - found)}"
    for snippet in ("superopt.optimize(", "superopt.op(", 'backend="superopt"', "superopt.load(", "make demo",
                    "make test"):
        assert snippet in _readme(), f"the README's quickstart lacks {snippet}"


@pytest.mark.parametrize("command", _readme_commands(), ids=" ".join)
def test_readme_command_parses(command):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        cli_main([*command, "--help"])
    assert exited.value.code == 0, f"superopt {' '.join(command)} --help exited {exited.value.code}"
    assert "usage: superopt" in out.getvalue()


def _links() -> list[tuple[str, Path]]:
    """(where, target) of the README's docs/ links and of the relative links between docs/ pages."""
    found = [(f"README.md -> {t}", ROOT / t) for t in re.findall(r"\]\((docs/[^)#\s]+)", _readme())]
    for page in sorted(DOCS.glob("*.md")):
        for t in re.findall(r"\]\(([^)#\s:]+)(?:#[^)]*)?\)", page.read_text()):
            found.append((f"docs/{page.name} -> {t}", (page.parent / t).resolve()))
    return found


def test_readme_links_into_docs():
    assert len({t for _, t in _links() if "README" in _}) >= 5


@pytest.mark.parametrize("where, target", _links(), ids=[w for w, _ in _links()])
def test_doc_link_resolves(where, target):
    assert target.exists(), f"{where}: no such file"


def _scanned_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *SCANNED_ROOTS],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in tracked
            if (Path(p).suffix in SCANNED_SUFFIXES or Path(p).name == "Makefile"
                or p.startswith("benchmarks/results/") and p.endswith(".json")) and (ROOT / p).is_file()]


def process_word_hits(text: str) -> list[str]:
    """The lines of ``text`` that speak of process history (after the allowed product senses are removed)."""
    return [line.strip() for line in text.splitlines() if PROCESS_WORDS.search(ALLOWED.sub("", line))]


def test_the_process_word_check_catches_process_history():
    for line in ("## Schedule search (issue 8)", "# measured in the nineteenth session", "this wave added",
                 "results/run_xeon_session12/", "the issue's module", "fixed in run 3", "Issue #12"):
        assert process_word_hits(line), line
    for line in ("sess = ort.InferenceSession(data)", "waves over the SMs", "each thread issues its loads",
                 '@pytest.fixture(scope="session")', "a second run measures nothing"):
        assert not process_word_hits(line), line


def test_no_process_words_in_the_repository():
    this = Path(__file__).resolve()
    hits = [f"{p.relative_to(ROOT)}: {line[:120]}" for p in _scanned_files() if p.resolve() != this
            for line in process_word_hits(p.read_text(errors="replace"))]
    assert not hits, f"{len(hits)} lines speak of process history:\n" + "\n".join(hits[:40])
