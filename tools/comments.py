"""Code comments as messages of a page's catalog: what the Chinese edition translates in
the code it shows, and nothing else.

A *unit* is one thing a translator translates: a block of whole-line comments (one or
more ``#`` lines at the same column, one after another) or a comment after code on its
line. Its message is the comments' text without the ``#`` (the lines of a block joined
by newlines). A unit is a message when it says something in words (a word of two
letters or more outside a shape: ``# prefill``, ``# 2. split: (B, L, D) -> ...``); a
shape such as ``# (B, Hkv, T, Dh)`` and a tool's directive (``# noqa: E501``) stay as
they are.

``tools.editions.gettext`` adds each page's units to its template (as it adds alt
text), and the Chinese edition's pages replace them in the code they show
(``book/_ext/editions.py``): the code a reader copies is the English code, token for
token, with other comments (``tests/test_translations.py`` proves it for every cell).
A translated block is wrapped to fit the width the English block had (at least
``WRAP`` columns, a Chinese character counting two), so its lines fit where the
English ones did, and balanced, so that no line holds a lone character.
"""

from __future__ import annotations

import io
import re
import tokenize
import unicodedata
from dataclasses import dataclass

WORD = re.compile(r"[A-Za-z]{2,}")
DIRECTIVE = re.compile(r"^\s*(noqa|type:|pragma|fmt:|pylint|ruff|isort|%%)", re.I)
WRAP = 56  # the narrowest a translated block is wrapped to (columns)
# Not at the start of a line (Chinese line breaking), nor at its end: opening marks.
NO_START = set("，。、；：？！）」』》”’%,.;:?!)]}")
NO_END = set("（「『《“‘([{")


@dataclass(frozen=True)
class Unit:
    first: int        # first line (0-based)
    last: int         # last line (inclusive)
    column: int       # where the first ``#`` stands
    inline: bool      # after code on its line
    text: str         # the message: the comments without ``#``, lines joined by "\n"
    width: int        # the widest of its lines, in columns, ``#`` and indent included


def width(text: str) -> int:
    """Columns a monospaced font gives ``text`` (wide and full-width characters two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def body(comment: str) -> str:
    text = comment[1:]
    return text[1:] if text.startswith(" ") else text


def comments(code: str) -> list[tokenize.TokenInfo] | None:
    """The comment tokens of ``code``, or None when it is not Python (a magic, a shell
    line, half a statement)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    if any(t.type == tokenize.ERRORTOKEN and t.string.strip() for t in tokens):
        return None
    return [t for t in tokens if t.type == tokenize.COMMENT]


def units(code: str) -> list[Unit]:
    """Every comment unit of ``code`` in order, messages or not."""
    found = comments(code)
    if not found:
        return []
    lines = code.splitlines()
    out: list[Unit] = []
    block: list[tokenize.TokenInfo] = []

    def close() -> None:
        if block:
            row, col = block[0].start
            out.append(Unit(row - 1, block[-1].start[0] - 1, col, False,
                            "\n".join(body(t.string) for t in block),
                            max(width(lines[t.start[0] - 1].rstrip()) for t in block)))
            block.clear()

    for token in found:
        row, col = token.start
        if lines[row - 1][:col].strip():  # code before it
            close()
            out.append(Unit(row - 1, row - 1, col, True, body(token.string),
                            width(lines[row - 1].rstrip())))
            continue
        if block and not (row == block[-1].start[0] + 1 and col == block[-1].start[1]):
            close()
        block.append(token)
    close()
    return out


# A shape or an index in brackets, every item one token: code, not words. A bracket
# holding words, "(sentence, its noun, the other noun)", is words.
BRACKETS = re.compile(r"\(([^()]*)\)|\[([^\[\]]*)\]")


def words(text: str) -> list[str]:
    """The words of a comment, shapes left out."""
    def shape(m: re.Match) -> str:
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        return " " if all(" " not in item.strip() for item in inner.split(",")) else m.group(0)

    return WORD.findall(BRACKETS.sub(shape, text))


def is_message(unit: Unit) -> bool:
    return bool(words(unit.text)) and not DIRECTIVE.match(unit.text)


def messages(code: str) -> list[str]:
    """The messages of ``code``: its units that say something in words."""
    return [u.text for u in units(code) if is_message(u)]


def pieces(text: str) -> list[str]:
    """What a line may break between: each wide character alone, each run of other
    characters up to a space (a word, a name, a number), each space."""
    return re.findall(r"\s+|[^\s\u2e80-\uffef]+|[\u2e80-\uffef]", text)


# Chinese punctuation after which a line breaks best (a phrase ends there).
BREAK_AFTER = set("，、；：。！？）」”")


def good_break(line: list[str], columns: int) -> int | None:
    """Where to end a full line so that it ends a phrase: after the last Chinese
    punctuation mark, else at the last space, as long as the line keeps at least 60%
    of ``columns``; None if there is no such place."""
    for good in (lambda i: line[i - 1][-1] in BREAK_AFTER, lambda i: line[i].isspace()):
        for i in range(len(line) - 1, 0, -1):
            if width("".join(line[:i]).rstrip()) < 0.5 * columns:
                break
            if good(i):
                return i
    return None


def wrap(text: str, columns: int) -> list[str]:
    """``text`` in lines of at most ``columns`` (where it can), broken after a phrase's
    punctuation or at a space where one is near the end of the line, else between wide
    characters; never inside a word, never before a closing mark and never after an
    opening one."""
    lines: list[list[str]] = []
    line: list[str] = []
    for piece in pieces(text):
        if line and not piece.isspace() and width("".join(line + [piece])) > columns:
            carried: list[str] = []
            if (at := good_break(line, columns)) is not None:
                carried, line = line[at:], line[:at]
            else:
                # A closing mark takes the piece before it along; an opening mark
                # goes down with what it opens.
                if piece[0] in NO_START and len(line) > 1:
                    carried.insert(0, line.pop())
                while len(line) > 1 and line[-1][-1] in NO_END:
                    carried.insert(0, line.pop())
            lines.append(line)
            while carried and carried[0].isspace():
                carried.pop(0)
            line = carried
        if line or not piece.isspace():
            line.append(piece)
    lines.append(line)
    return ["".join(pieces_).rstrip() for pieces_ in lines]


def balanced(text: str, columns: int) -> list[str]:
    """``text`` wrapped to ``columns`` or narrower, in no more lines than at
    ``columns``: of those widths, the one whose lines end most often on a phrase's
    punctuation, then the one whose shortest line is longest (no lone "元" on the last
    line)."""
    lines = wrap(text, columns)
    if len(lines) < 2:
        return lines

    def quality(candidate: list[str]) -> tuple[int, int]:
        ends = sum(line[-1] in BREAK_AFTER for line in candidate[:-1] if line)
        return ends, min(width(line) for line in candidate)

    candidates = [c for w in range(columns, columns // 2, -1)
                  if len(c := wrap(text, w)) == len(lines)]
    return max(candidates, key=quality)


def translate(code: str, table: dict[str, str]) -> str:
    """``code`` with each comment unit whose message ``table`` translates replaced:
    a block by the translation's lines (each wrapped to the English block's width, or
    ``WRAP`` columns if that is wider), an inline comment by its translation."""
    found = [u for u in units(code) if is_message(u) and table.get(u.text)]
    if not found:
        return code
    lines = code.split("\n")
    for unit in reversed(found):
        local = table[unit.text]
        if unit.inline:
            line = lines[unit.first]
            lines[unit.first] = line[:unit.column] + "# " + " ".join(local.splitlines())
            continue
        indent = lines[unit.first][:unit.column]
        room = max(unit.width, WRAP) - width(indent) - 2
        new = [indent + ("# " + piece if piece else "#")
               for paragraph in local.split("\n") for piece in balanced(paragraph, room)]
        lines[unit.first:unit.last + 1] = new
    return "\n".join(lines)


def code_tokens(code: str) -> list[tuple[int, str]]:
    """``code`` as Python reads it, comments and line breaks between statements left
    out (what a translated comment may change)."""
    skip = {tokenize.COMMENT, tokenize.NL}
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in skip]
