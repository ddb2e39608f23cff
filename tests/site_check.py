"""Open pages of the built site in headless Chromium and list what a reader would hit.

Used by ``tests/test_site.py``. A page passes when it makes no request outside the
local server, no request fails, the console stays free of errors, every image has
loaded and has alt text, and MathJax has typeset every formula (no raw ``\\(`` left).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
INSTALL_HINT = "headless Chromium not found: install it with `apt-get install chromium`"


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) for the duration of the block."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# Runs in the page after load: images and math, as the reader sees them.
PAGE_REPORT_JS = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  const images = Array.from(document.images).map(img => ({
    src: img.getAttribute('src'),
    loaded: img.complete && img.naturalWidth > 0,
    alt: (img.getAttribute('alt') || '').trim(),
  }));
  const math = Array.from(document.querySelectorAll('.math'));
  const untypeset = math.filter(el => !el.querySelector('mjx-container'))
                        .map(el => el.textContent.slice(0, 60));
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, textarea').forEach(el => el.remove());
  const text = clone.textContent;
  const raw = ['\\\\(', '\\\\[', '$$'].filter(marker => text.includes(marker));
  return {images, mathCount: math.length, untypeset, raw,
          mathjax: !!(window.MathJax && MathJax.startup)};
}
"""


def check_page(context, url: str, local_origin: str) -> list[str]:
    """Every problem found on the page at ``url``, one readable line each."""
    found: list[str] = []
    page = context.new_page()

    def on_request(route):
        request_url = route.request.url
        parsed = urlparse(request_url)
        if parsed.scheme in ("data", "blob", "about"):
            return route.continue_()
        if f"{parsed.scheme}://{parsed.netloc}" != local_origin:
            found.append(f"external request blocked: {request_url}")
            return route.abort()
        return route.continue_()

    page.route("**/*", on_request)
    page.on("console", lambda msg: found.append(f"console {msg.type}: {msg.text}")
            if msg.type == "error" else None)
    page.on("pageerror", lambda exc: found.append(f"page error: {exc}"))
    page.on("requestfailed", lambda req: found.append(
        f"request failed: {req.url} ({req.failure})") if local_origin in req.url else None)
    page.on("response", lambda resp: found.append(f"HTTP {resp.status}: {resp.url}")
            if resp.status >= 400 else None)
    try:
        page.goto(url, wait_until="load", timeout=30_000)
        page.wait_for_load_state("networkidle", timeout=30_000)
        report = page.evaluate(PAGE_REPORT_JS)
    finally:
        page.close()
    for image in report["images"]:
        if not image["loaded"]:
            found.append(f"image did not load: {image['src']}")
        if not image["alt"]:
            found.append(f"image without alt text: {image['src']}")
    if report["mathCount"] and not report["mathjax"]:
        found.append(f"{report['mathCount']} formulas but MathJax did not start")
    for snippet in report["untypeset"]:
        found.append(f"math not rendered: {snippet!r}")
    for marker in report["raw"]:
        found.append(f"raw math delimiter {marker!r} left in the page text")
    return found


def site_pages(html_root: Path) -> list[Path]:
    """Every HTML page a reader can reach (not the vendored MathJax files)."""
    pages = []
    for path in sorted(html_root.rglob("*.html")):
        rel = path.relative_to(html_root)
        if rel.parts[0] in {"_vendor", "_static", "_sources", "_images"}:
            continue
        pages.append(path)
    return pages


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}
