"""Every parse of the product goes through ``pyast``'s lock, and its helpers read as said."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline.core import pyast

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"


def _unlocked_parses(source: str) -> list[int]:
    """Lines of ``source`` that call ``ast.parse`` (or a bare ``parse`` imported from ast)."""
    tree = ast.parse(source)
    bare = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "ast"
        for alias in node.names
        if alias.name == "parse"
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "parse"
            and isinstance(f.value, ast.Name)
            and f.value.id == "ast"
        ) or (isinstance(f, ast.Name) and f.id in bare):
            lines.append(node.lineno)
    return lines


def test_the_finder_sees_both_spellings_of_a_parse() -> None:
    """The architecture walk finds ast.parse called by module and by imported name."""
    assert _unlocked_parses("import ast\nast.parse('x')\n") == [2]
    assert _unlocked_parses("from ast import parse as p\n\np('x')\n") == [3]
    assert _unlocked_parses("from pipeline.core import pyast\npyast.parse_module('x')\n") == []


def test_no_module_parses_outside_the_lock() -> None:
    """No module of the package parses Python but through pyast (its lock)."""
    # Worker threads parse answers at once; CPython 3.11 can fail two unlocked parses
    # with "AST constructor recursion depth mismatch". Code the sandbox runs in its own
    # process sits in a string, which this walk does not enter.
    found = {
        path.name: lines
        for path in sorted(PIPELINE.rglob("*.py"))
        if path.name != "pyast.py" and (lines := _unlocked_parses(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_literal_reads_an_indented_value_and_refuses_code() -> None:
    """A literal is read whatever its indentation; a call is refused."""
    assert pyast.literal("  [1, (2, 'a')]") == [1, (2, "a")]
    with pytest.raises(ValueError):
        pyast.literal("f(1)")


def test_strings_holds_every_constant_and_f_string_part() -> None:
    """Every string constant of a module is found, f-string parts included."""
    node = pyast.parse_module("x = 'a'\nassert f(\"b\") == f'c{x}d'\ny = 3\n")
    assert sorted(pyast.strings(node)) == ["a", "b", "c", "d"]


def test_parsed_is_none_for_what_python_cannot_parse() -> None:
    """Syntax errors, null bytes and parser exhaustion give None, never an exception."""
    assert isinstance(pyast.parsed("x = [1]\n"), ast.Module)
    assert pyast.parsed("assert f(1") is None  # a syntax error
    assert pyast.parsed("x = 1\x00") is None  # a null byte
    assert pyast.parsed("x = " + "-" * 100_000 + "1") is None  # MemoryError in the parser
    assert pyast.parsed("x = " + "a." * 200_000 + "b") is None  # RecursionError building ast


def test_parsed_expression_is_none_for_what_python_cannot_parse() -> None:
    """An expression that does not parse, or a statement, gives None."""
    assert isinstance(pyast.parsed_expression("f(1, [2])"), ast.Call)
    assert pyast.parsed_expression("f(1") is None  # a syntax error
    assert pyast.parsed_expression("x = 1") is None  # a statement, not an expression
    assert pyast.parsed_expression("'a\x00'") is None  # a null byte
    assert pyast.parsed_expression("a." * 200_000 + "b") is None  # RecursionError building ast
