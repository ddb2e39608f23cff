"""Sphinx extension: a site that is whole on its own, with nothing left to fetch.

* Jupyter Book 1 always loads sphinx-thebe, whose only job is to start live code cells
  on a remote Jupyter server. This book has none (it is read offline), and the inline
  script sphinx-thebe adds was emitted twice per page, which is a JavaScript error
  ("Identifier 'THEBE_JS_URL' has already been declared"). Its assets are dropped from
  each page.
* The site's front door, ``index.html``, was a bare redirect (written by
  sphinx-external-toc): no title, and no tab icon, so every browser asked for
  ``/favicon.ico`` and got a 404. It is written here instead, before that fallback runs.
* The theme ships source maps (``*.map``, 3 MB) for its scripts and styles. No page
  loads them (only a browser's developer tools would); they are not published.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

THEBE_MARKERS = ("THEBE_JS_URL", "sphinx-thebe")


def _is_thebe(asset: Any) -> bool:
    body = getattr(asset, "attributes", {}).get("body")
    text = " ".join(str(part) for part in (getattr(asset, "filename", asset), body) if part)
    return any(marker in text for marker in THEBE_MARKERS)


def drop_thebe(app, pagename, templatename, context, doctree) -> None:
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [asset for asset in context[key] if not _is_thebe(asset)]


INDEX = """<!doctype html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="icon" href="_static/{icon}">
<meta http-equiv="Refresh" content="0; url={target}">
</head>
<body><p><a href="{target}">{title}</a></p></body>
</html>
"""


def write_index(app, exception: Exception | None) -> None:
    """``index.html``: a redirect to the first page that names the tab icon too."""
    if exception is not None or app.builder.name != "html" or app.config.root_doc == "index":
        return
    if not app.config.html_favicon:
        return  # sphinx-external-toc's plain redirect will do
    (Path(app.outdir) / "index.html").write_text(
        INDEX.format(
            lang=app.config.language or "en",
            title=html.escape(app.config.html_title or app.config.project),
            icon=Path(app.config.html_favicon).name,
            target=f"{app.config.root_doc}.html",
        ),
        encoding="utf-8",
    )


def drop_source_maps(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        for path in Path(app.outdir, "_static").rglob("*.map"):
            path.unlink()


def setup(app):
    app.connect("html-page-context", drop_thebe, priority=900)
    # Before sphinx-external-toc's own (priority 500), which keeps an existing file.
    app.connect("build-finished", write_index, priority=400)
    app.connect("build-finished", drop_source_maps)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
