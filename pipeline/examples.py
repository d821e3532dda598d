"""The examples a coding request states, as tests that are right by definition.

A request often shows what it wants on an input or two: ``"userId" -> "user_id"``,
``[[1, 2, 3], [4, 5, 6]] becomes [[4, 1], [5, 2], [6, 3]]``, ``"MCMXCIV" (1994)``,
``fib(10) == 55``. Such an example is the request's own word. Code that fails it does
not do what was asked, whatever its own tests say; a test that expects another result
for the same call is wrong, and code bent to pass it is wrong too.

Only what plainly is an example is read, so that a misreading cannot push an answer
the wrong way:

- the input is a call of a function the request names (``fib(10)``: every argument a
  literal), or, where the request declares exactly one function and it takes one
  parameter, a literal alone (``"userId"``) or "the empty string", "an empty list"
  (also tuple, dict, set) standing for ``""``, ``[]``...;
- the result is a literal, after ``->``, ``→``, ``=>``, ``==``, "gives", "becomes",
  "returns", "yields", "should return", "maps to", "turns into", "evaluates to",
  "results in", "is converted to" (and their plain forms), after a call also ``=``,
  "is", "equals", "should be"; after a bare input "is" where the result ends a clause
  (a bracket, comma, semicolon, colon or full stop after it: ``"#fa0" is (255, 170,
  0))``, "so row 4 is [1, 4, 6, 4, 1]."; not "is 3 characters long"); or in parentheses
  right after a literal input (``"MCMXCIV" (1994)``); either side may be a ``code span``;
- a doctest's call (``>>> fib(10)``) and the literal on the line after it;
- neither side is a term of an expression or a step of a chain: an operator or an arrow
  right before a bare input or right after a result (``38 -> 3 + 8 = 11 -> 2``) reads
  as no example;
- where the request annotates the function (``signatures.signatures``), the input must
  fit its parameter and the result its return type; a bare input in parentheses, or
  followed by "is", is read only when both are annotated.

A request asking for an error also often lists inputs that must raise it: "It must raise
ValueError for any other text, such as "1,00" or ",100"". The literals listed right
after "such as", "like", "e.g." or "for example", in the sentence that asks for the
error, are read as examples of the raise (``Example.raises``), where the request declares
one function of one parameter and annotates it, each literal fitting it (a literal alone
only: "such as a missing "#"" lists a description, not an input). Where that function
takes several annotated parameters ("compare_versions(a: str, b: str) ... Raise ValueError
if either string has an empty component (for example '1..2')"), the literal is no call,
but an input the call must raise on wherever it is passed (``Listed``): at the one
parameter it fits, or at each it fits where the sentence says "either", "both", "each"
or "neither". A test expecting a value of a call passing it there contradicts the
request as one contradicting an example does (``contradicted``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from .brackets import closing, plain_quotes, string_end
from .pyast import parsed, parsed_expression
from .signatures import Signature, fits

__all__ = ["Example", "Listed", "contradicted", "listed_raising", "restated", "stated_examples"]

LIMIT = 8  # examples read from one request, at most
READ_CHARS = 20_000  # of a request's text, the first this many are read for examples
SPAN_CHARS = 500  # the longest literal or call read as (part of) an example


class Example(NamedTuple):
    """An example a request states: the call, the result it gives, and the request's words."""

    function: str
    args: tuple[Any, ...]
    value: Any
    stated: str  # as the request writes it: '"userId" -> "user_id"'
    raises: str = ""  # the error the call must raise, where it gives none: "ValueError"

    @property
    def call(self) -> str:
        """The call's source: ``camel_to_snake('userId')``."""
        return f"{self.function}({', '.join(repr(a) for a in self.args)})"

    @property
    def test(self) -> str:
        """The example as a test: ``assert camel_to_snake('userId') == 'user_id'``; for a
        raise, the call under ``try:`` failing unless it raises the error."""
        if not self.raises:
            return f"assert {self.call} == {self.value!r}"
        return (
            f"try:\n    {self.call}\nexcept {self.raises}:\n    pass\nelse:\n"
            f"    raise AssertionError({self.not_raised!r})"
        )

    @property
    def not_raised(self) -> str:
        """What the test of a raise says when the call does not raise it."""
        return f"{self.call} did not raise {self.raises}"


class Listed(NamedTuple):
    """An input a request lists as raising an error, for a function of several parameters:
    a call passing ``value`` as the argument at any of ``positions`` must raise ``raises``."""

    function: str
    value: Any
    positions: tuple[int, ...]
    stated: str  # as the request writes it: "ValueError for '1..2'"
    raises: str


# What parsing or evaluating a piece of prose as a Python literal may raise.
_NOT_A_LITERAL = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)
_CONNECTOR = re.compile(  # either side may close or open a `code span`
    r"`?\s*(?:->|\u2192|=>|==|(?:(?:should|must|will|would)\s+)?"
    r"(?:gives?|becomes?|returns?|yields?|maps?\s+to|turns?\s+into|evaluates?\s+to|"
    r"results?\s+in|is\s+converted\s+to)\b)\s*`?",
    re.IGNORECASE,
)
# After a call (not a bare value): "fib(10) = 55", "fib(10) is 55", "should be", "equals".
_AFTER_CALL = re.compile(
    r"`?\s*(?:=(?![=>])|(?:is|equals|(?:should|must|will|would)\s+be)\b)\s*`?",
    re.IGNORECASE,
)
# A doctest: ">>> fib(10)" and, on the next line, what it shows.
_DOCTEST = re.compile(r"^[ \t]*>>>[ \t]*(\S.*?)[ \t]*\n[ \t]*(?!>>>)(\S.*?)[ \t]*$", re.M)
_PAREN = re.compile(r" ?(?=\()")
# After a bare value "is" only where the result ends a clause: '"#fa0" is (255, 170, 0))',
# "row 4 is [1, 4, 6, 4, 1].", not '"abc" is 3 characters long'.
_BARE_IS = re.compile(r"`?\s+is\s+`?")
_CLAUSE_END = re.compile(r"`?(?:[),;:]|\.(?!\w)|\s*$)")
_NAMED = re.compile(r"\b(?:the|an?)\s+empty\s+(string|list|tuple|dict|dictionary|set)\b", re.I)
_NAMED_VALUES: dict[str, Any] = {
    "string": "",
    "list": [],
    "tuple": (),
    "dict": {},
    "dictionary": {},
    "set": set(),
}
# An operator or arrow beside a literal makes it part of an expression or a chain of
# steps, not an input or a result: "38 -> 3 + 8 = 11 -> 2" states no 38 -> 3, 11 -> 1.
_OPERATORS = frozenset("+-*/%=<>&|^@\u2192")
# "raise ValueError for any other text, such as "1,00", ",100" or """: the error, then the
# words that introduce the inputs listed, in the same sentence.
_RAISE_SUCH_AS = re.compile(
    r"\b[Rr]ais(?:e|es|ed)\s+(?:an?\s+)?`?([A-Z]\w*(?:Error|Exception))\b`?[^.;!?\n]*?"
    r"(?:\bsuch\s+as|\blike|\be\.g\.|\bfor\s+(?:example|instance))[,:]?\s+"
)
# "if either string ...": an input listed may be any of the parameters it fits.
_ANY_PARAMETER = re.compile(r"\b(?:either|both|each|neither)\b", re.IGNORECASE)
_LISTED = re.compile(r"\s*(?:,\s*(?:(?:or|and)\s+)?|\s+(?:or|and)\s+)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w)(?!\.\d)")
_WORD = re.compile(r"(?:True|False|None)\b")
_FUNCTION = re.compile(r"\bfunctions?\s+([A-Za-z_]\w*)\s*\(")
_CALL = re.compile(r"[A-Za-z_]\w*(?=\()")


def _evaluated(source: str) -> tuple[bool, Any]:
    """Whether ``source`` is a literal, and its value."""
    node = parsed_expression(source)
    return (False, None) if node is None else _literal_node(node)


def _literal(text: str, i: int) -> tuple[Any, int] | None:
    """The literal starting at ``text[i]`` and the index just past it, or None."""
    c = text[i]
    if c in "\"'":
        end = string_end(text, i, SPAN_CHARS)
    elif (named := _NAMED.match(text, i)) is not None:
        return _NAMED_VALUES[named.group(1).lower()], named.end()
    elif i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_."):
        return None  # part of a word, a number, a call or a subscript
    elif c in "([{":
        close = closing(text, i, SPAN_CHARS)
        end = None if close is None else close + 1
    else:
        match = _NUMBER.match(text, i) or _WORD.match(text, i)
        end = match.end() if match else None
    if end is None:
        return None
    ok, value = _evaluated(text[i:end])
    return (value, end) if ok else None


def _beside_operator(text: str, i: int, step: int) -> bool:
    """Whether the first character other than white space from ``text[i]`` on (``step`` 1)
    or before it (``step`` -1) is an operator or an arrow."""
    j = i if step > 0 else i - 1
    while 0 <= j < len(text) and text[j].isspace():
        j += step
    return 0 <= j < len(text) and text[j] in _OPERATORS


def _call(text: str, i: int, names: set[str]) -> tuple[str, tuple[Any, ...], int] | None:
    """A call of one of ``names`` with literal arguments at ``text[i]``: the name, the
    arguments and the index just past it."""
    if i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_."):
        return None
    match = _CALL.match(text, i)
    if match is None or match.group() not in names:
        return None
    close = closing(text, match.end(), SPAN_CHARS)
    if close is None:
        return None
    node = parsed_expression(text[i : close + 1])
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    given = [_literal_node(arg) for arg in node.args]
    if not all(ok for ok, _ in given):
        return None
    return match.group(), tuple(value for _, value in given), close + 1


def _annotation(source: str) -> ast.expr | None:
    return parsed_expression(source) if source else None


def _fitting(sig: Signature | None, args: tuple[Any, ...], value: Any) -> bool:
    """Whether the arguments fit the declared parameters and the value its return type."""
    if sig is None:
        return True
    if not _arguments_fit(sig, args):
        return False
    returns = _annotation(sig.returns)
    return returns is None or fits(value, returns, strict=True)


def _arguments_fit(sig: Signature, args: tuple[Any, ...]) -> bool:
    """Whether the arguments fit the declared parameters."""
    if len(args) > len(sig.params):
        return False
    for (_, source), arg in zip(sig.params, args, strict=False):
        annotation = _annotation(source)
        if annotation is not None and not fits(arg, annotation, strict=False):
            return False
    return True


def _listed_inputs(text: str) -> Iterator[tuple[re.Match[str], Any, str]]:
    """Each literal ``text`` lists as raising an error (see the module's docstring): the
    sentence's match (the error its first group), the literal's value and the request's
    words for it ("ValueError for '1..2'")."""
    for asked in _RAISE_SUCH_AS.finditer(text):
        i = asked.end()
        while (literal := _literal(text, i)) is not None:
            value, end = literal
            yield asked, value, f"{asked.group(1)} for {text[i:end]}"
            listed = _LISTED.match(text, end)
            if listed is None:
                break
            i = listed.end()


def _raising(text: str, alone: Signature | None) -> Iterable[Example]:
    """The inputs ``text`` lists as raising an error (see the module's docstring), for
    ``alone``, the one function of one annotated parameter the request declares."""
    if alone is None or not alone.params[0][1]:
        return
    for asked, value, stated in _listed_inputs(text):
        if _arguments_fit(alone, (value,)):
            yield Example(alone.name, (value,), None, stated, asked.group(1))


def listed_raising(text: str, declared: Sequence[Signature] = ()) -> tuple[Listed, ...]:
    """The inputs ``text`` lists as raising an error for the one function it declares,
    where that function takes several annotated parameters (see the module's docstring),
    at most ``LIMIT``, read from its first ``READ_CHARS`` characters."""
    if len(declared) != 1 or len(declared[0].params) < 2:
        return ()
    sig = declared[0]
    kinds = [_annotation(source) for _, source in sig.params]
    if any(kind is None for kind in kinds):
        return ()
    found: dict[str, Listed] = {}
    for asked, value, stated in _listed_inputs(plain_quotes(text[:READ_CHARS])):
        if len(found) >= LIMIT:
            break
        at = tuple(
            p
            for p, kind in enumerate(kinds)
            if kind is not None and fits(value, kind, strict=False)
        )
        anywhere = _ANY_PARAMETER.search(asked.group()) is not None
        if value is not None and (len(at) == 1 or (at and anywhere)):
            found.setdefault(repr(value), Listed(sig.name, value, at, stated, asked.group(1)))
    return tuple(found.values())


def stated_examples(text: str, declared: Sequence[Signature] = ()) -> tuple[Example, ...]:
    """The examples ``text`` states (see the module's docstring), the first of each call,
    at most ``LIMIT``, read from its first ``READ_CHARS`` characters; ``declared`` are
    the signatures the request declares."""
    text = plain_quotes(text[:READ_CHARS])
    by_name = {s.name: s for s in declared}
    names = set(by_name) | set(_FUNCTION.findall(text))
    alone = declared[0] if len(declared) == 1 and len(declared[0].params) == 1 else None
    found: dict[tuple[str, str], Example] = {}
    i = 0
    while i < len(text) and len(found) < LIMIT:
        start = i
        call = _call(text, i, names)
        if call is not None:
            function, args, end = call
            bare = False
        elif (
            alone is not None
            and (literal := _literal(text, i)) is not None
            and not _beside_operator(text, i, -1)
        ):
            function, args, end = alone.name, (literal[0],), literal[1]
            bare = True
        else:
            i += 1
            continue
        connector = _CONNECTOR.match(text, end) or (None if bare else _AFTER_CALL.match(text, end))
        bare_is = None if connector or not bare else _BARE_IS.match(text, end)
        paren = None if connector or bare_is or not bare else _PAREN.match(text, end)
        result = None
        if connector is not None:
            result = _literal(text, connector.end())
        elif bare_is is not None and _annotated(alone):
            result = _literal(text, bare_is.end())
            if result is not None and not _CLAUSE_END.match(text, result[1]):
                result = None
        elif paren is not None and _annotated(alone):
            result = _literal(text, paren.end())
            if result is not None and text[paren.end()] != "(":
                result = None
        if result is not None and _beside_operator(text, result[1], 1):
            result = None  # a term of a sum or a step of a chain, not what the call gives
        if result is not None and _fitting(by_name.get(function), args, result[0]):
            stated = text[start : result[1]].replace("`", "")
            example = Example(function, args, result[0], stated)
            found.setdefault((function, repr(args)), example)
            i = result[1]
        else:
            i = end if end > i else i + 1
    for shown in _DOCTEST.finditer(text):
        call = _call(shown.group(1), 0, names)
        ok, value = _evaluated(shown.group(2))
        if len(found) >= LIMIT or call is None or call[2] != len(shown.group(1)) or not ok:
            continue
        function, args, _ = call
        if _fitting(by_name.get(function), args, value):
            example = Example(function, args, value, f">>> {shown.group(1)} shows {shown.group(2)}")
            found.setdefault((function, repr(args)), example)
    for example in _raising(text, alone):
        if len(found) >= LIMIT:
            break
        found.setdefault((example.function, repr(example.args)), example)
    return tuple(found.values())


def _annotated(sig: Signature | None) -> bool:
    return sig is not None and bool(sig.returns) and all(source for _, source in sig.params)


def _same(a: Any, b: Any) -> bool:
    """Equal as literals are: numbers by value, containers of the same kind item by item."""
    numbers = (int, float, complex)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _literal_node(node: ast.expr) -> tuple[bool, Any]:
    """Whether ``node`` is a literal, and its value."""
    try:
        return True, ast.literal_eval(node)
    except _NOT_A_LITERAL:
        return False, None


def _compared(tree: ast.Module) -> Iterable[tuple[ast.expr, ast.expr]]:
    """Every pair a test asserts equal (``a == b``, ``assertEqual(a, b)``), both ways."""
    for node in ast.walk(tree):
        pair = None
        if isinstance(node, ast.Compare) and [type(op) for op in node.ops] == [ast.Eq]:
            pair = (node.left, node.comparators[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("assertEqual", "assertEquals")
            and len(node.args) >= 2
        ):
            pair = (node.args[0], node.args[1])
        if pair is not None:
            yield pair
            yield pair[1], pair[0]


def contradicted(
    unit: str, examples: Sequence[Example], listed: Sequence[Listed] = ()
) -> Example | Listed | None:
    """The example the test ``unit`` contradicts, or None: it expects a call the request
    shows (the same function, arguments equal to the example's) to equal a literal other
    than the example's result, or a call passing an input the request lists as raising
    (``listed``) where it is listed to equal a literal."""
    return _against(unit, examples, agreeing=False) or _against_listed(unit, listed)


def _against_listed(unit: str, listed: Sequence[Listed]) -> Listed | None:
    if not listed:
        return None
    for call, function, other in _compared_calls(unit):
        if not _literal_node(other)[0]:
            continue
        for raising in listed:
            if raising.function != function:
                continue
            for p in raising.positions:
                if p >= len(call.args):
                    continue
                ok, value = _literal_node(call.args[p])
                if ok and _same(value, raising.value):
                    return raising
    return None


def _compared_calls(unit: str) -> Iterator[tuple[ast.Call, str, ast.expr]]:
    """The calls of a named function, with positional arguments only, that the test
    ``unit`` compares with something: the call, the function's name, the other side."""
    tree = parsed(unit)
    if tree is None:
        return
    for call, other in _compared(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            continue
        yield call, call.func.id, other


def restated(unit: str, examples: Sequence[Example]) -> Example | None:
    """The example the test ``unit`` restates (the same call, the same result), or None."""
    return _against(unit, examples, agreeing=True)


def _against(unit: str, examples: Sequence[Example], *, agreeing: bool) -> Example | None:
    if not examples:
        return None
    for call, function, other in _compared_calls(unit):
        given = [_literal_node(a) for a in call.args]
        if not all(ok for ok, _ in given):
            continue
        args = tuple(value for _, value in given)
        ok, expected = _literal_node(other)
        if not ok:
            continue
        for example in examples:
            if example.function != function or not _same(args, example.args):
                continue
            if example.raises:  # any value expected of a call that must raise is wrong
                if not agreeing:
                    return example
            elif _same(expected, example.value) == agreeing:
                return example
    return None
