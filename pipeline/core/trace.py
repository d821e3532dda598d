"""A record's steps as stored: each call's messages as the turns it added to the conversation.

A record's calls are one conversation (``core.prompts``): each call sends the messages of an
earlier call, or their first part, and adds its own turns. Stored whole, call k would repeat
the k-1 calls before it, and a record's bytes would grow with the square of its rounds. So
the journal, traces.jsonl and the Ray driver's messages hold each step as::

    {"role": ..., "kind": ..., "model": ..., "iteration": ...,
     "extends": [j, n],   # the first n messages of step j's request (absent: none)
     "added": [...],      # then these messages, as sent
     "response": ..., ...}

``j`` is an earlier step of the same record. Usually it is the call before; a repair, a
sample or a copy retry extends the call it asks again whole and adds nothing; a restart
extends the first call's system message. ``steps_of`` rebuilds every request exactly as it
was sent. A step stored with ``messages`` (its whole request) is the form written before
this one; both are read, and one record may mix them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .steps import Outcome, Step

__all__ = ["extends", "step_of", "steps_of", "stored_step", "stored_steps", "trace_line"]

Messages = Sequence[Mapping[str, str]]


def _shared(a: Messages, b: Messages) -> int:
    """How many leading messages ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x is not y and x != y:
            break
        n += 1
    return n


def extends(messages: Messages, earlier: Sequence[Step]) -> tuple[int, int] | None:
    """The earlier step whose request starts ``messages`` longest, and for how many messages
    (the latest such step on a tie); None when none shares the first message."""
    best: tuple[int, int] | None = None
    for j in range(len(earlier) - 1, -1, -1):
        n = _shared(messages, earlier[j].messages)
        if n and (best is None or n > best[1]):
            best = (j, n)
            if n == len(messages):
                break  # nothing can extend it further
    return best


def stored_step(step: Step, earlier: Sequence[Step]) -> dict[str, Any]:
    """The stored form of ``step``, which follows ``earlier`` (its record's steps before it)."""
    base = extends(step.messages, earlier)
    if base is None:
        return step.to_dict({"added": step.messages})
    j, n = base
    return step.to_dict({"extends": [j, n], "added": step.messages[n:]})


def stored_steps(steps: Sequence[Step]) -> list[dict[str, Any]]:
    """The stored form of a record's steps, in order."""
    return [stored_step(s, steps[:i]) for i, s in enumerate(steps)]


def _messages(d: Mapping[str, Any], earlier: Sequence[Step]) -> list[dict[str, str]]:
    """The request of a stored step: whole (the older form), or rebuilt from what it extends."""
    if "messages" in d:
        return list(d["messages"])
    added = d["added"]
    if not isinstance(added, list):
        raise ValueError(f"added: a list of messages expected, not {type(added).__name__}")
    base = d.get("extends")
    if base is None:
        return list(added)
    ok = isinstance(base, list) and len(base) == 2 and all(type(x) is int for x in base)
    if not ok or not (0 <= base[0] < len(earlier)):
        raise ValueError(f"extends: {base!r} names no earlier step of the record")
    before = earlier[base[0]].messages
    if not 0 < base[1] <= len(before):
        raise ValueError(f"extends: step {base[0]} has {len(before)} messages, not {base[1]}")
    return [*before[: base[1]], *added]


def step_of(d: Mapping[str, Any], earlier: Sequence[Step]) -> Step:
    """Rebuild a stored step that follows ``earlier`` (already rebuilt).

    Raises ValueError (or KeyError, TypeError) for a stored form it cannot read.
    """
    return Step.from_dict(d, _messages(d, earlier))


def steps_of(stored: Sequence[Mapping[str, Any]]) -> list[Step]:
    """Rebuild a record's stored steps, each with its request exactly as it was sent."""
    steps: list[Step] = []
    for i, d in enumerate(stored):
        try:
            steps.append(step_of(d, steps))
        except KeyError as err:
            raise ValueError(f"step {i}: no {err.args[0]!r} field") from err
        except (TypeError, ValueError) as err:
            raise ValueError(f"step {i}: {err}") from err
    return steps


def trace_line(outcome: Outcome) -> dict[str, Any]:
    """The traces.jsonl object of a finished record; each iteration's answer is marked
    ``iteration_answer``, and the chosen answer ``chosen``."""
    steps = stored_steps(outcome.steps)
    for i in outcome.answer_steps:
        steps[i]["iteration_answer"] = True
    if outcome.chosen_step is not None:
        steps[outcome.chosen_step]["chosen"] = True
    return {"id": outcome.record.id, "steps": steps}
