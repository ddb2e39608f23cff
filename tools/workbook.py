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
``workbook: {check: NAME, stub: "def f(...):"}`` in its metadata: the one place where
the chapter declares the checker and the stub's signature.

A workbook that already exists is the learner's work: it is kept unless ``--refresh``
(``make workbook REFRESH=1``) is given, and then the old file is first copied to
``NAME.ipynb.bak``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import jupytext
import nbformat

from tools import CHAPTERS, ROOT, cell_source

OUT = ROOT / "workbook"

_EXERCISE = re.compile(r"```\{exercise\}[^\n]*\n(?P<body>.*?)\n```", re.S)
_OPTION = re.compile(r"^:(\w+):.*$", re.M)


def _is_marker(cell, name: str) -> bool:
    opening = f"```{{{name}}}"
    return cell["cell_type"] == "markdown" and cell_source(cell).lstrip().startswith(opening)


def chapter_number(name: str) -> int:
    """``04_multi_head_attention`` -> 4, the chapter's number on the site."""
    return int(name.split("_", 1)[0])


def _exercise_markdown(source: str, number: int, counter: list[int]) -> str:
    """Turn each ``{exercise}`` block into plain Markdown a notebook can show."""

    def replace(match: re.Match) -> str:
        counter[0] += 1
        body = _OPTION.sub("", match.group("body")).strip()
        return f"**Exercise {number}.{counter[0]}.** {body}"

    return _EXERCISE.sub(replace, source)


def stub_source(check: str, stub: str) -> str:
    """The cell that replaces a code-checked solution."""
    function = re.match(r"def\s+(\w+)\s*\(", stub)
    if function is None:
        raise ValueError(f"workbook stub must start with 'def name(', got {stub!r}")
    return (
        "from mha import exercises\n\n\n"
        f"{stub}\n"
        '    raise NotImplementedError("write your solution here")\n\n\n'
        f'exercises.check("{check}", {function.group(1)})'
    )


def build(name: str, chapters: Path = CHAPTERS):
    """The workbook notebook of chapter ``name`` (not written to disk)."""
    source = jupytext.read(chapters / f"{name}.md")
    number = chapter_number(name)
    counter = [0]
    cells = []
    solution: list = []
    inside = False
    for cell in source.cells:
        if _is_marker(cell, "solution-start"):
            inside, solution = True, []
            continue
        if _is_marker(cell, "solution-end"):
            inside = False
            for code in solution:
                spec = code.get("metadata", {}).get("workbook")
                if spec:
                    stub = stub_source(spec["check"], spec["stub"])
                    cells.append(nbformat.v4.new_code_cell(stub))
            # The marker's cell may go on with the chapter (the next exercise, say).
            rest = cell_source(cell).lstrip().split("```", 2)[-1].strip()
            if rest:
                text = _exercise_markdown(rest, number, counter)
                cells.append(nbformat.v4.new_markdown_cell(text))
            continue
        if inside:
            if cell["cell_type"] == "code":
                solution.append(cell)
            continue
        if cell["cell_type"] == "markdown":
            text = _exercise_markdown(cell_source(cell), number, counter)
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
