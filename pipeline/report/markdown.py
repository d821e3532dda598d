"""The report as GitHub-flavoured Markdown, for terminals and pull requests."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from .aggregate import RunReport
from .document import Block, Bullets, Heading, Image, Para, Table, Text, Verbatim, build

__all__ = ["render_markdown"]

_SPACE: Final = re.compile(r"\s+")  # a newline in a value would end the table row


def _inline(text: Text) -> str:
    out = []
    for part in text if isinstance(text, tuple) else (text,):
        if isinstance(part, Verbatim):
            # A backtick inside would end the code span early.
            out.append("`" + " ".join(part.text.split()).replace("`", "'") + "`")
        else:
            # A pipe would end a table cell.
            out.append(_SPACE.sub(" ", part).replace("|", "\\|"))
    return "".join(out)


def _row(cells: tuple[Text, ...]) -> str:
    return "| " + " | ".join(_inline(c) for c in cells) + " |"


def _block(block: Block, images: Mapping[str, str]) -> str | None:
    match block:
        case Heading(level, text):
            return "#" * level + " " + _inline(text)
        case Para(text):
            return _inline(text)
        case Bullets(items):
            return "\n".join("- " + _inline(item) for item in items)
        case Table(header, rows):
            lines = [_row(header), "|" + "---|" * len(header), *(_row(r) for r in rows)]
            return "\n".join(lines)
        case Image(key, alt):
            return f"![{alt}]({images[key]})" if key in images else None
    raise AssertionError(block)  # pragma: no cover - every block type is matched above


def render_markdown(report: RunReport, images: Mapping[str, str] | None = None) -> str:
    """The report as Markdown; ``images`` maps plot keys to relative paths."""
    blocks = (_block(b, images or {}) for b in build(report))
    return "\n\n".join(b for b in blocks if b is not None) + "\n"
