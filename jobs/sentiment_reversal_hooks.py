"""Hooks for the sentiment-reversal job: the answer is the review, without notes about it.

Whether a sentiment changed is the critic's call; what a program can see is an empty
answer, or a note about the edit left in it ("I changed the negative phrases ...").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core.extraction import meta_commentary


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """An action when the answer is empty or carries a note about the edit."""
    if not output.strip():
        return ["Write the rewritten review."]
    return meta_commentary(output, "review")
