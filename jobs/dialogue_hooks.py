"""Hooks for the dialogue job: the answer must be one system turn, not a whole conversation.

Small models often reply with the conversation rewritten, turn prefixes included, or
add a note about what they changed; a program can see both, so ``check`` reports them.
There is no automatic metric here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipeline.core.extraction import meta_commentary

_TURN = re.compile(r"^\s*(user|system)\s*:", re.I | re.M)


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """An action when the answer is empty or holds more than the system's next turn."""
    if not output.strip():
        return ["Write the system's next turn."]
    turns = _TURN.findall(output)
    if len(turns) > 1 or any(t.lower() == "user" for t in turns):
        return [
            "Reply with only the system's next turn: drop the repeated conversation and the "
            "'User:'/'System:' labels."
        ]
    return meta_commentary(output, "reply")
