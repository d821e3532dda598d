"""Scanning a request's text for the end of a bracket or a string literal.

Requests quote code in prose (``"userId" -> "user_id"``, ``chunk(xs: list[int], n: int)``):
reading a call, a literal or a signature out of them starts at an opening bracket or quote
and needs the index where it ends. Brackets inside string literals do not count, and a
string ends on its line. The readers make curly quotes plain first (``plain_quotes``).
"""

from __future__ import annotations

__all__ = ["closing", "plain_quotes", "string_end"]

_PLAIN = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


def closing(text: str, start: int, span: int | None = None) -> int | None:
    """The index of the bracket closing the one at ``text[start]`` (string literals
    skipped), or None: none within ``span`` characters (all of ``text`` when None), or
    a string literal that does not end on its line."""
    stop = len(text) if span is None else min(len(text), start + span)
    depth, i = 0, start
    while i < stop:
        c = text[i]
        if c in "\"'":
            end = string_end(text, i, span)
            if end is None:
                return None
            i = end
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def string_end(text: str, start: int, span: int | None = None) -> int | None:
    """The index just past the string literal whose quote is ``text[start]``, or None
    when it does not end on its line (or within ``span`` characters)."""
    quote, i = text[start], start + 1
    stop = len(text) if span is None else min(len(text), start + span)
    while i < stop and text[i] != "\n":
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return None


def plain_quotes(text: str) -> str:
    """``text`` with typographic quotes (curly double and single ones) made plain: a
    request typed in a word processor quotes ``"userId"`` with curly quotes."""
    return text.translate(_PLAIN)
