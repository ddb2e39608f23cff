"""Sphinx extension: the live translator's script and style, on its page only.

The page (book/notebooks/93_translator_live) holds an element with the class
``live-translator``; ``book/_static/live-translator.js`` builds the interface inside it
and ``live-translator.css`` styles it. Listed in ``html_js_files`` they would be loaded
by every page of the site; added from ``html-page-context`` they go to the pages whose
body holds that element (Sphinx adds a file named there to that page alone).
"""

from __future__ import annotations

MARKER = 'class="live-translator'
SCRIPT, STYLE = "live-translator.js", "live-translator.css"


def add_assets(app, pagename, templatename, context, doctree) -> None:
    if MARKER in context.get("body", ""):
        app.add_js_file(SCRIPT)
        app.add_css_file(STYLE)


def setup(app):
    app.connect("html-page-context", add_assets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
