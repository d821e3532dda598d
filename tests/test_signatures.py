"""Signatures a request declares, and tests whose literal values contradict them."""

from __future__ import annotations

import ast

import pytest

from pipeline.signatures import Signature, contradiction, fits, signatures

ISLANDS = "Write a Python function count_islands(grid: list[list[str]]) -> int that counts."
RLE = "Write run_length_encode(s: str) -> list[tuple[str, int]] that compresses a string."
MERGE = "merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]] merges."


def test_signatures_are_the_annotated_functions_a_request_declares() -> None:
    """Parameters with their annotations and the return annotation, up to the prose after
    it; unions joined; calls in prose and unannotated signatures declare nothing."""
    assert signatures(RLE) == (
        Signature("run_length_encode", (("s", "str"),), "list[tuple[str, int]]"),
    )
    assert signatures("Write f(x: int | None, y) -> str | None. It must...") == (
        Signature("f", (("x", "int | None"), ("y", "")), "str | None"),
    )
    assert signatures("fib(n) returns the n-th number (fib(0) == 0, fib(1) == 1).") == ()
    assert signatures("retry(times=3, delay=0.5) retries; g(a: int) -> dict[str, int].") == (
        Signature("g", (("a", "int"),), "dict[str, int]"),
    )


@pytest.mark.parametrize(
    ("request_text", "unit", "expected"),
    [
        # an argument of another kind: rows as strings where the grid is lists of str
        (
            ISLANDS,
            'assert count_islands(["110", "011"]) == 1',
            "`count_islands(['110', '011'])` passes `['110', '011']` as `grid: list[list[str]]`",
        ),
        (ISLANDS, 'assert count_islands([["1", "1"], ["0", "1"]]) == 1', None),
        (ISLANDS, "assert count_islands(grid=['10']) == 1", "as `grid: list[list[str]]`"),
        # a result of another kind: lists where the request returns tuples
        (
            RLE,
            'assert run_length_encode("aab") == [["a", 2], ["b", 1]]',
            "`run_length_encode('aab') == [['a', 2], ['b', 1]]` expects "
            "`[['a', 2], ['b', 1]]` where `run_length_encode` returns `list[tuple[str, int]]`",
        ),
        (RLE, 'assert [("a", 2)] == run_length_encode("aa")', None),
        (RLE, 'self.assertEqual(run_length_encode("aa"), [["a", 2]])', "expects `[['a', 2]]`"),
        (RLE, 'assert run_length_encode("") == []', None),
        # lists for tuples are fine as arguments (unpacked alike), not as results
        (MERGE, "assert merge_intervals([[1, 3], [2, 4]]) == [(1, 4)]", None),
        (MERGE, "assert merge_intervals([(1, 3), (2, 4)]) == [[1, 4]]", "expects `[[1, 4]]`"),
        # numbers are one kind; None and unknown annotations fit anything
        ("median(values: list[float]) -> float", "assert median([1, 2]) == 1", None),
        ("second(nums: list[int]) -> int | None", "assert second([4]) is None", None),
        ("pick(x: Any) -> Thing", "assert pick('a') == [1]", None),
        ("second(nums: list[int]) -> int", "assert second([1, 'a']) == 1", "passes `[1, 'a']`"),
        # a test of a raise may pass the bad input whose error the request asks for
        (ISLANDS, 'try:\n    count_islands("1")\nexcept TypeError:\n    pass', None),
        # values that are not literals are not judged, nor a test too deep to parse
        (ISLANDS, "assert count_islands(make_grid()) == 1", None),
        (ISLANDS, "assert count_islands(" + "a." * 200_000 + "b) == 1", None),
    ],
)
def test_contradiction(request_text: str, unit: str, expected: str | None) -> None:
    found = contradiction(unit, signatures(request_text))
    if expected is None:
        assert found is None
    else:
        assert found is not None and expected in found


def test_a_forward_reference_that_does_not_parse_fits_anything() -> None:
    assert fits([1], ast.Constant("list[int]"), strict=False)
    assert not fits(["a"], ast.Constant("list[int]"), strict=False)
    for broken in ("list[int", "list[\x00]", "a." * 200_000 + "b"):
        assert fits(["a"], ast.Constant(broken), strict=False)
