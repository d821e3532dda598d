"""The function signatures a coding request spells out, and tests that contradict them.

A request often declares what it asks for: "Write a Python function
count_islands(grid: list[list[str]]) -> int that ...". A test that calls the function
with a value of another kind (rows as strings, ``count_islands(["110"])``), or expects a
result of another kind (``[["a", 3]]`` where the request returns
``list[tuple[str, int]]``), asks for something the request does not: code that does
what the request says fails it, and a refinement bent to pass it is wrong.

Only literal values are judged, and only on what they plainly are. Numbers are one kind
(``3 == 3.0``); ``None``, and annotations this module does not know (``Any``, a class of
the request's own), fit anything. A list given for a declared tuple, or the reverse,
fits an argument (code that unpacks one unpacks the other) but not an expected result
(``[1, 2] != (1, 2)``). Pure functions only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from .brackets import closing
from .pyast import parsed, parsed_expression

__all__ = ["Signature", "contradiction", "fits", "signatures"]


class Signature(NamedTuple):
    """A function a request declares: its name, its parameters with their annotations'
    source ("" where none is given) and its return annotation's source ("" if none)."""

    name: str
    params: tuple[tuple[str, str], ...]
    returns: str


_CALL_START = re.compile(r"\b([A-Za-z_]\w*)\(")
_ARROW = re.compile(r"\s*->\s*")
_NUMBER = (int, float, complex)  # bool is an int
_SEQUENCES = (list, tuple)
_KINDS: dict[str, tuple[type, ...]] = {
    "int": _NUMBER,
    "float": _NUMBER,
    "complex": _NUMBER,
    "bool": _NUMBER,
    "str": (str,),
    "bytes": (bytes,),
    "list": (list,),
    "List": (list,),
    "MutableSequence": (list,),
    "tuple": (tuple,),
    "Tuple": (tuple,),
    "dict": (dict,),
    "Dict": (dict,),
    "Mapping": (dict,),
    "MutableMapping": (dict,),
    "set": (set, frozenset),
    "Set": (set, frozenset),
    "frozenset": (set, frozenset),
    "FrozenSet": (set, frozenset),
    "Sequence": (list, tuple, str),
    "Iterable": (list, tuple, str, bytes, dict, set, frozenset),
    "Collection": (list, tuple, str, bytes, dict, set, frozenset),
}
_MAPPINGS = frozenset({"dict", "Dict", "Mapping", "MutableMapping"})
_TUPLES = frozenset({"tuple", "Tuple"})


def _return_annotation(rest: str) -> str:
    """The annotation after ``->`` at the start of ``rest`` (up to the first space outside
    brackets that does not join a union), or ""."""
    arrow = _ARROW.match(rest)
    if arrow is None:
        return ""
    depth, i = 0, arrow.end()
    while i < len(rest):
        c = rest[i]
        if c in "[(":
            depth += 1
        elif c in "])":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and not (c.isalnum() or c in "_."):
            union = re.match(r"\s*\|\s*", rest[i:])
            if union is None:
                break
            i += union.end()
            continue
        i += 1
    return rest[arrow.end() : i].rstrip(".,;:")


def signatures(text: str) -> tuple[Signature, ...]:
    """Every function ``text`` declares with at least one annotation
    (``name(a: T, b) -> R``), the first of each name; calls in prose (``fib(0) == 0``)
    and signatures without annotations declare nothing."""
    found: dict[str, Signature] = {}
    for match in _CALL_START.finditer(text):
        name = match.group(1)
        end = closing(text, match.end() - 1)
        if end is None or name in found:
            continue
        params, returns = text[match.end() : end], _return_annotation(text[end + 1 :])
        node = _definition(name, params, returns) or _definition(name, params, "")
        if node is None:
            continue
        args = [*node.args.posonlyargs, *node.args.args]
        if node.returns is None and not any(a.annotation is not None for a in args):
            continue
        found[name] = Signature(
            name,
            tuple((a.arg, ast.unparse(a.annotation) if a.annotation else "") for a in args),
            ast.unparse(node.returns) if node.returns is not None else "",
        )
    return tuple(found.values())


def _definition(name: str, params: str, returns: str) -> ast.FunctionDef | None:
    arrow = f" -> {returns}" if returns else ""
    tree = parsed(f"def {name}({params}){arrow}: pass")
    if tree is None or not tree.body:
        return None
    node = tree.body[0]
    return node if isinstance(node, ast.FunctionDef) else None


def contradiction(unit: str, declared: Sequence[Signature]) -> str | None:
    """How the test ``unit`` contradicts a signature the request declares, or None: a
    literal argument of another kind than its parameter's annotation (``passes `['110']`
    as `grid: list[list[str]]```), or a literal it expects a call to equal (``==``,
    ``assertEqual``) of another kind than the return annotation. A test of a raise is
    never judged."""
    by_name = {s.name: s for s in declared}
    if not by_name:
        return None
    tree = parsed(unit)
    if tree is None:
        return None
    if any(_tests_a_raise(node) for node in ast.walk(tree)):
        return None  # a value of another kind may be the bad input whose error is asked for
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found = _arguments(node, by_name) or _expected(node, _asserted_equal(node), by_name)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            equal = isinstance(node.ops[0], ast.Eq)
            pair = (node.left, node.comparators[0]) if equal else None
            found = _expected(node, pair, by_name)
        else:
            found = None
        if found is not None:
            return found
    return None


def _tests_a_raise(node: ast.AST) -> bool:
    """A ``try``, a ``with`` (``pytest.raises``) or an ``assertRaises`` call."""
    if isinstance(node, ast.Try | ast.With):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("assertRaises", "assertRaisesRegex", "raises")
    )


def _declared_call(node: ast.expr, by_name: dict[str, Signature]) -> Signature | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return by_name.get(node.func.id)
    return None


def _arguments(call: ast.Call, by_name: dict[str, Signature]) -> str | None:
    sig = _declared_call(call, by_name)
    if sig is None:
        return None
    given: list[tuple[str, ast.expr]] = []
    for (param, _), arg in zip(sig.params, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            break
        given.append((param, arg))
    given += [(k.arg, k.value) for k in call.keywords if k.arg is not None]
    annotations = dict(sig.params)
    for param, arg in given:
        shown = _misfit(arg, annotations.get(param, ""), strict=False)
        if shown is not None:
            return (
                f"`{_clip(ast.unparse(call))}` passes `{shown}` as `{param}: {annotations[param]}`"
            )
    return None


def _asserted_equal(call: ast.Call) -> tuple[ast.expr, ast.expr] | None:
    func = call.func
    equal = isinstance(func, ast.Attribute) and func.attr in ("assertEqual", "assertEquals")
    return (call.args[0], call.args[1]) if equal and len(call.args) >= 2 else None


def _expected(
    node: ast.AST, pair: tuple[ast.expr, ast.expr] | None, by_name: dict[str, Signature]
) -> str | None:
    if pair is None:
        return None
    for call, other in (pair, pair[::-1]):
        sig = _declared_call(call, by_name)
        if sig is None or not sig.returns:
            continue
        shown = _misfit(other, sig.returns, strict=True)
        if shown is not None:
            return (
                f"`{_clip(ast.unparse(node))}` expects `{shown}` where `{sig.name}` "
                f"returns `{sig.returns}`"
            )
    return None


def _clip(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _misfit(node: ast.expr, annotation: str, *, strict: bool) -> str | None:
    """The literal ``node`` as shown, when it is of another kind than ``annotation``."""
    if not annotation:
        return None
    expected = parsed_expression(annotation)
    if expected is None:
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return None if fits(value, expected, strict) else _clip(repr(value), 60)


def _generic(annotation: ast.expr) -> tuple[str | None, list[ast.expr]]:
    """The annotation's base name (``typing.List`` -> ``List``) and its arguments."""
    base, args = annotation, []
    if isinstance(annotation, ast.Subscript):
        base = annotation.value
        inner = annotation.slice
        args = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
    if isinstance(base, ast.Name):
        return base.id, args
    if isinstance(base, ast.Attribute):
        return base.attr, args
    return None, args


def fits(value: Any, annotation: ast.expr, strict: bool) -> bool:
    """Whether the literal ``value`` is of the kind ``annotation`` (parsed) says; ``strict``:
    a list does not pass for a tuple nor the reverse (an expected result, not an argument)."""
    if value is None:
        return True
    if isinstance(annotation, ast.Constant):
        if annotation.value is None:
            return False
        if isinstance(annotation.value, str):  # a forward reference: "list[int]"
            inner = parsed_expression(annotation.value)
            return True if inner is None else fits(value, inner, strict)
        return True
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return fits(value, annotation.left, strict) or fits(value, annotation.right, strict)
    name, args = _generic(annotation)
    if name in ("Optional", "Union"):
        return any(fits(value, a, strict) for a in args) if args else True
    kinds = _KINDS.get(name or "")
    if kinds is None:
        return True  # Any, object, Callable, a class of the request's own...
    if not strict and set(kinds) & set(_SEQUENCES):
        kinds = (*kinds, *_SEQUENCES)
    if not isinstance(value, kinds):
        return False
    if not args or isinstance(value, str | bytes):
        return True
    if isinstance(value, dict):
        if name in _MAPPINGS and len(args) == 2:
            return all(
                fits(k, args[0], strict) and fits(v, args[1], strict) for k, v in value.items()
            )
        return True
    items = list(value) if isinstance(value, list | tuple | set | frozenset) else []
    if name in _TUPLES:
        if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
            return all(fits(x, args[0], strict) for x in items)
        return len(items) == len(args) and all(
            fits(x, a, strict) for x, a in zip(items, args, strict=True)
        )
    return all(fits(x, args[0], strict) for x in items)
