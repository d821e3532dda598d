"""The artifact in a reply: code apart from prose, text without preamble, notes left in it."""

from __future__ import annotations

import pytest

from pipeline.core.extraction import comment_commentary, extract_code, extract_text, meta_commentary


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("Here:\n```python\nprint(1)\n```\nDone.", "print(1)", id="python-fence"),
        pytest.param("```\nx = 1\n```", "x = 1", id="bare-fence"),
        pytest.param("```py title\nx = 1\n```", "x = 1", id="fence-with-info"),
        pytest.param("```python\na = 1\n```\nthen\n```python\nb = 2\n```", "a = 1", id="first"),
        pytest.param(
            "Output:\n```\n[1, 2]\n```\n```python\nx = 1\n```", "x = 1", id="tagged-beats-bare"
        ),
        pytest.param("```python\nx = 1\ny = 2", "x = 1\ny = 2", id="unclosed-fence-cut-off"),
        pytest.param("```python\n\n    x = 1\n\n```", "    x = 1", id="keeps-indentation"),
        pytest.param("  just code, no fence  \n", "just code, no fence", id="no-fence"),
    ],
)
def test_extract_code(text: str, expected: str) -> None:
    """The first Python block is the code, also when the answer was cut off inside it."""
    assert extract_code(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("A dog runs.", "A dog runs.", id="plain"),
        pytest.param(
            "Here is the improved sentence:\nA dog runs.", "A dog runs.", id="announcement"
        ),
        pytest.param("Sure!\nHere's the rewritten review:\nGreat food.", "Great food.", id="two"),
        pytest.param("Improved sentence: A dog runs.", "A dog runs.", id="label"),
        pytest.param("**Revised review:** Great food.", "Great food.", id="bold-label"),
        pytest.param('"A dog runs."', "A dog runs.", id="quotes"),
        pytest.param("```\nA dog runs.\n```", "A dog runs.", id="fenced"),
        pytest.param('He said "hi" and "bye"', 'He said "hi" and "bye"', id="inner-quotes-kept"),
        pytest.param(
            "Here's what happened: the soup was cold.",
            "Here's what happened: the soup was cold.",
            id="prose-kept",
        ),
        pytest.param(
            "Certainly the best pizza.\nGo.", "Certainly the best pizza.\nGo.", id="not-sure"
        ),
        pytest.param("NASA\nN-ational A-eronautics", "NASA\nN-ational A-eronautics", id="acronym"),
    ],
)
def test_extract_text(text: str, expected: str) -> None:
    """Prose loses its preamble, label, fence and wrapping quotes, and nothing else."""
    assert extract_text(text) == expected


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("To address the add… I put in the words.", "To address the add… I put in the words."),
        ("A dog runs. To address the feedback, I added a cat.", "To address the feedback"),
        ("A dog and a cat play. I added the missing words dog and cat.", "I added the missing"),
        ("A dog runs in the park.\nNote: the sentence now uses every concept.", "Note:"),
        ("This revised sentence includes all the words.", "This revised sentence"),
        ("The food was great, as suggested by the feedback.", "as suggested"),
        ("All the missing words are now used.", "missing words"),
        ("The previous version lacked a verb.", "The previous version"),
        ("A dog runs in the park.", None),
        ("I added extra salt to my fries and they were perfect.", None),
        ("The staff took our feedback cards with a smile.", None),
        ("The new version of the menu is great.", None),
        ("We were told to address the manager directly.", None),
    ],
)
def test_meta_commentary(text: str, flagged: str | None) -> None:
    """Notes about the feedback or the edit are one finding quoting them; plain prose is not."""
    found = meta_commentary(text, "sentence")
    if flagged is None:
        assert found == []
    else:
        assert len(found) == 1 and flagged in found[0]
        assert found[0].endswith("Reply with the sentence only.")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("x = sum(v)  # as suggested by the feedback, use sum\n", ["line 1 about the changes"]),
        ("# Improved: iterative instead of recursive\ndef f(): pass\n", ["line 1 about the"]),
        ("# the original code was slow\nx = 1\n", ["line 1 about the"]),
        ("print(dedupe([1, 1]))  # [1]\n", ["line 1 claims an output"]),
        ("x = f()\n# Output: [1, 2, 3]\n", ["line 2 claims an output"]),
        ("# -> 55\n", ["line 1 claims an output"]),
        ("# use a dict instead of a list: O(1) lookups\nx = {}\n", []),
        ("x = 1  # the count of items\nprint(x)  # show it\n", []),
        ("s = '# feedback in a string'\n", []),
        ("def f(:\n  # feedback\n", []),
    ],
)
def test_comment_commentary(code: str, expected: list[str]) -> None:
    """Comments about the review, and comments claiming an output, are findings."""
    found = comment_commentary(code, tests=True)
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        assert want in got
    if any("claims" in f for f in found):
        assert "assert in the tests" in found[0]
        assert "remove it" in comment_commentary(code)[0]
