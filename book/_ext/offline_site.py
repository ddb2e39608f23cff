"""Sphinx extension: keep every page free of scripts that need the network.

Jupyter Book 1 always loads sphinx-thebe, whose only job is to start live code cells
on a remote Jupyter server. This book has none (it is read offline), and the inline
script sphinx-thebe adds was emitted twice per page, which is a JavaScript error
("Identifier 'THEBE_JS_URL' has already been declared"). Drop its assets from each page.
"""

from __future__ import annotations

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


def setup(app):
    app.connect("html-page-context", drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
