"""The Chinese edition never drifts from the English one (issue 26).

For every page declared translated (``locales/zh_CN/TRANSLATED``), its catalog
(``locales/zh_CN/LC_MESSAGES/<page>.po``) must hold exactly the messages the current
English page has (extracted again here, alt text included), each one translated and
none fuzzy or obsolete; and a translated message that contains a term of the glossary
(``locales/zh_CN/glossary.csv``) uses the glossary's Chinese term.

After an English change, ``make translations`` updates the catalogs and lists what
needs translating; this test fails until it is translated.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import editions

babel_pofile = pytest.importorskip("babel.messages.pofile")

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE = "zh_CN"
LOCALE = ROOT / "locales" / LANGUAGE
DECLARED = editions.declared(LANGUAGE)


def read_catalog(path: Path):
    with path.open("rb") as f:
        return babel_pofile.read_po(f)


# --- the catalog checks, as functions of a catalog (so that they can be shown failing) ---


def catalog_problems(catalog, current: set[str] | None = None) -> list[str]:
    """What stops a catalog from being a whole translation of its page: untranslated,
    fuzzy and obsolete messages, and (given the page's current messages) messages the
    catalog lacks or still holds after the English changed."""
    problems = []
    ids = set()
    for message in catalog:
        if not message.id:
            continue
        ids.add(message.id)
        if message.fuzzy:
            problems.append(f"fuzzy: {message.id[:70]!r}")
        elif not message.string:
            problems.append(f"untranslated: {message.id[:70]!r}")
    problems += [f"obsolete: {m[:70]!r}" for m in catalog.obsolete]
    if current is not None:
        problems += [f"new in English, not in the catalog: {m[:70]!r}"
                     for m in sorted(current - ids)]
        problems += [f"gone from English, still in the catalog: {m[:70]!r}"
                     for m in sorted(ids - current)]
    return problems


# --- the glossary ---


def glossary() -> list[tuple[str, str]]:
    with (LOCALE / "glossary.csv").open(encoding="utf-8") as f:
        rows = [(row["english"].strip(), row["chinese"].strip()) for row in csv.DictReader(f)]
    return sorted(rows, key=lambda row: -len(row[0]))  # longer terms first


def term_pattern(english: str) -> re.Pattern:
    words = [re.escape(w) for w in re.split(r"[ -]", english)]
    return re.compile(r"\b" + r"[ -]".join(words) + r"(?:s|es)?\b", re.IGNORECASE)


# Markup whose words are not prose: code, math, roles and their targets, URLs.
NOT_PROSE = re.compile(r"``.*?``|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\{[a-z:-]+\}|https?://\S+", re.S)
# Emphasised or quoted spans: a title or a sentence of the running example, which the
# translation may keep in English (then its words are not glossary terms).
KEPT = re.compile(r"\*[^*]+\*|\"[^\"]+\"|“[^”]+”")


def prose(msgid: str, msgstr: str) -> str:
    text = NOT_PROSE.sub(" ", msgid)
    return KEPT.sub(lambda m: " " if m.group(0).strip('*"“”') in msgstr else m.group(0), text)


def glossary_problems(msgid: str, msgstr: str, terms: list[tuple[str, str]]) -> list[str]:
    if msgstr == msgid:
        return []  # kept as it is: a display equation, a number, a code name
    text = prose(msgid, msgstr)
    problems = []
    for english, chinese in terms:  # longer terms first
        pattern = term_pattern(english)
        if pattern.search(text):
            if chinese not in msgstr:
                problems.append(f"{english!r} is not {chinese!r} in {msgstr[:60]!r}")
            # A shorter term inside this one ("embedding" in "rotary position
            # embedding") is this term's, not a term of its own.
            text = pattern.sub(" ", text)
    return problems


# --- the tests ---


def pages_asked_for(items: list[pytest.Item]) -> list[str] | None:
    """The pages whose current messages the selected tests of this module need: each
    one's ``doc``, or every page (None) as soon as one needs the whole book."""
    pages: list[str] = []
    for item in items:
        if item.module.__name__ != __name__ or "current_messages" not in item.fixturenames:
            continue
        doc = item.callspec.params.get("doc") if hasattr(item, "callspec") else None
        if doc is None:
            return None
        pages.append(doc)
    return sorted(set(pages))


def extract(pages: list[str] | None, out: Path) -> dict[str, set[str]]:
    """The messages of ``pages`` (None: the whole book), extracted now from the
    notebooks, by page. In a process of its own: Sphinx and its extensions warn as they
    run, and this test suite turns warnings into errors."""
    subprocess.run(
        [sys.executable, "-c", f"from pathlib import Path; from tools.editions import "
         f"gettext; gettext(Path({str(out)!r}), {pages!r})"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    return {pot.relative_to(out).with_suffix("").as_posix():
            {m.id for m in read_catalog(pot) if m.id} for pot in sorted(out.rglob("*.pot"))}


@pytest.fixture(scope="module")
def current_messages(request, tmp_path_factory) -> dict[str, set[str]]:
    """The messages of every declared page the selected tests ask about: the whole book
    in a full run (about 10 to 25 s), one page in about 4 s when only that page's tests
    run (``make chapter-check``)."""
    if not DECLARED:
        return {}
    pages = pages_asked_for(request.session.items)
    return extract(pages, tmp_path_factory.mktemp("gettext") / "gettext")


@pytest.mark.slow
def test_every_page_of_the_book_is_declared_translated(current_messages):
    """A page new in English has no Chinese page until it is translated and listed."""
    missing = sorted(set(current_messages) - set(DECLARED))
    assert not missing, f"not translated (run `make translations`, translate, list in " \
        f"locales/{LANGUAGE}/TRANSLATED): {missing}"


@pytest.mark.plumbing
def test_some_pages_are_declared_translated_and_have_a_catalog():
    assert DECLARED
    for doc in DECLARED:
        assert (LOCALE / "LC_MESSAGES" / f"{doc}.po").exists(), doc


@pytest.mark.slow
@pytest.mark.parametrize("doc", DECLARED)
def test_declared_page_is_wholly_translated_and_up_to_date(doc, current_messages):
    catalog = read_catalog(LOCALE / "LC_MESSAGES" / f"{doc}.po")
    problems = catalog_problems(catalog, current_messages[doc])
    assert not problems, (
        f"{doc}: run `make translations`, then translate:\n  " + "\n  ".join(problems))


# A chapter rich in references into other pages (24 roles), citations, glued numbers
# and alt text: what could make its messages depend on the pages read with it.
ALONE = "book/notebooks/04_multi_head_attention"


@pytest.mark.slow
def test_a_page_extracted_alone_has_the_messages_it_has_in_the_whole_book(
        current_messages, tmp_path):
    """``make chapter-check`` extracts one page (tools.editions.gettext with pages): it
    must find what the whole book's extraction finds on that page."""
    alone = extract([ALONE], tmp_path / "gettext")
    assert list(alone) == [ALONE]
    assert alone[ALONE] == current_messages[ALONE], (
        f"only alone: {sorted(alone[ALONE] - current_messages[ALONE])[:3]}; only in the "
        f"whole book: {sorted(current_messages[ALONE] - alone[ALONE])[:3]}")


@pytest.mark.parametrize("doc", editions.toc_pages())
def test_every_page_of_the_toc_is_declared_translated(doc):
    """As test_every_page_of_the_book_is_declared_translated, from _toc.yml, without an
    extraction: a page of its own, for one chapter's check."""
    assert doc in DECLARED, f"{doc} is not translated (run `make translations`, " \
        f"translate, list it in locales/{LANGUAGE}/TRANSLATED)"


@pytest.mark.parametrize("doc", DECLARED)
def test_declared_page_uses_the_glossary(doc):
    terms = glossary()
    catalog = read_catalog(LOCALE / "LC_MESSAGES" / f"{doc}.po")
    problems = [p for m in catalog if m.id and m.string
                for p in glossary_problems(m.id, m.string, terms)]
    assert not problems, f"{doc}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("doc", DECLARED)
def test_declared_page_keeps_every_message_markup(doc):
    """Code, math, roles (a glued number, a reference's target), links and emphasis
    come out of MyST the same in the translation as in the English message."""
    catalog = read_catalog(LOCALE / "LC_MESSAGES" / f"{doc}.po")
    problems = [p for m in catalog if m.id
                if (p := editions.markup_problem(m.id, m.string))]
    assert not problems, f"{doc}:\n  " + "\n  ".join(problems)


def comment_problems(code: str, table: dict[str, str]) -> list[str]:
    """How ``code`` with its comments translated by ``table`` is not ``code``: another
    token, or a line wider than the cell's widest line (at least 72 columns)."""
    from tools import comments

    local = comments.translate(code, table)
    problems = []
    if comments.code_tokens(local) != comments.code_tokens(code):
        problems.append(f"the code changed: {code[:60]!r}")
    room = max([72] + [comments.width(line) for line in code.splitlines()])
    problems += [f"{comments.width(line)} columns (room {room}): {line.strip()[:50]!r}"
                 for line in local.splitlines() if comments.width(line) > room]
    return problems


@pytest.mark.parametrize("doc", [d for d in DECLARED if (ROOT / f"{d}.ipynb").exists()])
def test_declared_page_translates_comments_and_nothing_else_in_its_code(doc):
    """Every code cell, its comments translated by the page's catalog, is the English
    code token for token, and no line of it is wider than the cell allows."""
    import json

    catalog = read_catalog(LOCALE / "LC_MESSAGES" / f"{doc}.po")
    table = {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}
    cells = json.loads((ROOT / f"{doc}.ipynb").read_text(encoding="utf-8"))["cells"]
    problems = [p for cell in cells if cell["cell_type"] == "code"
                for p in comment_problems("".join(cell["source"]), table)]
    assert not problems, f"{doc}:\n  " + "\n  ".join(problems)


def test_the_spacing_rule_is_read_from_the_page_as_shown():
    def problems(body: str) -> list[str]:
        return editions.spacing_problems(f'<article class="bd-article">{body}</article>')

    assert problems("<p>练习 4.1 和练习 4.2 会用 <code>mask</code> 遮住。</p>") == []
    assert problems("<p>练习 4.1和练习</p>")  # digit then Chinese
    assert problems('<p>用<code class="literal">mask</code> 遮住</p>')  # code is Latin
    assert problems('<p>像 <a href="#x">把 Q 重塑成多个头</a> 中那样</p>')  # spaces at a link
    assert problems('<p>像「<a href="#x">把 Q 重塑成多个头</a>」一节中那样</p>') == []
    assert problems('<p>见 <span class="math">\\(x\\)</span> 式</p>') == []
    # Titles quoted as written, citations and code blocks keep their own spacing.
    assert problems("<p>文章《Transformer三种注意力》很好</p>") == []
    assert problems('<p>见 <a href="../references.html#id18">Transformer三种</a></p>') == []
    assert problems("<pre>x = 1  # 查询q</pre><p>好</p>") == []


def test_a_comment_is_translated_alike_on_every_page():
    """The same code comment (the set-up cell's, a shape's note) reads the same on
    every Chinese page."""
    seen: dict[str, dict[str, list[str]]] = {}
    for doc in DECLARED:
        for m in read_catalog(LOCALE / "LC_MESSAGES" / f"{doc}.po"):
            if m.id and m.string and any("code comment" in c for c in m.auto_comments):
                seen.setdefault(m.id, {}).setdefault(m.string, []).append(doc)
    differ = {msgid: ways for msgid, ways in seen.items() if len(ways) > 1}
    assert not differ, sorted(differ.items())[:5]


def test_comments_are_found_translated_and_wrapped_as_said():
    from tools import comments

    code = ("x = f(1)  # the queries, one per token\n"
            "# Split the width into heads:\n# each head sees Dh columns.\n"
            "    # an indented remark here\n"
            "y = g(x)  # (B, T, D)\n")
    found = comments.units(code)
    assert [(u.first, u.last, u.inline) for u in found] == [
        (0, 0, True), (1, 2, False), (3, 3, False), (4, 4, True)]
    assert comments.messages(code) == [
        "the queries, one per token", "Split the width into heads:\neach head sees Dh columns.",
        "an indented remark here"]  # a shape is not a message
    message = [comments.is_message(comments.Unit(0, 0, 0, True, text, 0)) for text in (
        "(B, Hkv, T, Dh)", "(S, Dh) @ (Dh,) -> (S,)", "noqa: E501 two words",
        "2. split: (B, L, D) -> (B, H, L, Dh)", "(sentence, its noun, the other noun)",
        "prefill")]
    assert message == [False, False, False, True, True, True]
    long = "把模型的宽度拆成多个头（每个头一份），每个头只看 Dh 列。" * 3
    table = {"the queries, one per token": "查询，每个词元一个",
             "Split the width into heads:\neach head sees Dh columns.": long}
    local = comments.translate(code, table)
    assert local.startswith("x = f(1)  # 查询，每个词元一个\n# 把模型")
    assert comment_problems(code, table) == []
    block = [line for line in local.splitlines() if line.startswith("# ")]
    assert len(block) > 2 and all(comments.width(line) <= comments.WRAP for line in block)
    # A line ends a phrase where it can: after Chinese punctuation, else at a space.
    assert comments.wrap("甲乙丙丁戊己庚辛，壬癸子丑寅卯辰巳午未", 20)[0].endswith("，")
    assert comments.balanced("(S,) < (B, 1)：s < lengths[b] 时是真实词元", 30)[1].startswith("s < ")
    # Balanced: no short last line ("词" / "元" on a line of its own).
    assert min(map(comments.width, block)) > comments.WRAP // 2, block
    # Never a closing mark first on a line, never an opening one last, never "Dh" split.
    assert not [line for line in block[1:] if line[2] in comments.NO_START]
    assert not [line for line in block if line[-1] in comments.NO_END]
    assert "".join(line[2:] for line in block).replace(" ", "") == long.replace(" ", "")
    # A translation cannot add code (an inline one stays on its line), and one that
    # overflows is caught.
    assert comments.translate(code, {"the queries, one per token": "查询\nz = 1"}).startswith(
        "x = f(1)  # 查询 z = 1\n")
    assert comment_problems(code, {"the queries, one per token": "很长的注释" * 20})
    # Not Python (a shell line), no units; the code is left alone.
    assert comments.units("!pip install x  # two words") == []


@pytest.mark.plumbing
def test_glossary_terms_are_unique_and_each_has_a_chinese_term():
    terms = glossary()
    assert len({e.lower() for e, _ in terms}) == len(terms)
    assert all(chinese for _, chinese in terms)


def test_the_checks_catch_what_they_are_for():
    from babel.messages.catalog import Catalog

    catalog = Catalog(locale=LANGUAGE)
    catalog.add("Masks", "掩码")
    catalog.add("Heads", "")
    catalog.add("Keys", "键", flags=["fuzzy"])
    catalog.obsolete["Old"] = catalog["Masks"]
    found = " ".join(catalog_problems(catalog, {"Masks", "Heads", "Keys", "Values"}))
    for word in ("untranslated: 'Heads'", "fuzzy: 'Keys'", "obsolete: 'Old'",
                 "not in the catalog: 'Values'"):
        assert word in found
    terms = glossary()
    assert glossary_problems("A mask hides keys.", "遮罩屏蔽了一些键。", terms)
    assert not glossary_problems("A mask hides keys.", "掩码屏蔽了一些键。", terms)
    # A term inside a longer one is the longer one's (no 嵌入 asked of RoPE's name).
    assert not glossary_problems("Rotary position embedding turns keys.",
                                 "旋转位置编码旋转键。", terms)
    assert glossary_problems("Rotary position embedding turns keys.", "RoPE 旋转键。", terms)
    # Code, math and a title kept in English are not prose.
    assert not glossary_problems("`padding_mask` and $QK^T$", "`padding_mask` 和 $QK^T$", terms)
    assert not glossary_problems("*Attention Is All You Need*",
                                 "*Attention Is All You Need*", terms)
    # Markup: a glued number or a code span dropped, a reference's target changed, and
    # bold that MyST does not open beside a Chinese quotation mark.
    glued = "Its weight is {glue:text}`02_overview.ipynb::ch2_w:s` for `dog`."
    assert editions.markup_problem(glued, "它的权重是 0.82，对应 `dog`。")
    assert editions.markup_problem(glued, "它的权重是 {glue:text}`02_overview.ipynb::ch2_w:s`。")
    assert not editions.markup_problem(
        glued, "`dog` 的权重是 {glue:text}`02_overview.ipynb::ch2_w:s`。")
    ref = "See {ref}`the masks <masks>`."
    assert not editions.markup_problem(ref, "见 {ref}`掩码一节 <masks>`。")
    assert editions.markup_problem(ref, "见 {ref}`掩码一节 <mask>`。")
    assert editions.markup_problem("A **\"word\"** here", "这里的**“词”**")
    assert not editions.markup_problem("A **word** here", "这里的**词**")
    # A link's target, changed or dropped, named in the report.
    link = "See [the paper](https://arxiv.org/abs/1706.03762)."
    assert not editions.markup_problem(link, "见[论文](https://arxiv.org/abs/1706.03762)。")
    for changed in ("见[论文](https://arxiv.org/abs/1706.0376)。", "见论文。"):
        problem = editions.markup_problem(link, changed)
        assert problem and "lost link: https://arxiv.org/abs/1706.03762" in problem
    image = "A head ![its weights](img/head.png) here."
    assert not editions.markup_problem(image, "一个头 ![它的权重](img/head.png)。")
    assert "lost image: img/head.png" in editions.markup_problem(image, "![权重](img/h.png)")


def test_the_references_notes_are_messages_and_reach_the_edition(tmp_path, monkeypatch):
    """Every ``note`` of references.bib is a message of the bibliography's page; the
    edition's copy of references.bib carries the translated notes and nothing else
    changed."""
    bib = editions.BIB.read_text(encoding="utf-8")
    notes = editions.bib_notes(bib)
    assert len(notes) == len(re.findall(r"^\s*(note|howpublished)\s*=", bib, re.M)) > 0
    assert editions.bibliography_page() == "book/references"
    monkeypatch.setattr(editions, "BUILD", tmp_path)
    copy = editions.translated_bib(LANGUAGE).read_text(encoding="utf-8")
    catalog = {m.id: m for m in read_catalog(
        LOCALE / "LC_MESSAGES" / f"{editions.bibliography_page()}.po") if m.id}
    pairs = zip(bib.splitlines(), copy.splitlines(), strict=True)
    changed = [(a, b) for a, b in pairs if a != b]
    assert len(changed) == sum(1 for _, _, n in notes if catalog.get(n) and catalog[n].string
                               and not catalog[n].fuzzy and catalog[n].string != n)
    for english, local in changed:
        assert english.split("{")[0] == local.split("{")[0]  # the same field, translated


def test_a_fuzzy_or_untranslated_note_stays_english(tmp_path, monkeypatch):
    """Only a translated message that is not fuzzy replaces its note: a fuzzy one is a
    translation of an older English note."""
    from babel.messages.catalog import Catalog

    bib = tmp_path / "references.bib"
    bib.write_text("@misc{a,\n  note = {Blog post},\n}\n@misc{b,\n  note = {Lecture notes},\n}\n"
                   "@misc{c,\n  howpublished = {Video},\n}\n", encoding="utf-8")
    catalog = Catalog(locale=LANGUAGE)
    catalog.add("Blog post", "博客文章")
    catalog.add("Lecture notes", "讲义", flags=["fuzzy"])
    catalog.add("Video", "")
    po = tmp_path / "LC_MESSAGES" / "book" / "references.po"
    po.parent.mkdir(parents=True)
    with po.open("wb") as f:
        babel_pofile.write_po(f, catalog)
    monkeypatch.setattr(editions, "BIB", bib)
    monkeypatch.setattr(editions, "BUILD", tmp_path / "build")
    monkeypatch.setattr(editions, "catalogs", lambda language: tmp_path / "LC_MESSAGES")
    monkeypatch.setattr(editions, "bibliography_page", lambda: "book/references")
    copy = editions.translated_bib(LANGUAGE).read_text(encoding="utf-8")
    assert copy == bib.read_text(encoding="utf-8").replace("{Blog post}", "{博客文章}")


def test_the_site_title_and_the_status_count_a_fuzzy_message_as_not_translated(
        tmp_path, monkeypatch):
    """The edition's title is taken only from a translated message that is not fuzzy,
    and ``status`` counts fuzzy messages apart from the translated ones."""
    import yaml
    from babel.messages.catalog import Catalog

    title = yaml.safe_load((ROOT / "_config.yml").read_text())["title"]
    root = yaml.safe_load((ROOT / "_toc.yml").read_text())["root"]
    po = tmp_path / LANGUAGE / "LC_MESSAGES" / f"{root}.po"
    po.parent.mkdir(parents=True)
    monkeypatch.setattr(editions, "LOCALES", tmp_path)
    for fuzzy, expected in ((True, None), (False, "多头注意力")):
        catalog = Catalog(locale=LANGUAGE)
        catalog.add(title, "多头注意力", flags=["fuzzy"] if fuzzy else [])
        catalog.add("Heads", "头")
        catalog.add("Keys", "")
        with po.open("wb") as f:
            babel_pofile.write_po(f, catalog)
        assert editions.translated_title(LANGUAGE) == expected
        assert editions.stats(po) == {"translated": 2 - fuzzy, "fuzzy": int(fuzzy),
                                      "untranslated": 1, "obsolete": 0}


def test_the_edition_shares_only_identical_files_with_the_english_one(tmp_path):
    """A file of _static, _images or _sources that is byte for byte the English one is
    removed and the pages point one folder up at the English copy; a file that differs
    stays, and so do the links to it."""
    english, edition = tmp_path / "en", tmp_path / "en" / "zh_CN"
    for site, differs in ((english, b"english"), (edition, b"chinese")):
        (site / "_static").mkdir(parents=True)
        (site / "_static" / "same.css").write_bytes(b"body {}")
        (site / "_static" / "own.js").write_bytes(differs)
    page = edition / "book" / "page.html"
    page.parent.mkdir(parents=True)
    page.write_text('<link href="../_static/same.css"><script src="../_static/own.js">',
                    encoding="utf-8")
    assert editions.share_with_english(edition, english) == (1, len(b"body {}"))
    assert not (edition / "_static" / "same.css").exists()
    assert (edition / "_static" / "own.js").read_bytes() == b"chinese"
    assert page.read_text(encoding="utf-8") == (
        '<link href="../../_static/same.css"><script src="../_static/own.js">')
    assert (english / "_static" / "same.css").exists()  # the target of the new link


def test_a_note_over_two_lines_is_refused():
    with pytest.raises(ValueError, match="one line"):
        editions.bib_notes("@misc{a,\n  note = {two\n  lines},\n}")
    assert editions.bib_notes("@misc{a,\n  note = {one line},\n}") == [("a", 2, "one line")]
