"""The learner's workbook: every chapter as a notebook, with the solutions taken out.

``python -m tools.workbook [--refresh] [--out DIR] [NAME ...]`` (``make workbook``)
writes ``workbook/NN_slug.ipynb`` for each chapter (the gallery aside):

* the chapter's cells, in order, without outputs, ready to run top to bottom;
* each exercise as plain Markdown, numbered as on the site ("Exercise 4.2");
* every solution removed, its prose and its code alike;
* for an exercise checked by code, a stub in place of the solution: the function
  with its signature, raising ``NotImplementedError``, then the call to
  ``mha.exercises.check`` that tells the learner what is still wrong.

An exercise is checked by code when its solution holds a code cell with
``workbook: {check: NAME}`` in its metadata, ``NAME`` being the checker in
``mha.exercises``. The stub's signature is not written twice: it is the ``def`` line(s)
of the solution's own function, copied as written (a signature over several lines
stays so). That function is the one the cell defines at top level under the checker's
own name (one name per idea: the learner writes ``causal_mask`` for the checker
``causal_mask``); the cell's other functions, top-level helpers or nested ones, are part
of the answer and stay out of the stub. A cell that defines no function of that name,
or two, stops the build with an error naming the chapter and the exercise.

A workbook that already exists is the learner's work: it is kept unless ``--refresh``
(``make workbook REFRESH=1``) is given, and then the old file is first copied to
``NAME.ipynb.bak``.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import sys
import tokenize
from pathlib import Path

import jupytext
import nbformat

from tools import CHAPTERS, ROOT, cell_source

OUT = ROOT / "workbook"

_EXERCISE = re.compile(r"```\{exercise\}[^\n]*\n(?P<body>.*?)\n```", re.S)
_OPTION = re.compile(r"^:(\w+):.*$", re.M)
_LABEL = re.compile(r"^:label:\s*(\S+)", re.M)


def _is_marker(cell, name: str) -> bool:
    opening = f"```{{{name}}}"
    return cell["cell_type"] == "markdown" and cell_source(cell).lstrip().startswith(opening)


def chapter_number(name: str) -> int:
    """``04_multi_head_attention`` -> 4, the chapter's number on the site."""
    return int(name.split("_", 1)[0])


def _exercise_markdown(source: str, number: int, labels: dict[str, str]) -> str:
    """Turn each ``{exercise}`` block into plain Markdown a notebook can show; record
    each one's number as on the site ("4.2") under its label (or ``#2`` without one)."""

    def replace(match: re.Match) -> str:
        shown = f"{number}.{len(labels) + 1}"
        label = _LABEL.search(match.group("body"))
        labels[label.group(1) if label else f"#{len(labels) + 1}"] = shown
        body = _OPTION.sub("", match.group("body")).strip()
        return f"**Exercise {shown}.** {body}"

    return _EXERCISE.sub(replace, source)


def checked_function(source: str, check: str) -> ast.FunctionDef:
    """The function of a solution cell that the checker ``check`` checks: the one
    top-level ``def`` of that name (helpers beside it or inside it are not it)."""
    defined = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
    found = [node for node in defined if node.name == check]
    if len(found) != 1:
        names = ", ".join(node.name for node in defined) or "none"
        raise ValueError(
            f"`check: {check}` needs one top-level `def {check}(` in the solution cell "
            f"(the learner's function takes the checker's name), found {len(found)}; "
            f"functions defined: {names}"
        )
    return found[0]


def signature(source: str, function: ast.FunctionDef) -> str:
    """The ``def`` of ``function`` up to its colon, as ``source`` writes it (on one
    line or several, comments inside the parentheses kept)."""
    lines = source.splitlines(keepends=True)[function.lineno - 1:]
    depth = 0
    for token in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if token.type != tokenize.OP:
            continue
        if token.string in {"(", "[", "{"}:
            depth += 1
        elif token.string in {")", "]", "}"}:
            depth -= 1
        elif token.string == ":" and depth == 0:  # the colon that opens the body
            row, column = token.end
            return "".join(lines[:row - 1]) + lines[row - 1][:column]
    raise ValueError(f"no end to the signature of {function.name}()")


def stub_source(check: str, source: str) -> str:
    """The cell that replaces the solution cell ``source`` checked by ``check``."""
    function = checked_function(source, check)
    return (
        "from mha import exercises\n\n\n"
        f"{signature(source, function)}\n"
        '    raise NotImplementedError("write your solution here")\n\n\n'
        f'exercises.check("{check}", {function.name})'
    )


def build(name: str, chapters: Path = CHAPTERS):
    """The workbook notebook of chapter ``name`` (not written to disk)."""
    source = jupytext.read(chapters / f"{name}.md")
    number = chapter_number(name)
    labels: dict[str, str] = {}  # exercise label -> its number on the site
    cells = []
    solution: list = []
    inside, label = False, ""
    for cell in source.cells:
        if _is_marker(cell, "solution-start"):
            inside, solution = True, []
            label = cell_source(cell).split("}", 1)[1].split("\n", 1)[0].strip()
            continue
        if _is_marker(cell, "solution-end"):
            inside = False
            for code in solution:
                spec = code.get("metadata", {}).get("workbook")
                if not spec:
                    continue
                try:
                    stub = stub_source(spec["check"], cell_source(code))
                except (ValueError, SyntaxError) as error:
                    exercise = f"exercise {labels.get(label, '?')} ({label})"
                    raise ValueError(f"{name}, {exercise}: {error}") from error
                cells.append(nbformat.v4.new_code_cell(stub))
            # The marker's cell may go on with the chapter (the next exercise, say).
            rest = cell_source(cell).lstrip().split("```", 2)[-1].strip()
            if rest:
                text = _exercise_markdown(rest, number, labels)
                cells.append(nbformat.v4.new_markdown_cell(text))
            continue
        if inside:
            if cell["cell_type"] == "code":
                solution.append(cell)
            continue
        if cell["cell_type"] == "markdown":
            text = _exercise_markdown(cell_source(cell), number, labels)
            cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            metadata = {k: v for k, v in cell.get("metadata", {}).items() if k == "tags"}
            cells.append(nbformat.v4.new_code_cell(cell_source(cell), metadata=metadata))
    if inside:
        raise ValueError(f"{name}: a solution-start has no solution-end")
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = source.metadata.get(
        "kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"}
    )
    for index, cell in enumerate(nb.cells):  # stable ids: the same workbook every time
        cell["id"] = f"{name[:2]}-{index:03d}"
    nbformat.validate(nb)
    return nb


def checks(name: str, chapters: Path = CHAPTERS) -> list[str]:
    """The checkers the solutions of chapter ``name`` call (``workbook: {check: NAME}``
    on a solution's code cell), in the chapter's order."""
    found, inside = [], False
    for cell in jupytext.read(chapters / f"{name}.md").cells:
        if _is_marker(cell, "solution-start"):
            inside = True
        elif _is_marker(cell, "solution-end"):
            inside = False
        elif inside and cell["cell_type"] == "code":
            spec = cell.get("metadata", {}).get("workbook")
            if spec:
                found.append(spec["check"])
    return found


def ownership_problems(owners: dict[str, str], used: dict[str, list[str]]) -> list[str]:
    """Where the checkers' owners (``owners``: checker -> chapter, from the registry of
    ``mha.exercises``) and what the chapters check (``used``: chapter -> its checks, from
    :func:`checks`) disagree, one line each, starting with the chapter concerned:

    * a chapter checks a checker the registry gives to another chapter, or none;
    * a chapter checks fewer than two checkers of its own;
    * a registered checker is not checked by the chapter that owns it (or its owner is
      not a chapter).
    """
    problems = []
    for chapter, names in used.items():
        for check in dict.fromkeys(names):
            owner = owners.get(check)
            if owner is None:
                problems.append(f"{chapter}: checks {check}, which mha.exercises does not "
                                "register")
            elif owner != chapter:
                problems.append(f"{chapter}: checks {check}, which mha.exercises gives to "
                                f"{owner} (a checker is practised by its own chapter only)")
        own = [check for check in dict.fromkeys(names) if owners.get(check) == chapter]
        if len(own) < 2:
            problems.append(f"{chapter}: checks {len(own)} checker(s) of its own "
                            f"({', '.join(own) or 'none'}), at least 2 expected")
    for check, owner in owners.items():
        if owner not in used:
            problems.append(f"{owner}: owns {check} in mha.exercises, but is not a chapter "
                            "with exercises")
        elif check not in used[owner]:
            problems.append(f"{owner}: owns {check} in mha.exercises, but no solution of it "
                            f"checks it (workbook: {{check: {check}}})")
    return problems


def chapter_names(chapters: Path = CHAPTERS) -> list[str]:
    """Every chapter with exercises: the numbered ones, not the gallery (90_)."""
    return [p.stem for p in sorted(chapters.glob("*.md")) if chapter_number(p.stem) < 90]


def write(names: list[str], out: Path = OUT, refresh: bool = False,
          chapters: Path = CHAPTERS) -> list[str]:
    """Write the workbooks; return one line per chapter saying what happened."""
    out.mkdir(parents=True, exist_ok=True)
    report = []
    for name in names:
        target = out / f"{name}.ipynb"
        if target.exists() and not refresh:
            report.append(f"kept    {target.relative_to(out.parent)} (your work; --refresh "
                          "rewrites it after a backup)")
            continue
        if target.exists():
            shutil.copy2(target, target.with_suffix(".ipynb.bak"))
        nbformat.write(build(name, chapters), target)
        report.append(f"wrote   {target.relative_to(out.parent)}")
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="chapters (default: all)")
    parser.add_argument("--refresh", action="store_true", help="rewrite existing workbooks")
    parser.add_argument("--out", type=Path, default=OUT, help="folder (default: workbook/)")
    args = parser.parse_args(argv)
    names = args.names or chapter_names()
    for line in write(names, args.out, args.refresh):
        print(line)
    print(f"open them with `make lab`, then the folder {args.out.name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
