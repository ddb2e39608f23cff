"""The learner's workbook: no answers in it, stubs that say "not implemented yet",
notebooks that run top to bottom, and a learner's work never overwritten unasked."""

from __future__ import annotations

import contextlib
import io

import jupytext
import nbformat
import numpy as np
import pytest
import workbook
from nbtools import _source_text, kernel_env

CHAPTERS = workbook.chapter_names()


def solutions(name: str) -> tuple[list, list[str]]:
    """The code cells inside the chapter's solutions, and the lines of code outside."""
    inside, code, outside = False, [], []
    for cell in jupytext.read(workbook.CHAPTERS / f"{name}.md").cells:
        if workbook._is_marker(cell, "solution-start"):
            inside = True
        elif workbook._is_marker(cell, "solution-end"):
            inside = False
        elif cell["cell_type"] == "code":
            if inside:
                code.append(cell)
            else:
                outside += [line.strip() for line in _source_text(cell).splitlines()]
    return code, outside


@pytest.fixture(scope="module")
def workbooks() -> dict:
    return {name: workbook.build(name) for name in CHAPTERS}


@pytest.mark.parametrize("name", CHAPTERS)
def test_workbook_holds_no_solution_code(workbooks, name):
    code, outside = solutions(name)
    text = "\n".join(_source_text(c) for c in workbooks[name].cells)
    lines = {line.strip() for line in text.splitlines()}
    stubs = {  # the signature is given away on purpose
        line.strip()
        for cell in code if "workbook" in cell.get("metadata", {})
        for line in cell.metadata["workbook"]["stub"].splitlines()
    }
    leaked = [
        line.strip()
        for cell in code
        for line in _source_text(cell).splitlines()
        if len(line.strip()) > 12 and line.strip() not in outside and line.strip() in lines
        and line.strip() not in stubs
        and not line.strip().startswith(("from mha import", "exercises.check("))
    ]
    assert not leaked, f"{name}: solution lines in the workbook: {leaked[:5]}"
    assert "solution-start" not in text and "solution-end" not in text


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_code_checked_exercise_has_a_stub_that_is_not_implemented(workbooks, name):
    code, _ = solutions(name)
    specs = [c.metadata["workbook"] for c in code if "workbook" in c.get("metadata", {})]
    stubs = [c for c in workbooks[name].cells if "raise NotImplementedError" in c.source]
    assert len(stubs) == len(specs)
    for spec, stub in zip(specs, stubs, strict=True):
        assert stub.source.startswith("from mha import exercises")
        assert spec["stub"] in stub.source
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(stub.source, {"np": np})  # noqa: S102 - our own generated stub
        assert "not implemented yet" in out.getvalue(), out.getvalue()


@pytest.mark.parametrize("name", CHAPTERS)
def test_exercises_are_numbered_as_on_the_site(workbooks, name):
    text = "\n".join(c.source for c in workbooks[name].cells if c.cell_type == "markdown")
    number = workbook.chapter_number(name)
    count = text.count(f"**Exercise {number}.")
    assert count >= 1 and "```{exercise}" not in text
    for i in range(1, count + 1):
        assert f"**Exercise {number}.{i}.**" in text


def test_a_learners_work_is_kept_unless_refreshed(tmp_path):
    name = CHAPTERS[0]
    workbook.write([name], tmp_path)
    path = tmp_path / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[-1].source = "my own attempt"
    nbformat.write(nb, path)
    report = workbook.write([name], tmp_path)
    assert report[0].startswith("kept")
    assert nbformat.read(path, as_version=4).cells[-1].source == "my own attempt"
    workbook.write([name], tmp_path, refresh=True)
    assert nbformat.read(path, as_version=4).cells[-1].source != "my own attempt"
    backup = nbformat.read(path.with_suffix(".ipynb.bak"), as_version=4)
    assert backup.cells[-1].source == "my own attempt"


def test_same_chapter_gives_the_same_workbook():
    name = CHAPTERS[0]
    assert nbformat.writes(workbook.build(name)) == nbformat.writes(workbook.build(name))


def test_a_stub_needs_a_function_signature():
    with pytest.raises(ValueError, match="must start with 'def name\\('"):
        workbook.stub_source("softmax", "softmax(x)")


@pytest.mark.slow
@pytest.mark.parametrize("name", CHAPTERS)
def test_workbook_runs_top_to_bottom_before_anything_is_solved(workbooks, name):
    """No later cell may depend on a solution's variables: the workbook, with every
    stub unsolved, runs without an error escaping."""
    from nbclient import NotebookClient

    nb = workbooks[name]
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(workbook.ROOT / "book" / "notebooks")}},
    )
    client.execute(env=kernel_env())  # raises CellExecutionError on an escaping error
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert outputs.count("not implemented yet") == sum(
        "raise NotImplementedError" in c.source for c in nb.cells
    )
