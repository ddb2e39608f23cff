"""The README's map of the package (its section "Where each idea lives") stays true:
every name it lists imports, every module of mha has a place in it, and it covers the
ideas a newcomer looks for."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import mha

README = Path(__file__).resolve().parent.parent / "README.md"
# What a newcomer looks up (issue 31): each is a row of the map.
IDEAS = ("softmax", "heads", "masks", "KV cache", "grouped-query", "RoPE", "ALiBi",
         "sliding window", "tiles", "layers", "training", "decoding", "checkers", "figures",
         "length studies", "benchmark")  # fmt: skip


def map_rows() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    table = text.split("<!-- map: start -->", 1)[1].split("<!-- map: end -->", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in table.strip().splitlines()]
    return [[cell.strip() for cell in row] for row in rows[2:]]  # after the header


def names(rows: list[list[str]]) -> list[str]:
    return sorted({name for row in rows for cell in row
                   for name in re.findall(r"`(mha(?:\.\w+)*)`", cell)})


def resolve(name: str) -> object:
    """The module or object a dotted name stands for: the longest importable module,
    then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


def test_the_map_lists_names_and_covers_the_ideas():
    rows = map_rows()
    assert all(len(row) == 3 for row in rows), rows
    ideas = " ".join(row[0] for row in rows)
    assert [idea for idea in IDEAS if idea not in ideas] == []
    assert len(names(rows)) > 60


@pytest.mark.parametrize("name", names(map_rows()))
def test_every_name_in_the_map_imports(name):
    assert resolve(name) is not None


def test_every_module_of_mha_has_a_place_in_the_map():
    """A module no row names is missing from the map (private modules aside)."""
    listed = names(map_rows())
    modules = [m.name for m in pkgutil.walk_packages(mha.__path__, "mha.")
               if not any(part.startswith("_") for part in m.name.split("."))]
    missing = [m for m in modules if not any(n == m or n.startswith(m + ".") for n in listed)]
    # A package's submodules each have their own family: the package's row names it.
    missing = [m for m in missing
               if not any(m.startswith(pkg + ".") for pkg in ("mha.draw", "mha.bench",
                                                             "mha.exercises"))]
    assert missing == [], "modules of mha with no place in the README's map"


def test_a_wrong_name_does_not_resolve():
    with pytest.raises(AttributeError):
        resolve("mha.attention.no_such_function")
    with pytest.raises(ModuleNotFoundError):
        resolve("nothing_by_that_name.at_all")
