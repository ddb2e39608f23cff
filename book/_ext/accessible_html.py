"""Sphinx extension: small fixes to the HTML that the theme and the extensions write, so
that a screen reader and voice control can use every page (axe-core finds nothing
serious; the browser tests run it).

Each fix rewrites one exact piece of markup in every page after the build; a fix whose
markup no longer appears (a new theme version) makes the build fail, so that it is
looked at again rather than silently lost.

* The toggle of a hidden cell (sphinx-togglebutton) says "Show code cell source" but
  is named "Toggle hidden content" (``aria-label``): a voice-control user who says what
  they see cannot press it. Without the label, its name is its visible text.
* The theme's search field shows "Search Ctrl+K" but is named "Search": the same
  mismatch. Without the label, the name is the text it shows.
* The colour-mode button is named "Color mode", but its icons carry titles ("Light",
  "Dark", "System Settings") that count as its visible text. The titles go; the
  button keeps its name and its tooltip.
* The bibliography is a ``role="list"`` whose items are ``role="doc-biblioentry"``
  (deprecated, and not list items): a list a screen reader cannot walk. Plain
  elements instead; the entries keep their labels and back-links.

The theme writes its labels in the edition's language (``title="搜索"`` in Chinese), so
in another edition each fix's ``title``/``aria-label`` is looked up in Sphinx's own
translation, as the theme looks it up.
"""

from __future__ import annotations

import re
from pathlib import Path

# (what the markup is, exactly as written, what it becomes, what a reader gains)
FIXES = (
    ('<summary aria-label="Toggle hidden content">', "<summary>",
     "a cell toggle named by its visible text"),
    ('class="btn search-button-field search-button__button pst-js-only" title="Search" '
     'aria-label="Search"',
     'class="btn search-button-field search-button__button pst-js-only" title="Search"',
     "the search field named by its visible text"),
    ('data-mode="light" title="Light"', 'data-mode="light"',
     "the colour-mode button named by its label alone"),
    ('data-mode="dark"  title="Dark"', 'data-mode="dark" ',
     "the colour-mode button named by its label alone"),
    ('data-mode="auto"  title="System Settings"', 'data-mode="auto" ',
     "the colour-mode button named by its label alone"),
    ('<div role="list" class="citation-list">', '<div class="citation-list">',
     "a bibliography that is not a broken list"),
    (' role="doc-biblioentry"', "", "no deprecated role on the entries"),
)


LABEL = re.compile(r'\b(title|aria-label)="([^"]+)"')


def fixes_for(language: str | None) -> tuple[tuple[str, str, str], ...]:
    """FIXES with their labels as the theme writes them in ``language``."""
    if not language or language.startswith("en"):
        return FIXES
    from sphinx.locale import get_translation

    _ = get_translation("sphinx")

    def local(markup: str) -> str:
        return LABEL.sub(lambda m: f'{m.group(1)}="{_(m.group(2))}"', markup)

    return tuple((local(before), local(after), gain) for before, after, gain in FIXES)


def fix_page(text: str, fixes=FIXES) -> tuple[str, set[int]]:
    """The page with every fix applied, and the indices of the fixes that applied."""
    applied = set()
    for index, (before, after, _) in enumerate(fixes):
        if before in text:
            text = text.replace(before, after)
            applied.add(index)
    return text, applied


def fix_site(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    fixes = fixes_for(app.config.language)
    applied: set[int] = set()
    for page in Path(app.outdir).rglob("*.html"):
        if "_vendor" in page.parts:
            continue
        text, done = fix_page(page.read_text(encoding="utf-8"), fixes)
        if done:
            page.write_text(text, encoding="utf-8")
            applied |= done
    missing = [fixes[i][2] for i in range(len(fixes)) if i not in applied]
    if missing:
        raise RuntimeError(
            "accessible_html: markup to fix not found in any page (did the theme or an "
            f"extension change?): {missing}"
        )


def setup(app):
    app.connect("build-finished", fix_site)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
