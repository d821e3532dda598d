"""The artifact in a model's reply, apart from preamble, fences and notes.

Models wrap what was asked for: a preamble ("Here is the improved sentence:"), fenced code
followed by prose, notes about the feedback they were given. ``extract_text`` and
``extract_code`` keep the artifact; ``meta_commentary`` and ``comment_commentary`` find the
notes that survive it, as findings for a job's check. Pure functions only.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable

__all__ = [
    "code_blocks",
    "comment_commentary",
    "extract_code",
    "extract_text",
    "meta_commentary",
]

_PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})
# An opening fence anywhere, its body up to a closing fence or the end of the answer
# (an answer cut off at max_tokens leaves its last fence open).
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_SHOWN_CHARS = 80

# Lines that only announce the answer: "Sure!", "Here is the rewritten review:".
_INTERJECTION = re.compile(r"^\W*(?:sure|certainly|of course|okay|ok|absolutely)\W*$", re.I)
_ANNOUNCEMENT = re.compile(
    r"^[^\n]{0,100}\b(?:answer|response|version|sentence|review|rewrite|code|program|turn|"
    r"acronym|solution)\b[^\n]{0,20}:[\s*]*$",
    re.IGNORECASE,
)
# A label in front of the answer on its own line: "Improved sentence: A dog ...".
_LABEL = re.compile(
    r"^\W{0,3}(?:the\s+)?(?:(?:final|improved|refined|revised|rewritten|updated|corrected|"
    r"extended|new)\s+)?(?:sentence|review|rewrite|answer|response)\s*\**\s*:\s*\**\s*",
    re.IGNORECASE,
)

# Notes about the feedback or the editing, which are no part of an artifact. Each
# pattern was seen in small models' answers (or is a close variant of one that was).
_META = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bto address (?:the|this|your|each|all|these)\b[^.\n]{0,30}?\b(?:feedback|comments?|"
        r"issues?|points?|suggestions?|actions?|concerns?|problems?|errors?|missing|add\w*)",
        r"\b(?:the|this|your|given) feedback\b",
        r"\bas (?:suggested|requested|recommended|advised|pointed out)\b",
        r"\bI (?:have |'ve )?(?:added|changed|replaced|removed|included|incorporated|used|"
        r"inserted|kept|rewrote|revised)\b[^.\n]{0,40}\b(?:words?|concepts?|sentences?|"
        r"phrases?|clauses?|missing|feedback|actions?|review)\b",
        r"\b(?:all |the |every )?(?:missing|required|given) (?:words|concepts)\b",
        r"\b(?:this|the|my) (?:revised|rewritten|refined|improved|corrected|extended|updated) "
        r"(?:sentence|version|review|rewrite|answer|response|turn|acronym)\b",
        r"\b(?:the|my) (?:previous|earlier|latest) (?:sentence|attempt|draft|version|answer|"
        r"rewrite)\b",
        r"^\W*\(?\s*(?:note|explanation|changes(?: made)?|revisions?)\s*:",
    )
)

# Comments that talk about the review rather than the code.
_META_COMMENT = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bfeedback\b",
        r"\bas (?:suggested|requested|recommended|advised|pointed out)\b",
        r"\breviewer\b",
        r"\b(?:previous|original|old|earlier) (?:version|code|implementation|attempt)\b",
        r"^\W*(?:improved|optimized|optimised|refactored|updated|fixed|changed|modified|"
        r"corrected|replaced)\s*(?::|version\b|to\b|from\b)",
        r"^\W*(?:improvement|change|fix)\s*\d*\s*:",
    )
)
# A comment claiming what the code prints or returns: "# Output: [1, 2]", "# -> 55".
_CLAIM_COMMENT = re.compile(
    r"^\s*(?:(?:expected\s+)?output|prints?|result|expected)\s*[:=]|^\s*(?:->|=>)", re.IGNORECASE
)
_VALUE_START = re.compile(r"^\s*(?:[-+]?\d|[\[({'\"]|True\b|False\b|None\b)")


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every fenced block, in order."""
    return [(m.group(1).lower(), m.group(2).strip("\n")) for m in _FENCE.finditer(text)]


def code_blocks(text: str) -> list[str]:
    """Bodies of the Python blocks (tagged python, or untagged when none is tagged)."""
    blocks = _blocks(text)
    tagged = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    return tagged or [body for tag, body in blocks if not tag]


def extract_code(text: str) -> str:
    """The first Python block of an answer, or the answer itself when it has no fence."""
    blocks = code_blocks(text)
    if blocks:
        return blocks[0]
    if _blocks(text):  # only blocks in other languages: the first one
        return _blocks(text)[0][1]
    return text.strip()


def extract_text(text: str) -> str:
    """A prose answer without its wrapping: a fence around it, preamble lines, a label, quotes."""
    text = text.strip()
    for _ in range(3):  # "Sure!" / "Here is the sentence:" / "```" may come in a row
        if text.startswith("```"):
            blocks = _blocks(text)
            text = blocks[0][1].strip() if blocks else text.strip("`").strip()
            continue
        first, _, rest = text.partition("\n")
        if rest.strip() and (_INTERJECTION.match(first) or _ANNOUNCEMENT.match(first)):
            text = rest.strip()
            continue
        break
    labelled = _LABEL.match(text)
    if labelled and text[labelled.end() :].strip():
        text = text[labelled.end() :].strip()
    for left, right in (('"', '"'), ("“", "”"), ("**", "**")):
        inner = text[len(left) : -len(right)] if len(text) > 2 * len(left) else ""
        if text.startswith(left) and text.endswith(right) and left not in inner:
            text = inner.strip()
    return text


def _quoted(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _sentences(text: str) -> Iterable[str]:
    for line in text.splitlines():
        yield from re.split(r"(?<=[.!?])\s+", line)


def meta_commentary(text: str, what: str = "answer") -> list[str]:
    """A finding when prose notes about the feedback or the edit remain in a text answer."""
    for sentence in _sentences(text):
        if any(p.search(sentence) for p in _META):
            return [
                f'Remove the note that is not part of the {what}: "{_quoted(sentence)}". '
                f"Reply with the {what} only."
            ]
    return []


def _comments(code: str) -> list[tuple[int, str, str]]:
    """(line number, comment text without '#', the code before it on its line)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    lines = code.splitlines()
    out = []
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            out.append((row, tok.string.lstrip("#").strip(), lines[row - 1][:col]))
    return out


def comment_commentary(code: str, *, tests: bool = False) -> list[str]:
    """Findings for comments about the review, and comments claiming an unchecked output."""
    found: list[str] = []
    for row, comment, before in _comments(code):
        if any(p.search(comment) for p in _META_COMMENT):
            found.append(
                f"Remove the comment on line {row} about the changes or the feedback "
                f"(`# {_quoted(comment)}`): comments explain the code as it is."
            )
        elif _CLAIM_COMMENT.search(comment) or ("print(" in before and _VALUE_START.match(comment)):
            fix = "turn it into an assert in the tests" if tests else "remove it"
            found.append(
                f"The comment on line {row} claims an output nobody checked "
                f"(`# {_quoted(comment)}`): {fix}."
            )
        if len(found) == 2:
            break
    return found
