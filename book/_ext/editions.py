"""Sphinx extension: what every edition of the book (English, 中文) needs of its own.

* **A language switch** at the top of every page: a link to the same page in the other
  edition, named by its visible text in that edition's language (``lang``) and marked
  with ``hreflang``. The editions are laid out as ``_build/html/`` (English) and
  ``_build/html/<lang>/`` (see tools/editions.py).
* **A CJK web font** served by the site itself (Noto Sans SC, sliced by Unicode range:
  a page downloads only the slices holding its glyphs), in both editions: the English
  pages hold Chinese terms too. It comes last in the font stack, so Latin text keeps
  the theme's fonts and only glyphs they lack fall back to it.
* **Translated alt text.** Sphinx's gettext builder does not extract a figure's alt
  text (``mystnb.image.alt`` in the cell metadata). Every alt text is looked up in the
  page's own catalog instead, as a message of its own, when the page is written (the
  catalogs carry them: ``tools.editions update`` adds them), so a figure's alt text is
  translated, fuzzy or missing like any other message.
* **The theme's labels** that no catalog translates: myst-nb's toggles ("Show code
  cell source"), and the tooltips and accessible names of the theme's controls ("Color
  mode", "Link to this heading", ...), in ``LABELS`` and ``ATTRIBUTE_LABELS``.
* **Translated code comments.** The comments in a page's code are messages of its
  catalog too (``tools/comments.py`` says which); the code an edition shows has them
  replaced, and nothing else changed.
"""

from __future__ import annotations

import html
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tools/ (comments.py) is the repository's
    sys.path.insert(0, str(ROOT))

# The editions and the name of each one's language in that language.
EDITIONS = {"en": ("English", "en", ""), "zh_CN": ("中文", "zh-CN", "zh_CN/")}
FONT_CSS = ("_vendor/fonts/noto-sans-sc/400.css", "_vendor/fonts/noto-sans-sc/700.css")


def edition(app) -> str:
    return app.config.language if app.config.language in EDITIONS else "en"


def switch_link(current: str, pagename: str) -> str:
    """The language switch of one page: links to the same page in every other edition."""
    depth = pagename.count("/") + (1 if EDITIONS[current][2] else 0)
    up = "../" * depth
    links = []
    for code, (name, tag, folder) in EDITIONS.items():
        if code == current:
            continue
        href = f"{up}{folder}{pagename}.html"
        links.append(
            f'<a class="language-switch__link" href="{html.escape(href)}" '
            f'hreflang="{tag}" lang="{tag}">{html.escape(name)}</a>'
        )
    return '<p class="language-switch">' + " ".join(links) + "</p>\n"


# Pages whose template has no body of ours (the index, the search page): the switch
# goes in after the build, after the first of these pieces of the theme's markup.
NO_BODY: set[str] = set()
ANCHORS = ('<article class="bd-article">', '<div class="bd-search-container">')


def add_switch(app, pagename, templatename, context, doctree) -> None:
    if "body" in context:
        context["body"] = switch_link(edition(app), pagename) + context["body"]
    else:
        NO_BODY.add(pagename)


def add_switch_after_build(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for pagename in sorted(NO_BODY):
        page = Path(app.outdir, pagename + ".html")
        if not page.exists():
            continue
        text = page.read_text(encoding="utf-8")
        anchor = next((a for a in ANCHORS if a in text), None)
        if anchor is None:
            raise RuntimeError(f"editions: no place for the language switch in {pagename}")
        page.write_text(text.replace(anchor, anchor + switch_link(edition(app), pagename), 1),
                        encoding="utf-8")
    NO_BODY.clear()


def add_font(app, config) -> None:
    # The stylesheets sit in the English edition's _vendor (html_extra_path), one level
    # above _static; another edition's pages reach them one level further up.
    up = "../" * (2 if EDITIONS[edition(app)][2] else 1)
    for sheet in FONT_CSS:
        app.add_css_file(up + sheet)
    app.add_css_file("editions.css")


# --- labels that no catalog holds ---------------------------------------------

# myst-nb writes its toggles' labels from its configuration ("Show code cell {type}"),
# not through a translation.
LABELS = {
    "zh_CN": {
        "Show code cell source": "显示代码",
        "Hide code cell source": "隐藏代码",
        "Show code cell outputs": "显示输出",
        "Hide code cell outputs": "隐藏输出",
        "Show code cell output": "显示输出",
        "Hide code cell output": "隐藏输出",
        "Show code cell content": "显示代码单元",
        "Hide code cell content": "隐藏代码单元",
        # A work without a date (sphinxcontrib-bibtex writes "n.d.", "n.d.-a").
        ", n.d.-": ", 无日期 ",
        ", n.d.": ", 无日期",
    },
}


# Labels of the theme's controls (tooltips and accessible names) that neither Sphinx's
# nor the theme's Chinese catalog holds; a screen reader reads them aloud.
ATTRIBUTE_LABELS = {
    "zh_CN": {
        "Link to this heading": "链接到此标题",
        "Link to this equation": "链接到此公式",
        "Link to this image": "链接到此图片",
        "Link to this table": "链接到此表格",
        "Link to this code": "链接到此代码",
        "Toggle primary sidebar": "展开或收起左侧栏",
        "Toggle secondary sidebar": "展开或收起右侧栏",
        "Color mode": "颜色模式",
        "Search the book...": "搜索本书……",
        "Main": "主导航",
        "Page": "本页",
        # The theme's own catalog says it as in Taiwan; the book's readers print.
        "列印成 PDF": "打印为 PDF",
    },
}
ATTRIBUTE = re.compile(r'\b(title|aria-label|placeholder)="([^"]*)"')


def translate_attribute_labels(app, exception) -> None:
    """After the build (and after accessible_html, which matches the theme's markup as
    written): the theme's English labels in every page of another edition."""
    labels = ATTRIBUTE_LABELS.get(edition(app))
    if exception is not None or app.builder.format != "html" or not labels:
        return

    def local(m: re.Match) -> str:
        return f'{m.group(1)}="{labels.get(m.group(2), m.group(2))}"'

    for page in Path(app.outdir).rglob("*.html"):
        if "_vendor" in page.parts:
            continue
        text = page.read_text(encoding="utf-8")
        new = ATTRIBUTE.sub(local, text)
        for pattern, replacement in FOOTER.get(edition(app), ()):
            new = pattern.sub(replacement, new)
        # Everywhere on the page: the article, and the section titles of its sidebar.
        new = HAN_EMPHASIS.sub(r'<em class="han-emphasis">\1</em>', new)
        if new != text:
            page.write_text(new, encoding="utf-8")


# The footer as the theme writes it in Chinese ("作者： ...", "© Copyright 2026.",
# "最后更新于 2026 年 12 月 04 日."): no space after a full-width colon, the copyright
# line in Chinese (版权所有 © 2026 ...), a full-width stop and no leading zero.
FOOTER = {"zh_CN": (
    (re.compile(r'(<p class="component-author">\s*)作者：\s*'), r"\1作者："),
    (re.compile(r'(<p class="copyright">\s*)© Copyright ([^<.]*)\.'), r"\1版权所有 © \2"),
    (re.compile(r'(<p class="last-updated">\s*)最后更新于 (\d+) 年 0?(\d+) 月 0?(\d+) 日\.'),
     r"\1最后更新于 \2 年 \3 月 \4 日。"),
)}


# A solution's title names its exercise after the word (sphinx-exercise: "Solution
# to Exercise 4.1"); in Chinese the exercise comes first: 练习 4.1 解答.
SOLUTION_TITLE = {"zh_CN": (
    re.compile(r'(<p class="admonition-title">)解答(<a [^>]*>) ?([^<]*)</a>'),
    r"\1\2\3</a> 解答")}


# Emphasis on Chinese text, drawn as Chinese typography draws it (editions.css: dots
# under the characters), not with slanted glyphs.
HAN_EMPHASIS = re.compile(r"<em>([^<]*[\u3400-\u4dbf\u4e00-\u9fff][^<]*)</em>")


# A citation that names its authors in the sentence ({cite:t}: "Jain and Wallace
# [2019]", "Brown et al. [2020]") names them the Chinese way: Jain 和 Wallace, Brown 等人.
CITED_AUTHORS = re.compile(
    r'(<span id="id\d+">)((?:[^<\[]|</?em>)+)'
    r'( \[<a class="reference internal" href="[^"]*references\.html#)')
AUTHOR_WORDS = {"zh_CN": {" and ": " 和 ", " <em>et al.</em>": " 等人", " et al.": " 等人"}}


def translate_labels(app, pagename, templatename, context, doctree) -> None:
    labels = LABELS.get(edition(app))
    if labels and "body" in context:
        body = context["body"]
        for english, local in labels.items():
            body = body.replace(english, local)
        if edition(app) in SOLUTION_TITLE:
            pattern, order = SOLUTION_TITLE[edition(app)]
            body = pattern.sub(order, body)
        if edition(app) in AUTHOR_WORDS:
            words = AUTHOR_WORDS[edition(app)]

            def authors(m: re.Match) -> str:
                names = m.group(2)
                for english, local in words.items():
                    names = names.replace(english, local)
                return m.group(1) + names + m.group(3)

            body = CITED_AUTHORS.sub(authors, body)
        context["body"] = body


# --- alt text -----------------------------------------------------------------

ALT = re.compile(r'(<img\b[^>]*?\balt=")([^"]*)(")')


def translate_alt(app, pagename, templatename, context, doctree) -> None:
    if edition(app) == "en" or "body" not in context:
        return
    translator = page_catalog(app, pagename)
    if translator is None:
        return

    def swap(m: re.Match) -> str:
        text = html.unescape(m.group(2))
        found = translator.get(text)
        return m.group(1) + html.escape(found, quote=True) + m.group(3) if found else m.group(0)

    context["body"] = ALT.sub(swap, context["body"])


def page_catalog(app, pagename):
    """``{msgid: msgstr}`` of the page's catalog, translated and not fuzzy messages only."""
    from babel.messages.pofile import read_po

    for folder in app.config.locale_dirs:
        po = Path(app.confdir, folder, app.config.language, "LC_MESSAGES", pagename + ".po")
        if po.exists():
            with po.open("rb") as f:
                catalog = read_po(f)
            return {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}
    return None


# --- code comments -------------------------------------------------------------

CODE_LANGUAGES = {"ipython3", "ipython", "python"}


def translate_code_comments(app, doctree, docname) -> None:
    """Each code cell's comments in the edition's language, where its catalog has them
    (the code itself is the English code: tests/test_translations.py)."""
    if edition(app) == "en":
        return
    from docutils import nodes

    from tools import comments

    table = page_catalog(app, docname)
    if not table:
        return
    for node in doctree.findall(nodes.literal_block):
        if node.get("language") not in CODE_LANGUAGES:
            continue
        code = node.astext()
        local = comments.translate(code, table)
        if local != code:
            node.children = []
            node += nodes.Text(local)
            node.rawsource = local


# --- the parts' captions -------------------------------------------------------


def translate_captions(app, doctree) -> None:
    """The captions of the parts (_toc.yml) are extracted from the root page, but
    sphinx-external-toc adds its toctrees after Sphinx's translation ran."""
    if edition(app) == "en":
        return
    from sphinx import addnodes
    from sphinx.locale import init as init_locale
    from sphinx.util.i18n import docname_to_domain

    toctrees = [n for n in doctree.findall(addnodes.toctree) if n.get("caption")]
    if not toctrees:
        return
    domain = docname_to_domain(app.env.docname, app.config.gettext_compact)
    dirs = [str(Path(app.srcdir, d)) for d in app.config.locale_dirs]
    catalog, found = init_locale(dirs, app.config.language, domain)
    if not found:
        return
    for node in toctrees:
        node["caption"] = node["rawcaption"] = catalog.gettext(node["caption"])


def front_door_language(app, exception) -> None:
    """offline_site writes the front door's ``lang`` as Sphinx's code (zh_CN); HTML wants
    a language tag (zh-CN)."""
    if exception is not None or app.builder.format != "html" or edition(app) == "en":
        return
    door = Path(app.outdir, "index.html")
    if door.exists():
        text = door.read_text(encoding="utf-8")
        door.write_text(text.replace(f'lang="{app.config.language}"',
                                     f'lang="{EDITIONS[edition(app)][1]}"', 1),
                        encoding="utf-8")


class _TermSet(set):
    """A set that grows like the list it replaces (``extend``)."""

    extend = set.update


def fast_chinese_search() -> None:
    """Sphinx 7.4's Chinese search keeps the Latin words it has seen in a list, and
    asks that list, for every word of every page it stems, whether it holds the word:
    quadratic, 40 of the Chinese edition's 80 s of build. The same words in a set give
    the same answers (the list is read only by ``in``), and the same index."""
    from sphinx.search import languages
    from sphinx.search.zh import SearchChinese

    class FastSearchChinese(SearchChinese):
        latin_terms = _TermSet()  # shared by every instance, as the list was
        # Sphinx indexes words of two characters or more; the book's one-character
        # terms (键, 值, 头, 块) are words of its dictionary, and indexed too.
        terms: frozenset[str] = frozenset()

        def init(self, options: dict[str, str]) -> None:
            super().init(options)
            path = options.get("dict")
            if path and os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    type(self).terms = frozenset(line.split()[0] for line in f if line.strip())

        def word_filter(self, stemmed_word: str) -> bool:
            return super().word_filter(stemmed_word) or stemmed_word in self.terms

        def split(self, input: str) -> list[str]:
            """As Sphinx's, but without jieba's guesses at words its dictionaries do
            not hold (HMM), which glued 键和值 into one word: what is not a word of
            theirs is split into characters."""
            import jieba

            latin = [term.strip() for term in self.latin1_letters.findall(input)]
            self.latin_terms.extend(latin)
            return list(jieba.cut_for_search(input, HMM=False)) + latin

    languages["zh"] = FastSearchChinese


def drop_translated_backrefs(app, doctree, docname) -> None:
    """A translated paragraph that cites a work is parsed again, and docutils counts its
    citations a second and third time: on the Chinese references page, the works its
    introduction cites showed back-links "(1,2,3)", two of them to the page's title.
    The English pages show no back-links; neither do the translations."""
    if edition(app) == "en":
        return
    from docutils import nodes

    for node in doctree.findall(nodes.citation):
        node["backrefs"] = []


def adopt_translated_nodes(app, doctree) -> None:
    """Sphinx parses each translated message as a small document of its own and moves
    its nodes into the page, where they keep pointing at that small document (and its
    settings): pickled with the page, 114 of them made chapter 4's doctree 7 times
    larger than the English one and cost the Chinese build 25 s of pickling. They
    belong to the page's document."""
    for node in doctree.findall():
        if getattr(node, "document", doctree) is not doctree:
            node.document = doctree


def setup(app):
    fast_chinese_search()
    app.connect("doctree-read", adopt_translated_nodes)
    app.connect("config-inited", add_font)
    # After sphinx-external-toc has inserted the toctrees (its handler: priority 500).
    app.connect("doctree-read", translate_captions, priority=600)
    app.connect("html-page-context", add_switch)
    app.connect("build-finished", add_switch_after_build)
    # After offline_site has written the front door (its handler: priority 400).
    app.connect("build-finished", front_door_language, priority=450)
    app.connect("html-page-context", translate_alt)
    app.connect("doctree-resolved", translate_code_comments)
    app.connect("doctree-resolved", drop_translated_backrefs)
    app.connect("html-page-context", translate_labels)
    app.connect("build-finished", translate_attribute_labels, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
