"""The book's tools, run from the repository's root as ``python -m tools.NAME``.

* :mod:`tools.nbtools` regenerates the chapter notebooks and checks them against their
  sources (``make notebooks``, ``make check-notebooks``);
* :mod:`tools.workbook` writes the learner's workbook (``make workbook``);
* :mod:`tools.stages` runs the stages of ``make test`` and times them;
* :mod:`tools.simulated_cpu` runs the unit tests and nbval as if on other CPUs
  (``make portability``).

What they share lives here: where the book is, and how a cell's source reads.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "book" / "chapters"
NOTEBOOKS = ROOT / "book" / "notebooks"


def cell_source(cell) -> str:
    """A notebook cell's source as one string (nbformat may store a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src
