"""``ast.parse`` that several threads may call at once.

CPython 3.11 keeps the recursion depth of its conversion of a parsed tree into ``ast``
objects in state every thread shares: two threads parsing at once can fail with
``SystemError: AST constructor recursion depth mismatch``. The loop parses answers in
worker threads (the job's checks and the pooled tests run off the event loop, many
records at a time), so every parse in this process goes through one lock. Parsing is
quick and holds the GIL anyway; the lock costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

__all__ = [
    "literal",
    "parse_expression",
    "parse_module",
    "parsed",
    "parsed_expression",
    "strings",
]

_LOCK = threading.Lock()
# What the parser raises for text it cannot make a tree of: a syntax error, a null byte
# (ValueError), nesting too deep (RecursionError, or MemoryError from the tokenizer).
_UNPARSABLE = (SyntaxError, ValueError, MemoryError, RecursionError)


def parse_module(source: str) -> ast.Module:
    """``ast.parse(source)``; raises what it raises (SyntaxError, ValueError, ...)."""
    with _LOCK:
        return ast.parse(source)


def parsed(source: str) -> ast.Module | None:
    """``parse_module(source)``, or None where ``source`` is no module Python can parse
    (a syntax error, a null byte, nesting too deep for the parser)."""
    try:
        return parse_module(source)
    except _UNPARSABLE:
        return None


def parse_expression(source: str) -> ast.expr:
    """The expression ``source`` is (``ast.parse(source, mode="eval").body``)."""
    with _LOCK:
        return ast.parse(source, mode="eval").body


def parsed_expression(source: str) -> ast.expr | None:
    """``parse_expression(source)``, or None where ``source`` is no expression Python can
    parse (as for ``parsed``)."""
    try:
        return parse_expression(source)
    except _UNPARSABLE:
        return None


def literal(source: str) -> Any:
    """``ast.literal_eval(source)`` for a string, parsed under the lock."""
    return ast.literal_eval(parse_expression(source.lstrip(" \t")))


def strings(node: ast.AST) -> list[str]:
    """The string constants within ``node`` (an f-string's literal parts included)."""
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
