"""What the build cuts from the site's heavy assets (issue 26, point 8): the theme's
Font Awesome script, cut to the icons the site names (book/_ext/offline_site.py), and
the CJK web font, cut to the characters the site shows (tools/editions.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools import editions

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import offline_site  # noqa: E402

# --- Font Awesome -----------------------------------------------------------------

PACK = ('{bars:[448,512,["navicon"],"f0c9","M0 96z"],'
        '"magnifying-glass":[512,512,[128269,"search"],"f002","M416 208z"],'
        'moon:[384,512,[127769],"f186",["M1 1z","M2 2z"]]}')


def test_icon_packs_keep_the_icons_named_by_name_or_alias():
    script = f"var a={PACK};var b={PACK};run(a,b);"
    cut, kept = offline_site.cut_icon_packs(script, {"navicon", "moon"})
    assert kept == 4  # two icons in each of the two packs
    assert "f0c9" in cut and "f186" in cut and "f002" not in cut
    assert cut.startswith("var a={") and cut.endswith("};run(a,b);")


def test_icon_packs_refuse_a_script_without_packs():
    with pytest.raises(RuntimeError, match="no icon pack"):
        offline_site.cut_icon_packs("var a={x:1};", {"bars"})


def test_the_themes_script_is_cut_to_a_few_icons():
    import pydata_sphinx_theme

    theme = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme"
    script = (theme / "static" / "scripts" / "fontawesome.js").read_text(encoding="utf-8")
    cut, kept = offline_site.cut_icon_packs(script, {"magnifying-glass", "bars"})
    assert kept == 2
    assert len(cut) < len(script) / 10
    # The icons kept are whole, the runtime around the packs untouched.
    for name in ("magnifying-glass", "bars"):
        key = f'"{name}":[' if f'"{name}":[' in script else f"{name}:["
        start = script.index(key)
        entry = script[start:script.index("]", script.index('"M', start)) + 1]
        assert entry in cut
    assert script[:2000] == cut[:2000]


def test_icons_named_reads_pages_and_scripts(tmp_path):
    (tmp_path / "a.html").write_text('<i class="fa-solid fa-bars"></i>')
    (tmp_path / "b.js").write_text('el.className = "fa-solid fa-xmark";')
    (tmp_path / "fontawesome.js").write_text("fa-everything")
    assert offline_site.icons_named(tmp_path) == {"solid", "bars", "xmark"}


# --- the CJK font -------------------------------------------------------------------


@pytest.fixture(scope="module")
def font_source():
    if not editions.FONT_SOURCE.is_dir():
        pytest.fail("no font slices in book/_vendor: run `make setup` first")
    return editions.FONT_SOURCE


def test_font_slices_are_cut_to_the_characters_shown(tmp_path, font_source):
    from fontTools.ttLib import TTFont

    shown = {ord(c) for c in "多头注意力，掩码。Attention"}
    out = tmp_path / "noto-sans-sc"
    kept, left_out, saved = editions.cut_fonts(out, font_source, shown)
    files = sorted(out.glob("files/*.woff2"))
    assert kept == len(files) and left_out > 0 and saved > 0
    covered = set()
    for path in files:
        cmap = set(TTFont(path).getBestCmap())
        assert cmap and cmap <= shown, path.name
        covered |= cmap
    cjk = {c for c in shown if c > 0x2FFF}
    assert cjk <= covered
    # Kept only where a browser would load it: its range holds a character shown.
    ranges = {name: chars for sheet in out.glob("*.css")
              for name, chars in editions.unicode_ranges(sheet.read_text()).items()}
    assert all(ranges[path.name] & shown for path in files)
    # Every face left in the stylesheets names a slice that is there, and only those.
    for sheet in out.glob("*.css"):
        named = editions.FACE.findall(sheet.read_text(encoding="utf-8"))
        assert named and all((out / "files" / name).exists() for name in named)
    assert {p.name for p in files} == {
        name for sheet in out.glob("*.css")
        for name in editions.FACE.findall(sheet.read_text(encoding="utf-8"))}


def test_a_faces_range_is_read_from_its_stylesheet():
    sheet = ("/* a */\n@font-face {\n  src: url(./files/a-400.woff2) format('woff2');\n"
             "  unicode-range: U+4e00-4e02,U+ff01;\n}\n\n/* b */\n@font-face {\n"
             "  src: url(./files/b-400.woff2) format('woff2');\n  unicode-range: U+20;\n}\n")
    assert editions.unicode_ranges(sheet) == {
        "a-400.woff2": {0x4E00, 0x4E01, 0x4E02, 0xFF01}, "b-400.woff2": {0x20}}


def test_cutting_again_starts_from_the_whole_font(tmp_path, font_source):
    from fontTools.ttLib import TTFont

    out = tmp_path / "noto-sans-sc"
    editions.cut_fonts(out, font_source, {ord("多")})
    editions.cut_fonts(out, font_source, {ord("多"), ord("头")})
    covered = set().union(*(set(TTFont(p).getBestCmap()) for p in out.glob("files/*.woff2")))
    assert {ord("多"), ord("头")} <= covered


def test_a_cut_slice_is_taken_from_the_cache_for_the_same_characters(tmp_path, font_source):
    """`make site-build` keeps the cut slices in _build/font-cache: the same slice cut to
    the same characters is copied from there; other characters are cut afresh, and
    what the last cut did not use leaves the cache."""
    from fontTools.ttLib import TTFont

    cache = tmp_path / "cache"
    first, again, other = (tmp_path / name for name in ("first", "again", "other"))
    editions.cut_fonts(first, font_source, {ord("多")}, cache)
    cached = sorted(cache.glob("*.woff2"))
    assert len(cached) == len(list(first.glob("files/*.woff2"))) > 0
    editions.cut_fonts(again, font_source, {ord("多")}, cache)
    # cutting is not byte for byte repeatable: equal bytes mean the cache was used
    assert [p.read_bytes() for p in sorted(again.glob("files/*.woff2"))] == \
        [p.read_bytes() for p in sorted(first.glob("files/*.woff2"))]
    editions.cut_fonts(other, font_source, {ord("头")}, cache)
    covered = set().union(*(set(TTFont(p).getBestCmap()) for p in other.glob("files/*.woff2")))
    assert covered == {ord("头")}
    now = set(cache.glob("*.woff2"))
    assert len(now) == len(list(other.glob("files/*.woff2"))) and not set(cached) & now


def test_the_font_cut_reads_characters_written_as_escapes():
    """A script's \\uXXXX (Sphinx's translations.js) and a page's &#...; are characters
    the site shows: the cut font keeps them."""
    from tools.editions import shown_characters

    assert ord("您") in shown_characters(r'"\u60a8\u7684"', ".js")
    assert 0x1F600 in shown_characters(r"'\u{1F600}'", ".js")
    assert {ord("您"), ord("的")} <= shown_characters("&#x60a8;&#30340;", ".html")
    assert ord("您") not in shown_characters(r'"\u60a8"', ".html")  # not an escape there
