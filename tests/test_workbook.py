"""The learner's workbook: no answers in it, stubs that say "not implemented yet",
notebooks that run top to bottom, and a learner's work never overwritten unasked."""

from __future__ import annotations

import ast
import contextlib
import io
import re

import jupytext
import nbformat
import numpy as np
import pytest

from tools import ROOT, cell_source, workbook
from tools.nbtools import kernel_env

CHAPTERS = workbook.chapter_names()

# The workbook is built with jupytext and run in a kernel: no mha code runs in this
# process, so coverage's tracer would only slow these tests down.
pytestmark = pytest.mark.no_cover


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
                outside += [line.strip() for line in cell_source(cell).splitlines()]
    return code, outside


@pytest.fixture(scope="module")
def workbooks() -> dict:
    return {name: workbook.build(name) for name in CHAPTERS}


@pytest.mark.parametrize("name", CHAPTERS)
def test_workbook_holds_no_solution_code(workbooks, name):
    code, outside = solutions(name)
    text = "\n".join(cell_source(c) for c in workbooks[name].cells)
    lines = {line.strip() for line in text.splitlines()}
    stubs = {  # the signature is given away on purpose
        line.strip()
        for cell in code if "workbook" in cell.get("metadata", {})
        for line in cell.metadata["workbook"]["stub"].splitlines()
    }
    leaked = [
        line.strip()
        for cell in code
        for line in cell_source(cell).splitlines()
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


# --- the workbook runs top to bottom ----------------------------------------------------
#
# A workbook is its chapter with the solution cells taken out and stubs put in. nbval
# proves that the chapter runs top to bottom; so the workbook does too, unless a cell
# that stays needs a name that only a removed solution cell defined. That is checked
# for every chapter from the cells' syntax (fast), and one workbook is also run for real
# to show that the argument holds end to end.


def _module_bindings(body: list[ast.stmt]) -> set[str]:
    """Names a cell binds at module level (assignments, defs, imports, loop targets)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            targets = [n for n in ast.walk(node) if isinstance(n, ast.Name)
                       and isinstance(n.ctx, ast.Store)]
            names |= {n.id for n in targets}
            for child in ast.iter_child_nodes(node):  # if/for/with/try bodies
                if isinstance(child, ast.FunctionDef | ast.ClassDef):
                    names.add(child.name)
    return names


def _loads(tree: ast.Module) -> set[str]:
    """Names a cell reads that it does not bind itself anywhere (parameters included)."""
    loads, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return loads - bound


def names_needed_from_solutions(cells) -> list[str]:
    """``cell: name`` for every cell the workbook keeps that reads a name whose latest
    binding before it is in a removed solution cell (a stub's function name counts as
    kept: the stub defines it)."""
    binder: dict[str, str] = {}  # name -> "kept" or "solution", latest binding first
    inside, problems = False, []
    for index, cell in enumerate(cells):
        if workbook._is_marker(cell, "solution-start"):
            inside = True
        elif workbook._is_marker(cell, "solution-end"):
            inside = False
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse(cell_source(cell))
        if not inside:
            problems += [f"cell {index}: {name}" for name in sorted(_loads(tree))
                         if binder.get(name) == "solution"]
        for name in _module_bindings(tree.body):
            binder[name] = "solution" if inside else "kept"
        spec = cell.get("metadata", {}).get("workbook")
        if inside and spec:  # the stub that replaces this cell defines these
            binder["exercises"] = "kept"
            binder[re.match(r"def (\w+)", spec["stub"]).group(1)] = "kept"
    return problems


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_cell_the_workbook_keeps_needs_a_solution(name):
    cells = jupytext.read(workbook.CHAPTERS / f"{name}.md").cells
    assert names_needed_from_solutions(cells) == []


def test_the_dependency_check_sees_a_name_only_a_solution_defines():
    def code(source, **metadata):
        return nbformat.v4.new_code_cell(source, metadata=metadata)

    def marker(name):
        return nbformat.v4.new_markdown_cell(f"```{{{name}}} ex\n```")

    cells = [
        code("import numpy as np\nx = np.ones(3)"),
        marker("solution-start"),
        code("answer = x.sum()\ndef helper(a):\n    return a"),
        code("def f(v):\n    return v", workbook={"check": "softmax", "stub": "def f(v):"}),
        marker("solution-end"),
        code("print(answer, helper(x), f(x))"),  # answer and helper are gone
        code("def g(answer):\n    return answer + x"),  # a parameter: fine
        code("answer = 2\nprint(answer)"),  # bound again before use: fine
    ]
    assert names_needed_from_solutions(cells) == ["cell 5: answer", "cell 5: helper"]


@pytest.mark.slow
def test_a_workbook_runs_top_to_bottom_before_anything_is_solved(workbooks):
    """End to end, on the quickest chapter: with every stub unsolved, the workbook runs
    without an error escaping, and each stub says it is not implemented yet."""
    from nbclient import NotebookClient

    nb = workbooks[CHAPTERS[0]]
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "book" / "notebooks")}},
    )
    client.execute(env=kernel_env())  # raises CellExecutionError on an escaping error
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert outputs.count("not implemented yet") == sum(
        "raise NotImplementedError" in c.source for c in nb.cells
    )
