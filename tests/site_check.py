"""Open pages of the built site in headless Chromium and list what a reader would hit.

Used by ``tests/test_site.py``. Each page is visited once (:func:`inspect_page`): a
first visit with an empty cache, at a desktop's width and then resized to a phone's,
and everything is measured on that visit: the bytes it fetched, its Chinese glyphs, its
layout at both widths and what axe-core finds. A page passes when it makes no request
outside the local server, no request fails, the console stays free of errors, every
image has loaded and has alt text, MathJax has typeset every formula (no raw ``\\(``
left), no link's text is raw LaTeX, no parentheses are doubled, nothing scrolls
sideways and axe finds nothing (see :func:`examine`).
"""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
# Written by tests/test_site_build.py for the browser tests of its own pytest session
# (one file per session): "building <pid>", then "built" or "failed".
BUILD_STATES = ROOT / "_build" / "site-build-states"

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # No host but this machine resolves: a page that asks for anything from outside
    # fails at once, and the request is reported (see check_page).
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
# mha.draw's smallest font (the numbers inside tensor cells), and the smallest text
# size on screen that stays readable.
SMALLEST_FIGURE_FONT_PT = 8.5
MIN_TEXT_PX = 8.0
INSTALL_HINT = "headless Chromium not found: install it with `apt-get install chromium`"
# axe-core, installed by the set-up from the npm registry (book/_vendor/package.json).
AXE = Path(__file__).resolve().parent.parent / "book/_vendor/node_modules/axe-core/axe.min.js"
# What axe still finds that comes from the theme's templates, each with its reason.
# Keyed by (rule, the element's selector); anything else axe finds is a problem.
AXE_KNOWN = {
    ("region", ".sidebar-primary-items__start > .sidebar-primary-item:nth-child(1)"):
        "the theme's sidebar title (the book's name) sits outside any landmark; its "
        "template places it there, and moving it would mean forking the template "
        "(moderate: a screen reader still reaches it)",
}
# Every page's first load (empty cache), fonts and MathJax included, stays under these:
# at most 3 MB transferred from a host that compresses text as static hosts do, and at
# most 6 MB once decompressed (what a host without compression would send; the
# heaviest pages weighed 5.4 MB when it was set, their SVG figures 1.3-1.6 MB of it).
PAGE_BUDGET_BYTES = 3_000_000
PAGE_BUDGET_UNCOMPRESSED_BYTES = 6_000_000


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


# Text a static host compresses on the way (GitHub Pages, Netlify, nginx's defaults do):
# sent gzip-compressed to a browser that asks for it. Fonts and images that are already
# compressed (WOFF2, PNG) go as they are.
COMPRESSED_TYPES = {".html", ".css", ".js", ".svg", ".json", ".txt", ".ipynb", ".map"}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass

    def do_GET(self):  # noqa: N802 - name fixed by the base class
        # Counted from the request's arrival to its last byte sent (a kept-alive
        # connection that waits for the next request is not a request in flight).
        with self.server.lock:
            self.server.in_flight += 1
        try:
            super().do_GET()
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            return super().send_head()  # a folder's index, or a 404
        size = path.stat().st_size
        if (path.suffix not in COMPRESSED_TYPES
                or "gzip" not in self.headers.get("Accept-Encoding", "")):
            self.server.record(self.path, size, size)
            return super().send_head()
        body = self.server.compressed(path)
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.server.record(self.path, len(body), size)
        return io.BytesIO(body)


class _Server(http.server.ThreadingHTTPServer):
    """Serves a folder, compresses each text file once (the site does not change while
    it is served), and records the bytes of every file it sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.sent: list[tuple[str, int, int]] = []  # (path, transferred, decoded)
        self._gzip: dict[tuple[Path, int], bytes] = {}

    def compressed(self, path: Path) -> bytes:
        key = (path, path.stat().st_mtime_ns)
        if key not in self._gzip:
            self._gzip[key] = gzip.compress(path.read_bytes(), compresslevel=6, mtime=0)
        return self._gzip[key]

    def record(self, path: str, transferred: int, decoded: int) -> None:
        with self.lock:
            self.sent.append((path, transferred, decoded))

    def handle_error(self, request, client_address):
        # The browser closed the connection (the page moved on, or the test ended).
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class Served(str):
    """The origin of a served folder (``http://127.0.0.1:PORT``), and its server's
    record of what it sent."""

    server: _Server

    def take_sent(self) -> list[tuple[str, int, int]]:
        """What the server sent since the last call: (path, transferred, decoded)."""
        with self.server.lock:
            sent, self.server.sent = self.server.sent, []
        return sent

    def wait_until_idle(self, timeout: float = 30.0) -> None:
        """Until no request is being answered (every file the page asked for is sent)."""
        end = time.monotonic() + timeout
        while self.server.in_flight and time.monotonic() < end:
            time.sleep(0.01)


@contextmanager
def serve(directory: Path) -> Iterator[Served]:
    """Serve ``directory`` on 127.0.0.1 (a free port) for the duration of the block."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    origin = Served(f"http://127.0.0.1:{server.server_address[1]}")
    origin.server = server
    try:
        yield origin
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
  clone.querySelectorAll('pre, code, script, style, textarea, mjx-container, mjx-assistive-mml')
       .forEach(el => el.remove());
  const text = clone.textContent;
  const raw = ['\\\\(', '\\\\[', '$$'].filter(marker => text.includes(marker));
  // Slips of the rendered prose: a link whose text is raw LaTeX (a reference to a
  // title with math), and doubled parentheses such as "((6.3))".
  const latexLinks = Array.from(clone.querySelectorAll('a'))
    .map(a => a.textContent.trim()).filter(t => /\\\\[a-zA-Z]+|\\$/.test(t));
  const doubled = (text.match(/\\(\\([^()]*\\)\\)|\\(\\s*\\(/g) || []);
  // Font Awesome swaps each icon <i class="fa-..."> for an <svg>; for an icon its (cut)
  // script does not hold, the <svg> is its "missing" placeholder, or the <i> stays.
  const icons = Array.from(document.querySelectorAll(
      'i[class*="fa-"], svg.svg-inline--fa:has(.missing)'))
    .map(el => el.getAttribute('class'));
  return {images, mathCount: math.length, untypeset, raw, latexLinks, doubled, icons,
          mathjax: !!(window.MathJax && MathJax.startup),
          typeset: document.querySelectorAll('mjx-container').length};
}
"""


# After the load event: MathJax has typeset the page (its startup promise) and every
# font the laid-out page uses has arrived (the fonts' own ready signal), so nothing more
# is fetched until the reader does something.
READY_JS = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  document.body.getBoundingClientRect();  // lay out what MathJax wrote: its fonts load
  await document.fonts.ready;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return !!document.querySelector('meta[http-equiv="refresh" i]');  // it leads on
}
"""


def _watch(page, local_origin: str) -> list[str]:
    """Start listing what goes wrong while ``page`` loads: the list fills as it does."""
    found: list[str] = []

    # Watched, not intercepted: intercepting every request (page.route) would switch
    # off the browser's cache. CHROMIUM_ARGS make every other host unresolvable, so
    # nothing leaves the machine.
    def on_request(request):
        parsed = urlparse(request.url)
        if parsed.scheme in ("data", "blob", "about"):
            return
        if f"{parsed.scheme}://{parsed.netloc}" != local_origin:
            found.append(f"external request blocked: {request.url}")

    page.on("request", on_request)
    page.on("console", lambda msg: found.append(f"console {msg.type}: {msg.text}")
            if msg.type == "error" else None)
    page.on("pageerror", lambda exc: found.append(f"page error: {exc}"))
    # A request cut short because the page moved on (the front door redirects at once)
    # is not a broken link: a missing file answers 404, reported below.
    page.on("requestfailed", lambda req: found.append(
        f"request failed: {req.url} ({req.failure})")
        if local_origin in req.url and req.failure != "net::ERR_ABORTED" else None)
    page.on("response", lambda resp: found.append(f"HTTP {resp.status}: {resp.url}")
            if resp.status >= 400 else None)
    return found


def _load(page, url: str) -> None:
    """Open ``url`` and wait until it is ready (READY_JS); a page that sends the reader
    on (the front door's ``<meta http-equiv="Refresh">``) is followed to where it leads,
    and waited for there: the refresh may fire before or after the first page is ready."""
    from playwright.sync_api import Error

    page.goto(url, wait_until="load", timeout=60_000)
    # A fresh clone's run once met the page moving on while it was asked three times in
    # a row (the refresh fires during READY_JS's awaits): ask again, a moment later,
    # until the page it leads to answers (20 tries, a few seconds at most).
    for _ in range(20):
        try:
            if not page.evaluate(READY_JS):
                return
            here = page.url
            page.wait_for_url(lambda now, here=here: now != here, wait_until="load", timeout=60_000)
        except Error as error:  # the page moved on while it was being asked
            if "context was destroyed" not in str(error) and "null" not in str(error):
                raise
            page.wait_for_load_state("load", timeout=60_000)
            page.wait_for_timeout(100)
    raise AssertionError(f"{url} kept sending the reader on: now at {page.url}")


def check_page(
    context, url: str, local_origin: str, phone: tuple[int, int] | None = None
) -> list[str]:
    """Every problem found on the page at ``url``, one readable line each (a new tab of
    ``context``; :func:`inspect_page` does the same on a first visit, and more)."""
    page = context.new_page()
    found = _watch(page, local_origin)
    try:
        _load(page, url)
        return found + examine(page, phone)
    finally:
        page.close()


@dataclass
class PageReport:
    """What one visit to a page found (see :func:`inspect_page`)."""

    problems: list[str]
    sent: list[tuple[str, int, int]]  # every file the first visit fetched: (path,
    # bytes transferred, bytes decoded)
    glyphs: dict | None  # MISSING_GLYPHS_JS's report, for a page with Chinese text
    facts: dict  # see examine()
    landed: str  # the page the visit ended on (another, for a front door that leads on)


def inspect_page(browser, origin: Served, path: str, desktop: tuple[int, int],
                 phone: tuple[int, int], cjk: bool,
                 measured: dict[str, set[str]] | None = None) -> PageReport:
    """One first visit to ``origin/path`` (a new browser context: an empty cache), and
    everything measured on it: the bytes it fetched, its Chinese glyphs (``cjk``), and
    :func:`examine`'s problems at the ``desktop`` window, then at ``phone`` (``measured``:
    the styles of text whose contrast this process has measured, see
    :func:`accessibility_problems`). A page that sends the reader on to another (the
    front door) is not examined: the page it leads to is, on its own visit."""
    context = browser.new_context(viewport={"width": desktop[0], "height": desktop[1]})
    try:
        page = context.new_page()
        origin.take_sent()  # what earlier pages fetched is theirs
        found = _watch(page, origin)
        _load(page, f"{origin}/{path}")
        origin.wait_until_idle()
        sent = origin.take_sent()
        glyphs = page.evaluate(MISSING_GLYPHS_JS) if cjk else None
        landed = urlparse(page.url).path.lstrip("/")
        facts: dict = {}
        if landed == path:
            found += examine(page, phone, facts, measured)
    finally:
        context.close()
    return PageReport(found, sent, glyphs, facts, landed)


def examine(page, phone: tuple[int, int] | None = None, facts: dict | None = None,
            measured: dict[str, set[str]] | None = None) -> list[str]:
    """Every problem on a loaded ``page``, one readable line each; ``facts`` (a dict)
    gets what the tests read besides: ``typeset``, the formulas MathJax typeset, and
    with ``phone``, ``words``: what the site's own scripts wrote at that width
    (``SCRIPT_WORDS_JS``).

    A page passes when it makes no request outside the local server, no request fails,
    the console stays free of errors (both watched by :func:`_watch`), every image has
    loaded and has alt text, MathJax has typeset every formula (no raw ``\\(`` left), no
    link's text is raw LaTeX, no parentheses are doubled and axe finds nothing (see
    :func:`accessibility_problems`).

    The page's window (about 1280 px wide) is the desktop: every code block or output
    that scrolls sideways there is a problem, and so is every figure scaled down so far
    that its smallest text falls below ``MIN_TEXT_PX`` (the figures draw text as paths,
    so the size is judged from the smallest font ``mha.draw`` uses and the figure's
    display scale).

    With ``phone`` (width, height), the same page is then resized to that window and
    laid out again: a display equation wider than its column, or a figure scaled down
    with no link to its full size, is a problem there. Resizing the loaded page gives
    the layout a fresh load at that width gives (CSS and MathJax's CHTML do not depend
    on the width the page was loaded at), for half the work."""
    found: list[str] = []
    report = page.evaluate(PAGE_REPORT_JS)
    if facts is not None:
        facts["typeset"] = report["typeset"]
    page.evaluate(OPEN_ALL_JS)
    layout = page.evaluate(LAYOUT_JS)
    found += accessibility_problems(page, measured=measured)
    small = None
    if phone is not None:
        page.set_viewport_size({"width": phone[0], "height": phone[1]})
        page.evaluate(SETTLE_JS)
        small = page.evaluate(LAYOUT_JS)
        if facts is not None:
            facts["words"] = page.evaluate(SCRIPT_WORDS_JS)
        found += accessibility_problems(page, phone=True, measured=measured)
    for shown in (layout, small):
        if shown is not None and shown["page"]:
            wide = shown["page"]
            found.append(
                f"page wider than a {wide['clientWidth']} px window: {wide['scrollWidth']} px; "
                "sticking out: " + "; ".join(wide["outermost"]))
    found += [f"code scrolls sideways: {c}" for c in layout["code"]]
    found += [f"output scrolls sideways: {o}" for o in layout["outputs"]]
    for fig in layout["figures"]:
        text_px = SMALLEST_FIGURE_FONT_PT * 4 / 3 * fig["scale"]
        if text_px < MIN_TEXT_PX:
            found.append(
                f"figure text {text_px:.1f} px (scaled to {fig['scale']:.0%}): {fig['src']}"
            )
    if phone is not None:
        width = phone[0]
        found += [f"equation wider than a {width} px column: {e}" for e in small["equations"]]
        found += [f"scrolls sideways at {width} px with no sign of it: {t}"
                  for t in small["silent"]]
        found += [
            f"figure scaled down at {width} px with no link to its full size: {f['src']}"
            for f in small["figures"]
            if f["scale"] < 0.999 and not f["zoom"]
        ]
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
    found += [f"link text is raw LaTeX: {t!r}" for t in report["latexLinks"]]
    found += [f"doubled parentheses: {d!r}" for d in report["doubled"]]
    found += [f"icon not drawn (not in the site's Font Awesome): {c!r}" for c in report["icons"]]
    return found


# A chapter holds thousands of elements with text (one <span> per code token, every
# link of the tables of contents, every cell of a table), yet the whole site holds a
# few hundred styles of text; axe's colour-contrast rule measured every element, most
# of the time a page spent in axe. The contrast of a text element is set by its colour,
# the size and weight of its font, its shadow, and what is painted behind it: its own
# and its ancestors' backgrounds, opacity and filters, and any other painted box it
# lies over. So, before each run, in the page's current mode and width, every element
# with text gets a key of all that (a box it lies over enters the key with its own
# painting and ancestors', its position and z-index, whether it comes before or after
# the text in the page, and whether it lies under all of the text or part of it). The
# rule then measures (``data-axe-measure``) one element of each key not yet measured in
# this mode by the test process, in sight (not cut off or scrolled out of its box) and
# with two characters or more where the page has one (where a single character fails,
# axe calls it undecided rather than a violation); a key with no element in sight is
# measured on every element, and so is each element axe itself cannot measure
# (characters outside the Basic Multilingual Plane, no box) and each form field (its
# text is its value). Where axe does not pass the element measured for a key, every
# element of that key is measured (``MARK_MEMBERS_JS``). Seen on chapter 4, at both
# widths and in both modes: 3,250 to 3,813 elements with text, 80 to 92 keys, and within
# each key axe measured the same colours and ratio every time. Returns the marks of the
# elements measured for a key, with their keys, and how many elements were marked (in
# all, and with a box: axe measures nothing that has none).
MARK_TEXT_JS = r"""
(known) => {
  known = new Set(known);
  document.querySelectorAll('[data-axe-measure]')
    .forEach(el => el.removeAttribute('data-axe-measure'));
  const style = new Map(), chain = new Map(), clips = new Map();
  const css = el => {
    let s = style.get(el);
    if (!s) style.set(el, s = getComputedStyle(el));
    return s;
  };
  const paint = el => {
    const s = css(el);
    return [s.backgroundColor, s.backgroundImage, s.boxShadow, s.opacity, s.filter,
            s.mixBlendMode, s.visibility].join(' ');
  };
  const hash = text => {  // 53 bits of a string (cyrb53): the same on every page
    let h1 = 0xdeadbeef, h2 = 0x41c6ce57;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      h1 = Math.imul(h1 ^ c, 2654435761);
      h2 = Math.imul(h2 ^ c, 1597334677);
    }
    h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
    h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
    return (2097152 * (h2 >>> 0) + (h1 >>> 0)).toString(36);
  };
  const NOTHING = 'rgba(0, 0, 0, 0) none none 1 none normal visible';  // a box that paints nothing
  const chainOf = el => {  // the painting of an element and of all its ancestors (those
    if (!el) return '';    // that paint nothing left out): a hash, the same on every page
    let c = chain.get(el);
    if (c === undefined) {
      const own = paint(el);
      c = own === NOTHING ? chainOf(el.parentElement)
                          : hash(chainOf(el.parentElement) + ';' + own);
      chain.set(el, c);
    }
    return c;
  };
  const clipsOf = el => {  // the boxes around an element that cut off what sticks out
    if (!el) return [];
    let c = clips.get(el);
    if (c === undefined) {
      const s = css(el);
      c = clipsOf(el.parentElement);
      if (s.overflowX !== 'visible' || s.overflowY !== 'visible' || s.clipPath !== 'none'
          || s.clip !== 'auto' || s.contain.includes('paint')) {
        c = c.concat([el.getBoundingClientRect()]);
      }
      clips.set(el, c);
    }
    return c;
  };
  // What puts colour on the page besides text: backgrounds, shadows, replaced content;
  // filed by 200 px bands of the page for the overlap test below.
  const replaced = new Set(['IMG', 'svg', 'CANVAS', 'VIDEO', 'IFRAME', 'OBJECT', 'EMBED']);
  const band = y => Math.floor((y + window.scrollY) / 200);
  const bands = new Map();
  for (const el of document.body.querySelectorAll('*')) {
    const s = css(el);
    if (s.backgroundColor === 'rgba(0, 0, 0, 0)' && s.backgroundImage === 'none'
        && s.boxShadow === 'none' && !replaced.has(el.tagName)) continue;
    const r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0) continue;
    for (let b = band(r.top); b <= band(r.bottom); b++) {
      if (!bands.has(b)) bands.set(b, []);
      bands.get(b).push([el, r]);
    }
  }
  const inside = (r, b) =>
    r.left >= b.left && r.right <= b.right && r.top >= b.top && r.bottom <= b.bottom;
  const overlaps = (a, b) =>
    a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  // The painted boxes other than its ancestors that an element's text lies over: its
  // line boxes (getClientRects, where axe looks for what is behind the text), not the
  // rectangle around them, which for a phrase broken over two lines spans both lines.
  const under = (el, r) => {
    const lines = Array.from(el.getClientRects()).filter(x => x.width > 0 && x.height > 0);
    if (!lines.length) lines.push(r);
    const found = new Set();
    for (let b = band(r.top); b <= band(r.bottom); b++) {
      for (const [p, box] of bands.get(b) || []) {
        if (!lines.some(x => overlaps(x, box)) || p.contains(el)) continue;
        const s = css(p);
        found.add([chainOf(p), s.position, s.zIndex, p.tagName,
                   p.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING
                     ? 'before' : 'after',
                   lines.every(x => inside(x, box)) ? 'all' : 'part'].join(' '));
      }
    }
    return [...found].sort().join(' + ');
  };
  // Every element with text of its own, in document order.
  const owners = new Set();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.data.trim() && n.parentElement) owners.add(n.parentElement);
  }
  const keys = {};
  let marked = 0, boxless = 0;
  const measure = (el, key) => {
    el.setAttribute('data-axe-measure', marked);
    if (key) keys[marked] = key;
    marked++;
  };
  const members = new Map();  // key -> its elements on this page, in document order
  for (const el of owners) {
    const text = Array.from(el.childNodes).filter(n => n.nodeType === 3)
      .map(n => n.data).join('').trim();
    const r = el.getBoundingClientRect();
    if (/[\ud800-\udfff]/.test(text) || r.width < 1 || r.height < 1) {
      measure(el, null);  // axe's own judgement: characters it cannot measure, no box
      boxless += r.width < 1 || r.height < 1;
      continue;
    }
    // Cut off or scrolled out of sight by a box around it: it can share a key, but not
    // stand for one, and what lies under it out there is never seen.
    const shown = clipsOf(el.parentElement).every(b => inside(r, b));
    const s = css(el);
    const key = [s.color, s.fontSize, s.fontWeight, s.textShadow, s.webkitTextFillColor,
                 s.webkitTextStrokeWidth, chainOf(el), shown ? under(el, r) : ''].join('|');
    if (!members.has(key)) members.set(key, []);
    members.get(key).push([el, shown, text.length]);
  }
  window.axeKeyMembers = members;  // for MARK_MEMBERS_JS
  for (const [key, els] of members) {
    if (known.has(key)) continue;  // measured before, with no violation
    const rep = els.find(([, shown, n]) => shown && n >= 2) || els.find(([, shown]) => shown);
    if (rep) measure(rep[0], key);
    else els.forEach(([el]) => measure(el, null));
  }
  document.querySelectorAll('input, select, textarea').forEach(el => measure(el, null));
  return {keys, marked, inSight: marked - boxless};
}
"""

# Marks every element of the given keys (of the last MARK_TEXT_JS) to be measured, but
# those measured already.
MARK_MEMBERS_JS = """
(keys) => {
  const measured = new Set(document.querySelectorAll('[data-axe-measure]'));
  measured.forEach(el => el.removeAttribute('data-axe-measure'));
  let marked = 0;
  for (const key of keys) {
    for (const [el] of window.axeKeyMembers.get(key) || []) {
      if (!measured.has(el)) el.setAttribute('data-axe-measure', 'all ' + marked++);
    }
  }
  return marked;
}
"""

# axe's colour-contrast rule looks at every element (selector '*'): only those marked.
AXE_CONFIGURE_JS = """
() => axe.configure({rules: [{id: 'color-contrast', selector: '[data-axe-measure]'}]})
"""

# The violations, and the marks of the elements whose contrast did not pass (a
# violation, or one axe could not decide). Passes are not listed one by one: building
# their selectors is most of axe's reporting time. For the run, each code block made of
# highlighting alone (spans with a class and no other attribute: nothing a rule but
# colour contrast looks at) and holding no element to measure is read as its text, then
# given its spans back: on a chapter they are half the page's elements, and axe lays
# out and stacks every element of the page before it measures the first contrast.
AXE_RUN_JS = """
async (options) => {
  const plain = el => el.tagName === 'SPAN' && el.attributes.length === (el.className ? 1 : 0);
  const flat = [];
  for (const pre of document.querySelectorAll('pre')) {
    const inner = pre.querySelectorAll('*');
    if (inner.length && !pre.hasAttribute('data-axe-measure')
        && Array.prototype.every.call(inner, plain)) {
      flat.push([pre, Array.from(pre.childNodes)]);
      pre.textContent = pre.textContent;
    }
  }
  let result;
  try {
    result = await axe.run(document, {...options, elementRef: true,
                                      resultTypes: ['violations', 'incomplete']});
  } finally {
    for (const [pre, children] of flat) pre.replaceChildren(...children);
  }
  const unresolved = result.violations.concat(result.incomplete)
    .filter(v => v.id === 'color-contrast')
    .flatMap(v => v.nodes.map(n => n.element.getAttribute('data-axe-measure')));
  const violations = result.violations.flatMap(
    v => v.nodes.map(n => ({rule: v.id, impact: v.impact, target: n.target.join(' '),
                            help: v.help, text: n.element.hasAttribute('data-axe-measure')
                              ? n.element.textContent.trim().slice(0, 40) : ''})));
  return {violations, unresolved};
}
"""


# Every finite CSS transition or animation running on the page, brought to its end at
# once (the colours axe then measures are the final ones, as after waiting, without
# drawing the frames between).
FINISH_TRANSITIONS_JS = """
() => {
  for (const a of document.getAnimations()) {
    if (Number.isFinite(a.effect.getComputedTiming().endTime)) a.finish();
  }
}
"""


# At a phone's width, what changes there: boxes that now scroll (reachable by the
# keyboard, each named once), the hint lines' contrast, and the landmarks.
PHONE_RULES = ["scrollable-region-focusable", "landmark-unique", "aria-prohibited-attr",
               "aria-allowed-role", "color-contrast", "region"]


def accessibility_problems(page, phone: bool = False,
                           measured: dict[str, set[str]] | None = None) -> list[str]:
    """What axe-core finds on the open page (every hidden cell shown), light and dark.

    All of axe's default rules (WCAG 2.x A and AA, best practices) in light mode, then
    colour contrast again in dark mode; with ``phone`` (the page already at a phone's
    width and axe loaded), ``PHONE_RULES`` in light mode and colour contrast in dark
    mode. Text is measured for contrast once per style (``MARK_TEXT_JS``): ``measured``
    holds, per mode, the styles of text already measured in this test process with
    no violation (a style's contrast is the same at either width), and gets this page's.
    A finding listed in ``AXE_KNOWN`` is not a problem."""
    measured = {} if measured is None else measured
    runs = (("light", {}), ("dark", {"runOnly": ["color-contrast"]}))
    if phone:
        runs = (("light, phone", {"runOnly": PHONE_RULES}),
                ("dark, phone", {"runOnly": ["color-contrast"]}))
    else:
        page.add_script_tag(path=str(AXE))
        page.evaluate(AXE_CONFIGURE_JS)
    found = []
    for mode, options in runs:
        page.evaluate(f"document.documentElement.dataset.theme = '{mode.split(',')[0]}'")
        # Colours measured half-way through a fade (a cell just opened, the theme
        # just switched) are neither the old nor the new ones: wait for the end.
        page.evaluate(FINISH_TRANSITIONS_JS)
        known = measured.setdefault(mode.split(",")[0], set())
        marks = page.evaluate(MARK_TEXT_JS, sorted(known))
        if not marks["inSight"]:
            # Nothing left to measure for contrast (every style measured before; no box,
            # no contrast): the run's other rules only, if it has any.
            if "runOnly" in options:
                options = {"runOnly": [r for r in options["runOnly"] if r != "color-contrast"]}
            else:
                options = {**options, "rules": {"color-contrast": {"enabled": False}}}
        if options.get("runOnly") == []:
            result = {"violations": [], "unresolved": []}
        else:
            result = page.evaluate(AXE_RUN_JS, options)
        doubtful = {marks["keys"][m] for m in result["unresolved"] if m in marks["keys"]}
        if doubtful:  # not passed: each element of those keys is measured
            page.evaluate(MARK_MEMBERS_JS, sorted(doubtful))
            again = page.evaluate(AXE_RUN_JS, {"runOnly": ["color-contrast"]})
            result["violations"] += [v for v in again["violations"]
                                     if v not in result["violations"]]
        known |= set(marks["keys"].values()) - doubtful
        for v in result["violations"]:
            # An element marked for measuring is named without its mark, by its text.
            target = re.sub(r'\[data-axe-measure="[^"]*"\]', "", v["target"])
            if v["text"]:
                target += f' "{v["text"]}"'
            if (v["rule"], target) not in AXE_KNOWN:
                found.append(f"axe {v['impact']} {v['rule']} ({mode}): {target}: {v['help']}")
    page.evaluate("document.documentElement.dataset.theme = 'light'")
    return found


# The pages Sphinx writes besides the book's documents, in each edition.
GENERATED_PAGES = ("genindex.html", "index.html", "search.html")


def expected_pages(root: Path = ROOT) -> list[str]:
    """Every page the build will write, as paths under the site's root, known from the
    sources before anything is built: each document of ``_toc.yml`` and Sphinx's own
    pages, in the English edition and in each edition of ``tools/editions.py``."""
    import yaml

    from tools.editions import LANGUAGES

    def documents(entry) -> list[str]:
        found = [entry["file"]] if isinstance(entry, dict) and "file" in entry else []
        if isinstance(entry, dict):
            for key in ("parts", "chapters", "sections"):
                for child in entry.get(key, []):
                    found += documents(child)
        return found

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages = [f"{doc}.html" for doc in [toc["root"], *documents(toc)]] + list(GENERATED_PAGES)
    return sorted(f"{prefix}{page}" for prefix in ["", *(f"{lang}/" for lang in LANGUAGES)]
                  for page in pages)


def site_pages(html_root: Path) -> list[Path]:
    """Every HTML page a reader can reach (not the vendored MathJax files)."""
    pages = []
    for path in sorted(html_root.rglob("*.html")):
        rel = path.relative_to(html_root)
        if rel.parts[0] in {"_vendor", "_static", "_sources", "_images"}:
            continue
        pages.append(path)
    return pages


def wait_for_the_build(state_file: Path, timeout: float = 900.0) -> str:
    """``"built"`` once the site is there: at once when this session builds no site
    (no ``state_file``), or when its build ends (``"failed"`` if it failed)."""
    end = time.monotonic() + timeout
    while True:
        try:
            state = state_file.read_text().split()
        except OSError:
            return "built"  # no build in this session: the site as it is
        if not state or state[0] != "building":
            return state[0] if state else "built"
        try:
            os.kill(int(state[1]), 0)  # the building process is still alive
        except (OSError, IndexError, ValueError):
            return "failed"  # it died without saying
        if time.monotonic() > end:
            return "failed"
        time.sleep(0.5)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


# --- layout: what scrolls sideways, what is too small to read -----------------------

# Opens every collapsed block first (hidden inputs, solutions): their code must fit too.
OPEN_ALL_JS = """
() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden').forEach(el => el.classList.remove('toggle-hidden'));
  document.querySelectorAll('.cell.tag_hide-input .cell_input, .cell.tag_hide-output .cell_output')
    .forEach(el => { el.style.display = 'block'; });
}
"""

# The words book/_static/table-scroll.js, figure-zoom.js and toggle-label.js add to a
# page: the phone's hint above a box that scrolls, that box's name, the full-size
# link's title, and the name of a solution's toggle.
SCRIPT_WORDS_JS = """() => ({
  hint: Array.from(document.querySelectorAll('.scroll-hint'), el => el.textContent),
  region: Array.from(document.querySelectorAll('[role="region"][aria-label]'),
                     el => el.getAttribute('aria-label')),
  zoom: Array.from(document.querySelectorAll('a.figure-zoom'), el => el.title),
  toggle: Array.from(document.querySelectorAll('button.toggle-button'),
                     el => el.getAttribute('aria-label'))})"""

# After a resize: two animation frames, so that scripts reacting to it have run.
SETTLE_JS = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"

LAYOUT_JS = """
() => {
  const label = el => {
    const cell = el.closest('.cell');
    const text = (el.textContent || '').trim().split('\\n')[0].slice(0, 60);
    return (cell && cell.id ? cell.id + ': ' : '') + text;
  };
  const wide = el => el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1;
  const code = Array.from(document.querySelectorAll('.cell_input pre, div.highlight pre'))
    .filter(el => !el.closest('.cell_output')).filter(wide).map(label);
  const outputs = Array.from(document.querySelectorAll(
      '.cell_output pre, .cell_output .output.text_html, .cell_output table'))
    .filter(wide).map(label);
  const equations = Array.from(document.querySelectorAll('mjx-container[display="true"]'))
    .filter(el => {
      const math = el.querySelector('mjx-math');
      const column = el.closest('article') || document.body;
      return math && math.getBoundingClientRect().width >
        Math.min(el.getBoundingClientRect().width, column.clientWidth) + 1;
    }).map(el => (el.getAttribute('aria-label') || el.textContent).slice(0, 60));
  const figures = Array.from(document.querySelectorAll('.cell_output img')).map(img => ({
    src: img.getAttribute('src'),
    scale: img.naturalWidth ? img.clientWidth / img.naturalWidth : 1,
    zoom: !!(img.closest('a') && img.closest('a').getAttribute('href') === img.getAttribute('src')),
  }));
  // The page itself: wider than the window means the reader scrolls the whole page
  // sideways. Named by the outermost elements that stick out past the window's right
  // edge (not those inside a box that scrolls on its own).
  const root = document.documentElement;
  const clips = el => {
    for (let a = el.parentElement; a && a !== root; a = a.parentElement) {
      const over = getComputedStyle(a).overflowX;
      if (over !== 'visible' && over !== 'clip') return true;
    }
    return false;
  };
  let page = null;
  if (root.scrollWidth > root.clientWidth) {
    const out = Array.from(document.body.querySelectorAll('*')).filter(el => {
      const r = el.getBoundingClientRect();
      return r.width > 0 && r.right > root.clientWidth + 1 && !clips(el);
    });
    const outermost = out.filter(el => !out.includes(el.parentElement)).slice(0, 3)
      .map(el => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string'
        ? '.' + el.className.trim().split(/\\s+/).join('.') : '') + ' "' +
        (el.textContent || '').trim().slice(0, 50) + '"');
    page = {scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, outermost};
  }
  // A table or printed output wider than its box must say that it scrolls: a line
  // above it, and the keyboard can reach it (book/_static/table-scroll.js).
  const silent = Array.from(document.querySelectorAll(
      '.pst-scrollable-table-container, .cell_output pre')).filter(wide).filter(el => {
    const hint = el.previousElementSibling;
    const shown = hint && hint.classList.contains('scroll-hint') && hint.offsetHeight > 0;
    return !(shown && el.tabIndex === 0 && el.getAttribute('aria-label'));
  }).map(label);
  return {code, outputs, equations, figures, page, silent};
}
"""


# --- the Chinese edition: the site's own CJK font, glyph by glyph -------------------

# Every distinct CJK character (and CJK punctuation) the page shows, and those that no
# loaded face of the site's font covers at the weight they are drawn in. A character
# outside every face's unicode-range, or in a slice that failed to load, is missing.
MISSING_GLYPHS_JS = """
async () => {
  await document.fonts.ready;
  const cjk = /[\\u3000-\\u303f\\u3400-\\u9fff\\uff00-\\uffef]/;
  const faces = [...document.fonts].filter(f => f.family.replace(/["']/g, "") === "Noto Sans SC");
  const covers = (face, cp) => face.unicodeRange.split(",").some(range => {
    const [a, b] = range.trim().replace(/^U\\+/i, "").split("-");
    const lo = parseInt(a, 16), hi = b ? parseInt(b, 16) : lo;
    return cp >= lo && cp <= hi;
  });
  const seen = new Map();
  const elements = new Map();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!el || !el.checkVisibility() || !cjk.test(node.data)) continue;
    const weight = parseInt(getComputedStyle(el).fontWeight) > 500 ? "700" : "400";
    for (const ch of node.data) if (cjk.test(ch)) {
      seen.set(ch + weight, [ch, weight]);
      elements.set(el, (elements.get(el) || "") + ch);
    }
  }
  // Ask for every slice the text needs (a slice loads when text drawn with it shows).
  await Promise.all([...seen.values()].map(
    ([ch, w]) => document.fonts.load(`${w} 16px "Noto Sans SC"`, ch)));
  // Drawn from the site's font, not as boxes from another: the element's Chinese
  // characters, in the element's own style, are as wide as in Noto Sans SC alone.
  // All probes are placed, then measured, at once: two layouts for the page, not two
  // per element.
  const probes = [...elements].map(([el, chars]) => {
    const probe = document.createElement("span");
    probe.style.cssText = "position:absolute;visibility:hidden;white-space:pre";
    probe.textContent = chars;
    el.appendChild(probe);
    return [probe, chars];
  });
  const own = probes.map(([probe]) => probe.getBoundingClientRect().width);
  probes.forEach(([probe]) => { probe.style.fontFamily = '"Noto Sans SC"'; });
  const otherFont = probes.filter(([probe], i) =>
    Math.abs(own[i] - probe.getBoundingClientRect().width) > 0.5).map(([, c]) => c.slice(0, 12));
  probes.forEach(([probe]) => probe.remove());
  const missing = [...seen.values()].filter(([ch, w]) =>
    !faces.some(f => f.status === "loaded" && f.weight === w && covers(f, ch.codePointAt(0))));
  return {count: seen.size, missing: missing.map(([ch, w]) => ch + "@" + w), otherFont,
          check: document.fonts.check('16px "Noto Sans SC"',
                                      [...seen.values()].map(v => v[0]).join(""))};
}
"""
