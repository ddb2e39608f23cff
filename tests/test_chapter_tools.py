"""An author's loop (issue 31): the one-chapter check and the chapter scaffold.

* No scaffold placeholder is left in the book (a scaffold is never a finished chapter).
* The registry's owners and the chapters' checks are compared so that each kind of
  disagreement names its chapter.
* ``pytest --chapter`` keeps the tests that concern the chapter (tools.chapter.concerns).
* ``tools.nbtools compare`` finds what nbval would find, and only that.
* ``make chapter`` lays out a chapter that passes the plumbing checks (in a temporary
  copy of the book, with one kernel and one extraction).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools import ROOT, chapter, editions, nbtools, workbook

pytestmark = pytest.mark.no_cover  # tools only: no mha code runs in this process


# --- placeholders -------------------------------------------------------------------


@pytest.mark.plumbing
def test_no_scaffold_placeholder_is_left():
    """A chapter laid out by `make chapter` passes the plumbing tests as it is: this
    test is the one that fails until every placeholder is replaced."""
    found = chapter.placeholders()
    assert not found, (
        f"{len(found)} placeholder(s) of a scaffold left ({chapter.MARKER}): replace each "
        "with the chapter's own text, exercise, checker or translation:\n  "
        + "\n  ".join(found)
    )


def test_placeholders_are_found_where_a_scaffold_leaves_them(tmp_path):
    for relative in ("book/chapters/10_x.md", "locales/zh_CN/LC_MESSAGES/book/notebooks/10_x.po",
                     "tests/prose_numbers/10_x.toml", "mha/exercises/_ch10_x.py", "_toc.yml"):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"fine\n  {chapter.MARKER}: write this\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "template.md").write_text(f"{chapter.MARKER}: not the book's\n")
    found = chapter.placeholders(tmp_path)
    assert len(found) == 5
    assert "book/chapters/10_x.md:2: SCAFFOLD: write this" in found
    assert not any(line.startswith("tools/") for line in found)


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


# --- the scaffold -------------------------------------------------------------------


def test_a_scaffold_refuses_a_name_the_book_has_or_cannot_have():
    for name, why in [("4_x", "NN_slug"), ("04_Heads", "NN_slug"), ("95_x", "01 to 89"),
                      ("04_more", "chapter 04 exists already")]:
        with pytest.raises(ValueError, match=why):
            chapter.validate(chapter.NewChapter(name, "A title"))
    with pytest.raises(ValueError, match="title"):
        chapter.validate(chapter.NewChapter("50_x", " "))


def test_a_new_chapter_goes_in_its_place():
    toc = (ROOT / "_toc.yml").read_text()
    lines = chapter.add_to_toc(toc, "04_a").splitlines()
    at = lines.index("      - file: book/notebooks/04_a")
    assert lines[at - 1].endswith("03_step_by_step")  # in the part of chapter 3
    lines = chapter.add_to_toc(toc, "00_a").splitlines()
    assert lines[lines.index("      - file: book/notebooks/00_a") + 1].endswith("01_notation")
    declared = (ROOT / "locales" / "zh_CN" / "TRANSLATED").read_text()
    lines = chapter.add_to_declared(declared, "book/notebooks/03_a").splitlines()
    at = lines.index("book/notebooks/03_a")
    assert lines[at - 1:at + 2:2] == ["book/notebooks/02_overview",
                                      "book/notebooks/03_step_by_step"]
    source = (ROOT / "mha" / "exercises" / "_registry.py").read_text()
    new = chapter.add_to_registry(source, chapter.NewChapter("04_a", "A"))
    # between chapter 3's last checker and chapter 4's first, and imported in order
    assert new.index('"add_and_norm": _Exercise(') < new.index('"a_row_sums": _Exercise(') \
        < new.index('"a_scale": _Exercise(') < new.index('"split_heads": _Exercise(')
    assert new.index("from ._attention import") < new.index("from ._ch04_a import (") \
        < new.index("from ._core import")


def _book_copy(root: Path) -> Path:
    """What a scaffold reads and writes, and what its checks need, in a copy."""
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("_config.yml", "_toc.yml", "references.bib", "pyproject.toml"):
        shutil.copy(ROOT / name, root / name)
    for folder in ("book/chapters", "book/_ext", "book/_static", "mha", "tests/prose_numbers",
                   "locales"):
        shutil.copytree(ROOT / folder, root / folder, ignore=ignore)
    (root / "book" / "notebooks").mkdir()
    shutil.copy(ROOT / "book" / "notebooks" / "ruff.toml", root / "book" / "notebooks")
    # The folders of html_extra_path, which `make setup` fills (Sphinx warns if missing).
    for folder in ("site", "model"):
        (root / "book" / "_vendor" / folder).mkdir(parents=True)
    return root


def free_name() -> str:
    """A chapter name the book does not have (the highest free number), so that these
    tests hold beside a scaffold in the book and `--chapter` never selects them."""
    taken = {path.name[:2] for path in (ROOT / "book" / "chapters").glob("*.md")}
    number = max(n for n in range(1, chapter.LAST_CHAPTER + 1) if f"{n:02d}" not in taken)
    return f"{number:02d}_scaffold_demo"


# The checks below, run in a fresh interpreter on the copy's mha: the new checkers are
# registered and owned by the chapter, pass its solutions (nbval's stored outputs say
# so), say "not implemented yet" to a stub, and tell each of their mistakes apart.
CHECKERS = """
import sys
from mha import exercises
name = sys.argv[1]
own = exercises.names(name)
assert len(own) == 2 and all(exercises.chapter_of(c) == name for c in own), own
for check in own:
    def stub(*args, **kwargs):
        raise NotImplementedError
    assert not exercises.check(check, stub)
    for mistake in exercises._EXERCISES[check].mistakes:
        assert not exercises.check(check, mistake.model)
print(" ".join(own))
"""


@pytest.mark.slow
def test_a_scaffolded_chapter_passes_the_plumbing_checks(tmp_path, monkeypatch):
    """`make chapter` in a copy of the book (one kernel, one extraction), then the checks
    the book's tests make of every chapter, run on the new one."""
    import test_notebooks
    import test_prose
    import test_translations
    import test_workbook

    root = _book_copy(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(root))  # the kernel imports the copy's mha
    name = free_name()
    new = chapter.NewChapter(name, "A demo chapter")
    written = chapter.new(new, root, say=lambda _: None)
    chapters, notebooks = root / "book" / "chapters", root / "book" / "notebooks"
    source, notebook = chapters / f"{name}.md", notebooks / f"{name}.ipynb"
    assert set(written) >= {source, notebook, root / "_toc.yml",
                            root / "mha" / "exercises" / f"{new.module}.py"}

    # Its notebook pairs with its source and was executed (no error, no stderr); the
    # table of contents lists it; the extraction it ran was strict, so Sphinx read and
    # resolved the page without a warning.
    assert nbtools.pair_problems(source, notebook) == []
    assert new.docname in editions.toc_pages(root)
    # Its reading rules and prose numbers.
    monkeypatch.setattr(nbtools, "CHAPTERS", chapters)
    monkeypatch.setattr(nbtools, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(test_prose, "ALLOWED", root / "tests" / "prose_numbers")
    test_notebooks.test_chapter_matches_its_notebook(name)
    test_notebooks.test_only_listed_cells_escape_nbval(name)
    test_notebooks.test_chapter_shows_at_most_200_lines_of_code(name)
    test_notebooks.test_chapter_has_exercises_with_hidden_solutions(name)
    for rule in (test_prose.test_typed_numbers_are_glued_or_listed_with_a_reason,
                 test_prose.test_no_doubled_word, test_prose.test_proof_is_marked_not_narrated,
                 test_prose.test_no_ordered_list_starts_inside_a_paragraph,
                 test_prose.test_markers_sit_right_above_a_hidden_cell):
        rule(source)
    assert (root / "tests" / "prose_numbers" / f"{name}.toml").exists()
    # Its workbook: built, two stubs, nothing kept that needs a solution.
    book = workbook.build(name, chapters)
    assert sum("raise NotImplementedError" in c.source for c in book.cells) == 2
    assert test_workbook.names_needed_from_solutions(
        nbtools.jupytext.read(source).cells) == []
    # Its checkers, in the copy's registry, owned by it and checked by its solutions.
    result = subprocess.run([sys.executable, "-c", CHECKERS, name], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == workbook.checks(name, chapters) \
        == list(new.checkers)
    outputs = notebook.read_text()
    for check in new.checkers:
        assert f"{check}: correct on 3 cases" in outputs
    # Its catalog: whole, declared, the markup and the glossary kept, and nothing of the
    # template's Chinese left unused.
    po = root / "locales" / "zh_CN" / "LC_MESSAGES" / f"{new.docname}.po"
    catalog = test_translations.read_catalog(po)
    assert test_translations.catalog_problems(catalog) == []
    terms = test_translations.glossary()
    assert [p for m in catalog if m.id for p in (
        *test_translations.glossary_problems(m.id, m.string, terms),
        editions.markup_problem(m.id, m.string)) if p] == []
    assert new.docname in (root / "locales" / "zh_CN" / "TRANSLATED").read_text()
    assert set(chapter.template_translations(new)) <= {m.id for m in catalog}
    # Lint, as `make lint` reads the files.
    lint = subprocess.run([str(Path(sys.executable).parent / "ruff"), "check",
                           "mha/exercises", f"book/notebooks/{name}.ipynb"],
                          cwd=root, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout
    # And its placeholders are named, each where it is.
    left = chapter.placeholders(root)
    assert any(line.startswith(f"book/chapters/{name}.md:") for line in left)
    assert any(line.startswith(f"mha/exercises/{new.module}.py:") for line in left)
    assert any(line.startswith("mha/exercises/_registry.py:") for line in left)
    assert any(f"{name}.po:" in line and "translate the title" in line for line in left)


def test_a_failed_scaffold_leaves_the_book_as_it_was(tmp_path, monkeypatch):
    root = _book_copy(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}

    def fails(*args, **kwargs):
        raise RuntimeError("the kernel died")

    monkeypatch.setattr(nbtools, "regenerate", fails)
    with pytest.raises(RuntimeError, match="the kernel died"):
        chapter.new(chapter.NewChapter(free_name(), "A demo chapter"), root, say=lambda _: None)
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.plumbing
def test_chapter_check_lints_the_chapter_as_make_test_does():
    """A chapter's check runs ruff on its notebook (make test's first stage would
    otherwise be the first to see an unsorted import), with or without the site."""
    from tools import chapter

    for site in (False, True):
        commands = [stage.command for lane in chapter.stages("01_notation", site)
                    for stage in lane]
        lint = [c for c in commands if Path(c[0]).name == "ruff"]
        assert lint and "book/notebooks/01_notation.ipynb" in lint[0], commands
