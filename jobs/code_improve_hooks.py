"""Hooks for the code-improve job: the answer's code runs its own tests in the sandbox.

An answer is the code plus the tests it carries (asserts on the behaviour the request
asks for), kept as one program by ``pipeline.answers``. ``evaluate`` counts the tests
that pass; ``check`` turns every failing test, exception, timeout, missing test and
note about the review into a finding for the refine step; ``rewrite`` tells the loop
which findings call for writing the code afresh rather than editing it.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline import answers
from pipeline.examples import Example, contradicted, restated
from pipeline.inplace import Change, in_place_changes
from pipeline.pyast import parsed, parsed_expression
from pipeline.quoted import untested
from pipeline.sandbox import TestsRun, run_calls, run_tests, syntax_problem
from pipeline.signatures import contradiction

SHOWN_FAILURES = 3  # more failing tests than this are counted, not listed
SHOWN_STRAY = 2  # calls shown doing what the request does not ask for
UNTESTED = "No test uses "  # how the finding for a quoted value no test uses begins
_NO_MODULE = re.compile(r"No module named '([A-Za-z_]\w*)")
_NO_PYTEST = "NameError: name 'pytest' is not defined"


@functools.lru_cache(maxsize=256)
def _run(code: str, tests: tuple[str, ...]) -> TestsRun:
    # evaluate and check ask for the same run.
    return run_tests(code, tests)  # the sandbox's limits for tests, as the pooled tests run


def _results(
    asked: answers.Terms, output: str
) -> tuple[list[str], TestsRun | None, TestsRun | None]:
    """The answer's tests, what running them found (None when the code does not parse or
    there are none), and what running the request's stated examples found (None when the
    code does not parse or the request states none).

    A test for an error the request does not name, one contradicting a signature it
    declares or expecting another result than an example it states is no test of what it
    asks and is left out (``answers.asked_tests``); a ``try`` of a call that catches an
    error it names, asserting nothing, runs as a test that the call raises it
    (``answers.must_raise``). The examples run first, in the same program: a test that
    stops the run cannot keep them from running."""
    code, tests = answers.split(output)
    units = answers.asked_tests(answers.split_tests(tests), asked)
    stated = tuple(example.test for example in asked.examples)
    if syntax_problem(code) is not None or not (units or stated):
        return units, None, None
    ran = _run(code, stated + tuple(answers.must_raise(u, asked.errors) for u in units))
    own = TestsRun(ran.results[len(stated) :], ran.error) if units else None
    shown = TestsRun(ran.results[: len(stated)], ran.error) if stated else None
    return units, own, shown


def _located(output: str, problem: str) -> str:
    """``problem`` ("line 3: ...") with the offending line of the tests quoted."""
    tests = answers.split(output)[1].splitlines()
    number = problem.removeprefix("line ").split(":", 1)[0]
    if number.isdigit() and 0 < int(number) <= len(tests):
        return f"{problem} (`{tests[int(number) - 1].strip()[:120]}`)"
    return problem


def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    """``tests_passed`` / ``tests_total`` of the answer's own tests, and which ones failed."""
    code, _ = answers.split(output)
    asked = answers.terms(fields)
    units, run, shown = _results(asked, output)
    metrics: dict[str, Any] = {"parses": syntax_problem(code) is None, "tests_total": len(units)}
    if asked.examples:  # the request's own examples: loop.chosen ranks answers by them first
        passed = 0 if shown is None or shown.error is not None else shown.passed
        metrics[answers.EXAMPLES_PASSED] = passed
        metrics["examples_total"] = len(asked.examples)
    if run is None or run.error is not None:
        failed = units
    else:
        failed = [u for u, r in zip(units, run.results, strict=True) if r is not None]
    metrics[answers.PASSED_TESTS] = len(units) - len(failed)
    # The loop keeps these tests' passing counterparts with later answers (see loop.py).
    metrics[answers.FAILED_TESTS] = [answers.normalized(u) for u in failed]
    return metrics


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """Findings: syntax errors, missing tests, a failing program or test, notes in comments."""
    code, tests = answers.split(output)
    if not code.strip():
        return ["Give the complete code in the first ```python block."]
    problem = syntax_problem(code)
    if problem is not None:
        return [f"Fix the syntax error at {problem}."]
    asked = answers.terms(fields)
    units, run, shown = _results(asked, output)
    found = _examples_failing(asked, shown)  # first: the request's own word
    found += answers.comment_commentary(code, tests=True)
    written = answers.split_tests(tests)  # before any is left out
    found += _contradicting(asked, written)
    tests_problem = syntax_problem(tests)
    if units and tests_problem is not None:
        found.append(f"Fix the syntax error in the tests at {_located(output, tests_problem)}.")
        if syntax_problem(units[0]) is not None:
            return found  # nothing before the error parses: no test can run
    if not units:
        if shown is not None and shown.error is not None:
            found.append(
                f"The code fails before any test runs: {shown.error}.{_missing(shown.error)}"
            )
        found += _unasked(asked, written)
        found.append(
            "Add tests: a second ```python block of assert statements that call the code "
            "and check the results the request asks for, edge cases included."
        )
        return found
    assert run is not None
    if run.error is not None:
        found.append(f"The code fails before any test runs: {run.error}.{_missing(run.error)}")
        return found
    failures = [(u, r) for u, r in zip(units, run.results, strict=True) if r is not None]
    if failures and shown is not None and shown.error is None:
        # A test restating an example the code gets wrong fails as the example does,
        # which a finding above names already.
        wrong = [e for e, why in zip(asked.examples, shown.results, strict=True) if why]
        failures = [(u, r) for u, r in failures if restated(u, wrong) is None]
    found += [_failing(unit, why, asked.errors) for unit, why in failures[:SHOWN_FAILURES]]
    found += _immutable(code, [why for _, why in failures])
    if any(not _missing(why) for _, why in failures):  # not only tests written for pytest
        more = len(failures) - SHOWN_FAILURES
        found.append(
            (f"{more} more {'tests fail' if more > 1 else 'test fails'}. " if more > 0 else "")
            + "Fix the code so that it does what the request asks; where a test expects a "
            "wrong value, correct the test instead."
        )
    ran = [*units, *(e.test for e in asked.examples)]
    return found + _untested(asked, ran) + _stray_effects(asked, code, ran)


def _contradicting(asked: answers.Terms, units: list[str]) -> list[str]:
    """Findings for the tests left out because they contradict what the request says: a
    signature it declares (rows given as strings where it declares lists, lists expected
    where it returns tuples), or an example it states (``"HTMLParser"`` expected to give
    ``"h_t_m_l_parser"`` where the request says ``"html_parser"``). ``units``: the
    answer's tests as written."""
    found = []
    wrong = [s for unit in units if (s := contradiction(unit, asked.signatures)) is not None]
    if wrong:
        found.append(
            "Tests that contradict the request's signature are left out: "
            + _listed(wrong)
            + ". Call the function with arguments of the types it declares, and expect "
            "results of the type it returns."
        )
    against = [
        f"`{_clip(' '.join(unit.split()))}` (the request: {example.stated})"
        for unit in units
        if (example := contradicted(unit, asked.examples, asked.listed)) is not None
    ]
    if against:
        found.append(
            "Tests that expect another result than the request's own example are left "
            f"out: {_listed(against)}. The request's examples are right: expect what they say."
        )
    return found


def _unasked(asked: answers.Terms, units: list[str]) -> list[str]:
    """A finding for tests left out as tests of an error the request does not name, for an
    answer none of whose tests is left (told to add tests: this says why its own do not
    count). ``units``: the answer's tests as written."""
    left_out = [
        f"`{_clip(' '.join(unit.split()), 80)}`"
        for unit in units
        if answers.unasked_raise(unit, asked.errors)
    ]
    if not left_out:
        return []
    names = " or ".join(sorted(asked.errors))
    asks = f"names {names} as the error to raise" if names else "names no error to raise"
    return [
        f"Tests of an error the request does not ask for are left out: {_listed(left_out)}; "
        f"the request {asks}. Test the results it describes."
    ]


def _untested(asked: answers.Terms, units: list[str]) -> list[str]:
    """A finding for the values the request quotes that no test uses (``quoted.untested``:
    ``"01"`` where it says leading zeros are not allowed): a case it points at that the
    code never met. ``units``: the tests that ran, the request's examples included."""
    missing = untested(asked.quoted, units)
    if not missing:
        return []
    values = " or ".join(f'"{q.value}"' for q in missing[:SHOWN_STRAY])
    said = "; ".join(dict.fromkeys(f"`{q.said}`" for q in missing[:SHOWN_STRAY]))
    return [
        f"{UNTESTED}{values}, which the request quotes: {said}. Add a test of what the "
        "request says for it, worked out by hand, and make the code do that."
    ]


def rewrite(findings: Sequence[str]) -> bool:
    """Whether the findings on an answer call for writing it afresh (``refine_failing``):
    not where every one is a quoted value no test uses. Such code passes every test it
    has and may well be right; it is edited (``refine``: the code, the critic's actions
    and the finding, which asks for the test and for the code to do what it says), not
    thrown away. docs/quality.md, "A quoted value no test uses: an edit, not a fresh
    start": on the suite's ipv4 request an edit kept right code and fixed wrong code more
    often than a fresh start did."""
    return not all(f.startswith(UNTESTED) for f in findings)


def _listed(items: list[str]) -> str:
    more = len(items) - SHOWN_STRAY
    return "; ".join(items[:SHOWN_STRAY]) + (f" (and {more} more)" if more > 0 else "")


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _examples_failing(asked: answers.Terms, shown: TestsRun | None) -> list[str]:
    """A finding for each of the request's own examples the code gets wrong (the first
    ``SHOWN_FAILURES``): right by definition, so the code is what is wrong."""
    if shown is None or shown.error is not None:
        return []  # the code does not parse or fails before its tests: found elsewhere
    failing = [
        (example, why)
        for example, why in zip(asked.examples, shown.results, strict=True)
        if why is not None
    ]
    return [
        f"The request's own example ({example.stated}) fails: {_why_not_raised(example, why)}. "
        "The request's examples are right: fix the code so that it "
        + ("raises that error for such input." if example.raises else "gives what they say.")
        for example, why in failing[:SHOWN_FAILURES]
    ]


def _why_not_raised(example: Example, why: str) -> str:
    """Why an example failed, without the line of its test that says a raise did not
    happen (``Example.test``): "`raise AssertionError(...)`: AssertionError: f('x') did not
    raise ValueError" is "f('x') did not raise ValueError"; any other failure (another
    error raised) as it is."""
    said = example.not_raised
    return said if example.raises and f"AssertionError: {said}" in why else why


def _stray_effects(asked: answers.Terms, code: str, units: list[str]) -> list[str]:
    """A finding when the code, on the calls its tests make, small changes of them or the
    same with a character foreign to a string argument, does what the request does not
    ask for: raises an error it does not name where it names the
    ones to raise (a ``KeyError`` from a dict lookup where the request asks for a
    ``ValueError`` on bad input), a ``NameError`` whatever it names (a name the code never
    bound), or changes an argument while returning a result (sorts the caller's list)
    where it does not ask for work in place."""
    calls = [c for part in answers.near_calls([code], units) for c in part]
    results = run_calls(code, calls) or ()
    stray = [
        (call, effect)
        for call, result in zip(calls, results, strict=False)
        if (effect := answers.stray_effect(call, result, asked)) is not None
    ]
    found = []
    raised: list[tuple[str, str]] = []  # errors the request does not name
    slips: list[tuple[str, str]] = []  # names the code never bound (answers.SLIPS)
    changed: list[tuple[str, str]] = []  # arguments the code changed
    for call, effect in stray:
        error = answers.raised_error(effect)
        kind = changed if error is None else slips if error.name in answers.SLIPS else raised
        kind.append((call, effect))
    if slips:
        found.append(
            f"{_examples(_where_raised(code, slips))}: the code uses a name it never defines "
            "(a helper called under another name than its own, a module not imported). "
            "Define it, or call the one meant."
        )
    if raised:
        names = " or ".join(sorted(asked.errors))
        found.append(
            f"{_examples(_where_raised(code, raised))}: the request names {names} as the "
            f"error to raise. Where such an input is not valid, check it and raise {names}; "
            f"where it is valid, return the result.{_lookup_hint(raised, names)}"
            f"{_rows_hint(asked, code, raised, names)}"
        )
    if changed:
        found.append(
            f"{_examples(changed)}: the caller's value is changed, which the request does "
            f"not ask for.{_where_changed(code, changed)} Leave the arguments as they are "
            "(work on a copy)."
        )
    return found


def _where_raised(code: str, raised: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``raised`` with the first call's effect saying where the code raised the error and
    its values there, as a failing test does (``raises KeyError: 'Z' (raised in
    roman_to_int, line 7 of the code: `total += m[c]`, where ...)``); as it was when the
    call, run on its own, does not raise that error."""
    call, effect = raised[0]
    (why,) = run_tests(code, [call]).results or (None,)
    error = answers.raised_error(effect)
    prefix = f"`{call}`: "
    if why is None or error is None or not why.startswith(prefix + error.name):
        return raised
    return [(call, "raises " + why.removeprefix(prefix)), *raised[1:]]


def _lookup_hint(raised: list[tuple[str, str]], names: str) -> str:
    """For a ``KeyError`` among the stray raises (a table looked up with a key it lacks),
    how to raise the named error instead."""
    if not any(answers.raised_error(effect) == ("KeyError", "") for _, effect in raised):
        return ""
    return (
        " A lookup `table[key]` raises KeyError for a key the table lacks: check "
        f"`if key not in table:` and raise {names} before looking it up."
    )


# A request that speaks of its rows' lengths (and so may ask for an error on rows of
# different lengths); one that does not gets no advice on checking them.
_ROW_LENGTHS = re.compile(
    r"\b(lengths?|rectangular|ragged|jagged|same (?:size|width)|uneven)\b", re.IGNORECASE
)


def _rows_hint(asked: answers.Terms, code: str, raised: list[tuple[str, str]], names: str) -> str:
    """For stray raises on a matrix with rows of different lengths (the foreign calls'
    shortened last row), the check that raises the named error instead, in the code's own
    parameter names: `if len({len(row) for row in a}) > 1:`. On the fresh dozen's matrix
    request no answer in eight runs checked its rows under the general sentence; sampled
    with the check written out, 11 of 12 answers wrote it and 4 were right, against 0 of
    12 before (docs/quality.md, "Rows of different lengths, said how"). "" where the
    request says nothing of lengths or no parameter is known for the argument."""
    tree = parsed(code)
    if tree is None or not any(_ROW_LENGTHS.search(text) for text in asked.texts):
        return ""
    params: list[str] = []
    for call, _ in raised:
        node = parsed_expression(call)
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        declared = _parameters(tree, node.func.id)
        for i, arg in enumerate(node.args):
            if i < len(declared) and _ragged(arg) and declared[i] not in params:
                params.append(declared[i])
    if not params:
        return ""
    test = " or ".join(f"len({{len(row) for row in {p}}}) > 1" for p in params)
    return (
        f" Rows of different lengths are such an input: check `if {test}:` and raise "
        f"{names} before using the rows."
    )


def _parameters(tree: ast.Module, function: str) -> list[str]:
    """The positional parameters of ``function`` as the code's ``tree`` defines it (its
    last definition); [] where it defines none by that name."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            found = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    return found


def _ragged(arg: ast.expr) -> bool:
    """A list literal of two or more list or tuple literals not all of one length."""
    if not isinstance(arg, ast.List) or len(arg.elts) < 2:
        return False
    rows = arg.elts
    return all(isinstance(r, ast.List | ast.Tuple) for r in rows) and (
        len({len(r.elts) for r in rows if isinstance(r, ast.List | ast.Tuple)}) > 1
    )


def _where_changed(code: str, changed: list[tuple[str, str]]) -> str:
    """The statements that change the arguments the ``changed`` calls changed
    (``inplace.in_place_changes``), as a sentence to put in the finding; "" when none
    is found."""
    changes: dict[Change, str] = {}  # each change, in order, and the function making it
    for call, effect in changed:
        node = parsed_expression(call)
        positions = [int(p) for p in re.findall(r"\d+", effect)]  # "changes argument 1, 2"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            for change in in_place_changes(code, node.func.id, positions):
                changes.setdefault(change, node.func.id)
    if not changes:
        return ""
    shown = "; ".join(f"line {c.line}, `{c.source[:60]}`" for c in list(changes)[:SHOWN_STRAY])
    more = len(changes) - SHOWN_STRAY
    shown += f" (and {more} more)" if more > 0 else ""
    sorts = [c for c in changes if c.sorts]
    if sorts:
        copy = _sorted_copy(sorts[0])
    else:  # a small model told to work on a copy writes the same loop again: say how
        first, function = next(iter(changes.items()))
        name = first.parameter
        copy = (
            f" Copy it before changing it: make `{name} = copy.deepcopy({name})` the first "
            f"line of `{function}` (with `import copy` above it)."
        )
    return f" It is changed in place at {shown}.{copy}"


def _sorted_copy(change: Change) -> str:
    """How to sort a copy where ``change`` sorts the argument in place: the line itself,
    rewritten, where it sorts the parameter by its name (``v.sort(key=f)`` becomes
    ``v = sorted(v, key=f)``); else that ``sorted`` gives a copy. (Told only the latter,
    the 1.5B model wrote ``intervals.sort(...)`` again in every answer of merge-intervals.)"""
    name = change.parameter
    node = parsed_expression(change.source)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == name
    ):
        given = [ast.unparse(a) for a in node.args] + [ast.unparse(k) for k in node.keywords]
        return (
            f" Write line {change.line} as `{name} = sorted({', '.join([name, *given])})`: "
            f"a sorted copy, which leaves the caller's `{name}` as it is."
        )
    return f" `sorted({name})` gives a sorted copy and leaves `{name}` as it is."


# A failing test's reason where the code assigned an item of a value that cannot change.
_ITEM_ASSIGNMENT = re.compile(
    r"TypeError: '(tuple|str)' object does not support item assignment "
    r"\(raised in [\w<>.]+, line (\d+) of the code"
)


def _immutable(code: str, whys: Sequence[str]) -> list[str]:
    """Where a test failed because the code assigned an item of a tuple or a string, how
    to put a new one in its place, once, by the first such line: ``merged[-1][1] = end``
    becomes ``merged[-1] = (*merged[-1][:1], end, *merged[-1][2:])``. [] where none did,
    or the line is no single assignment of one item. (Shown only the TypeError, the 1.5B
    model wrote the same assignment into a list of tuples in every answer of
    merge-intervals, six runs.)"""
    lines = code.splitlines()
    for why in whys:
        match = _ITEM_ASSIGNMENT.search(why)
        if match is None or not 0 < int(match.group(2)) <= len(lines):
            continue
        kind, number = match.group(1), int(match.group(2))
        tree = parsed(lines[number - 1].strip())
        stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], ast.unparse(stmt.value)
        elif isinstance(stmt, ast.AugAssign):
            target = stmt.target
            value = ast.unparse(ast.BinOp(left=stmt.target, op=stmt.op, right=stmt.value))
        else:
            continue
        if not isinstance(target, ast.Subscript) or isinstance(target.slice, ast.Slice):
            continue
        whole = ast.unparse(target.value)
        rebuilt = _with_item(whole, target.slice, value, kind)
        noun = "string" if kind == "str" else kind
        return [
            f"`{whole}` is a {noun}, and a {noun} cannot be changed in place: line {number}, "
            f"`{ast.unparse(stmt)[:80]}`, fails so. Put a new {noun} in its place: "
            f"`{whole} = {rebuilt}`."
        ]
    return []


def _with_item(whole: str, index: ast.expr, item: str, kind: str) -> str:
    """``whole`` with the item at ``index`` replaced by ``item``: a tuple of the items
    around it, ``(*t[:1], v, *t[2:])`` (a tuple also where ``whole`` is a list, as a
    probe's argument may be), or a string's slices joined, ``s[:1] + v + s[2:]``; a
    negative literal index counts from the end (``(*t[:-1], v)`` for ``-1``)."""
    try:
        at = ast.literal_eval(index)
    except (ValueError, TypeError):  # not a literal: a name, an expression
        at = None
    if isinstance(at, int) and not isinstance(at, bool):
        before = f"{whole}[:{at}]" if at != 0 else ""
        after = f"{whole}[{at + 1}:]" if at != -1 else ""
    else:
        shown = ast.unparse(index)
        before, after = f"{whole}[:{shown}]", f"{whole}[{shown} + 1:]"
    if kind == "str":
        return " + ".join(part for part in (before, item, after) if part)
    parts = [f"*{before}"] if before else []
    parts += [item, f"*{after}"] if after else [item]
    return "(" + ", ".join(parts) + ")"


def _examples(stray: list[tuple[str, str]]) -> str:
    shown = "; ".join(f"`{call[:80]}` {effect}" for call, effect in stray[:SHOWN_STRAY])
    more = len(stray) - SHOWN_STRAY
    return shown + (f" (and {more} more such call{'' if more == 1 else 's'})" if more > 0 else "")


def _missing(error: str) -> str:
    """For an error from a module the tests' run does not have (a third-party one, or
    pytest used without its import), what to write instead; "" for any other error."""
    module = _NO_MODULE.search(error)
    name = module.group(1) if module else "pytest" if _NO_PYTEST in error else None
    if name is None or name in sys.stdlib_module_names:
        return ""
    if name == "pytest":
        return (
            " The tests run without pytest: write each as a plain `assert` statement at the "
            "top level (no `import pytest`, no `@pytest` decorators)."
        )
    return f" Only Python's standard library is there: write the code without `{name}`."


def _failing(unit: str, why: str, errors: frozenset[str]) -> str:
    """The finding for a failing test; for one that compares a result with an exception (a
    new one cannot pass, whatever the code does; the class fails code that raises it), how
    to test that the call raises. Where the request names that error, the test ran as the
    check of the raise it meant (``answers.must_raise``), and the call did not raise."""
    meant = answers.raise_compared_as_value(unit)
    if meant is None:
        return f"Failing test {why}.{_missing(why)}"
    call, error, instance = meant
    if error in errors:
        return (
            f"Failing test `{' '.join(unit.split())[:120]}`, run as a check that `{call[:80]}` "
            f"raises {error}: it did not. Write such a test as: under `try:` the call, then "
            f"`assert False`; under `except {error}:` `pass`."
        )
    why_not = (
        f"cannot pass: a new {error} object equals only itself"
        if instance
        else f"compares the result with the class {error}: code that raises {error} fails it"
    )
    return (
        f"The test `{' '.join(unit.split())[:120]}` {why_not}. To test that `{call[:80]}` "
        f"raises {error}: under `try:` call it, then `assert False`; under "
        f"`except {error}:` `pass`."
    )
