"""The book's other editions: one set of notebooks, one gettext catalog per page.

The English site is built by ``jupyter-book build`` into ``_build/html``. Every other
edition is built here by the same machinery (Jupyter Book's ``build_sphinx``, the same
``_config.yml`` and ``_toc.yml``), with Sphinx's ``language`` set and the catalogs of
``locales/<lang>/LC_MESSAGES`` applied, into ``_build/html/<lang>/``. What does not
change with the language is not copied: MathJax is loaded from the English edition's
``_vendor``, and every file of ``_static``, ``_images`` or ``_sources`` that is byte for byte the
English one is removed from the edition and its pages point at the English file.
The notes of the references (``note`` and ``howpublished`` in references.bib) are
messages of the page that holds the bibliography, and an edition reads a copy of
references.bib with them translated.

    python -m tools.editions gettext         # extract the messages (_build/gettext)
    python -m tools.editions update zh_CN    # merge them into the catalogs, list the work
    python -m tools.editions build zh_CN     # build the edition (after the English one)
    python -m tools.editions status zh_CN    # what is left to translate, per catalog
    python -m tools.editions check zh_CN [page ...]   # translations that lost markup, and
                                             # spacing against the rule (built edition)
    python -m tools.editions fonts           # cut the CJK font to the site's characters
"""

from __future__ import annotations

import argparse
import collections
import html.parser
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCALES = ROOT / "locales"
BUILD = ROOT / "_build"
HTML = BUILD / "html"
POT = BUILD / "gettext"
LANGUAGES = ("zh_CN",)
# Folders of an edition whose files may be shared with the English edition.
SHARED_DIRS = ("_static", "_images", "_sources")


def overrides(language: str | None) -> dict:
    """Sphinx settings of an edition, on top of ``_config.yml``."""
    settings = {
        "external_toc_path": "_toc.yml",
        "nitpicky": True,
        "latex_individualpages": False,
        # One catalog per page (book/notebooks/01_notation.po), not one per folder.
        "gettext_compact": False,
        "locale_dirs": [str(LOCALES)],
    }
    if language:
        settings |= {
            "language": language,
            # The book's title, from the root page's catalog (where it is its heading).
            **({"html_title": title} if (title := translated_title(language)) else {}),
            # MathJax is the English edition's copy (one level up).
            "html_extra_path": [],
            "mathjax_path": "../../_vendor/mathjax/tex-chtml.js",
            "bibtex_bibfiles": [str(translated_bib(language))],
            # jieba splits the pages into words with the book's terms as words of
            # their own (book/_ext/editions.py indexes the one-character ones too).
            "html_search_options": {"dict": str(search_dictionary(language))},
            # The solutions' toggles: sphinx-togglebutton's catalog has no Chinese.
            **TOGGLE_HINTS.get(language, {}),
            # The footer's author and copyright holder, in the edition's language.
            **({"author": AUTHORS[language],
                "copyright": f"{book_config()['copyright']} {AUTHORS[language]}"}
               if language in AUTHORS else {}),
        }
    return settings


AUTHORS = {"zh_CN": "mha 课程团队"}
TOGGLE_HINTS = {"zh_CN": {"togglebutton_hint": "点击显示",
                           "togglebutton_hint_hide": "点击隐藏"}}


# A query is split as Sphinx's search page splits it (searchtools.js: on every run of
# characters that are not letters, numbers or "_"), and each piece must be a word of
# the index.
QUERY_SPLIT = re.compile(r"[^\w]+")


def search_terms(language: str) -> list[str]:
    """The words the edition's search must find as words: the glossary's terms (each
    piece of a term the search page splits, as "KV 缓存"), and the compounds of
    ``search_terms.txt`` (多头自注意力), longest first."""
    import csv

    with (LOCALES / language / "glossary.csv").open(encoding="utf-8") as f:
        terms = [row["chinese"].strip() for row in csv.DictReader(f)]
    extra = LOCALES / language / "search_terms.txt"
    if extra.exists():
        terms += [line.split("#")[0].strip() for line in extra.read_text("utf-8").splitlines()]
    pieces = {piece for term in terms for piece in QUERY_SPLIT.split(term)
              if piece and not piece.isascii()}
    return sorted(pieces, key=lambda t: (-len(t), t))


def search_dictionary(language: str) -> Path:
    """jieba's user dictionary for the edition's search index (one word a line, no
    frequency: jieba then gives each the frequency that keeps it whole)."""
    path = BUILD / f"search-{language}.dict"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{term}\n" for term in search_terms(language))
    if not path.exists() or path.read_text("utf-8") != text:
        path.write_text(text, "utf-8")
    return path


def book_config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "_config.yml").read_text())


def translated_title(language: str) -> str | None:
    import yaml
    from babel.messages.pofile import read_po

    title = book_config()["title"]
    root = yaml.safe_load((ROOT / "_toc.yml").read_text())["root"]
    po = LOCALES / language / "LC_MESSAGES" / f"{root}.po"
    if not po.exists():
        return None
    with po.open("rb") as f:
        message = read_po(f).get(title)
    return message.string if message and message.string and not message.fuzzy else None


def sphinx(builder: str, outdir: Path, doctrees: Path, language: str | None = None,
           root: Path = ROOT, settings: dict | None = None, strict: bool = True) -> int:
    """Build the book at ``root`` with ``builder``: every page read afresh, and with
    ``strict`` any warning an error (otherwise Sphinx says nothing)."""
    from jupyter_book.sphinx import build_sphinx

    return build_sphinx(
        root,
        outdir,
        noconfig=True,
        path_config=str(root / "_config.yml"),
        confoverrides=overrides(language) | (settings or {}),
        doctreedir=doctrees,
        builder=builder,
        force_all=True,
        freshenv=True,
        warningiserror=strict,
        keep_going=True,
        really_quiet=not strict,
    )


def toc_pages(root: Path = ROOT) -> list[str]:
    """Every page ``_toc.yml`` lists (docnames), the root page first, in reading order."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(node: dict) -> None:
        for key in ("parts", "chapters", "sections"):
            for entry in node.get(key, []):
                if "file" in entry:
                    pages.append(entry["file"])
                walk(entry)

    walk(toc)
    return pages


def gettext(outdir: Path = POT, pages: list[str] | None = None, root: Path = ROOT,
            strict: bool | None = None) -> None:
    """Extract the messages of every page, or of ``pages`` only (docnames), into
    ``<outdir>/<docname>.pot`` (emptied first), alt text, code comments and the references' notes
    included.

    Given ``pages``, Sphinx reads those pages alone, through a table of contents that
    lists nothing else: a chapter takes about 4 s instead of the whole book's 10 to
    25 s. A page's messages do not depend on the other pages (tests/test_translations.py
    compares the two extractions of a chapter), except the root page's: the parts'
    captions of the table of contents are its messages, so asking for it extracts the
    whole book. References into the pages left out cannot resolve: such warnings are
    not errors here (the strict site build reports the real ones), unless ``strict``
    says so (a page that refers to no other, as a new chapter's skeleton).
    """
    import yaml

    shutil.rmtree(outdir, ignore_errors=True)
    doctrees = outdir.parent / f".doctrees-{outdir.name}"
    settings, whole = {}, True
    if pages is not None:
        listed = toc_pages(root)
        if unknown := sorted(set(pages) - set(listed)):
            raise ValueError(f"not pages of _toc.yml: {unknown}")
        if listed[0] not in pages:
            toc = doctrees / "_toc.yml"
            toc.parent.mkdir(parents=True, exist_ok=True)
            chapters = {"chapters": [{"file": p} for p in pages[1:]]} if pages[1:] else {}
            toc.write_text(yaml.safe_dump({"format": "jb-book", "root": pages[0]} | chapters))
            settings, whole = {"external_toc_path": str(toc)}, False
    status = sphinx("gettext", outdir, doctrees, root=root, settings=settings,
                    strict=whole if strict is None else strict)
    if status:
        sys.exit(status)
    for pot in sorted(outdir.rglob("*.pot")):
        page = root / pot.relative_to(outdir).with_suffix("")
        if page.with_suffix(".ipynb").exists():
            add_alt_texts(pot, page.with_suffix(".ipynb"), root)
        source = page.with_suffix(".md")
        if source.exists() and "{bibliography}" in source.read_text(encoding="utf-8"):
            add_bib_notes(pot, root / "references.bib")


# --- the references' notes -------------------------------------------------------

BIB = ROOT / "references.bib"
BIB_KEY = re.compile(r"^@\w+\{([^,\s]+),")
# The fields of a reference written in words, each on one line: note = {...},
BIB_FIELDS = ("note", "howpublished")
BIB_NOTE = re.compile(r"^(\s*(?:" + "|".join(BIB_FIELDS) + r")\s*=\s*\{)(.*)(\},?\s*)$")
BIB_ANY = re.compile(r"^\s*(?:" + "|".join(BIB_FIELDS) + r")\s*=")


def bib_notes(text: str) -> list[tuple[str, int, str]]:
    """(entry key, line number, text) of every ``note`` and ``howpublished`` field of a
    .bib file, in the order of the file."""
    notes, key = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if m := BIB_KEY.match(line):
            key = m.group(1)
        elif (m := BIB_NOTE.match(line)) and key:
            notes.append((key, number, m.group(2)))
        elif BIB_ANY.match(line):
            raise ValueError(f"references.bib:{number}: a note must sit on one line")
    return notes


def bibliography_page(root: Path = ROOT) -> str:
    """The docname of the page with the ``{bibliography}`` directive."""
    pages = [p for p in sorted((root / "book").rglob("*.md"))
             if "{bibliography}" in p.read_text(encoding="utf-8")]
    if len(pages) != 1:
        raise RuntimeError(f"editions: expected one page with the bibliography, got {pages}")
    return pages[0].relative_to(root).with_suffix("").as_posix()


def add_bib_notes(pot: Path, bib: Path = BIB) -> None:
    """The gettext builder does not see the references' notes (sphinxcontrib-bibtex
    formats them when the page is written): add them to the page's template."""
    from babel.messages.pofile import read_po, write_po

    with pot.open("rb") as f:
        catalog = read_po(f)
    for key, number, note in bib_notes(bib.read_text(encoding="utf-8")):
        if note in catalog:  # "WeChat article", three times: one message
            catalog[note].locations.append(("../../references.bib", number))
            continue
        catalog.add(note, locations=[("../../references.bib", number)],
                    auto_comments=[f"note of the reference {key} (references.bib)"])
    with pot.open("wb") as f:
        write_po(f, catalog, width=0)


def translated_bib(language: str) -> Path:
    """A copy of references.bib with each note the edition's catalog translates (an
    untranslated or fuzzy one stays English), in the build folder."""
    from babel.messages.pofile import read_po

    po = catalogs(language) / f"{bibliography_page()}.po"
    table = {}
    if po.exists():
        with po.open("rb") as f:
            table = {m.id: m.string for m in read_po(f) if m.id and m.string and not m.fuzzy}
    lines = BIB.read_text(encoding="utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        if (m := BIB_NOTE.match(line)) and m.group(2) in table:
            lines[i] = m.group(1) + table[m.group(2)] + m.group(3)
    out = BUILD / f"references-{language}.bib"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(lines), encoding="utf-8")
    return out


def alt_texts(notebook: Path) -> list[tuple[str, int]]:
    """Each figure's alt text (cell metadata ``mystnb.image.alt``) and its cell's index."""
    import json

    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = []
    for index, cell in enumerate(cells):
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
        if alt:
            found.append((alt, index))
    return found


def code_comments(notebook: Path) -> list[tuple[str, int]]:
    """Each code cell's comment messages (tools/comments.py) and the cell's index."""
    import json

    from tools import comments

    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [(text, index) for index, cell in enumerate(cells) if cell["cell_type"] == "code"
            for text in comments.messages("".join(cell["source"]))]


def add_alt_texts(pot: Path, notebook: Path, root: Path = ROOT) -> None:
    """The gettext builder extracts neither alt text nor code comments: add them to the
    page's template as messages of their own (book/_ext/editions.py translates them when
    writing pages)."""
    from babel.messages.pofile import read_po, write_po

    with pot.open("rb") as f:
        catalog = read_po(f)
    where = notebook.relative_to(root).as_posix()
    for alt, index in alt_texts(notebook):
        catalog.add(alt, locations=[(f"../../{where}", index)],
                    auto_comments=[f"alt text of the figure of cell {index} (mystnb.image.alt)"])
    for text, index in code_comments(notebook):
        if text in catalog:
            catalog[text].locations.append((f"../../{where}", index))
            continue
        catalog.add(text, locations=[(f"../../{where}", index)],
                    auto_comments=[f"code comment of cell {index} (without its #)"])
    with pot.open("wb") as f:
        write_po(f, catalog, width=0)


def catalogs(language: str) -> Path:
    return LOCALES / language / "LC_MESSAGES"


def stats(po: Path) -> dict[str, int]:
    """Counts of translated, fuzzy, untranslated and obsolete messages in one catalog."""
    from babel.messages.pofile import read_po

    with po.open("rb") as f:
        catalog = read_po(f)
    counts = {"translated": 0, "fuzzy": 0, "untranslated": 0, "obsolete": len(catalog.obsolete)}
    for message in catalog:
        if not message.id:
            continue
        if message.fuzzy:
            counts["fuzzy"] += 1
        elif message.string:
            counts["translated"] += 1
        else:
            counts["untranslated"] += 1
    return counts


def status(language: str) -> None:
    translated = declared(language)
    for po in sorted(catalogs(language).rglob("*.po")):
        doc = po.relative_to(catalogs(language)).with_suffix("").as_posix()
        c = stats(po)
        mark = "declared translated" if doc in translated else ""
        print(f"{doc:40} {c['translated']:4} translated {c['fuzzy']:4} fuzzy "
              f"{c['untranslated']:4} untranslated {c['obsolete']:4} obsolete  {mark}")


def declared(language: str) -> list[str]:
    """The pages declared translated (``locales/<lang>/TRANSLATED``, one docname a line)."""
    path = LOCALES / language / "TRANSLATED"
    if not path.exists():
        return []
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def update(language: str, pot: Path = POT, locales: Path = LOCALES,
           quiet: bool = False) -> None:
    """Merge the extracted messages (``pot``) into the catalogs (new ones empty, changed
    ones fuzzy, vanished ones obsolete), then list what needs translating. Only the
    pages extracted into ``pot`` are touched."""
    subprocess.run(
        [sys.executable, "-m", "sphinx_intl", "update", "-p", str(pot), "-d", str(locales),
         "-l", language, "-w", "0"],
        check=True, stdout=subprocess.DEVNULL,
    )
    if not quiet:
        status(language)


def share_with_english(edition: Path, english: Path) -> tuple[int, int]:
    """Remove the edition's files that are the English edition's, byte for byte, and
    point its pages at the English copies. Returns (files removed, bytes saved)."""
    removed, saved = [], 0
    for folder in SHARED_DIRS:
        for path in sorted((edition / folder).rglob("*")):
            twin = english / path.relative_to(edition)
            if path.is_file() and twin.is_file() and path.read_bytes() == twin.read_bytes():
                removed.append(path.relative_to(edition).as_posix())
                saved += path.stat().st_size
                path.unlink()
    gone = set(removed)
    folders = "|".join(SHARED_DIRS)
    pattern = re.compile(r'((?:href|src|data-src)=")((?:\.\./)*)((?:' + folders + r')/[^"?#]+)')
    for page in edition.rglob("*.html"):
        text = page.read_text(encoding="utf-8")

        def repoint(m: re.Match, page=page) -> str:
            if m.group(3) not in gone:
                return m.group(0)
            return m.group(1) + "../" + m.group(2) + m.group(3)

        new = pattern.sub(repoint, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    for folder in SHARED_DIRS:
        for path in sorted((edition / folder).rglob("*"), reverse=True):
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    return len(removed), saved


def build(language: str) -> None:
    if not (HTML / "_static").is_dir():
        sys.exit("build the English edition first (_build/html)")
    out = HTML / language
    start = time.perf_counter()
    code = sphinx("html", out, BUILD / f".doctrees-{language}", language)
    # myst-nb writes its copies of the notebooks beside the output folder: here, inside
    # the English edition (its own are in _build/jupyter_execute). Not published.
    shutil.rmtree(HTML / "jupyter_execute", ignore_errors=True)
    if code:
        sys.exit(code)
    files, saved = share_with_english(out, HTML)
    print(f"{language}: built in {time.perf_counter() - start:.0f} s; {files} files "
          f"({saved / 1e6:.1f} MB) shared with the English edition instead of copied")


# --- the CJK web font, cut to the characters the site shows ------------------------

# The font as Fontsource slices it (book/_vendor, from `make setup`), and its copy in
# the built site (html_extra_path), which is cut.
FONT_SOURCE = ROOT / "book" / "_vendor" / "site" / "_vendor" / "fonts" / "noto-sans-sc"
FONTS = HTML / "_vendor" / "fonts" / "noto-sans-sc"
# Files whose text a reader can see drawn in the site's font: the pages, and the
# scripts that write labels into them (the search page's messages, in each language).
TEXT_SUFFIXES = (".html", ".js")


# A character a script writes as an escape (Sphinx's translations.js holds its Chinese
# as \\u60a8), or a page as a character reference (&#x60a8;, &#24744;).
JS_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\u\{([0-9a-fA-F]{1,6})\}")


def shown_characters(text: str, suffix: str) -> set[int]:
    """The characters a page (``.html``) or a script (``.js``) can show: those written
    as they are, and those written as escapes or references."""
    import html

    found = {ord(c) for c in text}
    if suffix == ".html":
        found |= {ord(c) for c in html.unescape(text)}
    else:
        found |= {int(a or b, 16) for a, b in JS_ESCAPE.findall(text)}
    return found


def site_characters(root: Path = HTML) -> set[int]:
    """Every character of every page and script of both editions (MathJax and the
    font stylesheets aside): a superset of what the site draws in the CJK font."""
    found: set[int] = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root).parts
        if path.suffix not in TEXT_SUFFIXES or rel[:2] == ("_vendor", "mathjax"):
            continue
        found |= shown_characters(path.read_text(encoding="utf-8", errors="ignore"),
                                  path.suffix)
    return found


FACE = re.compile(r"/\* [^*]* \*/\s*@font-face \{[^}]*?url\(\./files/([^)]+)\)[^}]*\}\s*", re.S)
RANGE = re.compile(r"url\(\./files/([^)]+)\).*?unicode-range:\s*([^;]+);", re.S)


def unicode_ranges(sheet: str) -> dict[str, set[int]]:
    """The characters each file of a font stylesheet is loaded for (its face's
    ``unicode-range``): a browser never draws a character outside it with that file."""
    found: dict[str, set[int]] = {}
    for name, ranges in RANGE.findall(sheet):
        chars = found.setdefault(name, set())
        for part in ranges.split(","):
            low, _, high = part.strip().removeprefix("U+").removeprefix("u+").partition("-")
            chars.update(range(int(low, 16), int(high or low, 16) + 1))
    return found


def cut_fonts(folder: Path = FONTS, source: Path = FONT_SOURCE,
              characters: set[int] | None = None,
              cache: Path | None = None) -> tuple[int, int, int]:
    """Cut every slice of the font (``source``) to the characters the site shows, into
    ``folder``: a slice holding none of them is left out, and its ``@font-face`` rule
    with it. The slices' Unicode ranges stay as Fontsource drew them, so a page still
    downloads only the slices its own characters fall in. Running it again after the
    text changed starts from the whole font again. Returns (slices kept, slices left
    out, bytes saved).

    With a ``cache`` folder, a slice cut before from the same file to the same
    characters (by the same fontTools) is taken from there instead of being cut again
    (cutting all of them takes 20 to 50 s); what this run did not use is removed."""
    import hashlib

    import fontTools
    from fontTools import subset
    from fontTools.ttLib import TTFont

    characters = site_characters() if characters is None else characters
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)
    before = sum(f.stat().st_size for f in folder.glob("files/*.woff2"))
    kept, deleted, used = set(), set(), set()
    options = subset.Options()
    options.flavor = "woff2"
    options.layout_features = ["*"]
    options.name_IDs = ["*"]
    options.notdef_outline = True
    named = {name for sheet in folder.glob("*.css")
             for name in FACE.findall(sheet.read_text(encoding="utf-8"))}
    ranges = {name: chars for sheet in folder.glob("*.css")
              for name, chars in unicode_ranges(sheet.read_text(encoding="utf-8")).items()}
    for path in sorted(folder.glob("files/*.woff2")):
        # A file no stylesheet names (Fontsource's whole unsliced font) is never loaded,
        # nor one whose range holds none of the characters (then it is not opened).
        font = None
        if path.name in named and characters & ranges.get(path.name, set()):
            font = TTFont(path)
        wanted = characters & set(font.getBestCmap()) if font is not None else set()
        if not wanted:
            deleted.add(path.name)
            path.unlink()
            continue
        kept.add(path.name)
        if cache is not None:
            key = hashlib.sha256(path.read_bytes() + repr(
                (sorted(wanted), fontTools.version, sorted(vars(options).items()))
            ).encode()).hexdigest()
            cut = cache / f"{key}.woff2"
            used.add(cut.name)
            if cut.exists():
                shutil.copyfile(cut, path)
                continue
        subsetter = subset.Subsetter(options)
        subsetter.populate(unicodes=wanted)
        subsetter.subset(font)
        font.flavor = "woff2"
        font.save(path)
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, cut)
    if cache is not None and cache.is_dir():
        for old in cache.glob("*.woff2"):
            if old.name not in used:
                old.unlink()
    for sheet in folder.glob("*.css"):
        text = sheet.read_text(encoding="utf-8")
        sheet.write_text(FACE.sub(lambda m: "" if m.group(1) in deleted else m.group(0), text),
                         encoding="utf-8")
    after = sum(f.stat().st_size for f in folder.glob("files/*.woff2"))
    return len(kept), len(deleted), before - after


def fonts() -> None:
    start = time.perf_counter()
    kept, deleted, saved = cut_fonts(cache=BUILD / "font-cache")
    print(f"fonts: {kept} slices cut to the site's characters, {deleted} unused deleted, "
          f"{saved / 1e6:.1f} MB saved in {time.perf_counter() - start:.0f} s")


# --- a translation keeps its message's markup ------------------------------------

# Roles whose text may be translated: only their target (``text <target>``) must stay.
TEXT_ROLES = {"ref", "doc", "numref", "term", "download"}
# Token kinds a translation adds or drops freely.
FREE_TOKENS = {"text", "softbreak", "hardbreak", "paragraph_open", "paragraph_close",
               "inline"}


def markup(text: str) -> collections.Counter:
    """What a message's markup is, as MyST parses it: every kind of token but plain text,
    and the content of every code span, math span, role target, link and image source.
    Emphasis that MyST does not open (``**`` beside CJK punctuation) is missing here, as
    on the page."""
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    global _PARSER
    if _PARSER is None:
        import yaml

        config = yaml.safe_load((ROOT / "_config.yml").read_text())
        extensions = set(config["parse"]["myst_enable_extensions"])
        _PARSER = create_md_parser(MdParserConfig(enable_extensions=extensions), RendererHTML)
    found: collections.Counter = collections.Counter()

    def walk(tokens) -> None:
        for token in tokens:
            if token.type not in FREE_TOKENS:
                found[token.type] += 1
            if token.type in ("code_inline", "math_inline", "math_block", "math_inline_double",
                              "code_block", "fence"):
                found[f"{token.type}: {token.content.strip()}"] += 1
            elif token.type == "myst_role":
                name, content = token.meta.get("name", ""), token.content
                target = re.search(r"<([^<>]+)>\s*$", content)
                if name in TEXT_ROLES and target:
                    content = target.group(1)
                found[f"{{{name}}}{content}"] += 1
            elif token.type == "link_open":
                found[f"link: {token.attrGet('href')}"] += 1
            elif token.type == "image":  # its alt text, the children, is translated
                found[f"image: {token.attrGet('src')}"] += 1
            walk(token.children or [])

    walk(_PARSER.parse(text))
    return found


_PARSER = None


def markup_problem(msgid: str, msgstr: str) -> str | None:
    """How a translation's markup differs from its message's, or None."""
    if not msgstr:
        return None
    want, got = markup(msgid), markup(msgstr)
    if want == got:
        return None
    lost = ", ".join(sorted((want - got).elements()))
    added = ", ".join(sorted((got - want).elements()))
    return (f"{msgid[:60]!r}: " + (f"lost {lost}" if lost else "")
            + ("; " if lost and added else "") + (f"added {added}" if added else ""))


# --- spacing between Chinese and Latin text ------------------------------------------

# The book's rule, as a Chinese reader sees the page: a space between a Chinese
# character and a Latin letter or digit (in text, a link, code or math: "练习 4.1 会",
# "用 `mask` 遮住"), none between two Chinese characters, even where a link begins or
# ends ("像「把 Q 重塑成多个头」那样", not "像 把 Q 重塑成多个头 中那样"). Titles quoted as
# written (《…》, “…”, a citation and the bibliography) keep their own spacing.
HAN = r"[\u3400-\u4dbf\u4e00-\u9fff]"
LATIN = r"[A-Za-z0-9]"
EDGE = "\x00"  # where an element begins or ends
SPACING = {
    "no space between Chinese and Latin": re.compile(
        rf"{HAN}{EDGE}*{LATIN}|{LATIN}{EDGE}*{HAN}"),
    "a space between two Chinese characters": re.compile(rf"{HAN}{EDGE}*\s+{EDGE}*{HAN}"),
}
QUOTED = re.compile(r"《[^》]*》|“[^”]*”")
CITATION = re.compile(r"^(?:[./]*references\.html)?#id\d+$")


class _Blocks(html.parser.HTMLParser):
    """The text of each block of a page's article, element edges marked with EDGE,
    code and math as one Latin letter, quoted titles and citations left out."""

    BLOCK = {"p", "li", "td", "th", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6",
             "figcaption", "caption", "div", "section", "blockquote", "summary"}
    EMPTY = {"br", "img", "wbr", "input", "meta", "link", "hr", "source"}
    HIDDEN = {"pre", "script", "style", "svg", "button", "nav", "aside", "template"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self.text: list[str] = []
        self.stack: list[tuple[str, str]] = []
        self.silent = 0

    def flush(self) -> None:
        if "".join(self.text).strip():
            self.blocks.append(QUOTED.sub("《》", "".join(self.text)))
        self.text = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag in self.EMPTY:
            return
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if self.silent or tag in self.HIDDEN or "headerlink" in classes or \
                "citation" in classes or CITATION.search(attrs.get("href") or ""):
            kind = "silent"
            self.silent += 1
        elif tag in self.BLOCK:
            kind = "block"
            self.flush()
        elif tag in ("code", "kbd", "samp") or (tag == "span" and "math" in classes):
            kind = "opaque"
            self.text.append(EDGE + "X")
            self.silent += 1
        else:
            kind = "inline"
            self.text.append(EDGE)
        self.stack.append((kind, tag))

    def handle_endtag(self, tag) -> None:
        if tag in self.EMPTY or tag not in {t for _, t in self.stack}:
            return
        while self.stack:
            kind, opened = self.stack.pop()
            if kind in ("silent", "opaque"):
                self.silent -= 1
            if kind == "block":
                self.flush()
            elif kind in ("inline", "opaque") and not self.silent:
                self.text.append(EDGE)
            if opened == tag:
                break

    def handle_data(self, data) -> None:
        if not self.silent:
            self.text.append(data)


def spacing_problems(page: str) -> list[str]:
    """Where the article of a built page breaks the spacing rule, with some context."""
    start = page.find('<article class="bd-article"')
    parser = _Blocks()
    parser.feed(page[start:page.find("</article>", start)] if start >= 0 else page)
    parser.flush()
    return [f"{rule}: {block[max(0, m.start() - 12):m.end() + 12].replace(EDGE, '|')!r}"
            for block in parser.blocks for rule, pattern in SPACING.items()
            for m in pattern.finditer(block)]


def spacing(language: str, pages: list[str] | None = None) -> int:
    """Print every place of the built edition that breaks the spacing rule."""
    out = HTML / language
    if not out.is_dir():
        print(f"spacing: not checked (no {out.relative_to(ROOT)}: `make book` first)")
        return 0
    problems = 0
    for doc in toc_pages():
        if pages and doc not in pages:
            continue
        for problem in spacing_problems((out / f"{doc}.html").read_text(encoding="utf-8")):
            print(f"{doc}: {problem}")
            problems += 1
    print(f"{problems} place(s) against the spacing rule (in {out.relative_to(ROOT)})")
    return problems


def check(language: str, pages: list[str] | None = None) -> int:
    """Print every translated message whose markup is not its English message's."""
    from babel.messages.pofile import read_po

    problems = 0
    for po in sorted(catalogs(language).rglob("*.po")):
        doc = po.relative_to(catalogs(language)).with_suffix("").as_posix()
        if pages and doc not in pages:
            continue
        with po.open("rb") as f:
            catalog = read_po(f)
        for message in catalog:
            if message.id and (problem := markup_problem(message.id, message.string)):
                print(f"{doc}: {problem}")
                problems += 1
    print(f"{problems} message(s) with markup other than the English")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command",
                        choices=("gettext", "update", "build", "status", "check", "fonts"))
    parser.add_argument("language", nargs="?", default=LANGUAGES[0])
    parser.add_argument("pages", nargs="*", help="check: only these pages (docnames)")
    args = parser.parse_args(argv)
    if args.command == "check":
        markup_left = check(args.language, args.pages)
        sys.exit(1 if markup_left + spacing(args.language, args.pages) else 0)
    {"gettext": lambda _: gettext(), "fonts": lambda _: fonts(), "update": update, "build": build,
     "status": status}[args.command](args.language)


if __name__ == "__main__":
    main()
