"""The documentation: the site builds strictly, the configuration reference is what the
config models say, the README stays short, and what the docs tell a user to run exists."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli.main import app
from gateway.core.config.reference import render, undocumented

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)


def bash_lines() -> list[tuple[str, str]]:
    """(doc, line) of every line of every ```bash block of the README and docs/."""
    out = []
    for doc in DOCS:
        for block in BASH_BLOCK.findall(doc.read_text(encoding="utf-8")):
            out += [(doc.name, line.strip()) for line in block.splitlines() if line.strip()]
    return out


def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs, "mkdocs is in the dev extra"
    res = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_the_configuration_reference_is_current():
    """Regenerate with `python -m gateway.core.config.reference > docs/configuration.md`."""
    assert undocumented() == [], "every config field needs Field(description=...)"
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == render()


def test_the_readme_is_short_and_links_the_pages():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).is_file(), page
    # the test command is the one CI runs
    command = (
        "bash scripts/install.sh cpu,dev && bash scripts/check.sh && "
        ".venv/bin/python -m pytest -v tests"
    )
    assert command in text
    assert command in (ROOT / ".ci" / "run").read_text()


def test_every_rmgate_command_shown_parses():
    runner = CliRunner()
    seen = set()
    for doc, line in bash_lines():
        for m in re.finditer(r"rmgate ((?:[a-z-]+)(?: (?:stats|export|replay|invalidate))?)", line):
            words = tuple(m.group(1).split())
            if words in seen:
                continue
            seen.add(words)
            res = runner.invoke(app, [*words, "--help"])
            assert res.exit_code == 0, f"{doc}: `rmgate {' '.join(words)}`: {res.output}"
    assert {("demo",), ("check",)} <= seen


def test_every_module_script_and_config_shown_exists():
    for doc, line in bash_lines():
        for module in re.findall(r"python -m ((?:benchmarks|gateway)[\w.]*)", line):
            assert importlib.util.find_spec(module) is not None, f"{doc}: {module}"
        for path in re.findall(r"(?<![\w/])((?:scripts|examples|configs)/[\w./-]+)", line):
            assert (ROOT / path).exists(), f"{doc}: {path}"
    for doc in DOCS:
        for path in re.findall(r"(?<![\w/])(configs/[\w.-]+\.yaml)", doc.read_text()):
            assert (ROOT / path).is_file(), f"{doc.name} names {path}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_speak_of_the_project_and_its_users(doc):
    text = doc.read_text(encoding="utf-8").lower()
    for phrase in (
        "these machines",
        "this machine",
        "measured here",
        "was not lent",
        "../shared",
        "budget_left",
    ):
        assert phrase not in text, f"{doc.name}: {phrase!r}"


RESULT_FILE = re.compile(r"`((?:benchmarks/)?(?:gpu/)?(?:reports|results)/[\w.-]+\.(?:json|md))`")


@pytest.mark.parametrize(
    "doc",
    [*DOCS, ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "gpu" / "H200-RESULTS.md"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_result_file_a_doc_cites_is_committed(doc):
    """A figure's source is named as a file path in backquotes; each named file exists, so a
    figure cannot cite a run that was never committed (``…`` and ``*`` abbreviations name a
    family of files and are not checked)."""
    text = doc.read_text(encoding="utf-8")
    base = ROOT / "benchmarks" if doc.parent.name == "benchmarks" else ROOT
    if doc.parent.name == "gpu":
        base = doc.parent
    cited = RESULT_FILE.findall(text)
    missing = [
        c
        for c in cited
        if not (ROOT / c).is_file()
        and not (base / c).is_file()
        and not (ROOT / "benchmarks" / c).is_file()
    ]
    assert missing == [], f"{doc.name} cites files that are not in the repository: {missing}"
    assert "TBD(" not in text, f"{doc.name} has a figure still to be measured"


def test_the_benchmarks_readme_stays_readable():
    """Current results first, at most 25 KB; superseded runs go to benchmarks/reports/."""
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 25_000
    assert text.index("## Current results") < text.index("## GPU")
