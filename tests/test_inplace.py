"""Statements that change a function's parameter in place, read from its code."""

from __future__ import annotations

import pytest

from pipeline.inplace import Change, in_place_changes

CODE = """\
import heapq


def median(values, k=1):
    if not values:
        raise ValueError
    values.sort()
    heapq.heapify(values)
    values += [1]
    values[0] = 2
    del values[-1]
    k += 1
    values = sorted(values)
    values.append(3)
    return values[0]


def rotate(m, out):
    m[0][1] = 5
    m[1].reverse()
    out.append(m)
    return m
"""


def test_every_kind_of_change_before_the_parameter_is_bound_again() -> None:
    """A changing method, a heapq function, `+=`, an item assigned or deleted count, in
    line order; after `values = sorted(values)` the name is the code's own list."""
    assert in_place_changes(CODE, "median", [1]) == [
        Change("values", 7, "values.sort()", True),
        Change("values", 8, "heapq.heapify(values)", False),
        Change("values", 9, "values += [1]", False),
        Change("values", 10, "values[0] = 2", False),
        Change("values", 11, "del values[-1]", False),
    ]


@pytest.mark.parametrize(
    ("function", "positions", "lines"),
    [
        ("rotate", [1], [19, 20]),  # an item of an item; a method on an item
        ("rotate", [2], [21]),
        ("rotate", [1, 2], [19, 20, 21]),
        ("median", [2], [12]),  # `+=` (asked only about an argument a call changed: a list)
        ("median", [3], []),  # no such parameter
        ("missing", [1], []),
    ],
)
def test_changes_of_the_parameters_at_the_positions_asked(
    function: str, positions: list[int], lines: list[int]
) -> None:
    assert [c.line for c in in_place_changes(CODE, function, positions)] == lines


def test_code_that_does_not_parse_has_none() -> None:
    assert in_place_changes("def median(values:\n    values.sort()", "median", [1]) == []
    deep = "def median(values):\n    return " + "a." * 200_000 + "b"  # RecursionError
    assert in_place_changes(deep, "median", [1]) == []
