"""The words of the chapters, checked like code.

* **Typed numbers:** a number in a chapter's prose with a decimal point, or an integer
  of three or more digits, is either glued from the cell that computes it
  (``{glue:text}``) or listed in ``tests/prose_numbers/NN_slug.toml`` with a one-line
  reason (a definition, an input, a published figure, a year). A new unlisted one
  fails, and so does a listed one the chapter no longer has.
* **Slips a reader sees:** a doubled word ("the the"), and an ordered list that starts
  inside a paragraph (a wrapped line beginning with "1." becomes a list item).
* **One quiet marker for proof:** what a hidden cell checks is said by one line,
  ``✓ checked: <what>``, right above that cell, not by sentences about hidden cells
  ("The hidden cell below checks ..."), which made pages read like a test log.

Prose is the Markdown outside code cells, fenced code, inline code, MyST roles
(``{ref}``, ``{cite}``, ``{glue:text}``, ...), targets, directive options and URLs.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("*.md"))
PAGES = [*CHAPTERS, ROOT / "book" / "intro.md"]
ALLOWED = ROOT / "tests" / "prose_numbers"

ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")  # {ref}`...`, {glue:text}`...`, {cite:p}`...`
INLINE_CODE = re.compile(r"``.+?``|`[^`]*`")
URL = re.compile(r"<?https?://\S+>?|\]\([^)]*\)")  # bare and Markdown link targets
# 2,048 / 10 000 / 163\,840 (one number), 0.8203, 512; not the 3 and 2 of "3.2.3"
GROUPED = r"\d{1,3}(?:(?:,|\u2009|\u202f|\\,| )\d{3})+(?!\d)"
NUMBER = re.compile(rf"(?<![\w.,])(?:{GROUPED}(?:\.\d+)?|\d+\.\d+(?!\.\d)|\d{{3,}})(?![\w])")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\{[\w:-]+\})?")


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of the prose of a MyST page, code and markup removed."""
    lines = path.read_text().splitlines()
    start = 0
    if lines and lines[0] == "---":  # jupytext / MyST front matter
        start = lines.index("---", 1) + 1
    fences: list[tuple[str, bool]] = []  # (fence, is prose inside)
    in_options = False
    for number, line in enumerate(lines[start:], start + 1):
        fence = FENCE.match(line)
        if fence:
            marker, directive = fence.group(1), fence.group(2) or ""
            if fences and line.strip() == fences[-1][0] and not directive:
                fences.pop()
                in_options = False
                continue
            prose = directive not in ("", "{code-cell}", "{code-block}", "{math}")
            fences.append((marker, prose))
            in_options = prose
            continue
        if fences and not fences[-1][1]:
            continue  # code, or a math block
        if in_options and line.startswith(":"):
            continue  # :label: ..., :class: ... of a directive
        in_options = False
        if re.match(r"^\(.+\)=\s*$", line) or line.strip() in ("+++",) or line.startswith("<!--"):
            continue
        text = ROLE.sub(" ", line)
        text = INLINE_CODE.sub(" ", text)
        text = URL.sub(" ", text)
        yield number, text


def typed_numbers(path: Path) -> Iterator[tuple[int, str, str]]:
    """``(line, number, line text)`` of every number the rule asks about."""
    for line, text in prose_lines(path):
        for match in NUMBER.finditer(text):
            yield line, match.group(0), text.strip()


def allowed(path: Path) -> dict[str, str]:
    file = ALLOWED / f"{path.stem}.toml"
    return tomllib.loads(file.read_text()) if file.exists() else {}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_typed_numbers_are_glued_or_listed_with_a_reason(page: Path):
    listed = allowed(page)
    found = list(typed_numbers(page))
    unlisted = [f"  line {line}: {number!r} in: {text}" for line, number, text in found
                if number not in listed]  # fmt: skip
    assert not unlisted, (
        f"{page.name}: numbers typed into the prose; glue each from the cell that computes "
        f"it ({{glue:text}}), or list it in tests/prose_numbers/{page.stem}.toml with "
        "its reason:\n" + "\n".join(unlisted)
    )
    stale = sorted(set(listed) - {number for _, number, _ in found})
    assert not stale, f"{page.stem}.toml lists numbers the page no longer has: {stale}"
    assert all(reason.strip() for reason in listed.values()), "every entry needs a reason"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_no_doubled_word(page: Path):
    doubled = [
        f"  line {line}: {match.group(0)!r}"
        for line, text in prose_lines(page)
        for match in re.finditer(r"\b([A-Za-z]+)\s+\1\b", text, flags=re.IGNORECASE)
        if match.group(1).lower() not in {"that", "had"}  # "that that" can be right
    ]
    assert not doubled, f"{page.name}: doubled words:\n" + "\n".join(doubled)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_no_ordered_list_starts_inside_a_paragraph(page: Path):
    """A wrapped line that begins with "1." (or "1)") turns the rest of the paragraph
    into a numbered list."""
    lines = dict(prose_lines(page))
    starts = [
        f"  line {number}: {text.strip()}"
        for number, text in lines.items()
        if re.match(r"^1[.)]\s", text)
        and (previous := lines.get(number - 1, "").strip())
        and not re.match(r"^(\d+[.)]|[-*+])\s", previous)
    ]
    assert not starts, f"{page.name}: a list starts inside a paragraph:\n" + "\n".join(starts)


MARKER = "\u2713 checked: "  # ✓ checked: <what>
# The old voice: "the hidden cell below checks", "the hidden code", "a hidden check",
# "the hidden model cell above", "hidden behind a toggle".
HIDDEN_CELL_TALK = re.compile(
    r"\bhidden\s+(?:\w+\s+)?(?:cells?|code|helpers?|checks?)\b|hidden behind", re.IGNORECASE
)


def prose_sections(path: Path) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """``(heading, prose lines)`` per ``##`` section of a page (the title's first)."""
    heading, lines = "", []
    for number, text in prose_lines(path):
        if text.startswith("## "):
            yield heading, lines
            heading, lines = text.strip(), []
        else:
            lines.append((number, text))
    yield heading, lines


def hidden_cell_talk(path: Path) -> list[str]:
    """Sentences about hidden cells, outside the Exercises sections."""
    found = []
    for heading, lines in prose_sections(path):
        if heading == "## Exercises":
            continue
        for index, (number, text) in enumerate(lines):
            # a phrase may wrap: read each line with the start of the next
            following = lines[index + 1][1] if index + 1 < len(lines) else ""
            joined = f"{text} {following}"
            for match in HIDDEN_CELL_TALK.finditer(joined):
                if match.start() < len(text):
                    found.append(f"  line {number}: {text.strip()}")
                    break
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_proof_is_marked_not_narrated(page: Path):
    found = hidden_cell_talk(page)
    assert not found, (
        f"{page.name}: sentences about hidden cells; say what a hidden cell checks with "
        f"one line '{MARKER}<what>' right above it:\n" + "\n".join(found)
    )


def marker_problems(path: Path) -> list[str]:
    """Markers that are not a paragraph of their own right above a hidden-input cell."""
    lines = path.read_text().splitlines()
    found = []
    for number, line in enumerate(lines, 1):
        if MARKER.strip() not in line:
            continue
        if not line.startswith(MARKER):
            found.append(f"  line {number}: the marker starts its own line: {line.strip()}")
            continue
        rest = lines[number:]
        end = next((i for i, text in enumerate(rest) if not text.strip()), len(rest))
        after = [text for text in rest[end:] if text.strip()]
        header = []  # the cell's options: ":tags: ..." lines, or a YAML block
        if after and after[0].startswith("```{code-cell}"):
            if len(after) > 1 and after[1] == "---":
                header = after[2 : after.index("---", 2)] if "---" in after[2:] else []
            else:
                header = [text for text in after[1:3] if text.startswith(":")]
        if not any("hide-input" in text for text in header):
            found.append(f"  line {number}: not right above a hide-input cell: {line.strip()}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_markers_sit_right_above_a_hidden_cell(page: Path):
    found = marker_problems(page)
    assert not found, f"{page.name}: misplaced proof markers:\n" + "\n".join(found)


def test_the_marker_rules_catch_the_old_voice(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "# T\nThe hidden\ncell below checks it. (The hidden code\nchecks both.)\n"
        "\u2713 checked: a claim\n\nprose, no cell\n\n"
        "\u2713 checked: another\n\n```{code-cell} ipython3\n:tags: [hide-input]\n\n```\n"
        "\u2713 checked: a third\n\n```{code-cell} ipython3\n---\nmystnb: {}\n"
        "tags: [hide-input]\n---\nx = 1\n```\n"
        "\u2713 checked: a visible cell\n\n```{code-cell} ipython3\nx = 1\n```\n"
        "## Exercises\nReuse the hidden helpers.\n"
    )
    assert [line.split(":")[0] for line in hidden_cell_talk(page)] == ["  line 2", "  line 3"]
    assert [line.split(":")[0] for line in marker_problems(page)] == ["  line 5", "  line 24"]


def test_the_prose_reader_skips_code_roles_and_options(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "---\njupytext: {}\n---\n(target-123)=\n# Title 2017\n"
        "Prose 3.14 and `code 2.71` and {ref}`ex 1.5 <x>` and https://a.b/123.45\n"
        "pairs 10 000 and 2,048 and $163\\,840$ in section 3.2.3 of 16, 64 and 256\n"
        "```{code-cell} ipython3\nx = 1.25\n```\n"
        "```{exercise}\n:label: ex-999\nInside 0.500 words\n```\n"
        "```{math}\nz = 4.25\n```\n"
        "the the end\nwrapped text ends\n1. and a list\n"
    )
    assert [n for _, n, _ in typed_numbers(page)] == [
        "2017", "3.14", "10 000", "2,048", "163\\,840", "256", "0.500"
    ]
    texts = dict(prose_lines(page))
    assert not any("x = 1.25" in t or "4.25" in t or "ex-999" in t for t in texts.values())
    with pytest.raises(AssertionError, match="doubled words"):
        test_no_doubled_word(page)
    with pytest.raises(AssertionError, match="list starts inside a paragraph"):
        test_no_ordered_list_starts_inside_a_paragraph(page)
