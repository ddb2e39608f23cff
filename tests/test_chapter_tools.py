"""An author's loop (issue 31): the one-chapter check and the chapter scaffold.

* The registry's owners and the chapters' checks are compared so that each kind of
  disagreement names its chapter.
* ``pytest --chapter`` keeps the tests that concern the chapter (tools.chapter.concerns).
* ``tools.nbtools compare`` finds what nbval would find, and only that.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from tools import chapter, nbtools, workbook

pytestmark = pytest.mark.no_cover  # tools only: no mha code runs in this process


# --- who owns a checker -----------------------------------------------------------------


def test_ownership_problems_name_the_chapter():
    owners = {"a": "01_x", "b": "01_x", "c": "02_y", "d": "02_y", "e": "02_y", "f": "09_z"}
    used = {"01_x": ["a", "b", "c"], "02_y": ["d", "zz"]}
    assert workbook.ownership_problems(owners, used) == [
        "01_x: checks c, which mha.exercises gives to 02_y (a checker is practised by its "
        "own chapter only)",
        "02_y: checks zz, which mha.exercises does not register",
        "02_y: checks 1 checker(s) of its own (d), at least 2 expected",
        "02_y: owns c in mha.exercises, but no solution of it checks it (workbook: "
        "{check: c})",
        "02_y: owns e in mha.exercises, but no solution of it checks it (workbook: "
        "{check: e})",
        "09_z: owns f in mha.exercises, but is not a chapter with exercises",
    ]
    assert workbook.ownership_problems({"a": "01_x", "b": "01_x"}, {"01_x": ["a", "b"]}) == []


# --- which tests concern a chapter --------------------------------------------------------


# Made-up names: a test's parameters or literals naming the real chapters would make
# `--chapter` select this test for them.
@pytest.mark.parametrize(("values", "literals", "plumbing", "expected"), [
    (["07_heads"], set(), False, True),
    ([Path("/r/book/chapters/07_heads.md")], set(), False, True),
    (["zh_CN/book/notebooks/07_heads.html"], set(), False, True),
    (["book/notebooks/07_heads"], set(), False, True),
    (["split", "reshape only"], set(), False, True),  # a checker the chapter owns
    (["08_other"], set(), False, False),
    (["soft"], {"split"}, False, False),  # parametrised with another chapter's checker
    ([], {"split", "x"}, False, True),  # names a checker of the chapter in its code
    ([1, "a message"], {"merge"}, False, True),
    ([], {"soft"}, False, False),
    ([], set(), True, True),  # plumbing
])
def test_a_test_concerns_the_chapters_it_names(values, literals, plumbing, expected):
    known = {"07_heads", "08_other", "split", "merge", "soft"}
    assert chapter.concerns("07_heads", {"split", "merge"}, known, values, literals,
                            plumbing) is expected


# --- comparing a fresh run with the stored notebook ------------------------------------


def _notebook(*cells):
    nb = nbformat.v4.new_notebook()
    for index, (source, outputs, tags) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source, execution_count=index + 1,
                                         metadata={"tags": tags} if tags else {})
        cell.id = f"c{index}"
        cell.outputs = [nbformat.from_dict(out) for out in outputs]
        nb.cells.append(cell)
    return nb


def _stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def _data(**data):
    return {"output_type": "display_data", "data": data, "metadata": {}}


def test_the_comparison_sees_what_nbval_sees_and_nothing_else():
    stored = _notebook(
        ("print(x)", [_stream("[0.5 0.25]\n")], []),
        ("fig", [_data(**{"image/svg+xml": "<svg>a</svg>", "image/png": "AAA",
                          "text/plain": "<Figure>"})], []),
        ("train()", [_stream("loss 0.31\n")], ["nbval-ignore-output"]),
        ("obj", [_data(**{"text/plain": "<A at 0x7f00aa11bb22>"})], []),
        ("print(y)", [_stream("a\n"), _stream("b\n")], []),
    )
    fresh = nbformat.from_dict(json.loads(json.dumps(stored)))
    fresh.cells[1].outputs[0]["data"]["image/png"] = "BBB"  # nbval skips PNG
    fresh.cells[2].outputs[0]["text"] = "loss 0.29\n"  # ignored by its tag
    fresh.cells[3].outputs[0]["data"]["text/plain"] = "<A at 0x7f00cc33dd44>"  # sanitized
    fresh.cells[4].outputs = [nbformat.from_dict(_stream("a\nb\n"))]  # streams coalesced
    patterns = nbtools.sanitizers()
    assert nbtools.output_differences(stored, fresh, patterns) == []

    fresh.cells[0].outputs[0]["text"] = "[0.5 0.26]\n"
    fresh.cells[1].outputs[0]["data"]["image/svg+xml"] = "<svg>b</svg>"
    found = nbtools.output_differences(stored, fresh, patterns)
    assert [line.split(":")[0] for line in found] == [
        "cell 0 (id c0) ['print(x)']", "cell 1 (id c1) ['fig']"]
    assert "stdout differs" in found[0] and "-[0.5 0.25]" in found[0]
    assert "+[0.5 0.26]" in found[0]
    assert "image/svg+xml differs" in found[1]


def test_the_comparison_names_a_stale_notebook():
    stored = _notebook(("a = 1", [], []), ("print(a)", [_stream("1\n")], []))
    fresh = _notebook(("a = 2", [], []), ("print(a)", [_stream("1\n")], []),
                      ("b = 3", [], []))
    found = nbtools.output_differences(stored, fresh, {})
    assert found == [
        "cell 0 (id c0): its source changed since the notebook was stored (run make "
        "notebooks)",
        "cell 2 (id c2): not in the stored notebook (run make notebooks)",
    ]
    del fresh.cells[1]
    assert nbtools.output_differences(stored, fresh, {})[-1].startswith(
        "cell 1 (id c1) of the stored notebook: no longer in the source")
