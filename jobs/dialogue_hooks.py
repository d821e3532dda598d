"""Hooks for the dialogue job: the answer must be one system turn, not a whole conversation.

Small models often reply with the conversation rewritten, turn prefixes included; a
program can see that, so ``check`` reports it. There is no automatic metric here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

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
    return []
