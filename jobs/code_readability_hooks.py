"""Hooks for the code-readability job: does the rewrite parse, and how is it structured.

Besides ``parses``, ``evaluate`` counts two of the paper's readability signals that a
program can measure: functions defined and comment lines.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Mapping
from typing import Any

from pipeline.core.extraction import comment_commentary
from pipeline.core.metrics import MetricSpec
from pipeline.core.pyast import parse_module
from pipeline.sandbox import syntax_problem

# More functions or comments is not better in itself: only ``parses`` has a direction.
METRICS = {
    "parses": MetricSpec("check", value_type="boolean"),
    "functions": MetricSpec("check", better=None, value_type="number"),
    "comment_lines": MetricSpec("check", better=None, value_type="number"),
}


def _comment_lines(code: str) -> int:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return 0
    return len({t.start[0] for t in tokens if t.type == tokenize.COMMENT})


def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    """``{"parses": bool}``; for code that parses also ``functions`` and ``comment_lines``."""
    problem = syntax_problem(output)
    if problem is not None:
        return {"parses": False, "syntax_error": problem}
    tree = parse_module(output)
    functions = sum(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) for node in ast.walk(tree)
    )
    return {"parses": True, "functions": functions, "comment_lines": _comment_lines(output)}


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """An action when the answer holds no code, code that does not parse, or comments
    about the review."""
    if not output.strip():
        return ["Give the complete program in one ```python block."]
    problem = syntax_problem(output)
    return [f"Fix the syntax error at {problem}."] if problem else comment_commentary(output)
