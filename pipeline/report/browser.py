"""The record browser's data: a summary row for every record, full iterations for some.

The page lists up to ``index_limit`` records (id, line, status, stop reason, iterations,
chosen iteration, cost, error type, each measure's initial and chosen value, and its value
at every iteration), so a reader can filter, search and sort them all, and find the
records a given refinement round made worse. Full iterations (every answer, the feedback
on it with its findings, metrics, errors and calls) are embedded for up to
``detail_limit`` records: every record of a run that small, otherwise those asked for by
id, or else a mix of the failed ones, the most improved, the most worsened, the lowest final
values and the most worsened by one round of the run's main measure, and the first in
file order.

Rows and iterations are written to temporary files while the run is read, so memory
holds only the candidates for full iterations (a few per slot), never the whole run.
"""

from __future__ import annotations

import heapq
import itertools
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

import orjson

from ..core.steps import Superseded
from .source import Key, Pricing, integer, number, record_values

__all__ = [
    "DETAIL_LIMIT",
    "INDEX_LIMIT",
    "TEXT_LIMIT",
    "Browser",
    "Candidate",
    "clip",
    "record_detail",
]

INDEX_LIMIT: Final = 100_000  # records listed in the page (filter, search, sort)
DETAIL_LIMIT: Final = 2_000  # records whose iterations are embedded
TEXT_LIMIT: Final = 20_000  # characters kept of one answer or raw response


@dataclass(slots=True)
class Candidate:
    """One outputs line as the browser keeps it: its index row and what its iterations need."""

    seq: int  # position in outputs.jsonl
    row: list[Any]
    scores: list[Any]
    error: Any
    why: str = ""


def clip(text: Any, limit: int = TEXT_LIMIT) -> str | None:
    """Text cut to ``limit`` characters, saying how much was left out; None stays None."""
    if text is None:
        return None
    value = text if isinstance(text, str) else orjson.dumps(text).decode()
    if len(value) <= limit:
        return value
    return value[:limit] + f"\n… [{len(value) - limit:,} more characters in traces.jsonl]"


def _small(value: Any) -> Any:
    """A JSON value kept as is unless its text is longer than TEXT_LIMIT (then clipped text)."""
    if value is None:
        return None
    text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    return value if len(text) <= TEXT_LIMIT else clip(text.decode())


def _call(step: Mapping[str, Any], pricing: Pricing) -> dict[str, Any]:
    used = step.get("usage")
    used = used if isinstance(used, dict) else {}
    seconds = number(step.get("latency_s"))
    tries = step.get("tries")
    return {
        "role": str(step.get("role")),
        "kind": str(step.get("kind") or _default_kind(step)),
        "model": pricing.model_of(step),
        "tokens": [integer(used.get("prompt_tokens")), integer(used.get("completion_tokens"))],
        "latency": None if seconds is None else round(seconds[0], 4),
        "attempts": integer(step.get("attempts"), 1),
        # each attempt's HTTP status (or failure category), when there was more than one
        "tries": [str(t[0]) for t in tries if isinstance(t, list) and t]
        if isinstance(tries, list)
        else None,
        "cost": pricing.step(step),
        "batch": step.get("batch_id"),
    }


def _default_kind(step: Mapping[str, Any]) -> str:
    """The call kind of a step in a trace written before steps had one."""
    return "feedback" if step.get("role") == "feedback" else "answer"


def _error(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    return {"type": str(value.get("type", "error")), "message": clip(value.get("message")) or ""}


def record_detail(cand: Candidate, steps: Sequence[Any], pricing: Pricing) -> dict[str, Any]:
    """A record's iterations in order: answer, feedback, metrics, errors and calls.

    An iteration shows the answer its loop went on with (marked ``iteration_answer`` in the
    trace; in a trace without marks, its latest answer that stands); the attempts asked
    again and a strategy's other drafts are listed apart.
    """
    marked = any(isinstance(s, dict) and s.get("iteration_answer") for s in steps)
    by_t: dict[int, dict[str, Any]] = {}
    for step in steps:
        if not isinstance(step, dict):
            continue
        t = integer(step.get("iteration"), -1)
        if t < 0:
            continue
        entry = by_t.setdefault(
            t,
            {"t": t, "role": None, "output": None, "copies": [], "feedback": None, "calls": []},
        )
        entry["calls"].append(_call(step, pricing))
        error = _error(step.get("error"))
        if step.get("role") == "feedback":
            parsed = step.get("parsed")
            if entry["feedback"] is not None:  # a cut-off feedback was retried: keep it shown
                entry.setdefault("retried_feedback", []).append(entry["feedback"])
            entry["feedback"] = {
                "parsed": _small(parsed) if isinstance(parsed, dict) else None,
                # The raw answer only when it could not be parsed: it is what went wrong.
                "response": None if isinstance(parsed, dict) else clip(step.get("response")),
                "error": error,
            }
            continue
        output = step.get("output")
        text = clip(output if isinstance(output, str) else step.get("response"))
        if error is not None and error["type"] == Superseded.COPY:
            entry["copies"].append(text)
            continue
        if error is not None and error["type"] == Superseded.CUT_OFF:
            entry.setdefault("cut_off", []).append(text)
            continue
        if step.get("response") is not None and marked and not step.get("iteration_answer"):
            entry.setdefault("drafts", []).append(f"[{step.get('kind')}] {text}")
            continue
        checks = step.get("checks")
        entry.update(
            role=str(step.get("role")),
            output=text,
            metrics=_small(step.get("metrics")),
            checks=[clip(c) for c in checks] if isinstance(checks, list) else None,
            error=error,
        )
    iterations = []
    for t in sorted(by_t):
        entry = by_t[t]
        costs = [c["cost"] for c in entry["calls"]]
        entry["cost"] = None if None in costs else sum(costs)
        score = cand.scores[t] if t < len(cand.scores) else None
        entry["score"] = score if number(score) is not None else None
        iterations.append(entry)
    return {"why": cand.why, "error": _error(cand.error), "iterations": iterations}


class _Codes:
    """Small integers for repeated strings (statuses, stop reasons, error types)."""

    __slots__ = ("codes",)

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def __call__(self, value: Any) -> int:
        return self.codes.setdefault(str(value), len(self.codes))

    def names(self) -> list[str]:
        return list(self.codes)


@dataclass(slots=True)
class _MeasureInfo:
    index: int
    key: Key
    numeric: bool = False  # a value was a number, not a boolean
    values: int = 0
    declared: str | None = ""  # the job's better direction ("": undeclared; None: neither)

    @property
    def better(self) -> str | None:
        """Which way is better: the score higher, a metric as declared, else a boolean higher."""
        if self.key[0] == "score":
            return "higher"
        if self.declared == "":
            return None if self.numeric else "higher"
        return self.declared

    @property
    def rate(self) -> bool:
        return self.key[0] == "metric" and not self.numeric

    @property
    def label(self) -> str:
        if self.key[0] == "score":
            return "score (critic)"
        return f"{self.key[1]} (rate)" if self.rate else self.key[1]


@dataclass(slots=True)
class _Slot:
    """The best ``size`` candidates by a priority (ties go to the earlier record)."""

    size: int
    why: str
    heap: list[tuple[float, int, Candidate]] = field(default_factory=list)

    def offer(self, priority: float, cand: Candidate) -> None:
        item = (priority, -cand.seq, cand)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, item)
        elif item[:2] > self.heap[0][:2]:
            heapq.heapreplace(self.heap, item)

    def best_first(self) -> Iterator[tuple[str, Candidate]]:
        for _, _, cand in sorted(self.heap, key=lambda i: i[:2], reverse=True):
            yield self.why, cand


class _Spool:
    """A JSON array or object written piece by piece to a temporary file."""

    def __init__(self, opening: bytes, closing: bytes) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.file.write(opening)
        self.closing = closing
        self.count = 0

    def add(self, data: bytes) -> None:
        if self.count:
            self.file.write(b",")
        self.file.write(data)
        self.count += 1

    def chunks(self) -> Iterator[bytes]:
        """The whole JSON text, in chunks, once everything has been added."""
        self.file.write(self.closing)
        self.file.seek(0)
        while chunk := self.file.read(1 << 20):
            yield chunk

    def close(self) -> None:
        self.file.close()


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _worst_round(series: Sequence[float | None], better: str | None) -> float:
    """The largest step for the worse between consecutive iterations (0: none, or no way
    is better)."""
    if better is None:
        return 0.0
    sign = 1.0 if better == "higher" else -1.0
    pairs = itertools.pairwise(series)
    return max([0.0, *(sign * (a - b) for a, b in pairs if a is not None and b is not None)])


def _round_robin(
    sources: Sequence[Iterator[tuple[str, Candidate]]],
) -> Iterator[tuple[str, Candidate]]:
    live = list(sources)
    while live:
        for source in list(live):
            item = next(source, None)
            if item is None:
                live.remove(source)
            else:
                yield item


class Browser:
    """A run reader that collects the record browser's rows and iterations."""

    def __init__(
        self,
        pricing: Pricing,
        *,
        wanted: Collection[str] | None = None,
        index_limit: int = INDEX_LIMIT,
        detail_limit: int = DETAIL_LIMIT,
        better: Mapping[str, str | None] | None = None,
    ) -> None:
        self.pricing = pricing
        self.better = dict(better or {})  # metric -> the job's declared direction
        self.wanted = None if wanted is None else set(wanted)
        self.index_limit = index_limit
        self.detail_limit = detail_limit
        self.statuses = _Codes()
        self.stops = _Codes()
        self.error_types = _Codes()
        self.measures: dict[Key, _MeasureInfo] = {}
        self.rows = _Spool(b"[", b"]")
        self.details = _Spool(b"{", b"}")
        self.total = 0
        self.longest = 0  # answers of the longest record
        self.first: list[Candidate] = []
        self.failed = _Slot(detail_limit, "failed")
        # The critic's score and the first metric seen: most improved, most worsened, lowest
        # final value, most worsened by one round. Only these two are followed, so memory
        # stays a few slots.
        self.slots: dict[Key, tuple[_Slot, ...]] = {}
        self.picked: dict[str, Candidate] | None = None
        self.main: Key | None = None  # known once the outputs are read
        self.built: set[str] = set()

    # -- outputs.jsonl ------------------------------------------------------------------------

    def _measure(self, key: Key) -> _MeasureInfo:
        info = self.measures.get(key)
        if info is None:
            declared = self.better.get(key[1], "") if key[0] == "metric" else "higher"
            info = self.measures[key] = _MeasureInfo(len(self.measures), key, declared=declared)
        return info

    def output(self, line: Mapping[str, Any]) -> None:
        """Index one outputs.jsonl line, and keep it if it may get its iterations embedded."""
        seq = self.total
        self.total += 1
        values = record_values(line)
        self.longest = max(self.longest, values.size)
        final = values.chosen if values.chosen is not None else values.size - 1
        flat: list[Any] = []
        by_iteration: list[Any] = []
        ends: list[tuple[Key, float | None, float | None, float]] = []
        for key, series in values.series.items():
            if all(v is None for v in series):
                continue
            info = self._measure(key)
            info.numeric = info.numeric or values.numeric[key]
            by_iteration += [info.index, series]
            initial, chosen = series[0], series[final]
            if initial is None and chosen is None:
                continue
            info.values += 1
            flat += [info.index, initial, chosen]
            ends.append((key, initial, chosen, _worst_round(series, info.better)))
        error = line.get("error")
        row = [
            str(line.get("id")),
            integer(line.get("line")),
            self.statuses(line.get("status")),
            self.stops(line.get("stop_reason")),
            values.made,
            values.chosen,
            self.pricing.record(line),
            self.error_types(error.get("type")) if isinstance(error, dict) else None,
            flat,
            by_iteration,  # [measure, [value at 0, 1, ...]] pairs
        ]
        if seq < self.index_limit:
            self.rows.add(_json(row))
        scores = line.get("scores")
        cand = Candidate(seq, row, scores if isinstance(scores, list) else [], error)
        if self.wanted is not None:
            if row[0] in self.wanted and len(self.first) < self.detail_limit:
                cand.why = "asked for"
                self.first.append(cand)
            return
        if len(self.first) < self.detail_limit:
            self.first.append(cand)
        if line.get("status") == "failed":
            self.failed.offer(0.0, cand)
        for key, initial, chosen, drop in ends:
            self._offer(key, initial, chosen, drop, cand)

    def _offer(
        self, key: Key, initial: float | None, chosen: float | None, drop: float, c: Candidate
    ) -> None:
        slots = self.slots.get(key)
        if slots is None:
            if key[0] == "metric" and any(k[0] == "metric" for k in self.slots):
                return
            label, n = self.measures[key].label, self.detail_limit
            slots = self.slots[key] = (
                _Slot(n, f"most improved {label}"),
                _Slot(n, f"most worsened {label}"),
                _Slot(n, f"lowest final {label}"),
                _Slot(n, f"most worsened {label} by one round"),
            )
        improved, worsened, lowest, by_round = slots
        if drop > 0:
            by_round.offer(drop, c)
        if initial is not None and chosen is not None:
            if chosen > initial:
                improved.offer(chosen - initial, c)
            elif chosen < initial:
                worsened.offer(initial - chosen, c)
        if chosen is not None:
            lowest.offer(-chosen, c)

    # -- the choice ---------------------------------------------------------------------------

    def _main_measure(self) -> Key | None:
        """The measure the choice ranks by: the critic's score, else the first metric seen."""
        keys = [k for k, i in self.measures.items() if i.values and k in self.slots]
        keys.sort(key=lambda k: k[0] != "score")
        return keys[0] if keys else None

    def _choose(self) -> dict[str, Candidate]:
        if self.wanted is not None or self.total <= self.detail_limit:
            return {c.row[0]: c for c in self.first}
        sources = [self.failed.best_first()]
        if self.main is not None:
            sources += [slot.best_first() for slot in self.slots[self.main]]
        picked: dict[str, Candidate] = {}
        # Round robin: each reason gets an equal share while it has candidates left.
        for why, cand in _round_robin(sources):
            if len(picked) >= self.detail_limit:
                break
            if cand.row[0] not in picked:
                cand.why = why
                picked[cand.row[0]] = cand
        for cand in self.first:
            if len(picked) >= self.detail_limit:
                break
            if cand.row[0] not in picked:
                cand.why = "first in file order"
                picked[cand.row[0]] = cand
        return picked

    def _chosen(self) -> dict[str, Candidate]:
        if self.picked is None:
            self.main = self._main_measure()
            self.picked = self._choose()
            # Only the chosen candidates stay in memory from here on.
            self.first, self.slots, self.failed = [], {}, _Slot(0, "failed")
        return self.picked

    # -- traces.jsonl -------------------------------------------------------------------------

    def trace(self, line: Mapping[str, Any]) -> None:
        """Embed the iterations of a chosen record."""
        rid = str(line.get("id"))
        cand = self._chosen().get(rid)
        if cand is None or rid in self.built:
            return
        steps = line.get("steps")
        detail = record_detail(cand, steps if isinstance(steps, list) else [], self.pricing)
        self.details.add(_json(rid) + b":" + _json(detail))
        self.built.add(rid)

    # -- the result ---------------------------------------------------------------------------

    def finish(self) -> tuple[dict[str, Any], Iterator[bytes], Iterator[bytes]]:
        """The page's view of the rows, then the rows (a JSON array) and iterations, in chunks.

        Chosen records past the listing limit are listed too: every embedded record has a row.
        """
        late = [c for c in self._chosen().values() if c.seq >= self.index_limit]
        for cand in late:
            self.rows.add(_json(cand.row))
        meta = {
            "total": self.total,
            "listed": self.rows.count,
            "detailed": len(self.built),
            "index_limit": self.index_limit,
            "detail_limit": self.detail_limit,
            "selection": "asked"
            if self.wanted is not None
            else ("all" if self.total <= self.detail_limit else "chosen"),
            "asked": None if self.wanted is None else len(self.wanted),
            "statuses": self.statuses.names(),
            "stops": self.stops.names(),
            "error_types": self.error_types.names(),
            "measures": [
                {"label": i.label, "rate": i.rate, "better": i.better}
                for i in sorted(self.measures.values(), key=lambda i: i.index)
            ],
            # refinement rounds: 1 .. rounds (the longest record's)
            "rounds": max(0, self.longest - 1),
            "main": None if self.main is None else self.measures[self.main].index,
        }
        return meta, self.rows.chunks(), self.details.chunks()

    def close(self) -> None:
        """Remove the temporary files."""
        self.rows.close()
        self.details.close()
