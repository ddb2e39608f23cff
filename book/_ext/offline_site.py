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
* The theme's Font Awesome script (1.5 MB, every page loads it first) carries the
  SVG of each of its 2,045 free icons, for about twenty that the site shows. It is
  cut to the icons that the site's pages and scripts name (``fa-<name>``, or one of
  the icon's aliases); the rest of the script is left as it is.
"""

from __future__ import annotations

import html
import re
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


# One icon in Font Awesome's packs: name: [width, height, [aliases], "unicode", path(s)].
_FA_KEY = r'(?:"[^"\\]+"|[A-Za-z_$][\w$]*|\d+)'
_FA_ENTRY = _FA_KEY + r':\[\d+,\d+,\[[^\]]*\],"[0-9a-f]+",(?:"[^"]*"|\[[^\]]*\])\]'
FA_ENTRY = re.compile(r"(?P<key>" + _FA_KEY + r"):\[\d+,\d+,\[(?P<aliases>[^\]]*)\],")
# A pack: an object literal made of icons only.
FA_PACK = re.compile(r"\{(?:" + _FA_ENTRY + r",)*" + _FA_ENTRY + r"\}")
FA_ICON_CLASS = re.compile(r"\bfa-([a-z0-9]+(?:-[a-z0-9]+)*)")
FONTAWESOME = Path("_static", "scripts", "fontawesome.js")


def icons_named(outdir: Path) -> set[str]:
    """Every ``fa-<name>`` that a page or a script (other than Font Awesome's) names."""
    names = set()
    for path in outdir.rglob("*"):
        if path.suffix in (".html", ".js") and path.name != FONTAWESOME.name:
            names |= set(FA_ICON_CLASS.findall(path.read_text(encoding="utf-8", errors="ignore")))
    return names


def cut_icon_packs(script: str, keep: set[str]) -> tuple[str, int]:
    """The script with every icon pack cut to the icons named in ``keep`` (by name or
    alias). Returns (script, icons kept)."""
    kept = 0

    def cut(pack: re.Match) -> str:
        nonlocal kept
        body = pack.group(0)[1:-1]
        entries = [m.group(0) for m in re.finditer(_FA_ENTRY, body)]
        chosen = []
        for entry in entries:
            head = FA_ENTRY.match(entry)
            names = {head.group("key").strip('"')} | {
                a.strip('"') for a in head.group("aliases").split(",") if a.startswith('"')}
            if names & keep:
                chosen.append(entry)
        kept += len(chosen)
        return "{" + ",".join(chosen) + "}"

    cut_script, packs = FA_PACK.subn(cut, script)
    if packs == 0:
        raise RuntimeError("offline_site: no icon pack found in Font Awesome's script")
    return cut_script, kept


def cut_fontawesome(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    script = outdir / FONTAWESOME
    if not script.exists():
        return
    keep = icons_named(outdir)
    text, kept = cut_icon_packs(script.read_text(encoding="utf-8"), keep)
    script.write_text(text, encoding="utf-8")


def setup(app):
    app.connect("html-page-context", drop_thebe, priority=900)
    # Before sphinx-external-toc's own (priority 500), which keeps an existing file.
    app.connect("build-finished", write_index, priority=400)
    app.connect("build-finished", drop_source_maps)
    app.connect("build-finished", cut_fontawesome)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
