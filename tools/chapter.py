"""One chapter at a time: check it in under a minute, or lay out a new one.

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

``python -m tools.chapter new NN_slug --title "..." [--title-zh "..."]`` (``make
chapter NAME=NN_slug TITLE="..."``) lays out a new chapter with every piece the tests
ask for: its source from ``tools/chapter_template/`` (learning objectives, a section,
a summary, four exercises of the three kinds with gated solutions, two of them checked
by code), its entry in ``_toc.yml``, its executed notebook, its prose-number list, its
two checkers (a module ``mha/exercises/_chNN_slug.py`` and their registry entries,
owned by the chapter), and its Chinese catalog, the skeleton translated, listed in
``locales/zh_CN/TRANSLATED``. It passes the plumbing tests as it is; every placeholder
carries the word SCAFFOLD, and ``tests/test_chapter_tools.py`` fails, naming each one,
until none is left.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from tools import ROOT

TEMPLATE = Path(__file__).resolve().parent / "chapter_template"
MARKER = "SCAFFOLD"
LANGUAGE = "zh_CN"
NAME = re.compile(r"^(?P<number>\d\d)_(?P<slug>[a-z][a-z0-9]*(?:_[a-z0-9]+)*)$")
# The appendix starts at 90 (tools.workbook.chapter_names): chapters are 01 to 89.
LAST_CHAPTER = 89


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
    # The chapter's notebook and the package, as make test's ruff stage lints them.
    lint = Stage("lint", [str(Path(py).parent / "ruff"), "check", "mha", "tests", "tools",
                          f"book/notebooks/{name}.ipynb"])
    tests = Stage("tests", [py, "-m", "pytest", "-q", "--chapter", name, *skip,
                            "-p", "no:playwright", "-p", "no:base_url",
                            "-m", "not browser", "-k", f"not {SLOW_WORKBOOK}", *files])
    if not site:
        return [[notebook], [lint, tests]]
    build = Stage("site-build", ["make", "--no-print-directory", "site-build"])
    browser = Stage("browser", [py, "-m", "pytest", "-q", *skip, "tests/test_site.py",
                                "-m", "browser", "-k", name], after_success=True)
    # The build is the longest stage: it starts first, and the browser waits for it.
    return [[build, browser], [lint, notebook, tests]]


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


# --- placeholders ---------------------------------------------------------------------

# Where a scaffold leaves placeholders (relative to the root).
PLACEHOLDER_FILES = ("book/chapters/*.md", "locales/*/LC_MESSAGES/**/*.po",
                     "tests/prose_numbers/*.toml", "mha/exercises/*.py", "_toc.yml")


def placeholders(root: Path = ROOT) -> list[str]:
    """Every line of the book's sources, catalogs, prose-number lists and checkers that
    still holds a scaffold's placeholder, as ``path:line: text``."""
    found = []
    for pattern in PLACEHOLDER_FILES:
        for path in sorted(root.glob(pattern)):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                # a catalog's English is the source's, listed from there
                if MARKER in line and not (path.suffix == ".po" and line.startswith("msgid")):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:110]}")
    return found


# --- the scaffold -----------------------------------------------------------------------


@dataclass(frozen=True)
class NewChapter:
    name: str
    title: str
    title_zh: str | None = None

    @property
    def number(self) -> int:
        return int(self.name[:2])

    @property
    def slug(self) -> str:
        return self.name[3:]

    @property
    def docname(self) -> str:
        return f"book/notebooks/{self.name}"

    @property
    def module(self) -> str:
        return f"_ch{self.name}"

    @property
    def checkers(self) -> tuple[str, str]:
        return f"{self.slug}_row_sums", f"{self.slug}_scale"

    def tokens(self) -> dict[str, str]:
        rows, scale = self.checkers
        return {"__NAME__": self.name, "__NUMBER__": str(self.number), "__TITLE__": self.title,
                "__LABEL__": f"ch{self.number}-{self.slug.replace('_', '-')}",
                "__GLUE__": f"ch{self.number}_largest_weight",
                "__ROWS__": rows, "__SCALE__": scale}

    def fill(self, text: str) -> str:
        for token, value in self.tokens().items():
            text = text.replace(token, value)
        return text


def validate(chapter: NewChapter, root: Path = ROOT) -> None:
    """Refuse a name that is not ``NN_slug`` (01 to 89, lower case), a number or a name
    the book has, or checker names the registry has."""
    match = NAME.match(chapter.name)
    if not match:
        raise ValueError(f"{chapter.name!r}: a chapter is named NN_slug (two digits, an "
                         "underscore, lower-case words joined by underscores)")
    if not 1 <= chapter.number <= LAST_CHAPTER:
        raise ValueError(f"{chapter.name}: chapters are numbered 01 to {LAST_CHAPTER} "
                         "(90 and up is the appendix)")
    if not chapter.title.strip():
        raise ValueError("a chapter needs a title (TITLE=...)")
    for path in (root / "book" / "chapters").glob("*.md"):
        if path.stem[:2] == chapter.name[:2]:
            raise ValueError(f"{chapter.name}: chapter {chapter.name[:2]} exists already "
                             f"({path.relative_to(root)})")
    registry = (root / "mha" / "exercises" / "_registry.py").read_text()
    for check in chapter.checkers:
        if f'"{check}": _Exercise(' in registry:
            raise ValueError(f"{chapter.name}: mha.exercises has a checker {check} already")


class _Changes:
    """The files a scaffold writes, so that a failure leaves the tree as it was."""

    def __init__(self) -> None:
        self.before: dict[Path, str | None] = {}

    def write(self, path: Path, text: str) -> None:
        if path not in self.before:
            self.before[path] = path.read_text(encoding="utf-8") if path.exists() else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def note(self, path: Path) -> None:
        """A file written by another tool (the notebook, the catalog)."""
        if path not in self.before:
            self.before[path] = path.read_text(encoding="utf-8") if path.exists() else None

    def undo(self) -> None:
        for path, text in self.before.items():
            if text is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(text, encoding="utf-8")


def add_to_toc(toc: str, name: str) -> str:
    """``_toc.yml`` with ``book/notebooks/<name>`` after the numbered chapter before it
    (or before the first one), in the same part."""
    lines = toc.splitlines(keepends=True)
    entries = [(i, m.group(1)) for i, line in enumerate(lines)
               if (m := re.match(r"\s*- file: book/notebooks/(\d\d_\w+)\s*$", line))
               and int(m.group(1)[:2]) <= LAST_CHAPTER]
    if not entries:
        raise ValueError("_toc.yml lists no numbered chapter to put the new one beside")
    before = [(i, n) for i, n in entries if n < name]
    index, _ = before[-1] if before else entries[0]
    indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
    entry = f"{indent}- file: book/notebooks/{name}\n"
    at = index + 1 if before else index
    return "".join(lines[:at] + [entry] + lines[at:])


def add_to_declared(text: str, docname: str) -> str:
    """``locales/<lang>/TRANSLATED`` with ``docname`` after the chapter before it."""
    lines = text.splitlines(keepends=True)
    pages = [(i, line.strip()) for i, line in enumerate(lines)
             if line.strip().startswith("book/notebooks/")]
    before = [i for i, page in pages if page < docname]
    at = before[-1] + 1 if before else (pages[0][0] if pages else len(lines))
    return "".join(lines[:at] + [docname + "\n"] + lines[at:])


def add_to_registry(source: str, chapter: NewChapter) -> str:
    """``mha/exercises/_registry.py`` with the chapter's checkers imported from their
    module and registered under the chapter's name, in the book's order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    rows, scale = chapter.checkers
    names = sorted([f"_{rows}", f"_{rows}_cases", f"_{rows}_mistakes",
                    f"_{scale}", f"_{scale}_cases", f"_{scale}_mistakes"])
    entries = "".join(
        f'    "{check}": _Exercise(\n'
        f"        _{check}_cases,\n"
        f"        ({json.dumps(output)},),\n"
        f"        {json.dumps(covers)},\n"
        f"        _{check}_mistakes(),\n"
        f"        {json.dumps(hint)},\n"
        f"        reference=_{check},\n"
        f'        chapter="{chapter.name}",\n'
        "    ),\n"
        for check, output, covers, hint in (
            (rows, "the sums", "0 to 2 batch axes, more keys than queries and fewer",
             "Add up one row of weights by hand."),
            (scale, "the scaled scores", "head_dim 4, 9 and 64",
             "Scale one score by hand: q . k / sqrt(head_dim)."),
        )
    )
    comment = (f"    # {MARKER}: {chapter.name}'s checkers as `make chapter` laid them out; "
               "replace\n    # them with the chapter's own.\n")
    registry = next(node for node in tree.body if isinstance(node, ast.AnnAssign)
                    and getattr(node.target, "id", "") == "_EXERCISES")
    keys = [(key.value, value) for key, value in zip(registry.value.keys, registry.value.values,
                                                     strict=True)]
    later = [value for _, value in keys if _owner(value) > chapter.name]
    at = later[0].lineno - 1 if later else registry.value.end_lineno - 1
    lines[at:at] = [comment + entries]
    imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)
               and node.level == 1 and node.module > chapter.module]
    statement = (f"from .{chapter.module} import (\n"
                 + "".join(f"    {name},\n" for name in names) + ")\n")
    position = imports[0].lineno - 1 if imports else next(
        node.end_lineno for node in reversed(tree.body) if isinstance(node, ast.ImportFrom))
    lines[position:position] = [statement]
    return "".join(lines)


def _owner(call: ast.expr) -> str:
    for keyword in getattr(call, "keywords", []):
        if keyword.arg == "chapter" and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return ""


def template_translations(chapter: NewChapter) -> dict[str, str]:
    """The skeleton's messages and their Chinese, shipped with the template."""
    from babel.messages.pofile import read_po

    with (TEMPLATE / f"{LANGUAGE}.po").open("rb") as f:
        catalog = read_po(f)
    return {chapter.fill(m.id): chapter.fill(m.string) for m in catalog if m.id}


def translate_catalog(po: Path, chapter: NewChapter) -> None:
    """Fill the new catalog from the template's Chinese; the title, unless given in
    Chinese, stays English with a placeholder comment for the translator."""
    from babel.messages.pofile import read_po, write_po

    table = template_translations(chapter)
    with po.open("rb") as f:
        catalog = read_po(f)
    missing = []
    for message in catalog:
        if not message.id:
            continue
        if message.id == chapter.title:
            message.string = chapter.title_zh or chapter.title
            if not chapter.title_zh:
                message.user_comments = [f"{MARKER}: translate the title (TITLE_ZH=...)"]
        elif message.id in table:
            message.string = table[message.id]
        else:
            missing.append(message.id)
            continue
        message.flags.discard("fuzzy")
    if missing:
        raise ValueError("the template's Chinese (tools/chapter_template/zh_CN.po) lacks: "
                         + "; ".join(repr(m[:60]) for m in missing))
    with po.open("wb") as f:
        write_po(f, catalog, width=0)


def extract(docname: str, pot: Path, root: Path = ROOT) -> None:
    """Extract the messages of one page into ``pot``, strictly (a new chapter's skeleton
    refers to no other page: any warning is its own), in a process of its own: Sphinx
    and its extensions warn as they run, and under pytest warnings are errors."""
    code = ("import sys; from pathlib import Path; from tools.editions import gettext; "
            "gettext(Path(sys.argv[1]), [sys.argv[2]], root=Path(sys.argv[3]), strict=True)")
    result = subprocess.run([sys.executable, "-c", code, str(pot), docname, str(root)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the extraction of {docname}'s messages failed:\n"
                           + (result.stderr or result.stdout)[-3000:])


def new(chapter: NewChapter, root: Path = ROOT, say: Callable[[str], object] = print) -> list[Path]:
    """Lay out ``chapter`` under ``root``; return the files written or changed. On a
    failure, every file is put back as it was."""
    from tools import editions, nbtools

    validate(chapter, root)
    changes = _Changes()
    chapters, notebooks = root / "book" / "chapters", root / "book" / "notebooks"
    try:
        changes.write(chapters / f"{chapter.name}.md",
                      chapter.fill((TEMPLATE / "chapter.md").read_text(encoding="utf-8")))
        toc = root / "_toc.yml"
        changes.write(toc, add_to_toc(toc.read_text(encoding="utf-8"), chapter.name))
        changes.write(root / "tests" / "prose_numbers" / f"{chapter.name}.toml",
                      f"# Numbers typed in the prose of {chapter.name}.md, each with its "
                      "reason (tests/test_prose.py).\n")
        package = root / "mha" / "exercises"
        changes.write(package / f"{chapter.module}.py",
                      chapter.fill((TEMPLATE / "checkers.py.tmpl").read_text(encoding="utf-8")))
        registry = package / "_registry.py"
        changes.write(registry, add_to_registry(registry.read_text(encoding="utf-8"), chapter))
        say(f"{chapter.name}: source, table of contents, prose numbers, checkers written; "
            "running the notebook")
        changes.note(notebooks / f"{chapter.name}.ipynb")
        nbtools.regenerate(chapter.name, chapters, notebooks)
        say(f"{chapter.name}: notebook executed; extracting its messages")
        po = root / "locales" / LANGUAGE / "LC_MESSAGES" / f"{chapter.docname}.po"
        changes.note(po)
        # Two levels under the root, as _build/gettext: the catalog's locations read
        # ../../book/notebooks/..., as `make translations` writes them.
        pot = root / "_build" / f"gettext-{chapter.name}"
        try:
            extract(chapter.docname, pot, root)
            editions.update(LANGUAGE, pot, root / "locales", quiet=True)
        finally:
            shutil.rmtree(pot, ignore_errors=True)
            shutil.rmtree(pot.parent / f".doctrees-{pot.name}", ignore_errors=True)
        translate_catalog(po, chapter)
        declared = root / "locales" / LANGUAGE / "TRANSLATED"
        changes.write(declared, add_to_declared(declared.read_text(encoding="utf-8"),
                                                chapter.docname))
    except BaseException:
        changes.undo()
        raise
    return list(changes.before)


# --- the command line -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chapter",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_cmd = commands.add_parser("check", help="check one chapter (make chapter-check)")
    check_cmd.add_argument("name", help="NN_slug")
    check_cmd.add_argument("--site", action="store_true",
                           help="also build the site and check the chapter's page")
    new_cmd = commands.add_parser("new", help="lay out a new chapter (make chapter)")
    new_cmd.add_argument("name", help="NN_slug: a number free in the book, 01 to 89")
    new_cmd.add_argument("--title", required=True, help="the chapter's title, in English")
    new_cmd.add_argument("--title-zh", help="the title in Chinese (else the catalog keeps "
                         "the English one, marked SCAFFOLD)")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.name, args.site)
    chapter = NewChapter(args.name, args.title, args.title_zh)
    try:
        written = new(chapter)
    except ValueError as error:
        print(f"make chapter: {error}", file=sys.stderr)
        return 2
    print(f"{chapter.name}: laid out; files written or changed:")
    for path in written:
        print(f"  {path.relative_to(ROOT)}")
    left = [line for line in placeholders() if chapter.name in line or chapter.module in line]
    print(f"{len(left)} placeholders to replace (grep -rn {MARKER}); then "
          f"make chapter-check NB={chapter.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
