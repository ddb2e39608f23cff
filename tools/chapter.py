"""One chapter at a time: check it in under a minute.

``python -m tools.chapter check NN_slug [--site]`` (``make chapter-check NB=NN_slug``,
``SITE=1`` for the page too) runs what concerns that chapter, two lanes side by side:

* its notebook regenerated from its source into ``_build/chapter-check/`` and compared
  with the stored one as nbval compares (``tools.nbtools compare``);
* the tests that concern it (``pytest --chapter NN_slug``, see :func:`concerns`): its
  source and notebook (pairs, execution, outputs nbval may skip), its reading rules and
  prose numbers, its checkers (those the registry of ``mha.exercises`` gives it), its
  workbook (without the slow run of every workbook), its catalog (its messages
  extracted alone), and the cheap checks of the whole book's plumbing;
* with ``--site``: the strict build of both editions (``make site-build``), then the
  browser tests of the chapter's page in both editions (``tests/test_site.py -m
  browser -k NN_slug``).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from tools import ROOT

# --- which tests concern a chapter (pytest --chapter) --------------------------------


def _book_name(value: object) -> str | None:
    """The chapter or checker a test parameter names: ``04_multi_head_attention`` as
    itself, a docname, a page path or a source path; a checker's name as itself."""
    if isinstance(value, PurePath | str) and value:
        return PurePosixPath(str(value)).stem
    return None


def concerns(chapter: str, owned: set[str], known: set[str], values: Iterable[object],
             literals: set[str], plumbing: bool) -> bool:
    """Whether a test concerns ``chapter`` (whose checkers are ``owned``).

    ``known`` holds every chapter and checker of the book; ``values`` are the test's
    parameters, ``literals`` the strings its function's code spells out, and
    ``plumbing`` says it is marked as a check of the whole book's plumbing. A test
    parametrised with chapters or checkers concerns those; any other test concerns the
    chapters and checkers it names in its code (``run(capsys, "split_heads", ...)``),
    and a plumbing test concerns every chapter.
    """
    mine = {chapter} | owned
    if plumbing:
        return True
    named = {_book_name(value) for value in values} & known
    if named:
        return bool(named & mine)
    return bool(literals & mine)


def _literals(function: Callable) -> set[str]:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return set()
    return {node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def select(items: list, chapter: str) -> tuple[list, list]:
    """Split pytest's items into those that concern ``chapter`` and the others."""
    from mha import exercises
    from tools import CHAPTERS

    chapters = {path.stem for path in CHAPTERS.glob("*.md")}
    if chapter not in chapters:
        raise ValueError(f"--chapter {chapter}: no book/chapters/{chapter}.md")
    owned = set(exercises.names(chapter))
    known = chapters | set(exercises.names())
    cache: dict[Callable, set[str]] = {}
    keep, drop = [], []
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and function not in cache:
            cache[function] = _literals(function)
        callspec = getattr(item, "callspec", None)
        yes = concerns(chapter, owned, known,
                       callspec.params.values() if callspec else (),
                       cache.get(function, set()),
                       item.get_closest_marker("plumbing") is not None)
        (keep if yes else drop).append(item)
    return keep, drop


# --- the check ------------------------------------------------------------------------

# What concerns one chapter, in these files (tests/test_site.py runs on its own: it
# needs the built site). The first are parametrised by chapter or hold checks of the
# whole book's plumbing; a file of CHECKER_FILES only holds tests of named checkers, and
# is collected only when it names one of the chapter's (test_exercises_chapters.py
# imports torch, seconds of a one-chapter check that has nothing there).
TEST_FILES = ("tests/test_notebooks.py", "tests/test_prose.py", "tests/test_exercises.py",
              "tests/test_workbook.py", "tests/test_translations.py",
              "tests/test_chapter_tools.py")
CHECKER_FILES = ("tests/test_exercises_chapters.py",)
# Plugins these runs do not use (each costs start-up time in every process).
UNUSED_PLUGINS = ("nbval", "hypothesispytest", "pytest_cov", "xdist", "anyio")
# make test runs every workbook top to bottom in a kernel (minutes); nbval and the
# syntax checks of test_workbook.py already prove one chapter's.
SLOW_WORKBOOK = "test_a_workbook_runs_top_to_bottom"


@dataclass
class Stage:
    name: str
    command: list[str]
    after_success: bool = False  # skipped when the stage before it in its lane failed


def stages(name: str, site: bool) -> list[list[Stage]]:
    """The check of chapter ``name`` as lanes of stages: each lane runs its stages in
    order, the lanes side by side (one per core: each stage keeps one core busy)."""
    from mha import exercises

    py = sys.executable
    skip = [arg for plugin in UNUSED_PLUGINS for arg in ("-p", f"no:{plugin}")]
    files = [*TEST_FILES, *(
        path for path in CHECKER_FILES
        if any(f'"{check}"' in (ROOT / path).read_text() for check in exercises.names(name)))]
    notebook = Stage("notebook", [py, "-m", "tools.nbtools", "compare", name])
    tests = Stage("tests", [py, "-m", "pytest", "-q", "--chapter", name, *skip,
                            "-p", "no:playwright", "-p", "no:base_url",
                            "-m", "not browser", "-k", f"not {SLOW_WORKBOOK}", *files])
    if not site:
        return [[notebook], [tests]]
    build = Stage("site-build", ["make", "--no-print-directory", "site-build"])
    browser = Stage("browser", [py, "-m", "pytest", "-q", *skip, "tests/test_site.py",
                                "-m", "browser", "-k", name], after_success=True)
    # The build is the longest stage: it starts first, and the browser waits for it.
    return [[build, browser], [notebook, tests]]


def _run_lane(lane: list[Stage], results: dict[str, tuple[int | None, float, str]],
              logs: Path) -> None:
    failed = False
    for stage in lane:
        if stage.after_success and failed:
            results[stage.name] = (None, 0.0, "skipped: the stage before it failed")
            continue
        log = logs / f"{stage.name}.log"
        start = time.perf_counter()
        with log.open("w") as out:
            code = subprocess.run(stage.command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  env=_env(), check=False).returncode
        results[stage.name] = (code, time.perf_counter() - start, str(log))
        failed = failed or code != 0


def _env() -> dict[str, str]:
    from tools.nbtools import kernel_env

    return kernel_env()  # the kernels need figures inline and no debugger warning


def check(name: str, site: bool = False) -> int:
    """Run the check of chapter ``name``; print each stage's verdict, time and log."""
    if not (ROOT / "book" / "chapters" / f"{name}.md").exists():
        print(f"no chapter book/chapters/{name}.md", file=sys.stderr)
        return 2
    logs = ROOT / "_build" / "chapter-check" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    lanes = stages(name, site)
    results: dict[str, tuple[int | None, float, str]] = {}
    start = time.perf_counter()
    threads = [threading.Thread(target=_run_lane, args=(lane, results, logs)) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = time.perf_counter() - start
    order = [stage.name for lane in lanes for stage in lane]
    bad = [stage for stage in order if results[stage][0] != 0]
    for stage in bad:
        code, _, log = results[stage]
        if code is None:
            continue
        print(f"--- {stage} failed (exit {code}); its log, {os.path.relpath(log)}:")
        print(_tail(Path(log)))
    for stage in order:
        code, seconds, log = results[stage]
        verdict = "skipped" if code is None else "ok" if code == 0 else "FAILED"
        print(f"{stage:11} {verdict:8} {seconds:6.1f} s   {_summary(stage, code, log)}")
    print(f"{name}: {'every check passed' if not bad else 'failed'} in {total:.0f} s")
    return 1 if bad else 0


def _tail(log: Path, lines: int = 80) -> str:
    text = log.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _summary(stage: str, code: int | None, log: str) -> str:
    if code is None:
        return log
    lines = [line for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else ""


# --- the command line -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chapter",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_cmd = commands.add_parser("check", help="check one chapter (make chapter-check)")
    check_cmd.add_argument("name", help="NN_slug")
    check_cmd.add_argument("--site", action="store_true",
                           help="also build the site and check the chapter's page")
    args = parser.parse_args(argv)
    return check(args.name, args.site)


if __name__ == "__main__":
    sys.exit(main())
