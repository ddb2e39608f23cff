"""The references: every entry of ``references.bib`` complete, every cited work there.

The site renders the file with sphinxcontrib-bibtex, which formats entries with pybtex;
these tests read and format it with pybtex too, in the style the references page asks
for, so that what they check is what a reader sees. A complete entry has an author (a
person, or an organisation), a year, and a title that renders without raw LaTeX. The
articles the book follows have their address. A work without an author, a year or an
address is listed below with the reason, and the list is checked to stay true.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pybtex.database import Entry, parse_file
from pybtex.plugin import find_plugin

ROOT = Path(__file__).resolve().parent.parent
BIB = ROOT / "references.bib"
REFERENCES_PAGE = ROOT / "book" / "references.md"
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]*)`")  # {cite}`a,b`, {cite:p}`a`, {cite:t}`a`

# The articles the book follows (book/intro.md, "Credits and further reading"): the
# references page cites each of them.
FOLLOWED = {
    "doshi2020part1", "doshi2021part2", "doshi2021part3", "doshi2021part4",
    "aifrontiers_part1", "aifrontiers_part2", "aifrontiers_part3",
    "threeattentions_zh",
}  # fmt: skip
# What the copies the book was written from do not say. Nothing is filled in by guess.
NO_ADDRESS = {
    "doshi2020part1": "the sources the book was written from give no address for it",
    "doshi2021part2": "the sources the book was written from give no address for it",
    "doshi2021part3": "the sources the book was written from give no address for it",
    "doshi2021part4": "the sources the book was written from give no address for it",
    "threeattentions_zh": "the copy the book follows names no address",
}
NO_AUTHOR = {"threeattentions_zh": "the copy the book follows names no author"}
UNDATED = {
    "aifrontiers_part1": "WeChat article; the copies give no date",
    "aifrontiers_part2": "WeChat article; the copies give no date",
    "aifrontiers_part3": "WeChat article; the copy gives no date",
    "threeattentions_zh": "the copy the book follows gives no date",
}


def entries() -> dict[str, Entry]:
    return dict(parse_file(BIB).entries)


def cited_keys(pages: list[Path] | None = None) -> dict[str, list[str]]:
    """Cited key -> the pages (relative paths) that cite it."""
    pages = pages if pages is not None else sorted((ROOT / "book").rglob("*.md"))
    found: dict[str, list[str]] = {}
    for page in pages:
        for match in CITE.finditer(page.read_text()):
            for key in match.group(1).split(","):
                found.setdefault(key.strip(), []).append(page.relative_to(ROOT).as_posix())
    return found


def page_style() -> str:
    """The pybtex style of the page's ``{bibliography}`` (sphinxcontrib-bibtex: alpha)."""
    match = re.search(r"^:style:\s*(\S+)", REFERENCES_PAGE.read_text(), flags=re.MULTILINE)
    return match.group(1) if match else "alpha"


def problems(key: str, entry: Entry) -> list[str]:
    """What is missing or wrong in one entry."""
    found = []
    if not entry.persons.get("author") and "organization" not in entry.fields:
        if key not in NO_AUTHOR:
            found.append("no author or organization")
    elif any("anonymous" in str(p).lower() for p in entry.persons.get("author", [])):
        found.append("'Anonymous' is not an author: leave the author out (NO_AUTHOR)")
    elif any(str(p).startswith("{") for p in entry.persons.get("author", [])):
        # the list sorts "{" after every letter: an organisation in braces comes last
        found.append("an author in braces sorts after Z: write an organisation without them")
    year = entry.fields.get("year")
    if year is None or year.startswith("n.d.-"):
        if key not in UNDATED:
            found.append("no year")
        if year is not None and not re.fullmatch(r"n\.d\.-[a-z]", year):
            found.append(f"year {year!r} is not n.d.-a, n.d.-b, ...")
    elif not re.fullmatch(r"\d{4}[a-z]?", year):
        found.append(f"year {year!r} is not a year (leave it out and list it in UNDATED)")
    title = entry.fields.get("title", "")
    if not title.strip():
        found.append("no title")
    if "$" in title or re.search(r"\\(?![#&%_])", title):
        found.append(f"LaTeX in the title renders raw on the site: {title!r}")
    if key in FOLLOWED and key not in NO_ADDRESS:
        if not entry.fields.get("url", "").startswith("https://"):
            found.append("an article the book follows, without its https address (url)")
    return found


ENTRIES = entries()


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_entry_is_complete(key):
    assert not problems(key, ENTRIES[key]), f"{key}: " + "; ".join(problems(key, ENTRIES[key]))


def test_the_exceptions_are_still_true():
    """A work listed as having no author, year or address really has none (else the
    list is stale), and every listed key is an entry."""
    for listed, field in ((NO_AUTHOR, "author"), (UNDATED, "year"), (NO_ADDRESS, "url")):
        for key, reason in listed.items():
            assert key in ENTRIES, f"{key} is listed but not in references.bib"
            assert reason.strip()
            entry = ENTRIES[key]
            has = entry.persons.get(field) if field == "author" else entry.fields.get(field)
            if field == "year" and has and has.startswith("n.d.-"):
                continue  # undated, told apart from the author's other undated works
            assert not has, f"{key} has a {field} now: take it off the list"


def told_apart(bib: dict[str, Entry]) -> list[str]:
    """Works cited alike ("Doshi, 2021") must carry the letters that tell them apart:
    one author (or organisation) and one year, or undated, share a citation; each such
    group has the letters a, b, c, ... in the order of its keys, and a work alone in its
    group has none."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for key, entry in sorted(bib.items()):
        authors = entry.persons.get("author") or []
        who = str(authors[0]) if authors else entry.fields.get("organization", "")
        year = entry.fields.get("year", "n.d.")
        base, letter = re.fullmatch(r"(\d{4}|n\.d\.)-?([a-z]?)", year).groups()
        groups.setdefault((who, base), []).append((key, letter))
    found = []
    for (who, base), works in groups.items():
        letters = [letter for _, letter in works]
        want = [chr(ord("a") + i) for i in range(len(works))] if len(works) > 1 else [""]
        if letters != want:
            found.append(f"{who}, {base}: {', '.join(k for k, _ in works)} have the letters "
                         f"{letters}, not {want}")
    return found


def test_works_cited_alike_are_told_apart():
    assert not told_apart(ENTRIES), "\n".join(told_apart(ENTRIES))


def test_the_letters_are_checked():
    def bib(*years: str) -> dict[str, Entry]:
        return {f"k{i}": Entry("misc", fields={"title": "t", "year": y},
                               persons={"author": ["Doshi, Ketan"]})
                for i, y in enumerate(years)}

    assert told_apart(bib("2021a", "2021b", "2020")) == []
    assert told_apart(bib("2021", "2021"))  # two alike, no letters
    assert told_apart(bib("2021b", "2021a"))  # out of the keys' order
    assert told_apart(bib("2020a"))  # a letter with nothing to tell apart
    assert told_apart(bib("n.d.-a", "n.d.-c"))


def test_every_cited_work_is_in_the_bibliography():
    cited = cited_keys()
    missing = {key: pages for key, pages in cited.items() if key not in ENTRIES}
    assert not missing, f"cited but not in references.bib: {missing}"


def test_the_references_page_cites_the_articles_the_book_follows():
    on_page = set(cited_keys([REFERENCES_PAGE]))
    assert FOLLOWED <= on_page, f"not cited on the references page: {FOLLOWED - on_page}"
    assert "{bibliography}" in REFERENCES_PAGE.read_text()


def test_entries_render_with_a_clean_label_and_no_raw_latex():
    """Format every entry as the page does: a label of letters, digits or '+' (an
    entry with year "n.d." got the label "Anonymousd."), and text without TeX."""
    style = find_plugin("pybtex.style.formatting", page_style())()
    bib = parse_file(BIB)
    for formatted in style.format_entries(bib.entries.values()):
        text = formatted.text.render_as("text")
        assert re.fullmatch(r"[A-Za-z0-9+]+", formatted.label), (formatted.key, formatted.label)
        assert not re.search(r"[$\\{}]", text), (formatted.key, text)
        url = bib.entries[formatted.key].fields.get("url")
        assert url is None or url in text, (formatted.key, text)


def test_the_checks_catch_an_incomplete_entry(tmp_path):
    """The entry of issue 23: no author, year "n.d.", math in the title, no url."""
    bad = tmp_path / "bad.bib"
    bad.write_text(
        "@misc{bad, title = {Self-attention Does Not Need {$O(n^2)$} Memory},\n"
        " author = {{Anonymous}}, year = {n.d.}}\n"
    )
    entry = parse_file(bad).entries["bad"]
    found = problems("bad", entry)
    assert any("Anonymous" in p for p in found)
    assert any("not a year" in p for p in found)
    assert any("LaTeX" in p for p in found)
    followed = problems("doshi2021part2", Entry("misc", fields={"title": "t", "year": "2021"}))
    assert followed == ["no author or organization"]  # listed without an address
    assert "an article the book follows" in " ".join(problems("aifrontiers_part1", entry))
    style = find_plugin("pybtex.style.formatting", "alpha")()
    (formatted,) = style.format_entries(parse_file(bad).entries.values())
    assert not re.fullmatch(r"[A-Za-z0-9+]+", formatted.label)  # "Anonymousd."
