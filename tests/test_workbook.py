"""The learner's workbook: no answers in it, stubs that say "not implemented yet",
notebooks that run top to bottom, and a learner's work never overwritten unasked."""

from __future__ import annotations

import ast
import contextlib
import functools
import io
from pathlib import Path

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


@functools.cache
def built(name: str) -> nbformat.NotebookNode:
    """The chapter's workbook, built once (a chapter that cannot be built fails only
    its own tests)."""
    return workbook.build(name)


def solution_header(cell) -> tuple[ast.FunctionDef, list[str]]:
    """The function a checked solution cell defines under its checker's name, and the
    lines of its ``def`` up to its body, found here from the syntax tree alone."""
    source, check = cell_source(cell), cell.metadata["workbook"]["check"]
    function = next(node for node in ast.parse(source).body
                    if isinstance(node, ast.FunctionDef) and node.name == check)
    lines = source.splitlines()[function.lineno - 1:function.body[0].lineno - 1]
    return function, lines


def _interface(function: ast.FunctionDef) -> tuple[str, str, str]:
    """A function's name, parameters and return annotation, without their layout."""
    returns = "" if function.returns is None else ast.dump(function.returns)
    return function.name, ast.dump(function.args), returns


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_check_names_a_function_its_solution_defines(name):
    try:
        built(name)
    except ValueError as error:  # names the chapter, the exercise and the check
        pytest.fail(str(error))


@pytest.mark.parametrize("name", CHAPTERS)
def test_workbook_holds_no_solution_code(name):
    code, outside = solutions(name)
    text = "\n".join(cell_source(c) for c in built(name).cells)
    lines = {line.strip() for line in text.splitlines()}
    stubs = {  # the signature is given away on purpose, and nothing below it
        line.strip()
        for cell in code if "workbook" in cell.get("metadata", {})
        for line in solution_header(cell)[1]
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
def test_every_code_checked_exercise_has_a_stub_that_is_not_implemented(name):
    code, _ = solutions(name)
    checked = [c for c in code if "workbook" in c.get("metadata", {})]
    stubs = [c for c in built(name).cells if "raise NotImplementedError" in c.source]
    assert len(stubs) == len(checked)
    for cell, stub in zip(checked, stubs, strict=True):
        assert stub.source.startswith("from mha import exercises")
        # The solution's signature, as the chapter writes it, and the same parameters.
        solution, header = solution_header(cell)
        assert "\n".join(header) + "\n    raise NotImplementedError(" in stub.source
        given = next(n for n in ast.parse(stub.source).body if isinstance(n, ast.FunctionDef))
        assert _interface(given) == _interface(solution)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(stub.source, {"np": np})  # noqa: S102 - our own generated stub
        assert "not implemented yet" in out.getvalue(), out.getvalue()


@pytest.mark.parametrize("name", CHAPTERS)
def test_exercises_are_numbered_as_on_the_site(name):
    text = "\n".join(c.source for c in built(name).cells if c.cell_type == "markdown")
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


def test_a_stub_is_the_checked_functions_signature_as_written():
    """Helpers beside or inside the checked function stay out; a signature over several
    lines, with a comment, annotations and colons in its defaults, is copied whole."""
    solution = (
        "from mha import exercises\n\n\n"
        "def helper(a):\n    return a\n\n\n"
        "def causal_mask(size: int,  # rows: and columns\n"
        '                fill: dict[str, int] = {"a": 1},\n'
        '                key=lambda v: v[1:]) -> "np.ndarray":\n'
        '    """Lower triangle."""\n'
        "    def inner(b):\n        return b\n\n"
        "    return helper(inner(size))\n\n\n"
        'exercises.check("causal_mask", causal_mask)'
    )
    assert workbook.stub_source("causal_mask", solution) == (
        "from mha import exercises\n\n\n"
        "def causal_mask(size: int,  # rows: and columns\n"
        '                fill: dict[str, int] = {"a": 1},\n'
        '                key=lambda v: v[1:]) -> "np.ndarray":\n'
        '    raise NotImplementedError("write your solution here")\n\n\n'
        'exercises.check("causal_mask", causal_mask)'
    )
    one_line = "def softmax(x, axis=-1): return x\n"
    assert "def softmax(x, axis=-1):\n    raise" in workbook.stub_source("softmax", one_line)


def _chapter(folder: Path, solution_code: str) -> str:
    """A chapter of two exercises whose second one's solution cell is checked by
    ``causal_mask``; returns its name."""
    name = "01_tiny"
    (folder / f"{name}.md").write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n"
        "    format_name: myst\n    format_version: 0.13\n---\n\n"
        "```{exercise}\n:label: ex-first\n\n*Explain why.* One.\n```\n\n"
        "```{exercise}\n:label: ex-mask\n\n*Implement.* Two.\n```\n\n+++\n\n"
        "```{solution-start} ex-mask\n:class: dropdown\n```\n\n"
        "```{code-cell} ipython3\n---\nworkbook:\n  check: causal_mask\n---\n"
        f"{solution_code}\n```\n\n+++\n\n```{{solution-end}}\n```\n"
    )
    return name


NEEDS = ("`check: causal_mask` needs one top-level `def causal_mask(` in the solution "
         "cell (the learner's function takes the checker's name), ")


@pytest.mark.parametrize(("code", "why"), [
    ("def my_mask(size):\n    return size", NEEDS + "found 0; functions defined: my_mask"),
    ("def helper(a):\n    def causal_mask(s):\n        return s\n    return a",
     NEEDS + "found 0; functions defined: helper"),  # nested: not the learner's function
    ("if True:\n    def causal_mask(size):\n        return size",
     NEEDS + "found 0; functions defined: none"),
    ("def causal_mask(size):\n    return 1\n\n\ndef causal_mask(size):\n    return 2",
     NEEDS + "found 2; functions defined: causal_mask, causal_mask"),
    ("%time causal_mask = None", "invalid syntax (<unknown>, line 1)"),  # a magic
])
def test_a_check_without_its_function_names_the_chapter_and_exercise(tmp_path, code, why):
    name = _chapter(tmp_path, code)
    with pytest.raises(ValueError) as error:
        workbook.build(name, tmp_path)
    assert str(error.value) == f"{name}, exercise 1.2 (ex-mask): {why}"
    fixed = _chapter(tmp_path, "def causal_mask(size):\n    return size")
    assert "def causal_mask(size):\n    raise" in workbook.build(fixed, tmp_path).cells[-1].source


# --- the workbook runs top to bottom ----------------------------------------------------
#
# A workbook is its chapter with the solution cells taken out and stubs put in. nbval
# proves that the chapter runs top to bottom; so the workbook does too, unless a cell
# that stays needs a name that only a removed solution cell defined, or calls a function
# whose stub the learner has not filled in yet (it would raise NotImplementedError).
# Both are checked for every chapter from the cells' syntax (fast); that each stub,
# run unsolved, says "not implemented yet" without an error escaping is checked above
# without a kernel; and each workbook is run once for real, with the solutions in the
# stubs' place, to show that the argument holds end to end.


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
    binding before it is in a removed solution cell, or is a stub's function (which
    raises until the learner writes it)."""
    binder: dict[str, str] = {}  # name -> "kept", "solution" or "stub", latest binding
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
            problems += [f"cell {index}: {name}" + (" (a stub)" if binder[name] == "stub" else "")
                         for name in sorted(_loads(tree))
                         if binder.get(name) in ("solution", "stub")]
        for name in _module_bindings(tree.body):
            binder[name] = "solution" if inside else "kept"
        spec = cell.get("metadata", {}).get("workbook")
        if inside and spec:  # the stub that replaces this cell defines these
            binder["exercises"] = "kept"
            binder[spec["check"]] = "stub"
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
        code("def softmax(v):\n    return v", workbook={"check": "softmax"}),
        marker("solution-end"),
        code("print(answer, helper(x), softmax(x))"),  # answer and helper are gone
        code("def g(answer):\n    return answer + x"),  # a parameter: fine
        code("answer = 2\nprint(answer)"),  # bound again before use: fine
        code("softmax = np.exp\nprint(softmax(x))"),  # the stub's name bound again: fine
    ]
    # softmax in cell 5 is the stub: unsolved, it raises NotImplementedError
    assert names_needed_from_solutions(cells) == [
        "cell 5: answer", "cell 5: helper", "cell 5: softmax (a stub)"]


def checks(name: str) -> list[str]:
    """The checkers a chapter's solutions call, in order."""
    return [cell.metadata["workbook"]["check"] for cell in solutions(name)[0]
            if "workbook" in cell.metadata]


@pytest.mark.parametrize("name", CHAPTERS)
def test_each_chapter_practises_its_own_checkers(name):
    """The registry of mha.exercises names each checker's chapter: a chapter checks at
    least two checkers of its own, none of another chapter's, and every one it owns."""
    from mha import exercises

    owners = {check: exercises.chapter_of(check) for check in exercises.names()}
    # This chapter's lines depend on its own checks and the registry alone.
    problems = [p for p in workbook.ownership_problems(owners, {name: checks(name)})
                if p.startswith(f"{name}: ")]
    assert not problems, "\n".join(problems)


def solved(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The workbook with every stub replaced by its solution, as a learner who has
    solved everything would have it."""
    answers = iter(cell_source(c) for c in solutions(name)[0] if "workbook" in c.metadata)
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type == "code" and "raise NotImplementedError" in cell.source:
            cell.source = next(answers)
    assert next(answers, None) is None
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("name", CHAPTERS)
def test_a_workbook_runs_top_to_bottom(name):
    """End to end, every chapter, once: the workbook with the solutions in the stubs'
    place runs without an error escaping, and every check passes. (Unsolved, each stub
    says "not implemented yet" and the cells after it need nothing from it: see
    test_every_code_checked_exercise_has_a_stub_that_is_not_implemented and
    test_no_cell_the_workbook_keeps_needs_a_solution.)"""
    from nbclient import NotebookClient

    from tools import kernels

    nb = solved(workbook.build(name), name)  # a copy of its own: executing fills it
    client = NotebookClient(
        nb, kernel_manager_class=kernels.kernel_manager_class(), timeout=600,
        resources={"metadata": {"path": str(ROOT / "book" / "notebooks")}},
    )
    client.execute(env=kernel_env())  # raises CellExecutionError on an escaping error
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert "not implemented yet" not in outputs
    for check in checks(name):
        assert f"{check}: correct on " in outputs, check
