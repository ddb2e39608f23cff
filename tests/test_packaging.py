"""The package's declared dependencies: what ``pip install .`` brings is what mha
imports, at the versions requirements.txt pins (the book is tested with those)."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Import name -> distribution, where they differ (IPython and matplotlib_inline come
# with ipykernel, which the kernels that run mha.notebook have anyway).
DISTRIBUTION = {"IPython": "ipykernel", "matplotlib_inline": "ipykernel"}


def pins(lines: list[str]) -> dict[str, str]:
    """``{name: version}`` of ``name==version`` lines (comments and blanks skipped)."""
    found = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line!r}"
            found[name.strip().lower()] = version.strip()
    return found


def third_party_imports(package: Path) -> set[str]:
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != package.name}


def test_declared_dependencies_are_what_mha_imports_pinned_as_in_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = pins(project["dependencies"])
    extras = {name: pins(deps) for name, deps in project["optional-dependencies"].items()}
    required = pins((ROOT / "requirements.txt").read_text().splitlines())
    everything = declared | {k: v for group in extras.values() for k, v in group.items()}
    # The same versions as the environment the book is tested in.
    assert {k: required.get(k) for k in everything} == everything
    # Every distribution mha imports is declared, and nothing else is.
    imported = {DISTRIBUTION.get(n, n).lower() for n in third_party_imports(ROOT / "mha")}
    assert imported == set(everything), (imported, set(everything))
    assert set(extras["notebook"]) == {"ipykernel"}  # only mha.notebook needs it


def test_the_pins_parser_refuses_a_range():
    assert pins(["numpy==2.4.6  # comment", "", "# only a comment"]) == {"numpy": "2.4.6"}
    with pytest.raises(AssertionError, match="not an exact pin"):
        pins(["torch>=2"])
