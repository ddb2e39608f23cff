"""The built site, opened page by page in headless Chromium (run after `make book`)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import live_page
import pytest
import site_check

ROOT, HTML = site_check.ROOT, site_check.HTML

pytestmark = pytest.mark.browser

DESKTOP, DESKTOP_HEIGHT, PHONE, PHONE_HEIGHT = 1280, 900, 390, 844  # CSS pixels


def _missing(reason: str):
    if site_check.in_ci():
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


# pytest-playwright provides the browser, context and page fixtures; these two
# fixtures of its own point it at the system's Chromium and set the window size.
@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    executable = site_check.chromium_path()
    if executable is None:
        _missing(site_check.INSTALL_HINT)
    return {
        **browser_type_launch_args,
        "executable_path": executable,
        "headless": True,
        "args": site_check.CHROMIUM_ARGS,
    }


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": DESKTOP, "height": DESKTOP_HEIGHT}}


@pytest.fixture(scope="session")
def served_site(build_state):
    if site_check.wait_for_the_build(build_state) == "failed":
        pytest.fail("the site build failed: see tests/test_site_build.py's report")
    if not (HTML / "index.html").exists():
        _missing("no built site at _build/html: run `make book` first")
    with site_check.serve(HTML) as origin:
        yield origin


# Known from the sources, so that the tests can be collected before the site is built
# (test_every_page_the_build_wrote_is_checked holds it to the built site).
PAGES = site_check.expected_pages()
ZH = "zh_CN"
ZH_PAGES = [p for p in PAGES if p.startswith(f"{ZH}/")]
# The pages of either edition that show Chinese text: every page of the Chinese
# edition, and the English pages that pair a term with its Chinese name.
CJK_PAGES = ZH_PAGES + ["book/intro.html", "book/notebooks/01_notation.html"]


# One context for the checker's own tests below (their pages share the browser's cache).
@pytest.fixture(scope="session")
def desktop(browser, browser_context_args):
    ctx = browser.new_context(**browser_context_args)
    yield ctx
    ctx.close()


# Each page is visited once per test process, and every test of that page reads what
# that visit found (the bytes, the layout at both widths, axe, the glyphs).
_VISITS: dict[str, site_check.PageReport] = {}
# The styles of text whose contrast this process has measured, per mode (see
# site_check.accessibility_problems): each is measured once, on the first page showing it.
_MEASURED: dict[str, set[str]] = {}


@pytest.fixture
def visit(browser, served_site):
    def visit(page: str) -> site_check.PageReport:
        if page not in _VISITS:
            _VISITS[page] = site_check.inspect_page(
                browser, served_site, page, (DESKTOP, DESKTOP_HEIGHT),
                (PHONE, PHONE_HEIGHT), cjk=page in CJK_PAGES, measured=_MEASURED)
        return _VISITS[page]
    return visit


@pytest.mark.parametrize("page", PAGES)
def test_first_load_is_within_the_budget(visit, page):
    """An empty cache, as a reader's first visit: the page and all it loads."""
    sizes: dict[str, list[int]] = {}
    for path, transferred, decoded in visit(page).sent:
        total = sizes.setdefault(path, [0, 0])
        total[0] += transferred
        total[1] += decoded
    assert sizes, f"{page}: nothing was fetched"
    for which, budget in ((0, site_check.PAGE_BUDGET_BYTES),
                          (1, site_check.PAGE_BUDGET_UNCOMPRESSED_BYTES)):
        total = sum(size[which] for size in sizes.values())
        heaviest = sorted(sizes.items(), key=lambda item: -item[1][which])[:5]
        assert total <= budget, (
            f"{page}: {total / 1e6:.2f} MB {('transferred', 'decompressed')[which]} on a "
            f"first load, over the budget of {budget / 1e6:.1f} MB; heaviest: "
            + ", ".join(f"{url.rsplit('/', 1)[-1]} {size[which] / 1e6:.2f} MB"
                        for url, size in heaviest)
        )


@pytest.mark.parametrize("page", PAGES)
def test_page_is_clean_at_desktop_and_phone_width(visit, page):
    """At 1280 px nothing scrolls sideways and figure text stays readable; at 390 px
    the page is no wider than the window, every equation fits the column and every
    shrunk figure opens at full size."""
    report = visit(page)
    # A front door that leads on: the page it leads to is examined on its own visit.
    assert report.landed == page or report.landed in PAGES, report.landed
    assert not report.problems, f"{page}:\n  " + "\n  ".join(report.problems)


def test_site_check_sees_layout_problems(desktop, tmp_path):
    """The layout checks fail on a page made to fail them, at both widths."""
    (tmp_path / "wide.svg").write_text(OK_SVG.replace('width="10"', 'width="3000"', 1))
    (tmp_path / "bad.html").write_text(LAYOUT_PAGE)
    with site_check.serve(tmp_path) as origin:
        problems = site_check.check_page(desktop, f"{origin}/bad.html", origin,
                                         phone=(PHONE, PHONE_HEIGHT))
    joined = "\n".join(problems)
    assert "code scrolls sideways: " in joined and "x" * 40 in joined
    assert "output scrolls sideways" in joined
    assert "figure text" in joined and "wide.svg" in joined
    assert f"equation wider than a {PHONE} px column: wide equation" in joined
    assert f"figure scaled down at {PHONE} px with no link to its full size: wide.svg" in joined
    assert f"page wider than a {PHONE} px window: " in joined and "z" * 50 in joined
    assert joined.count("page wider than a ") == 1  # at 390 px only, not at 1280 px
    assert f"scrolls sideways at {PHONE} px with no sign of it: " + "y" * 40 in joined
    # axe's rules for what changes at a phone's width run there.
    phone_only = [p for p in problems if "scrollable-region-focusable" in p
                  and "article > pre:" in p]
    assert len(phone_only) == 1 and "(light, phone)" in phone_only[0], problems


def test_a_wide_table_says_that_it_scrolls(desktop, tmp_path):
    """book/_static/table-scroll.js gives a table wider than a phone its cue (a line
    above it, keyboard focus and a name) and leaves it alone where it fits."""
    script = ROOT / "book" / "_static" / "table-scroll.js"
    (tmp_path / "table-scroll.js").write_text(script.read_text())
    (tmp_path / "ok.svg").write_text(OK_SVG)
    row = "<tr>" + "<td>a&nbsp;cell&nbsp;that&nbsp;does&nbsp;not&nbsp;wrap</td>" * 4 + "</tr>"
    (tmp_path / "table.html").write_text(
        '<!doctype html><html lang="en"><head><title>Table</title>'
        '<link rel="icon" href="ok.svg"><script src="table-scroll.js"></script></head>'
        '<body><main><h1>Table</h1><div class="pst-scrollable-table-container" '
        'style="overflow-x:auto"><table><thead><tr><th>one</th><th>two</th><th>three</th>'
        f"<th>four</th></tr></thead><tbody>{row}</tbody></table></div></main></body></html>"
    )
    with site_check.serve(tmp_path) as origin:
        assert site_check.check_page(desktop, f"{origin}/table.html", origin,
                                     phone=(PHONE, PHONE_HEIGHT)) == []
        page = desktop.new_page()
        page.set_viewport_size({"width": PHONE, "height": PHONE_HEIGHT})
        page.goto(f"{origin}/table.html")
        box = page.locator(".pst-scrollable-table-container")
        assert box.get_attribute("aria-label") == "table: one, two, three, four (scrolls sideways)"
        assert page.locator(".scroll-hint").is_visible()
        page.set_viewport_size({"width": DESKTOP, "height": 900})
        page.evaluate(site_check.SETTLE_JS)
        assert box.get_attribute("tabindex") is None and page.locator(".scroll-hint").count() == 0
        page.close()


LAYOUT_PAGE = (
    '<!doctype html><html><body><article style="max-width:600px">'
    '<div class="cell"><div class="cell_input"><pre style="overflow:auto">'
    + "x" * 400
    + '</pre></div><div class="cell_output"><pre style="overflow:auto">'
    + "y" * 400
    + '</pre><img src="wide.svg" alt="wide" style="max-width:100%"></div></div>'
    # A display equation as MathJax lays it out, wider than a phone's column.
    '<mjx-container display="true" aria-label="wide equation" style="display:block">'
    '<mjx-math style="display:inline-block;width:500px">x</mjx-math></mjx-container>'
    # Inline code that cannot wrap: it fits 1280 px but pushes the page past 390 px.
    "<p>See <code>" + "z" * 60 + "</code>.</p>"
    # A box that fits 1280 px and scrolls at 390 px, with nothing the keyboard can reach.
    '<pre style="overflow:auto;font:16px monospace">' + "v" * 50 + "</pre>"
    "</article></body></html>"
)


def test_every_page_the_build_wrote_is_checked(served_site):
    """The pages checked above, listed from the sources, are the pages of the site."""
    built = [p.relative_to(HTML).as_posix() for p in site_check.site_pages(HTML)]
    assert built == PAGES


def test_every_chapter_page_was_built(served_site):
    toc = (ROOT / "_toc.yml").read_text()
    names = [line.split("book/notebooks/")[1].strip() for line in toc.splitlines()
             if "book/notebooks/" in line]
    assert names
    for name in names:
        assert (HTML / "book" / "notebooks" / f"{name}.html").exists(), name


def test_front_door_leads_to_the_first_page_and_names_the_tab_icon(served_site):
    """index.html (book/_ext/offline_site.py) redirects to the book's first page and
    names the icon, so that no browser asks for a /favicon.ico the site does not have."""
    front = (HTML / "index.html").read_text()
    target = re.search(r'url=([^"]+)"', front).group(1)
    icon = re.search(r'rel="icon" href="([^"]+)"', front).group(1)
    assert (HTML / target).exists() and target == "book/intro.html"
    assert (HTML / icon).exists() and "<title>Multi-head attention" in front


def test_math_is_rendered_somewhere(visit):
    """The notation chapter has display math: it must come out typeset, not raw."""
    assert visit("book/notebooks/01_notation.html").facts["typeset"] >= 3


@pytest.mark.parametrize("edition", ["", f"{ZH}/"])
def test_references_page_lists_every_cited_work(served_site, edition):
    """The built references page, in each edition, has one entry per work the book
    cites, each showing its title, with a link to its address where references.bib has
    one, a clean label (no back-links: the Chinese page once had some, to its own
    title) and no raw TeX (tests/test_references.py checks the file itself)."""
    import html as html_lib

    import test_references as refs

    page = (HTML / edition / "book" / "references.html").read_text()
    blocks = re.findall(r'<div class="citation"[^>]*>(.*?)</div>', page, flags=re.S)
    shown = [html_lib.unescape(re.sub(r"<[^>]+>", "", b)).strip() for b in blocks]
    cited = refs.cited_keys()
    assert len(shown) == len(cited), f"{len(shown)} entries listed, {len(cited)} works cited"
    for key in cited:
        fields = refs.ENTRIES[key].fields
        title = re.sub(r"[{}]", "", fields["title"]).replace("\\#", "#").lower()
        assert any(title in text.lower() for text in shown), f"{key}: title not listed"
        if "url" in fields:
            assert f'href="{fields["url"]}"' in page, f"{key}: no link to {fields['url']}"
    for text in shown:
        label, _, body = text.partition("]")
        assert re.fullmatch(r"\[\s*[A-Za-z0-9+]+\s*", label), f"label {label!r}"
        assert not body.lstrip().startswith("("), f"back-links after {label}]: {body[:20]}"
        assert not re.search(r"[$\\{}]", body), f"raw TeX: {body}"


# --- the checker itself catches what it must --------------------------------------

BAD_PAGE = """<!doctype html><html><head>
<script src="https://cdn.example.org/lib.js"></script></head>
<body><p>Inline math \\(x^2\\) never typeset. See exercise ((6.3)) and
<a href="#x">Why divide by \\sqrt{d_k}</a>; fine: (see (a)) and <a href="#y">6.3</a>.</p>
<img src="missing.png"><img src="ok.svg">
<script>console.error("boom")</script></body></html>"""

OK_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
          '<rect width="10" height="10"/></svg>')


def test_checker_catches_a_bad_page(desktop, tmp_path):
    (tmp_path / "bad.html").write_text(BAD_PAGE)
    (tmp_path / "ok.svg").write_text(OK_SVG)
    with site_check.serve(tmp_path) as origin:
        problems = site_check.check_page(desktop, f"{origin}/bad.html", origin)
    joined = "\n".join(problems)
    assert "external request blocked: https://cdn.example.org/lib.js" in joined
    assert "console error: boom" in joined
    assert "HTTP 404" in joined and "missing.png" in joined
    assert "image did not load: missing.png" in joined
    assert "image without alt text: ok.svg" in joined
    assert "raw math delimiter" in joined
    assert "axe critical image-alt (light)" in joined  # axe runs, and names the rule
    assert "link text is raw LaTeX: 'Why divide by \\\\sqrt{d_k}'" in joined
    assert "doubled parentheses: '((6.3))'" in joined
    assert "(see (a))" not in joined and "'6.3'" not in joined


def test_checker_passes_a_clean_page(desktop, tmp_path):
    (tmp_path / "good.html").write_text(
        # A page without a tab icon would make the browser ask for /favicon.ico (a 404).
        '<!doctype html><html lang="en"><head><title>Good</title>'
        '<link rel="icon" href="ok.svg"></head><body><main><h1>Hello</h1>'
        '<img src="ok.svg" alt="a square"></main></body></html>'
    )
    (tmp_path / "ok.svg").write_text(OK_SVG)
    with site_check.serve(tmp_path) as origin:
        assert site_check.check_page(desktop, f"{origin}/good.html", origin) == []


# Text whose contrast was measured on one page is not measured again where it has the
# same style; the same words on another background, a new colour in a code block, are.
CONTRAST_CSS = ("<style>body{background:#fff;color:#222} pre{background:#f6f6f6}"
                ".k{color:#1a1a8a} .n{color:#222} .faint{color:#c4c4c4}"
                ".dim{background:#767676}</style>")
CODE = ('<pre><span class="k">def</span> <span class="n">area</span>(): '
        '<span class="k">pass</span></pre>')


def contrast_page(body: str) -> str:
    return ('<!doctype html><html lang="en"><head><title>Contrast</title>'
            f'<link rel="icon" href="ok.svg">{CONTRAST_CSS}</head>'
            f'<body><main><h1>Contrast</h1>{body}</main></body></html>')


def test_contrast_is_measured_once_per_style_and_every_failure_is_still_found(desktop,
                                                                             tmp_path):
    (tmp_path / "first.html").write_text(contrast_page("<p>Plain words.</p>" + CODE))
    (tmp_path / "second.html").write_text(contrast_page(
        "<p>Plain words.</p>" + CODE + CODE.replace('"n"', '"faint"')
        + '<div class="dim"><p>Plain words.</p></div>'))
    (tmp_path / "ok.svg").write_text(OK_SVG)
    measured: dict[str, set[str]] = {}
    spans = "() => document.querySelectorAll('pre span').length"
    with site_check.serve(tmp_path) as origin:
        page = desktop.new_page()
        page.goto(f"{origin}/first.html")
        assert site_check.accessibility_problems(page, measured=measured) == []
        first_styles = set(measured["light"])
        assert len(first_styles) >= 3  # the paragraph, and two colours of code
        page.goto(f"{origin}/second.html")
        # Of its styles, only the two not on the first page are to be measured.
        marks = page.evaluate(site_check.MARK_TEXT_JS, sorted(first_styles))
        assert sorted(marks["keys"].values()) != [] and len(marks["keys"]) == 2, marks
        before = page.evaluate(spans)
        problems = site_check.accessibility_problems(page, measured=measured)
        assert page.evaluate(spans) == before == 6  # the code blocks have their spans back
    contrast = [p for p in problems if "color-contrast (light)" in p]
    assert len(contrast) == 2, problems
    assert any('.faint "area"' in p for p in contrast), contrast
    assert any('p "Plain words."' in p for p in contrast), contrast
    assert measured["light"] == first_styles  # what failed is not taken for measured


@pytest.mark.parametrize("delay", ["0", "1"])
def test_a_page_that_sends_the_reader_on_is_followed_whenever_it_moves(desktop, tmp_path,
                                                                        delay):
    """The front door's refresh may fire before or after the door itself is ready (a CI
    run once examined the door while it was leaving): the visit ends on the page it
    leads to, ready, either way."""
    head = '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{}</title>'
    (tmp_path / "door.html").write_text(
        head.format("Door") + f'<meta http-equiv="Refresh" content="{delay}; url=room.html">'
        '</head><body><p><a href="room.html">Room</a></p></body></html>')
    (tmp_path / "room.html").write_text(
        head.format("Room") + "</head><body><main><h1>Room</h1></main></body></html>")
    with site_check.serve(tmp_path) as origin:
        page = desktop.new_page()
        try:
            site_check._load(page, f"{origin}/door.html")
            assert page.url == f"{origin}/room.html"
            assert page.evaluate("document.title") == "Room"
        finally:
            page.close()


# --- the Chinese edition (issue 26) --------------------------------------------------


@pytest.mark.parametrize("page_path", CJK_PAGES)
def test_every_chinese_glyph_comes_from_the_site_font(visit, page_path):
    """This Chromium has no CJK font of its own: each Chinese character on the page is
    covered by a loaded slice of the site's Noto Sans SC, at its weight, and is drawn
    with it (not as a box from a font listed before it)."""
    found = visit(page_path).glyphs
    assert found["count"] > 0, f"{page_path}: no Chinese text found"
    assert not found["missing"] and not found["otherFont"] and found["check"], (
        f"{page_path}: {found}")


@pytest.mark.parametrize("page_path", [p for p in PAGES if p != "index.html"
                                       and not p.endswith("/index.html")])
def test_language_switch_leads_to_the_same_page_in_the_other_edition(served_site, page_path):
    text = (HTML / page_path).read_text(encoding="utf-8")
    links = re.findall(r'<a class="language-switch__link" href="([^"]+)" '
                       r'hreflang="([^"]+)" lang="([^"]+)">([^<]+)</a>', text)
    assert len(links) == 1, f"{page_path}: {links}"
    href, hreflang, lang, name = links[0]
    target = (HTML / page_path).parent.joinpath(href).resolve()
    if page_path.startswith(f"{ZH}/"):
        assert (hreflang, name) == ("en", "English")
        assert target == (HTML / page_path.removeprefix(f"{ZH}/")).resolve()
    else:
        assert (hreflang, name) == ("zh-CN", "中文")
        assert target == (HTML / ZH / page_path).resolve()
    assert target.exists(), f"{page_path}: {href}"


def test_language_switch_keeps_the_section_and_the_search_query(page, served_site):
    """book/_static/language-switch.js: from a section, the switch leads to that section
    of the other edition; from the search page, to the same search there."""
    if not ZH_PAGES:
        pytest.skip("no Chinese edition built")
    page.goto(f"{served_site}/{ZH}/search.html?q=注意力", wait_until="load")
    link = page.locator("a.language-switch__link")
    assert link.evaluate("a => new URL(a.href).search") == "?q=" + quote("注意力")
    chapter = "book/notebooks/12_how_attention_learns.html"
    page.goto(f"{served_site}/{chapter}#attention-learns-tiled", wait_until="load")
    target = link.evaluate("a => a.href")
    assert target == f"{served_site}/{ZH}/{chapter}#attention-learns-tiled", target
    page.goto(target, wait_until="load")
    assert page.locator("#attention-learns-tiled").count() == 1  # the section is there
    page.evaluate("window.location.hash = 'attention-learns-cost'")
    page.wait_for_function("() => document.querySelector('a.language-switch__link')"
                           ".href.endsWith('#attention-learns-cost')")


def test_chinese_search_finds_attention(page, served_site):
    """Sphinx's Chinese search splits words with jieba: 注意力 is a term of its own."""
    if not ZH_PAGES:
        pytest.skip("no Chinese edition built")
    page.goto(f"{served_site}/{ZH}/search.html?q=注意力", wait_until="load")
    page.wait_for_selector("#search-results li", timeout=30_000)
    assert page.locator("#search-results li").count() >= 2


def queries_the_chinese_pages_use() -> list[str]:
    """The glossary's terms and the compounds of search_terms.txt, as a reader types
    them, that some Chinese page shows (a translated message holds them)."""
    import csv

    from tools import editions

    shown = "".join(
        line for po in sorted((ROOT / "locales" / ZH / "LC_MESSAGES").rglob("*.po"))
        for line in po.read_text(encoding="utf-8").splitlines() if line.startswith("msgstr"))
    with (ROOT / "locales" / ZH / "glossary.csv").open(encoding="utf-8") as f:
        terms = [row["chinese"].strip() for row in csv.DictReader(f)]
    extra = (ROOT / "locales" / ZH / "search_terms.txt").read_text(encoding="utf-8")
    terms += [line.split("#")[0].strip() for line in extra.splitlines()]
    assert set(editions.search_terms(ZH)) >= {t for t in terms if t.isalpha() and not t.isascii()}
    return [t for t in dict.fromkeys(terms) if t and t in shown]


def test_chinese_search_finds_every_term_the_pages_use(page, served_site):
    """Each term of the glossary (and each compound of search_terms.txt) that a Chinese
    page shows is found by the Chinese search, as its search page splits the query."""
    if not ZH_PAGES:
        pytest.skip("no Chinese edition built")
    queries = queries_the_chinese_pages_use()
    assert len(queries) > 50 and "多头自注意力" in queries and "键" in queries
    page.goto(f"{served_site}/{ZH}/search.html", wait_until="load")
    page.wait_for_function("() => typeof Search !== 'undefined' && Search.hasIndex()",
                           timeout=30_000)
    found = page.evaluate("""(queries) => Object.fromEntries(queries.map(q =>
        [q, Search._performSearch(...Search._parseQuery(q)).length]))""", queries)
    missing = [q for q, n in found.items() if n == 0]
    assert not missing, f"the Chinese search finds nothing for: {missing}"


def test_the_chinese_no_result_message_is_drawn_in_the_site_font(page, served_site):
    """Sphinx's search messages come from translations.js, which writes its Chinese as
    escapes (\\u60a8): the font cut reads them too, so 您 is not a box."""
    if not ZH_PAGES:
        pytest.skip("no Chinese edition built")
    page.goto(f"{served_site}/{ZH}/search.html?q=qqqzzzxxx", wait_until="load")
    page.wait_for_function("() => /没有匹配/.test(document.body.innerText)", timeout=30_000)
    message = page.inner_text("#search-results")
    shown = {ord(c) for c in message if "\u3000" <= c <= "\u9fff" or "\uff00" <= c <= "\uffef"}
    assert ord("您") in shown, message
    assert not cut_font_lacks(shown), message


def cut_font_lacks(characters: set[int]) -> list[str]:
    """Those of ``characters`` that the site's CJK font draws (a slice of Fontsource's
    font holds it) but that the slice cut to the site's characters no longer holds:
    without a CJK font of its own, the reader sees a box, and a browser can not tell
    (the face still claims the character)."""
    from fontTools.ttLib import TTFont

    from tools import editions

    def cmap(folder: Path, name: str, cache: dict) -> set[int]:
        if (folder, name) not in cache:
            path = folder / "files" / name
            cache[folder, name] = set(TTFont(path).getBestCmap()) if path.exists() else set()
        return cache[folder, name]

    lacking, cache = [], {}
    for sheet in sorted(editions.FONT_SOURCE.glob("*.css")):
        ranges = editions.unicode_ranges(sheet.read_text(encoding="utf-8"))
        for c in sorted(characters):
            files = [name for name, covered in ranges.items() if c in covered]
            drawn = [n for n in files if c in cmap(editions.FONT_SOURCE, n, cache)]
            if drawn and not any(c in cmap(editions.FONTS, n, cache) for n in drawn):
                lacking.append(f"{chr(c)} ({sheet.stem})")
    return lacking


def test_every_character_the_site_can_show_is_in_its_cut_font(served_site):
    """Pages and the site's own scripts, characters written as escapes included."""
    from tools import editions

    assert not cut_font_lacks(editions.site_characters())


@pytest.mark.parametrize("page_path", ["book/notebooks/09_positions_and_tiles.html",
                                       f"{ZH}/book/notebooks/09_positions_and_tiles.html"])
def test_the_sites_own_scripts_write_in_the_pages_language(visit, page_path):
    """The words table-scroll.js, figure-zoom.js and toggle-label.js add (the phone's
    scroll hint, the name of a box that scrolls, the full-size link's title, the name
    of a solution's toggle) are Chinese in the Chinese edition and English in the
    English one."""
    words = visit(page_path).facts["words"]
    assert all(words.values()), f"{page_path}: some kind of word is missing: {words}"
    chinese = [bool(re.search(r"[\u4e00-\u9fff]", w)) for kind in words.values() for w in kind]
    if page_path.startswith(f"{ZH}/"):
        assert all(chinese), f"{page_path}: {words}"
    else:
        assert not any(chinese), f"{page_path}: {words}"


LABEL_ATTRIBUTE = re.compile(r'\b(?:title|aria-label|placeholder)="([^"]*)"')


def test_the_chinese_edition_names_no_control_in_english():
    """The theme's controls (their tooltips and the names a screen reader reads) are
    labelled in Chinese: no label that the site's chrome carries on most English pages,
    and no "Link to this ..." anchor, is left in English on a Chinese page."""
    english = [p for p in PAGES if not p.startswith(f"{ZH}/")]
    if len(english) == len(PAGES):
        _missing("no Chinese edition built: run `make book` first")
    counts: dict[str, int] = {}
    for page in english:
        for label in set(LABEL_ATTRIBUTE.findall((HTML / page).read_text(encoding="utf-8"))):
            counts[label] = counts.get(label, 0) + 1
    chrome = {label for label, n in counts.items()
              if n >= len(english) / 2 or label.startswith("Link to this")}
    assert "Toggle primary sidebar" in chrome  # the theme's chrome was found
    left = {(page, label) for page in ZH_PAGES
            for label in LABEL_ATTRIBUTE.findall((HTML / page).read_text(encoding="utf-8"))
            if label in chrome}
    assert not left, sorted(left)[:20]
    # The solutions' toggles ("Click to show" at 768 px and wider), in Chinese.
    hints = {(page, hint) for page in ZH_PAGES
             for hint in re.findall(r"toggleHint(?:Show|Hide) = '([^']*)'",
                                    (HTML / page).read_text(encoding="utf-8"))}
    assert hints and not [h for h in hints if re.search(r"[A-Za-z]", h[1])], sorted(hints)[:4]
    # Mainland usage: 打印, not Taiwan's 列印 (the theme's own catalog).
    taiwan = [page for page in ZH_PAGES if "列印" in (HTML / page).read_text(encoding="utf-8")]
    assert not taiwan, taiwan


CODE_BLOCK = re.compile(r'<div class="highlight-ipython3 notranslate"><div class="highlight">'
                        r"<pre>(.*?)</pre>", re.S)


def shown_code(page: str) -> list[str]:
    """The code cells a built page shows, as text."""
    import html

    text = (HTML / page).read_text(encoding="utf-8")
    return [html.unescape(re.sub(r"<[^>]+>", "", block)) for block in CODE_BLOCK.findall(text)]


def test_the_chinese_code_is_the_english_code_with_chinese_comments():
    """Every code cell of a Chinese page is its English twin's code token for token once
    comments are left out, and at least 90% of the comments that say something in words
    (tools/comments.py) are in Chinese."""
    from tools import comments

    if not ZH_PAGES:
        _missing("no Chinese edition built: run `make book` first")
    worded = chinese = 0
    for page in ZH_PAGES:
        twin = page.removeprefix(f"{ZH}/")
        local, english = shown_code(page), shown_code(twin)
        assert len(local) == len(english), f"{page}: {len(local)} code cells, {len(english)}"
        for index, (ours, theirs) in enumerate(zip(local, english, strict=True)):
            assert comments.code_tokens(ours) == comments.code_tokens(theirs), (page, index)
            units = [u for u in comments.units(theirs) if comments.is_message(u)]
            worded += len(units)
            shown = [u.text for u in comments.units(ours)]
            chinese += sum(u.text not in shown for u in units)
    assert worded > 400, worded  # the code cells were found
    assert chinese >= 0.9 * worded, f"{chinese} of {worded} worded comments translated"


class _Interface(__import__("html.parser").parser.HTMLParser):
    """The interface strings of a page: the text outside its article (header, sidebars,
    footer), the names and tooltips of its controls anywhere (title, aria-label,
    placeholder), and the text of its buttons and toggles (button, summary)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.strings: set[str] = set()
        self.article = self.code = self.control = 0

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        if tag == "article":
            self.article += 1
        elif tag in ("script", "style", "pre"):
            self.code += 1
        elif tag in ("button", "summary"):
            self.control += 1
        for name in ("title", "aria-label", "placeholder"):
            if attrs.get(name) and not (self.article and name == "title" and tag == "a"
                                        and "headerlink" not in (attrs.get("class") or "")):
                self.strings.add(attrs[name].strip())

    def handle_endtag(self, tag) -> None:
        if tag == "article":
            self.article -= 1
        elif tag in ("script", "style", "pre"):
            self.code -= 1
        elif tag in ("button", "summary"):
            self.control -= 1

    def handle_data(self, data) -> None:
        if data.strip() and not self.code and (not self.article or self.control):
            self.strings.add(data.strip())


# Not English words: file types of the download menu, a key's name, the English
# edition's own name in the language switch, and math (a heading's TeX).
NOT_WORDS = {".ipynb", ".md", ".pdf", "Ctrl", "English"}


def english_interface(page_html: str) -> list[str]:
    parser = _Interface()
    parser.feed(page_html)
    return sorted(s for s in parser.strings
                  if s not in NOT_WORDS and not s.startswith("\\(")
                  and re.search(r"[A-Za-z]{2,}", s) and not re.search(r"[\u4e00-\u9fff]", s))


def test_no_chinese_page_shows_an_english_interface_string():
    """Every interface string of every Chinese page is Chinese (the footer's author,
    copyright and date included), and 列印 (Taiwan usage) appears nowhere."""
    if not ZH_PAGES:
        _missing("no Chinese edition built: run `make book` first")
    left = {page: found for page in ZH_PAGES
            if (found := english_interface((HTML / page).read_text(encoding="utf-8")))}
    assert not left, sorted(left.items())[:5]
    # The collector sees the interface: on an English page it finds the English one.
    english = english_interface((HTML / ZH_PAGES[1].removeprefix(f"{ZH}/")).read_text("utf-8"))
    assert {"Skip to main content", "Back to top"} <= set(english), english
    footer = (HTML / ZH_PAGES[1]).read_text(encoding="utf-8")
    assert re.search(r"最后更新于 \d{4} 年 [1-9]\d? 月 [1-9]\d? 日。", footer)
    assert "作者：" in footer and "版权所有 © " in footer
    # A work without a date is 无日期 in the citations and the bibliography.
    undated = [page for page in ZH_PAGES if ", n.d." in (HTML / page).read_text("utf-8")]
    # Authors named in a sentence ({cite:t}) are joined the Chinese way (Jain 和 Wallace).
    joined = [m for page in ZH_PAGES for m in re.findall(
        r'<span id="id\d+">((?:[^<\[]|</?em>)+) \[<a', (HTML / page).read_text("utf-8"))]
    assert "Jain 和 Wallace" in joined and "Kobayashi 等人" in joined, joined
    assert not [m for m in joined if " and " in m or "et al." in m], joined
    assert not undated and "无日期" in (HTML / f"{ZH}/book/references.html").read_text("utf-8")


def test_chinese_pages_keep_the_spacing_rule():
    """A space between Chinese and Latin text, none between two Chinese characters,
    links, code and math included (tools.editions, "spacing")."""
    from tools import editions

    if not ZH_PAGES:
        _missing("no Chinese edition built: run `make book` first")
    left = {page: found for page in ZH_PAGES
            if (found := editions.spacing_problems((HTML / page).read_text(encoding="utf-8")))}
    assert not left, sorted(left.items())[:5]


def test_emphasis_on_chinese_text_is_not_slanted():
    """Every emphasis on Chinese text of a Chinese page is marked for the edition's
    style sheet, which draws it upright with dots under the characters."""
    if not ZH_PAGES:
        _missing("no Chinese edition built: run `make book` first")
    plain = [(page, m) for page in ZH_PAGES
             for m in re.findall(r"<em>([^<]*[\u4e00-\u9fff][^<]*)</em>",
                                 (HTML / page).read_text(encoding="utf-8"))]
    assert not plain, plain[:5]
    marked = sum((HTML / page).read_text("utf-8").count('<em class="han-emphasis">')
                 for page in ZH_PAGES)
    assert marked > 100, marked
    css = (ROOT / "book" / "_static" / "editions.css").read_text(encoding="utf-8")
    rule = re.search(r"em\.han-emphasis \{([^}]*)\}", css)
    assert rule and "font-style: normal" in rule.group(1) and "text-emphasis" in rule.group(1)


# --- the live translator (book/notebooks/93_translator_live, tests/live_page.py) -------

LIVE = live_page.PAGE
# What the page fetches when the reader starts the model, and only then.
LIVE_FILES = {"/_vendor/onnxruntime-web/ort.wasm.min.js",
              "/_vendor/onnxruntime-web/ort-wasm-simd-threaded.mjs",
              "/_vendor/onnxruntime-web/ort-wasm-simd-threaded.wasm",
              "/_vendor/translator/translator.json",
              "/_vendor/translator/translator_encoder.onnx",
              "/_vendor/translator/translator_decoder.onnx"}  # fmt: skip
# Sentences outside the grammar, and the page's message for each (its live-s-<key>
# string, with what it names).
OUTSIDE = [("the dragon sleeps", "unknown", {"word": "dragon"}),
           ("the cat sleep", "from", {"word": "sleep"}),
           ("a old cat sleeps", "from", {"word": "old"}),
           ("the cats sees a dog", "from", {"word": "sees"}),
           ("the cat sees", "incomplete", {}),
           ("   ", "empty", {}),
           ("the cat sleeps and " * 8 + "the dog runs", "long", {"max": 32})]  # fmt: skip
LIVE_STRING_JS = "(key) => document.getElementById(`live-s-${key}`).textContent.trim()"


def _live_string(page, key: str, values: dict) -> str:
    text = page.evaluate(LIVE_STRING_JS, key.lower())
    return re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), m.group(0))), text)


def _open_live_page(browser, served_site, path: str, width: int = DESKTOP):
    context = browser.new_context(viewport={"width": width, "height": DESKTOP_HEIGHT})
    page = context.new_page()
    found = site_check._watch(page, served_site)
    page.goto(f"{served_site}/{path}", wait_until="load")
    served_site.wait_until_idle()
    return context, page, found


def _wait_done(page, steps: int) -> None:
    """Until the page has written ``steps`` words and says it is done."""
    done = _live_string(page, "done", {"steps": steps})
    page.wait_for_function("(done) => document.querySelector('.live-status').textContent"
                           " === done && !document.querySelector('.live-start').disabled",
                           arg=done)


def _drawn(page, kind: str) -> dict[tuple[int, int], float]:
    """The weights a heat map drew: (row, column) -> data-weight of its cell."""
    cells = page.eval_on_selector_all(
        f'svg rect[data-kind="{kind}"]',
        "els => els.map(e => [+e.dataset.row, +e.dataset.col, +e.dataset.weight])")
    return {(r, c): w for r, c, w in cells}


@pytest.mark.parametrize("page_path", [LIVE])
def test_the_live_translator_writes_and_draws_what_the_python_model_does(
        browser, served_site, visit, page_path):
    """One visit, many sentences (tests/live_page.py): 24 held-out sentences, 6
    compositional ones and chapter 7's 8 probes, and four of them with heads silenced.
    The page's words are greedy_decode's and every weight it computes is the torch
    model's (1e-4); the
    runtime and the model come from this site, only once the reader starts the model,
    and weigh what the page says. Then by keyboard alone: a sentence typed and
    translated, a step, a head and a silenced head chosen; the heat maps, the lines and
    the tables draw the torch model's weights for that choice. Axe, the layout at both
    widths and dark mode are checked on the page with the model running."""
    first = {path for path, _, _ in visit(page_path).sent}
    assert not first & LIVE_FILES, "the first load fetched the runtime or the model"
    context, page, found = _open_live_page(browser, served_site, page_path)
    try:
        served_site.take_sent()
        cases = live_page.cases()
        results = live_page.translate_in_page(page, cases)
        # The downloads: the files the page names, each once, as many bytes as it says.
        sent = [s for s in served_site.take_sent() if s[0] != "/_static/favicon.svg"]
        assert sorted(p for p, _, _ in sent) == sorted(LIVE_FILES)
        total = sum(decoded for _, _, decoded in sent)
        assert total == sum((HTML / p.lstrip("/")).stat().st_size for p in LIVE_FILES)
        glued = page.eval_on_selector_all(".pasted-text", "els => els.map(e => e.textContent)")
        assert glued[2] == f"{total / 1e6:.1f}", glued  # "in all ... MB"
        # Translations and weights, case by case.
        problems = [p for case, got in zip(cases, results, strict=True)
                    for p in live_page.compare(case, got)]
        assert not problems, "\n".join(problems)
        silenced = [(c, r) for c, r in zip(cases, results, strict=True) if c["silenced"]]
        for case, got in silenced:  # the comparison the page shows beside them
            assert got["heard"] == live_page.expected(case["sentence"], []).target
        assert any(got["heard"] != got["target"] for _, got in silenced)  # not vacuous

        # Keyboard only: type, Enter, then step 3, head 1.
        # A sentence that silencing the encoder's head 0 changes (it changes most).
        sentence = next(c["sentence"] for c in cases if not c["silenced"]
                        and live_page.expected(c["sentence"], ["encoder:0:0"]).target
                        != live_page.expected(c["sentence"], []).target)
        page.focus(".live-form input[type=text]")
        page.keyboard.press("Control+A")
        page.keyboard.type(sentence)
        page.keyboard.press("Enter")
        want = live_page.expected(sentence, [])
        _wait_done(page, len(want.target))
        step_select = page.locator(".live-controls select").nth(0)
        step_select.focus()
        for _ in range(2):
            page.keyboard.press("ArrowDown")
        head_select = page.locator(".live-controls select").nth(2)
        head_select.focus()
        page.keyboard.press("ArrowDown")
        assert (step_select.input_value(), head_select.input_value()) == ("2", "1")
        step, head = 2, 1
        cross = want.maps["cross"][0][head]  # (T, S)
        dec_self = want.maps["decoderSelf"][0][head]  # (T, T)
        encoder = want.maps["encoder"][0][head]  # (S, S)
        for kind, expected_map in (("cross", cross), ("decoderSelf", dec_self),
                                   ("encoder", encoder)):
            drawn = _drawn(page, kind)
            rows, cols = expected_map.shape
            shown = {(r, c) for r in range(rows) for c in range(cols)
                     if kind != "decoderSelf" or c <= r}  # the causal mask hides c > r
            assert set(drawn) == shown, kind
            error = max(abs(w - expected_map[r, c]) for (r, c), w in drawn.items())
            assert error <= live_page.ATOL, (kind, error)
            table = page.eval_on_selector_all(
                f'table[data-kind="{kind}"] td', "els => els.map(e => e.textContent)")
            assert len(table) == rows * cols
            values = [float(t) for t in table if t != "–"]
            assert len(values) == len(shown)  # the rest say "masked"
            assert max(abs(v - w) for v, w in zip(
                values, [expected_map[r, c] for r, c in sorted(shown)], strict=True)) <= 5.1e-4
        lines = page.eval_on_selector_all('line[data-kind="crossLines"]',
                                          "els => els.map(e => +e.dataset.weight)")
        assert max(abs(a - b) for a, b in zip(lines, cross[step], strict=True)) <= live_page.ATOL
        framed = page.locator(".live-word.live-on").inner_text()
        assert framed == want.target[step]
        # Silence encoder head 0 with the space bar: the torch model with it silenced.
        box = page.locator('input[data-head="encoder:0:0"]')
        box.focus()
        page.keyboard.press(" ")
        quiet = live_page.expected(sentence, ["encoder:0:0"]).target
        page.wait_for_function("() => document.querySelector('.live-compare')")
        _wait_done(page, len(quiet))
        words = page.eval_on_selector_all(".live-word", "els => els.map(e => e.textContent)")
        assert words == quiet and words != want.target
        assert page.evaluate("document.activeElement.dataset.head") == "encoder:0:0"

        # Completion: after "the black", another adjective or a noun of either number.
        from mha.translator.lexicon import ADJECTIVES, NOUNS

        page.fill(".live-form input[type=text]", "the black ")
        offered = page.eval_on_selector_all(".live-form datalist option",
                                            "els => els.map(e => e.value)")
        nexts = page.eval_on_selector_all(".live-form select option",
                                          "els => els.map(e => e.value).filter(Boolean)")
        grammar = {a.en for a in ADJECTIVES} - {"black"} | {w for n in NOUNS
                                                           for w in (n.en, n.en_plural)}
        assert set(nexts) == grammar and len(nexts) == len(grammar)
        assert offered == [f"the black {w}" for w in nexts]
        page.fill(".live-form input[type=text]", "the black ca")  # a word begun
        offered = page.eval_on_selector_all(".live-form datalist option",
                                            "els => els.map(e => e.value)")
        assert offered == ["the black cat", "the black cats"]
        page.focus(".live-form select")
        page.keyboard.press("ArrowDown")  # the first word offered, by keyboard
        assert page.input_value(".live-form input[type=text]") == f"the black {nexts[0]}"

        # Outside the grammar: the page's own message, and no translation.
        for sentence, key, values in OUTSIDE:
            got = page.evaluate("s => window.liveTranslator.translate(s)", sentence)
            message = _live_string(page, key, values)
            assert got == {"problem": message}, (sentence, got)
            assert page.locator(".live-status").inner_text() == message
            assert page.locator(".live-output").is_hidden()

        # The running page, every table open, at both widths and in dark mode.
        live_page.translate_in_page(page, cases[:1])
        # At the top, as a first visit is examined (scrolled, the theme shows its "Back
        # to top" button, whose contrast is the theme's own affair).
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_function("() => !document.querySelector('#pst-back-to-top')"
                               " || getComputedStyle(document.querySelector("
                               "'#pst-back-to-top')).display === 'none'")
        assert not site_check.examine(page, (PHONE, PHONE_HEIGHT), measured=_MEASURED)
        assert not found, found
    finally:
        context.close()


@pytest.mark.parametrize("page_path", [f"{ZH}/{LIVE}"])
def test_the_live_translator_speaks_the_chinese_editions_language(browser, served_site,
                                                                  page_path):
    """The Chinese page runs the same runtime and model (the English edition's files)
    and words its interface from its own catalog: every label, button and message the
    script writes is Chinese."""
    context, page, found = _open_live_page(browser, served_site, page_path, width=PHONE)
    try:
        served_site.take_sent()
        sentence = live_page.sentences()[0]
        page.fill(".live-form input[type=text]", sentence)
        page.click(".live-start")
        want = live_page.expected(sentence, [])
        _wait_done(page, len(want.target))
        assert LIVE_FILES <= {path for path, _, _ in served_site.take_sent()}
        words = page.eval_on_selector_all(".live-word", "els => els.map(e => e.textContent)")
        assert words == want.target
        shown = page.eval_on_selector_all(
            ".live-translator label, .live-translator button, .live-translator legend, "
            ".live-translator figcaption, .live-translator summary, .live-status, "
            ".live-step-note, .live-translator caption",
            "els => els.map(e => e.textContent.trim())")
        english = [text for text in shown if not re.search(r"[\u4e00-\u9fff]", text)]
        assert len(shown) > 20 and not english, english
        assert not found, found
    finally:
        context.close()
