"""The appendix pages that are reference, not chapters: their tables and their promises.

* The shape cheat sheet (``91_shapes``): every row of its table of the layer names
  expressions in ``mha`` and the shapes they have; here each expression is evaluated on
  sizes that are all different and its shape compared with the letters. A row typed
  wrong, or an ``mha`` step whose shape changes, fails.
* Multi-head attention in plain NumPy (``92_numpy_mha``): the code a reader types in
  imports nothing of ``mha``; the one cell that does is hidden, and compares the two.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import mha
from tools import CHAPTERS, cell_source
from tools.nbtools import jupytext

SHEET = CHAPTERS / "91_shapes.md"
STANDALONE = CHAPTERS / "92_numpy_mha.md"
CODE = re.compile(r"`([^`]+)`")


def sheet_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(expressions, shapes) of each row of the first table with an ``in `mha` `` column."""

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    lines = text.replace("\u00a0", " ").splitlines()  # shapes keep their spaces unbroken
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("|") and "in `mha`" in cells(line))
    header = cells(lines[start])
    code, shape = header.index("in `mha`"), header.index("shape")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        row = cells(line)
        rows.append((CODE.findall(row[code]), CODE.findall(row[shape])))
    return rows


def namespace() -> dict:
    B, T, S, H, Dh = 2, 3, 5, 4, 6  # all different, as on the page
    D = H * Dh
    rng = np.random.default_rng(0)
    query = rng.normal(size=(B, T, D))
    key = value = rng.normal(size=(B, S, D))
    params = mha.AttentionParams.init(D, seed=0)
    pad_mask = mha.padding_mask([5, 2])
    steps = mha.multi_head_attention_steps(query, key, value, params, H, mask=pad_mask)
    causal = mha.causal_mask(T)
    sizes = {"B": B, "T": T, "S": S, "D": D, "H": H, "Dh": Dh, "1": 1}
    return {"sizes": sizes, "B": B, "T": T, "H": H, "Dh": Dh, "query": query, "key": key,
            "value": value, "params": params, "steps": steps, "pad_mask": pad_mask,
            "causal": causal}


def spelled_shape(spelled: str, sizes: dict) -> tuple[int, ...]:
    return tuple(sizes[a.strip()] for a in spelled.strip("()").split(",") if a.strip())


def sheet_problems(text: str) -> list[str]:
    ns = namespace()
    found = []
    rows = sheet_rows(text)
    assert len(rows) >= 15, f"the table of the layer has {len(rows)} rows"
    for expressions, shapes in rows:
        if len(shapes) not in (1, len(expressions)):
            found.append(f"{expressions}: one shape, or one per expression, not {shapes}")
            continue
        for expression, spelled in zip(expressions, shapes * len(expressions), strict=False):
            got = eval(expression, {}, ns).shape  # noqa: S307 - the page's own table
            want = spelled_shape(spelled, ns["sizes"])
            if got != want:
                found.append(f"{expression} is {got}, the table says {spelled} = {want}")
    return found


def test_every_row_of_the_cheat_sheet_has_the_shape_it_says():
    problems = sheet_problems(SHEET.read_text())
    assert not problems, "91_shapes.md, table of the layer:\n  " + "\n  ".join(problems)


def test_the_cheat_sheet_check_catches_a_wrong_row():
    text = SHEET.read_text().replace("\u00a0", " ").replace(
        "| `(B, H, T, Dh)` | `steps.q_heads` |", "| `(B, T, H, Dh)` | `steps.q_heads` |"
    )
    assert sheet_problems(text) == [
        "steps.q_heads is (2, 4, 3, 6), the table says (B, T, H, Dh) = (2, 3, 4, 6)"
    ]


def cells(path):
    return [(cell_source(c), c.get("metadata", {}).get("tags", []))
            for c in jupytext.read(path).cells if c["cell_type"] == "code"]


def test_the_standalone_code_imports_nothing_of_mha():
    shown = [src for src, tags in cells(STANDALONE) if "hide-input" not in tags]
    assert shown and not [src for src in shown if re.search(r"\bmha\b", src)]
    assert "def softmax" in "".join(shown) and "def multi_head_attention" in "".join(shown)


def test_the_standalone_code_is_checked_against_mha_in_a_hidden_cell():
    hidden = [src for src, tags in cells(STANDALONE) if "hide-input" in tags]
    assert any("mha.multi_head_attention(" in src and "assert_allclose" in src
               for src in hidden)


@pytest.mark.parametrize("page", [SHEET, STANDALONE], ids=lambda p: p.stem)
def test_linked_from_the_introduction(page):
    intro = (CHAPTERS.parent / "intro.md").read_text()
    assert f"notebooks/{page.stem}" in intro


GALLERY = CHAPTERS / "90_gallery.md"


def drawing_functions() -> set[str]:
    """The functions of ``mha.draw`` that return a figure."""
    import inspect

    from mha import draw

    return {name for name in draw.__all__ if inspect.isfunction(getattr(draw, name))
            and inspect.signature(getattr(draw, name)).return_annotation == "Figure"}


def shown(text: str) -> set[str]:
    """The ``draw.`` functions the page's code cells call."""
    cells = jupytext.reads(text, fmt="md:myst").cells
    code = "\n".join(cell_source(c) for c in cells if c.cell_type == "code")
    return set(re.findall(r"\bdraw\.(\w+)\(", code))


def test_the_gallery_shows_every_drawing_function_once_or_more():
    """Its introduction says it shows each drawing function; a new one must join it."""
    missing = drawing_functions() - shown(GALLERY.read_text())
    assert drawing_functions() and not missing, sorted(missing)


def test_the_gallery_check_sees_a_function_only_in_prose():
    text = ("```{code-cell} ipython3\nfig = draw.rope_figure(q, k)\n```\n\n"
            "`draw.tiles_figure` in prose\n")
    assert shown(text) == {"rope_figure"}
