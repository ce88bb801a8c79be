"""benchmarks/studies/: one file per study, each naming the doc that quotes it; the harness at the
top of benchmarks/ imports none of them (benchmarks/__init__.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
STUDIES = ROOT / "benchmarks" / "studies"


def _studies() -> list[Path]:
    return sorted(p for p in STUDIES.glob("*.py") if p.name != "__init__.py")


def _quoted_by(path: Path) -> list[str]:
    """The documents the module docstring's "Quoted by" paragraph names (paths ending in .md)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = next((p for p in doc.split("\n\n") if p.startswith("Quoted by ")), "")
    return re.findall(r"[\w./-]+\.md", paragraph)


def test_studies_are_found() -> None:
    """The checks below would pass vacuously on an empty folder."""
    names = {p.stem for p in _studies()}
    assert {"pipeline", "rings", "mosquitto_max_connections"} <= names


def test_every_study_names_the_docs_that_quote_it() -> None:
    missing = [p.name for p in _studies() if not _quoted_by(p)]
    assert missing == [], "start a paragraph of the docstring with 'Quoted by docs/....md'"
    named = sorted({doc for p in _studies() for doc in _quoted_by(p)})
    assert [doc for doc in named if not (ROOT / doc).is_file()] == [], named


def test__quoted_by_reads_the_paragraph_only(tmp_path: Path) -> None:
    study = tmp_path / "s.py"
    study.write_text('"""Study: x.\n\nSee docs/other.md.\n\nQuoted by docs/a.md ("A") and\nREADME.md."""\n')
    assert _quoted_by(study) == ["docs/a.md", "README.md"]


def _imports(path: Path) -> set[str]:
    """Every module a file imports; `from a import b` counts as `a` and `a.b`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_harness_imports_no_study() -> None:
    harness = sorted((ROOT / "benchmarks").glob("*.py"))
    assert "run.py" in [p.name for p in harness]
    offenders = [
        f"{path.name} imports {name}"
        for path in harness
        for name in sorted(_imports(path))
        if name == "benchmarks.studies" or name.startswith("benchmarks.studies.")
    ]
    assert offenders == []


def test__imports_sees_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import benchmarks.studies.rings\nfrom benchmarks import studies\n")
    assert {"benchmarks.studies.rings", "benchmarks.studies"} <= _imports(module)
