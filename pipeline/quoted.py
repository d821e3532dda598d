"""The values a coding request quotes, and whether an answer's tests use them.

A request that quotes a value (``without leading zeros ("0" itself is fine, "01" is
not)``, ``a grid of "1" (land) and "0" (water)``) points at a case it cares about. Where
no test of an answer uses the value, its code never met that case, and a small model's
code often gets exactly that case wrong while every test it wrote passes: its checks find
nothing and its critic calls it done. ``untested`` names such values, so that the check
can ask for a test of them.

Only double quotes are read (straight or typographic): a single quote is as often an
apostrophe. A value is used when it occurs within a string literal of a test
(``"01.2.3.4"`` uses ``"01"``); what a test does with it is the test's business.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .brackets import plain_quotes
from .pyast import parsed, strings

__all__ = ["Quoted", "quoted_values", "untested"]

LIMIT = 8  # values read from one request, at most
READ_CHARS = 20_000  # of a request's text, the first this many are read
AROUND_CHARS = 70  # of the request's words, at most this many either side of a value

# An empty "" is read too (and passed over): else `"" gives ""` quotes " gives ".
_QUOTED = re.compile(r"\"([^\"\n]{0,40})\"")
_SENTENCE_END = re.compile(r"[.!?](?=\s)")


class Quoted(NamedTuple):
    """A value a request quotes, and the request's words around it."""

    value: str
    said: str  # '...and without leading zeros ("0" itself is fine, "01" is not)'


def quoted_values(text: str) -> tuple[Quoted, ...]:
    """The values ``text`` quotes in double quotes (the first of each, at most ``LIMIT``),
    each with the words of its sentence around it (at most ``AROUND_CHARS`` either side,
    cut at a word)."""
    text = plain_quotes(text[:READ_CHARS])
    found: dict[str, Quoted] = {}
    for match in _QUOTED.finditer(text):
        value = match.group(1)
        if not value.strip() or value in found:
            continue
        found[value] = Quoted(value, _around(text, match.start(), match.end()))
        if len(found) >= LIMIT:
            break
    return tuple(found.values())


def _around(text: str, start: int, end: int) -> str:
    """The words of ``start:end``'s sentence around it, ``...`` where cut short."""
    left = max(0, start - AROUND_CHARS)
    ends = [m.end() for m in _SENTENCE_END.finditer(text, left, start)]
    cut_left = not ends and left > 0
    if ends:
        left = ends[-1]
    elif cut_left:  # from the first whole word
        space = text.find(" ", left, start)
        left = space + 1 if space >= 0 else left
    right = min(len(text), end + AROUND_CHARS)
    stop = _SENTENCE_END.search(text, end, right)
    cut_right = stop is None and right < len(text)
    if stop is not None:
        right = stop.start()
    elif cut_right:  # to the last whole word
        space = text.rfind(" ", end, right)
        right = space if space > end else right
    said = text[left:right].strip().rstrip(".!?")
    return ("..." if cut_left else "") + said + ("..." if cut_right else "")


def _strings(unit: str) -> list[str]:
    """The string literals of a test; none where it does not parse."""
    tree = parsed(unit)
    return [] if tree is None else strings(tree)


def untested(quoted: Sequence[Quoted], units: Iterable[str]) -> list[Quoted]:
    """The values of ``quoted`` that no string literal of the tests ``units`` holds."""
    if not quoted:
        return []
    literals = [s for unit in units for s in _strings(unit)]
    return [q for q in quoted if not any(q.value in s for s in literals)]
