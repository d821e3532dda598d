"""Where code changes an argument it was given: the statements to point a fix at.

Running a call shows that it changed the caller's list (``sandbox.run_calls`` marks it
``[argument 1 changed]``); it does not show which line did. A finding that names the
line (``values.sort()`` at line 5) is one a small model acts on, where "work on a copy"
alone is often repeated back with the same ``values.sort()`` in place. This reads the
code for the statements that change a parameter's value in place:

- a call of a changing method on it: ``values.sort()``, ``.append``, ``.extend``,
  ``.insert``, ``.pop``, ``.remove``, ``.reverse``, ``.clear``, ``.update``,
  ``.setdefault``, ``.popitem``, ``.add``, ``.discard``;
- ``heapq.heapify(values)`` (and ``heappush``, ``heappop``, ``heapreplace``,
  ``heappushpop``), ``random.shuffle(values)``, called by module or by bare name;
- an assignment, augmented assignment or ``del`` of an item or slice of it, however
  deep, also among several targets (``values[0] = x``, ``grid[i][j] = "0"``,
  ``m[i][j], m[j][i] = m[j][i], m[i][j]``, ``del values[-1]``);
- ``values += [...]`` (a list's ``+=`` extends it in place; the reading cannot tell a
  list from a number, but it is asked only about arguments a call was seen to change).

Only statements before the parameter is first bound again (``values = sorted(values)``)
count: after that the name holds the code's own value. The reading is static and
conservative: a change made through another name (``v = values; v.sort()``) or in a
helper is not found, and then the finding says only that the call changed it.
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from .pyast import parsed

__all__ = ["Change", "in_place_changes"]

_METHODS = frozenset(
    {
        "sort",
        "append",
        "extend",
        "insert",
        "pop",
        "remove",
        "reverse",
        "clear",
        "update",
        "setdefault",
        "popitem",
        "add",
        "discard",
    }
)
_FUNCTIONS = frozenset({"heapify", "heappush", "heappop", "heapreplace", "heappushpop", "shuffle"})


class Change(NamedTuple):
    """A statement that changes a parameter in place."""

    parameter: str  # the parameter's name
    line: int  # the statement's line in the code
    source: str  # the changing expression or statement as written, on one line
    sorts: bool  # ``.sort()``: ``sorted(...)`` gives a sorted copy instead


def in_place_changes(code: str, function: str, positions: list[int]) -> list[Change]:
    """The statements in ``function`` (a top-level ``def`` of ``code``) that change the
    positional parameters at ``positions`` (1-based, as ``sandbox.run_calls`` counts them)
    in place, in line order, each once; [] when the code does not parse, the function is
    not found or nothing is (see the module's notes)."""
    tree = parsed(code)
    if tree is None:
        return []
    node = next(
        (
            n
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function
        ),
        None,
    )
    if node is None:
        return []
    params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    names = {params[p - 1] for p in positions if 0 < p <= len(params)}
    found: dict[tuple[int, str], Change] = {}
    for name in names:
        rebound = _first_binding(node, name)
        for stmt in ast.walk(node):
            change = _change(stmt, name, code)
            if change is not None and (rebound is None or change.line < rebound):
                found.setdefault((change.line, change.source), change)
    return sorted(found.values(), key=lambda c: (c.line, c.source))


def _first_binding(function: ast.AST, name: str) -> int | None:
    """The first line where ``name`` is bound again (``name = ...``, ``for name in``,
    ``with ... as name``; not ``name += ...``, which changes a list in place), or None."""
    extended = {id(n.target) for n in ast.walk(function) if isinstance(n, ast.AugAssign)}
    lines = [
        n.lineno
        for n in ast.walk(function)
        if isinstance(n, ast.Name)
        and n.id == name
        and isinstance(n.ctx, ast.Store)
        and id(n) not in extended
    ]
    return min(lines, default=None)


def _root(node: ast.expr) -> str | None:
    """The name an item chain starts from: ``grid`` for ``grid[i][j]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _change(node: ast.AST, name: str, code: str) -> Change | None:
    """The change ``node`` makes to ``name`` in place, if it is one (module notes), with
    its source as written in ``code``."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _METHODS and _root(func.value) == name:
            return Change(name, node.lineno, _source(code, node), func.attr == "sort")
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called in _FUNCTIONS and node.args and _root(node.args[0]) == name:
            return Change(name, node.lineno, _source(code, node), False)
        return None
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        extends = node.target.id == name
        return Change(name, node.lineno, _source(code, node), False) if extends else None
    if isinstance(node, ast.Assign | ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.AugAssign):
        targets = [node.target]
    else:
        return None
    if any(isinstance(t, ast.Subscript) and _root(t) == name for t in _flat(targets)):
        return Change(name, node.lineno, _source(code, node), False)
    return None


def _flat(targets: list[ast.expr]) -> list[ast.expr]:
    """Assignment targets with tuples and lists of them unpacked (``m[i], m[j] = ...``)."""
    flat: list[ast.expr] = []
    for target in targets:
        if isinstance(target, ast.Starred):
            target = target.value
        if isinstance(target, ast.Tuple | ast.List):
            flat.extend(_flat(target.elts))
        else:
            flat.append(target)
    return flat


def _source(code: str, node: ast.AST) -> str:
    """``node``'s text in ``code``, its lines joined (``ast.unparse``'s when not found)."""
    text = ast.get_source_segment(code, node)
    return " ".join((text if text is not None else ast.unparse(node)).split())
