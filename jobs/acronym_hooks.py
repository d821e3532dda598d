"""Hooks for the acronym job: is the acronym spelled from the title, does it match the reference.

The answer's first line holds the acronym (a label such as "Acronym:" and markdown
are tolerated). "Drawn from the title" means its letters can be picked from the
title's letters in order, the first one being the first letter of a title word:
"COGENT" from "Cognitive Objects within a Graphical EnviroNmenT" qualifies, as do
plain initialisms.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipeline.core.extraction import meta_commentary
from pipeline.core.metrics import MetricSpec

_LABEL = re.compile(r"^\W*(?:(?:the|new|improved|final)\s+)*acronym\s*(?:is)?\s*[:=\-]?\s*", re.I)
_TOKEN = re.compile(r"[^\W_][\w.&'\-]*")
_WORD = re.compile(r"[^\W_]+")
# ``matches_reference`` reads the reference acronym (a label); the other reads the title only.
METRICS = {
    "letters_from_title": MetricSpec("check", value_type="boolean"),
    "matches_reference": MetricSpec("label", value_type="boolean"),
}


def extract_acronym(output: str) -> str:
    """The acronym an answer gives: the first word of its first non-empty line."""
    for line in output.splitlines():
        line = line.strip().strip("*_`#>\"' ")
        line = _LABEL.sub("", line).strip("*_`\"' ")
        m = _TOKEN.search(line)
        if m:
            return m.group(0).rstrip(".-'")
    return ""


def _letters(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def drawn_from(acronym: str, title: str) -> bool:
    """Whether ``acronym``'s letters appear in ``title`` in order, starting at a word."""
    letters = _letters(acronym)
    if not letters:
        return False
    text = _letters(title)
    starts: list[int] = []
    pos = 0
    for word in _WORD.findall(title.lower()):
        starts.append(pos)
        pos += len(_letters(word))
    for start in starts:
        if text[start] != letters[0]:
            continue
        # The earliest possible start leaves the most room: one greedy pass decides.
        rest = iter(text[start + 1 :])
        return all(ch in rest for ch in letters[1:])
    return False


def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    """``{"acronym": ..., "letters_from_title": bool}``, plus ``matches_reference`` when
    the record carries a reference acronym."""
    acronym = extract_acronym(output)
    title = str(fields.get("title") or "")
    metrics: dict[str, Any] = {
        "acronym": acronym,
        "letters_from_title": drawn_from(acronym, title),
    }
    reference = fields.get("acronym")
    if isinstance(reference, str) and reference.strip():
        metrics["matches_reference"] = bool(acronym) and _letters(acronym) == _letters(reference)
    return metrics


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """An action when the acronym is missing or not spelled from the title's letters, or
    when a note about the edit follows it."""
    acronym = extract_acronym(output)
    if not acronym:
        return ["Put the acronym alone on the first line of the answer."]
    title = str(fields.get("title") or "")
    found = meta_commentary(output, "acronym and the line showing its letters")
    if not drawn_from(acronym, title):
        found.insert(
            0,
            f"'{acronym}' cannot be spelled from the title: build it from the title's letters "
            "in order, starting with the first letter of a title word.",
        )
    return found
