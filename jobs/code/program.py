"""A program and its tests as one answer: joining, splitting, and the tests as units.

A code-with-tests answer is one program: the code, then ``TESTS_MARKER`` on a line of its
own, then the tests. That is what the sandbox runs, what the conversation shows the model
and what ``split`` takes apart again for the output line. ``code_with_tests`` reads it out
of a model's reply (fenced blocks, tests in the same block as the code or in their own);
``split_tests`` cuts the tests into units that run one at a time. Pure functions only.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
import textwrap
from collections.abc import Iterable

from pipeline.core.extraction import code_blocks
from pipeline.core.pyast import parsed

__all__ = [
    "TESTS_MARKER",
    "code_with_tests",
    "join",
    "normalized",
    "pooled_tests",
    "split",
    "split_tests",
    "without_unfinished_test",
]

TESTS_MARKER = "# --- tests ---"


def join(code: str, tests: str) -> str:
    """One program: the code, then the marker and the tests (just the code without tests)."""
    code = code.strip("\n")
    tests = tests.strip("\n")
    if not tests:
        return code
    return f"{code}\n\n\n{TESTS_MARKER}\n{tests}"


def split(program: str) -> tuple[str, str]:
    """(code, tests) of a program that ``join`` made; tests are "" when it has none."""
    code, marker, tests = program.partition(TESTS_MARKER)
    if not marker:
        return program.strip("\n"), ""
    return code.strip("\n"), tests.strip("\n")


def _mentions_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


# Errors a top-level ``try`` of a program catches for its own sake, never a behaviour a
# request asks a call to have
_PROGRAM_ERRORS = frozenset(
    {"BaseException", "Exception", "ImportError", "KeyboardInterrupt", "ModuleNotFoundError"}
)


def _caught(node: ast.Try) -> set[str]:
    """The names of the errors a ``try``'s handlers catch ("" for a bare ``except``)."""
    names: set[str] = set()
    for handler in node.handlers:
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names |= {str(getattr(t, "id", None) or getattr(t, "attr", "")) for t in types}
    return names


def _raise_check(node: ast.stmt) -> bool:
    """``try: f(0)`` / ``except ValueError: pass``: a check, written without an assert, that
    a call raises the error a request names (it fails when the call raises another one).

    Only calls of the program's own functions in the ``try`` (no builtin such as ``int``,
    no method), only named errors caught (not ``Exception``), and nothing but ``pass`` or
    expressions (a ``print``) in the handlers: a program's own ``try`` around an import,
    reading its input, or one that recovers with a value, stays code.
    """
    if not isinstance(node, ast.Try) or not node.handlers or node.finalbody:
        return False
    for stmt in node.body:
        call = stmt.value if isinstance(stmt, ast.Expr | ast.Assign) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            return False
        if hasattr(builtins, call.func.id):
            return False
    if _caught(node) & (_PROGRAM_ERRORS | {""}):
        return False
    return all(isinstance(s, ast.Pass | ast.Expr) for h in node.handlers for s in h.body)


def _is_test(node: ast.stmt) -> bool:
    """Whether a top-level statement is a test rather than part of the code."""
    if isinstance(node, ast.Assert) or _raise_check(node):
        return True
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name.startswith("test")
    if isinstance(node, ast.ClassDef):
        return node.name.startswith("Test")
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name.startswith("test")
    return isinstance(node, ast.If | ast.For | ast.While | ast.With | ast.Try) and (
        _mentions_assert(node)
    )


def _segments(source: str, tree: ast.Module) -> list[tuple[ast.stmt, str]]:
    """Each top-level statement with its source, comments and blank lines before it included."""
    lines = source.splitlines(keepends=True)
    out = []
    start = 0
    for node in tree.body:
        end = node.end_lineno or node.lineno
        out.append((node, "".join(lines[start:end])))
        start = end
    if out and start < len(lines):  # trailing comments belong to the last statement
        node, text = out[-1]
        out[-1] = (node, text + "".join(lines[start:]))
    return out


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


def _foreign_import(node: ast.stmt) -> bool:
    """An import of a module outside the standard library (the tests share the code's names)."""
    if isinstance(node, ast.ImportFrom):
        top = (node.module or "").split(".")[0]
        return node.level > 0 or top not in sys.stdlib_module_names
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] not in sys.stdlib_module_names for a in node.names)
    return False


def _split_block(source: str, code_names: set[str], *, first: bool) -> tuple[str, str]:
    """(code, tests) of one fenced block.

    In the first block with code, only test statements are tests. A later block that
    holds any test is all tests, less imports of the code's own module and copies of
    functions the code defines (a copy would shadow the code under test).
    """
    if TESTS_MARKER in source:
        return split(source)
    tree = parsed(source)
    if tree is None and first:
        return _split_unparsable(source)
    if tree is None:  # tests cut off at max_tokens, or with a syntax error: the tests in
        prefix = _parsable_prefix(source)  # what parses, then the rest (whose syntax error
        if prefix is None:  # the check names)
            return "", ""
        found = _split_block(prefix, code_names, first=False)[1]
        return "", (found + "\n" + source[len(prefix) :]).strip("\n") if found else ""
    segments = _segments(source, tree)
    if not any(_is_test(node) for node, _ in segments):
        return (source, "") if first else ("", "")
    code: list[str] = []
    tests: list[str] = []
    for node, text in segments:
        if _is_test(node):
            tests.append(text)
        elif first:
            code.append(text)
        elif _foreign_import(node) or (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name in code_names
        ):
            continue
        else:
            tests.append(text)
    return "".join(code).strip("\n"), "".join(tests).strip("\n")


_TEST_START = re.compile(r"(?:assert\b|def test|class Test|if __name__|#.*\btests?\b)", re.I)


def _split_unparsable(source: str) -> tuple[str, str]:
    """(code, tests) of a block that does not parse: cut at the first line, at the left
    margin, that starts the tests, when the code before it parses (the syntax error is
    then the tests', and the finding can say so); else all code."""
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if i and _TEST_START.match(line) and parsed("".join(lines[:i])) is not None:
            return "".join(lines[:i]).strip("\n"), "".join(lines[i:]).strip("\n")
    return source, ""


def code_with_tests(text: str) -> str:
    """An answer's code and its tests, as one program (see ``join``)."""
    blocks = code_blocks(text) or [text.strip()]
    code = ""
    tests: list[str] = []
    for block in blocks:
        tree = parsed(code)
        names = _defined(tree) if tree is not None else set()
        block_code, block_tests = _split_block(block, names, first=not code)
        if block_code and not code:
            code = block_code
        if block_tests:
            tests.append(block_tests)
    return join(code, "\n\n".join(tests))


def _unrollable(node: ast.stmt) -> bool:
    """A test function whose body can run at the top level, one statement at a time.

    No parameters, decorators, returns, yields, scope statements or nested definitions,
    and at least one test statement of its own (an assert, or a loop or ``try`` holding
    one): ``def test_all(): assert a; assert b`` is several tests written as one, and
    counted as one a wrong assert would hide the rest.
    """
    if not isinstance(node, ast.FunctionDef) or not _is_test(node) or node.decorator_list:
        return False
    a = node.args
    if a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg:
        return False
    scoped = (ast.Return, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal, ast.Await)
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for inner in node.body:
        if any(isinstance(n, scoped + nested) for n in ast.walk(inner)):
            return False
    return any(_is_test(n) for n in node.body)


def _calls_only(node: ast.stmt, names: set[str]) -> bool:
    """A call of one of ``names`` without arguments, or ``if __name__ == ...:`` of only such."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        return isinstance(call.func, ast.Name) and call.func.id in names and not call.args
    if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and not node.orelse:
        return all(_calls_only(n, names) or _is_print(n) for n in node.body)
    return False


def _is_print(node: ast.stmt) -> bool:
    call = node.value if isinstance(node, ast.Expr) else None
    return isinstance(call, ast.Call) and getattr(call.func, "id", "") == "print"


def _unrolled(tests: str, tree: ast.Module) -> str:
    """``tests`` with each unrollable test function replaced by its body, dedented, and the
    calls of those functions dropped; unchanged when there is none or the result does
    not parse."""
    lines = tests.splitlines(keepends=True)
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _unrollable(n)}
    if not names:
        return tests
    out: list[str] = []
    for node, text in _segments(tests, tree):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            start = body[0].lineno - 1 if body else node.end_lineno or node.lineno
            head = text[: len(text) - len("".join(lines[node.lineno - 1 : node.end_lineno]))]
            inner = "".join(lines[start : node.end_lineno])
            out.append(head + textwrap.dedent(inner))
        elif _calls_only(node, names):
            continue
        else:
            out.append(text)
    result = "".join(out)
    return result if parsed(result) is not None else tests


def _parsable_prefix(tests: str) -> str | None:
    """The longest run of whole first lines of ``tests`` that parses (an answer cut off at
    max_tokens ends inside a statement), or None."""
    lines = tests.splitlines(keepends=True)
    for end in range(len(lines) - 1, 0, -1):
        prefix = "".join(lines[:end])
        if prefix.strip() and parsed(prefix) is not None:
            return prefix
    return None


def split_tests(tests: str) -> list[str]:
    """The tests as separately runnable pieces: one per top-level statement.

    A test function of plain statements is unrolled first, so each of its asserts is a
    test of its own (and a failed ``assert a == b`` can say what ``a`` was). Statements
    that are not tests themselves (setting up data, helpers, a test function the tests
    call later) stay with the test after them. A test function nobody calls is called.
    A test class's test methods are each a test, in the class without its other test
    methods (``_one_method``); a statement that only runs a test method is no test of its
    own. A repeated test counts once. Tests that do not parse are cut after their last
    line that does (a cut-off answer); when no first lines parse they are one piece.
    """
    tree = parsed(tests)
    if tree is None:
        prefix = _parsable_prefix(tests)
        if prefix is None:
            return [tests] if tests.strip() else []
        tests, tree = prefix, parsed(prefix)
        assert tree is not None
    tests = _unrolled(tests, tree)
    tree = parsed(tests)
    assert tree is not None  # _unrolled returns source that parses
    called = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef) and _test_methods(n)}
    units: list[str] = []
    pending = ""
    for node, text in _segments(tests, tree):
        if isinstance(node, ast.ClassDef) and _test_methods(node):
            # Each test method is a test, in the class without its other test methods
            # (unittest.main() would find none: the tests do not run as the __main__ module).
            units += [
                (pending + _one_method(text, node, m)).strip("\n") + _method_call(node, m)
                for m in _test_methods(node)
            ]
            pending = ""
        elif _runs_a_test_method(node, classes):
            continue  # the test method it runs is a test already
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if _is_test(node) and node.name not in called and not isinstance(node, ast.ClassDef):
                units.append((pending + text).strip("\n") + f"\n{node.name}()")
                pending = ""
            else:
                pending += text
        elif _is_test(node):
            units.append((pending + text).strip("\n"))
            pending = ""
        else:
            pending += text
    if pending.strip() and units:
        units[-1] += "\n" + pending.strip("\n")
    elif pending.strip():
        units.append(pending.strip("\n"))
    seen: set[str] = set()
    unique = []
    for unit in units:
        key = normalized(unit)
        if key not in seen:
            seen.add(key)
            unique.append(unit)
    return unique


def _test_methods(node: ast.ClassDef) -> list[str]:
    """The test methods of a test class (``TestX``, a ``unittest.TestCase`` or a plain class)."""
    if not _is_test(node):
        return []
    return [
        n.name
        for n in node.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test") and n.args.args
    ]


def _one_method(text: str, node: ast.ClassDef, method: str) -> str:
    """The source of a test class (``text``, ending at its last line) without its test
    methods but ``method``, and without blank lines between its members: each test method
    runs as a unit of its own, not with the class's others."""
    others = set(_test_methods(node)) - {method}
    lines = text.splitlines(keepends=True)
    first = (node.end_lineno or node.lineno) - len(lines) + 1  # text's first line number
    dropped: set[int] = set()
    kept: set[int] = set()  # the lines of the members kept (a blank line there may be data)
    after = None  # the last line of the member before
    for member in node.body:
        start = min([d.lineno for d in getattr(member, "decorator_list", [])] + [member.lineno])
        end = member.end_lineno or member.lineno
        if isinstance(member, ast.FunctionDef) and member.name in others:
            # from the end of the member before: the comments before it go too
            dropped.update(range(start if after is None else after + 1, end + 1))
        else:
            kept.update(range(start, end + 1))
        after = end
    return "".join(
        line
        for number, line in enumerate(lines, first)
        if number not in dropped and (line.strip() or number in kept)
    )


def _runs_a_test_method(node: ast.stmt, classes: set[str]) -> bool:
    """Whether a top-level statement only runs a test method of one of the test
    ``classes`` (the lines ``_method_call`` writes, or the tests' own
    ``TestX().test_y()``): each test method is a test on its own already."""
    if isinstance(node, ast.Assign):
        return [ast.unparse(t) for t in node.targets] == [_CASE]
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value
    if isinstance(owner, ast.Name):
        return owner.id == _CASE
    return (
        isinstance(owner, ast.Call)
        and isinstance(owner.func, ast.Name)
        and owner.func.id in classes
        and func.attr.startswith("test")
    )


_CASE = "__case__"  # the name ``_method_call`` runs a unittest test method by


def _method_call(node: ast.ClassDef, method: str) -> str:
    """Lines that run one test method of a test class, as a test runner would."""
    if any("TestCase" in ast.unparse(b) for b in node.bases):
        make = f"{node.name}({method!r})"
        return f"\n{_CASE} = {make}\n{_CASE}.setUp()\n{_CASE}.{method}()"
    return f"\n{node.name}().{method}()"


def normalized(unit: str) -> str:
    """A test's identity across answers: its code, whatever the spacing and comments."""
    tree = parsed(unit)
    return ast.unparse(tree) if tree is not None else " ".join(unit.split())


def pooled_tests(programs: Iterable[str]) -> list[str]:
    """Every test the ``programs`` carry, once each (as ``normalized`` tells), oldest first."""
    pool: dict[str, str] = {}
    for program in programs:
        for unit in split_tests(split(program)[1]):
            pool.setdefault(normalized(unit), unit)
    return list(pool.values())


def without_unfinished_test(program: str) -> str:
    """``program``, an answer cut off at max_tokens inside its tests, without the line the
    limit stopped: a half-written ``assert f`` is no test (it would fail every answer)."""
    code, tests = split(program)
    if not tests:
        return program
    return join(code, "\n".join(tests.splitlines()[:-1]))
