"""Answers: the artifact inside a model's reply, apart from tests, preamble and notes.

Models wrap what was asked for: a preamble ("Here is the improved sentence:"), fenced
code followed by prose, tests next to the code, notes about the feedback they were
given. ``extract`` keeps the artifact the job asks for; ``meta_commentary`` and
``comment_commentary`` find the notes that survive it, as findings for a job's check.

For jobs whose answers carry their own tests (``extract = "code-with-tests"``) an
answer is kept as one program: the code, then ``TESTS_MARKER`` on a line of its own,
then the tests. That is what the sandbox runs, what the critic and the refine step see
and what ``split`` takes apart again for the output. Pure functions only.
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import sys
import textwrap
import tokenize
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .examples import Example, Listed, contradicted, listed_raising, stated_examples
from .pyast import parsed, strings
from .quoted import Quoted, quoted_values
from .signatures import Signature, contradiction, signatures

__all__ = [
    "EXAMPLES_PASSED",
    "EXTRACT_MODES",
    "FAILED_TESTS",
    "PASSED_TESTS",
    "POOLED_TESTS",
    "SLIPS",
    "TESTS_MARKER",
    "RaiseAsValue",
    "Raised",
    "Terms",
    "asked_tests",
    "carry_tests",
    "comment_commentary",
    "extract",
    "extract_code",
    "extract_text",
    "foreign_calls",
    "join",
    "meta_commentary",
    "must_raise",
    "near_calls",
    "normalized",
    "pooled_tests",
    "probe_calls",
    "raise_compared_as_value",
    "raised_error",
    "split",
    "split_tests",
    "stray_effect",
    "terms",
    "unasked_message",
    "unasked_raise",
    "without_unfinished_test",
]

EXTRACT_MODES = ("text", "code", "code-with-tests")
TESTS_MARKER = "# --- tests ---"
# The metric in which a code-with-tests job's evaluator lists the tests an answer fails
# (each as ``normalized`` gives it): the loop keeps the others with later answers.
FAILED_TESTS = "tests_failed"
# The metric in which it counts the answer's own tests that ran and passed (a test left
# out as no test of what the request asks is not among them): see loop.chosen.
PASSED_TESTS = "tests_passed"
# The metric in which the loop records how each answer so far fares on the tests that all
# of them wrote (``{"total": n, "passed": [per answer, oldest first]}``): see loop.choose.
POOLED_TESTS = "tests_pooled"
# The metric in which a code-with-tests job's evaluator counts the examples the request
# states (``examples.stated_examples``) that an answer's code gets right: see loop.choose.
EXAMPLES_PASSED = "examples_passed"
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


def _code_blocks(text: str) -> list[str]:
    """Bodies of the Python blocks (tagged python, or untagged when none is tagged)."""
    blocks = _blocks(text)
    tagged = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    return tagged or [body for tag, body in blocks if not tag]


def extract_code(text: str) -> str:
    """The first Python block of an answer, or the answer itself when it has no fence."""
    blocks = _code_blocks(text)
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


def unasked_raise(unit: str, errors: frozenset[str]) -> bool:
    """Whether ``unit`` tests for an error the request does not ask for: a ``try`` at its
    top level catching only particular errors (not ``Exception``), none of them one the
    request names (``errors``; a request naming none asks for none). The request leaves
    such an input open (``second_largest(['a'])``), so the test asks what it does not."""
    tree = parsed(unit)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Try) and node.handlers:
            caught = _caught(node)
            if caught and not caught & (_PROGRAM_ERRORS | {""}) and not caught & errors:
                return True
    return False


def unasked_message(unit: str, texts: Sequence[str]) -> bool:
    """Whether ``unit`` asserts the words of an error it catches (``except ValueError as
    e:`` then ``assert str(e) == "List cannot be empty"``) that no text of the request
    (``texts``) holds: a request that names the error to raise leaves its message open, so
    such a test asks what it does not (the code's ``"List is empty"`` fails it)."""
    tree = parsed(unit)
    for node in tree.body if tree is not None else ():
        if not isinstance(node, ast.Try):
            continue
        for handler in node.handlers:
            if handler.name is None:
                continue
            for statement in handler.body:
                for check in ast.walk(statement):
                    if isinstance(check, ast.Assert) and _unstated(check.test, handler.name, texts):
                        return True
    return False


def _unstated(test: ast.expr, name: str, texts: Sequence[str]) -> bool:
    """Whether ``test`` uses the caught error ``name`` and a string no text holds."""
    used = any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(test))
    return used and any(w and not any(w in text for text in texts) for w in strings(test))


def must_raise(unit: str, errors: frozenset[str]) -> str:
    """``unit`` as the test that its call raises which it was written to be, for errors the
    request names (``errors``). A ``try`` of a call that catches only such errors and
    asserts nothing (see ``_raise_check``) passes whether or not the call raises: an
    ``else`` that fails it when the call returns is added. ``assert CALL == SomeError`` (or
    ``SomeError(...)``, see ``raise_compared_as_value``) fails whatever the call does: it is
    replaced by that ``try``. Any other unit is returned as it is."""
    tree = parsed(unit) if errors else None
    last = tree.body[-1] if tree is not None and tree.body else None
    if last is None or last.col_offset != 0:
        return unit
    meant = raise_compared_as_value(unit)
    if meant is not None and meant.error in errors:
        lines = unit.splitlines()
        before = "\n".join([*lines[: last.lineno - 1], ""])
        return before + _raise_test(meant.call, {meant.error})
    if not _raise_check(last):
        return unit
    assert isinstance(last, ast.Try)
    caught = _caught(last)
    if last.orelse or not caught <= errors:
        return unit
    call = ast.unparse(getattr(last.body[-1], "value", last.body[-1]))
    return f"{unit.rstrip()}\n{_else_fails(call, caught)}"


def _else_fails(call: str, errors: set[str]) -> str:
    """The ``else`` of a ``try`` of ``call`` that fails the test when the call returns."""
    failure = f"{call[:80]} did not raise {' or '.join(sorted(errors))}"
    return f"else:\n    raise AssertionError({failure!r})"


def _raise_test(call: str, errors: set[str]) -> str:
    """A test that ``call`` raises one of ``errors``."""
    caught = ", ".join(sorted(errors))
    caught = f"({caught})" if len(errors) > 1 else caught
    return f"try:\n    {call}\nexcept {caught}:\n    pass\n{_else_fails(call, errors)}"


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
    blocks = _code_blocks(text) or [text.strip()]
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


def extract(text: str, mode: str) -> str:
    """The artifact of an answer for a job's ``[output] extract`` mode."""
    if mode == "code":
        return extract_code(text)
    if mode == "code-with-tests":
        return code_with_tests(text)
    return extract_text(text)


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
    methods but ``method``, and without blank lines between its members: a test carried to
    a later answer (``carry_tests``) brings its own method, not the class's others once
    per method."""
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
    ``classes`` (the lines ``_method_call`` writes, a carried test's among them, or the
    tests' own ``TestX().test_y()``): each test method is a test on its own already."""
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


PROBE_LIMIT = 200  # calls at most that ``probe_calls`` returns


def _variants(arg: ast.expr) -> list[ast.expr]:
    """Small changes of a literal argument: a number made 0, negated or moved by one; a
    string emptied, shortened, its first or last character doubled, its case changed or
    reversed; a list or tuple emptied, cut to its first item, without its last, reversed,
    its first item doubled, of numbers only, each number's sign turned, and, holding lists
    or tuples, with each of those as the other kind (``[1, [2, 3]]`` as ``[1, (2, 3)]``:
    code that flattens tuples too is told apart from code that keeps them as items).
    Nothing for anything else."""
    if isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub):
        operand = arg.operand
        if isinstance(operand, ast.Constant) and isinstance(operand.value, int | float):
            arg = ast.Constant(-operand.value)
    if isinstance(arg, ast.Constant):
        v = arg.value
        values: list[Any]
        if isinstance(v, bool):
            values = [not v]
        elif isinstance(v, int):
            values = [0, -v, v + 1, v - 1]
        elif isinstance(v, float):
            values = [0.0, -v]
        elif isinstance(v, str):
            values = ["", v[1:], v[:-1], v[:1] + v, v + v[-1:], v.upper(), v.lower(), v[::-1]]
        else:
            return []
        return [ast.Constant(x) for x in values if x != v or type(x) is not type(v)]
    if isinstance(arg, ast.List | ast.Tuple):
        items = arg.elts
        forms = [[], items[:1], items[:-1], items[::-1], items[:1] + items]
        numbers = [_number(item) for item in items]
        if items and all(n is not None for n in numbers):  # the numbers' signs turned
            forms.append([ast.Constant(-n) for n in numbers if n is not None])
        swapped = [_other_sequence(item) for item in items]
        if swapped != items:  # the lists in it as tuples, the tuples as lists
            forms.append(swapped)
        return [type(arg)(elts=list(form), ctx=ast.Load()) for form in forms]
    return []


def _other_sequence(node: ast.expr) -> ast.expr:
    """A list literal as a tuple and a tuple as a list; anything else as it is."""
    if isinstance(node, ast.List):
        return ast.Tuple(elts=node.elts, ctx=ast.Load())
    if isinstance(node, ast.Tuple):
        return ast.List(elts=node.elts, ctx=ast.Load())
    return node


def _number(node: ast.expr) -> int | float | None:
    """The value of a number literal (``3``, ``-2.5``), else None."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node, sign = node.operand, -1
    value = node.value if isinstance(node, ast.Constant) else None
    return sign * value if isinstance(value, int | float) and not isinstance(value, bool) else None


def probe_calls(codes: Sequence[str], tests: Sequence[str], limit: int = PROBE_LIMIT) -> list[str]:
    """Calls to run each code on, to tell whether two codes behave alike beyond what
    their ``tests`` (the pooled tests) assert: every call of the codes' own functions in
    the tests, then each of them with one literal argument changed a little (see
    ``_variants``), at most ``limit``, each once."""
    return near_calls(codes, tests, limit)[0]


def foreign_calls(
    codes: Sequence[str], tests: Sequence[str], limit: int = PROBE_LIMIT
) -> list[str]:
    """The calls of the codes' own functions in ``tests`` with a character foreign to one
    string argument added at its end: a ``#``, and a letter the string lacks (``"MCMXCIV"``
    as ``"MCMXCIV#"`` and ``"MCMXCIVZ"``), or with the last of one argument's rows one
    item shorter (``[[1, 2], [3, 4]]`` as ``[[1, 2], [3]]``), at most ``limit``, each
    once. Code that looks each character up in a table raises ``KeyError`` on them, and
    code reading a matrix's width off its first row ``IndexError``, where a request asks
    for ``ValueError`` on a character it does not allow or on rows of different lengths;
    no small change of the tests' own arguments (``_variants``) shows that. Only for
    finding such raises (``stray_effect``): what code returns for such input is a
    behaviour no request fixes, so these calls do not tell two codes apart."""
    return near_calls(codes, tests, limit)[1]


def near_calls(
    codes: Sequence[str], tests: Sequence[str], limit: int = PROBE_LIMIT
) -> tuple[list[str], list[str]]:
    """``probe_calls`` and ``foreign_calls`` of the same codes and tests, from one reading
    of them."""
    calls: list[str] = []
    variants: list[str] = []
    foreign: list[str] = []
    for node in _own_calls(codes, tests):
        calls.append(ast.unparse(node))
        for i, arg in enumerate(node.args):
            variants.extend(_with_argument(node, i, _variants(arg)))
            foreign.extend(_with_argument(node, i, _foreign(arg)))
    probes = list(dict.fromkeys(calls + variants))[:limit]
    return probes, list(dict.fromkeys(foreign))[:limit]


def _own_calls(codes: Sequence[str], tests: Sequence[str]) -> Iterator[ast.Call]:
    """Every call in ``tests`` of a function the ``codes`` define, by name, whose arguments
    stand alone: they read no name but Python's built-ins, the functions and classes every
    code defines and what they bind themselves (a comprehension's variable). A call of a
    test's own variable (``rotate(matrix)`` in a parametrized test, ``median(xs)`` after
    ``xs = [3, 1]``) is left out: run on its own it would raise ``NameError`` whatever the
    code does."""
    defined = [_defined(tree) for code in codes if (tree := parsed(code)) is not None]
    names = set().union(*defined)
    known = set(dir(builtins)) | (set.intersection(*defined) if defined else set())
    for unit in tests:
        tree = parsed(unit)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in names
                and _free_names([*node.args, *(k.value for k in node.keywords)]) <= known
            ):
                yield node


def _free_names(nodes: Iterable[ast.AST]) -> set[str]:
    """The names ``nodes`` read and do not bind themselves (as a comprehension's variable,
    a lambda's parameter or by ``:=``)."""
    read: set[str] = set()
    bound: set[str] = set()
    for node in (sub for top in nodes for sub in ast.walk(top)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound


def _with_argument(call: ast.Call, i: int, values: list[ast.expr]) -> list[str]:
    """``call`` with its ``i``-th positional argument as each of ``values``, as source."""
    return [
        ast.unparse(
            ast.Call(call.func, [*call.args[:i], value, *call.args[i + 1 :]], call.keywords)
        )
        for value in values
    ]


_FOREIGN_LETTERS = "zqjxkw"


def _foreign(arg: ast.expr) -> list[ast.expr]:
    """A non-empty string literal with a ``#`` added at its end, and with a letter it lacks
    (in either case) added, upper case where its letters are; a list literal of two or
    more list literals of one length, not empty (rows), with the last one item shorter;
    nothing for anything else (``foreign_calls``). Tuples are left alone: ``[(1, 3), (2,
    6)]`` is more often records of a fixed size (intervals) than rows."""
    if isinstance(arg, ast.List):
        rows = [item.elts for item in arg.elts if isinstance(item, ast.List)]
        if len(rows) < 2 or len(rows) < len(arg.elts) or len({len(r) for r in rows}) > 1:
            return []
        if not rows[0]:
            return []
        last = ast.List(elts=rows[-1][:-1], ctx=ast.Load())
        return [ast.List(elts=[*arg.elts[:-1], last], ctx=ast.Load())]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value):
        return []
    v = arg.value
    values = [v + "#"] if "#" not in v else []
    letter = next((c for c in _FOREIGN_LETTERS if c not in v.lower()), None)
    if letter is not None:
        values.append(v + (letter.upper() if v.isupper() else letter))
    return [ast.Constant(x) for x in values]


_ERROR_NAME = re.compile(r"\b[A-Z][A-Za-z0-9_]*(?:Error|Exception)\b")
# Errors no request asks for, whatever errors it names: a name the code uses and never
# bound (a misspelt helper, a module not imported) is a slip in the code, not its answer.
SLIPS = frozenset({"NameError", "UnboundLocalError"})
_IN_PLACE = re.compile(r"\bin[- ]?place\b", re.IGNORECASE)
_CHANGED = re.compile(r" \[argument ([0-9, ]+) changed\]$")  # see sandbox.run_calls


class Raised(NamedTuple):
    """An error a call raised, as ``sandbox.run_calls`` writes it: ``raises
    RomanError(ValueError)`` is ``Raised("RomanError", "ValueError")``, the base the built-in
    class a class of the code's own derives from; ``raises KeyError`` has none ("")."""

    name: str
    base: str = ""

    @property
    def names(self) -> set[str]:
        """The class's name and its built-in base's: a request naming either names it."""
        return {self.name, self.base}


def raised_error(result: str) -> Raised | None:
    """The error a call's result (or its stray effect, ``stray_effect``) says it raised;
    None for anything else (a value, ``timeout``, ``changes argument 1``)."""
    if not result.startswith("raises "):
        return None
    name, _, base = result.removeprefix("raises ").partition("(")
    return Raised(name, base.removesuffix(")"))


class Terms(NamedTuple):
    """What a request allows a function besides returning a value: the exceptions it
    names ("it must raise ValueError for an empty list"), and whether it asks for work in
    place (changing the caller's list, say); the signatures it declares
    (``signatures.signatures``: what its arguments and results are); the examples it
    states (``examples.stated_examples``: ``"userId" -> "user_id"``), the values it
    quotes (``"01" is not``) and, for a function of several parameters, the inputs it
    lists as raising (``examples.listed_raising``)."""

    errors: frozenset[str] = frozenset()
    in_place: bool = False
    signatures: tuple[Signature, ...] = ()
    examples: tuple[Example, ...] = ()
    texts: tuple[str, ...] = ()  # the request's text fields, for words it states
    quoted: tuple[Quoted, ...] = ()  # the values it quotes (``quoted.quoted_values``)
    # the inputs it lists as raising, for a function of several parameters
    # (``examples.listed_raising``: "either string ... (for example '1..2')")
    listed: tuple[Listed, ...] = ()


def terms(fields: Mapping[str, Any]) -> Terms:
    """The ``Terms`` of a record's request, read from its text fields: the names ending in
    ``Error`` or ``Exception``, "in place" (or "in-place"), the annotated signatures, the
    stated examples, the texts themselves and the values they quote."""
    texts = [value for value in fields.values() if isinstance(value, str)]
    declared = tuple(sig for text in texts for sig in signatures(text))
    return Terms(
        frozenset(name for text in texts for name in _ERROR_NAME.findall(text)),
        any(_IN_PLACE.search(text) for text in texts),
        declared,
        tuple(example for text in texts for example in stated_examples(text, declared)),
        tuple(texts),
        tuple(q for text in texts for q in quoted_values(text)),
        tuple(raising for text in texts for raising in listed_raising(text, declared)),
    )


def asked_tests(units: Iterable[str], asked: Terms) -> list[str]:
    """The tests of ``units`` that test what the request asks: without those for an error
    it does not name (``unasked_raise``), asserting an error's words it does not state
    (``unasked_message``), contradicting a signature it declares
    (``signatures.contradiction``) or expecting another result than an example it states
    or a value where it lists the input as raising (``examples.contradicted``)."""
    return [
        unit
        for unit in units
        if not unasked_raise(unit, asked.errors)
        and not unasked_message(unit, asked.texts)
        and contradiction(unit, asked.signatures) is None
        and contradicted(unit, asked.examples, asked.listed) is None
    ]


def stray_effect(call: str, result: str, asked: Terms) -> str | None:
    """What ``call`` did that its request does not ask for, from the call's
    ``sandbox.run_calls`` result: an error raised where the request names the errors to
    raise and this is none of them nor derives from one (``raises KeyError``; a class of
    the code's own is shown with its built-in base, ``raises RomanError(ValueError)``), a
    ``NameError`` whatever the request names (unless it is that: a name the code never
    bound, as where a helper it calls is misspelt, is no answer to any request), or
    an argument changed by a call that also returned a value, where the request does not
    ask for work in place (``changes argument 1``). None when the call did neither, and
    for a call passing a literal of another kind than a signature the request declares
    (``roman_to_int(1994)`` where it declares ``s: str``): the request asks nothing of
    such a call, so a ``TypeError`` there is no error it left unnamed."""
    if contradiction(call, asked.signatures) is not None:
        return None
    error = raised_error(result)
    if error is not None:
        stray = not error.names & asked.errors and (error.names & SLIPS or asked.errors)
        return result if stray else None
    changed = _CHANGED.search(result)
    if changed is None or asked.in_place or result[: changed.start()] == "None":
        return None
    return f"changes argument {changed.group(1)}"


class RaiseAsValue(NamedTuple):
    """A test that compares a call's result with an exception instead of testing the raise."""

    call: str  # the call's source
    error: str  # the exception's name
    instance: bool  # compared with a new exception object, not the class itself


def raise_compared_as_value(unit: str) -> RaiseAsValue | None:
    """The call and exception when the test ``unit`` ends in ``assert CALL == SomeError(...)``
    or ``assert CALL == SomeError``.

    A new exception object equals only itself, so the first can never pass; a call that
    raises, as the test meant it to, fails either with that exception (the second passes
    only for code that returns the class itself, which no request asks for).
    """
    tree = parsed(unit)
    if tree is None or not tree.body or not isinstance(tree.body[-1], ast.Assert):
        return None
    test = tree.body[-1].test
    if not isinstance(test, ast.Compare) or [type(op) for op in test.ops] != [ast.Eq]:
        return None
    right = test.comparators[0]
    instance = isinstance(right, ast.Call)
    named = right.func if isinstance(right, ast.Call) else right
    if not isinstance(named, ast.Name):
        return None
    name = named.id
    known = getattr(builtins, name, None)
    if not (isinstance(known, type) and issubclass(known, BaseException)) and not name.endswith(
        ("Error", "Exception")
    ):
        return None
    return RaiseAsValue(ast.unparse(test.left), name, instance)


def carry_tests(program: str, kept: Sequence[str]) -> str:
    """``program`` with the ``kept`` tests it dropped put back, before its own tests: they
    run even when its own tests end in a statement that does not parse (tests that do not
    parse are cut after their last line that does)."""
    code, tests = split(program)
    present = {normalized(u) for u in split_tests(tests)}
    missing = [u for u in kept if normalized(u) not in present]
    if not missing:
        return program
    return join(code, "\n".join([*missing, tests]).strip("\n"))


def without_unfinished_test(program: str) -> str:
    """``program``, an answer cut off at max_tokens inside its tests, without the line the
    limit stopped: a half-written ``assert f`` is no test (it would fail every answer)."""
    code, tests = split(program)
    if not tests:
        return program
    return join(code, "\n".join(tests.splitlines()[:-1]))


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
