"""An OpenAI-compatible HTTP server simulator for tests and benchmarks.

The server speaks just enough HTTP/1.1 (keep-alive, ``Content-Length`` bodies) on raw
``asyncio`` protocols to be driven by the real ``openai`` client at thousands of requests
per second. Answers are deterministic functions of the request messages and the seed, and
the simulator can enforce OpenAI-style per-second rate limits and inject faults (errors,
hangs, resets, truncated bodies, outages, cut-off answers, refusals).

Use it in-process (``with Simulator(SimConfig(...)) as sim: ... sim.url``) or as a separate
process: ``python -m pipeline.testing.simulator --port 0 --latency 0.05`` prints one line
``listening http://127.0.0.1:PORT/v1`` once ready and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import math
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Final, cast

import orjson

__all__ = ["RequestLog", "SimConfig", "Simulator", "main"]

STRUCTURED_LEVELS: Final = ("json_schema", "json_object", "none")
DEFAULT_MODEL: Final = "sim-model"
BACKLOG: Final = 8192
MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024
DEFAULT_COST_COMPLETION_TOKENS: Final = 256
REFUSAL_TEXT: Final = "I'm sorry, but I can't help with that request."
_FAULTS: Final = ("p_500", "p_503", "p_hang", "p_reset", "p_truncate", "p_length", "p_refusal")
_PROBABILITIES: Final = ("p_done", *_FAULTS)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Behaviour of the simulated server (swap it at runtime with ``Simulator.set_config``)."""

    latency_s: float = 0.0
    jitter_s: float = 0.0
    p_done: float = 0.3
    seed: int = 0
    api_key: str | None = None
    models: tuple[str, ...] | None = None
    structured: str = "json_schema"
    fence_json: bool = False
    rpm: float | None = None
    tpm: float | None = None
    p_500: float = 0.0
    p_503: float = 0.0
    p_hang: float = 0.0
    hang_s: float = 3600.0
    p_reset: float = 0.0
    p_truncate: float = 0.0
    p_length: float = 0.0
    p_refusal: float = 0.0
    outages: tuple[tuple[float, float], ...] = ()
    faults_seed: int = 0

    def __post_init__(self) -> None:
        if self.structured not in STRUCTURED_LEVELS:
            raise ValueError(
                f"structured must be one of {STRUCTURED_LEVELS}, not {self.structured!r}"
            )
        for name in _PROBABILITIES:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], not {value!r}")
        if self.latency_s < 0 or self.jitter_s < 0 or self.hang_s < 0:
            raise ValueError("latency_s, jitter_s and hang_s must not be negative")
        for name in ("rpm", "tpm"):
            limit = getattr(self, name)
            if limit is not None and not limit > 0:
                raise ValueError(f"{name} must be positive when set, not {limit!r}")
        for window in self.outages:
            if len(window) != 2 or window[1] < window[0]:
                raise ValueError(f"outage windows are (start_s, end_s) pairs, not {window!r}")


@dataclass(frozen=True, slots=True)
class RequestLog:
    """One HTTP request received on ``/v1/chat/completions``."""

    t: float
    body: dict[str, Any]
    status: int
    outcome: str
    completed: bool
    headers: dict[str, str]


_DEFAULT_CONFIG: Final = SimConfig()

# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------

_REASONS: Final[dict[int, str]] = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}

_FENCED_JSON: Final = re.compile(r"```json[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def _error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def _fmt_duration(seconds: float) -> str:
    """Format like Go's ``time.Duration`` at millisecond precision ("250ms", "1.5s", "6m0s")."""
    ms = math.ceil(seconds * 1000.0 - 1e-6)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = str(rest // 1000) if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _fmt_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _content_text(content: Any) -> str:
    """The text of a message ``content`` (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def _estimate_tokens(n_chars: int) -> int:
    return max(1, math.ceil(n_chars / 4))


def _unit(digest: bytes, label: bytes) -> float:
    """A deterministic number in [0, 1) derived from ``digest`` and ``label``."""
    sub = hashlib.blake2b(label, key=digest[:32], digest_size=8).digest()
    return int.from_bytes(sub, "big") / 2.0**64


def _mask_key(token: str) -> str:
    if len(token) <= 8:
        return "*" * len(token)
    return f"{token[:3]}{'*' * min(len(token) - 7, 20)}{token[-4:]}"


def _raise_nofile_limit() -> None:
    """Best effort: allow thousands of concurrent sockets in this process."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - platform dependent
        pass


# --------------------------------------------------------------------------------------
# Deterministic content
# --------------------------------------------------------------------------------------

_VARS: Final = ("x", "i", "tmp", "val", "data", "res", "n", "buf", "acc", "item")
_NEW_VARS: Final = ("count", "index", "total", "value", "records", "result", "size", "buffer")
_FUNCS: Final = (
    "parse_items",
    "compute_total",
    "load_config",
    "merge_rows",
    "normalize",
    "score_answer",
    "render_table",
    "read_input",
)
_MODULES: Final = ("os", "sys", "re", "json", "math", "itertools", "typing")
_VAGUE: Final = ("many", "some", "very", "significant", "various", "a lot of")
_TERMS: Final = ("latency", "throughput", "idempotent", "baseline", "self-refinement", "recall")
_FILLERS: Final = (
    "in order to",
    "it is important to note that",
    "at the end of the day",
    "basically",
    "needless to say",
)
_ACTIONS: Final = (
    "Rename variable {v} to {w} in line {n}",
    "Add a docstring to {f}() describing its arguments and return value",
    "Handle the empty-input case at the top of {f}() before line {n}",
    "Replace the manual index loop in line {n} with enumerate()",
    "Extract lines {n}-{n2} into a helper function named {f}_step",
    "Remove the unused import of {m} on line 1",
    "Add a unit test for {f}() that covers negative numbers",
    "Split the long sentence in paragraph {p} into two shorter sentences",
    "Replace the vague word '{adj}' in sentence {n} with a concrete number",
    "Add a concrete example right after the claim in paragraph {p}",
    "Cite a source for the statistic quoted in sentence {n}",
    "Move the conclusion in paragraph {p} to the opening line",
    "Check {v} for None before it is dereferenced in line {n}",
    "Use a with-statement to close the file opened in line {n}",
    "Define the term '{term}' before its first use in paragraph {p}",
    "Cut the filler phrase '{filler}' from sentence {n}",
    "Return early from {f}() when {v} is empty instead of nesting the loop",
    "State the final answer explicitly in the last line",
)
_OPENERS: Final = (
    "Here is a revised answer.",
    "Here is my answer.",
    "Below is a concise response.",
    "The short version:",
    "Answer:",
)
_SENTENCES: Final = (
    "The approach processes the input in a single pass and keeps only a running total.",
    "Each step is checked against the constraints given in the task before moving on.",
    "Edge cases such as empty input and repeated values are handled explicitly.",
    "The result is stated first, followed by a short justification.",
    "A worked example makes the reasoning easy to verify line by line.",
    "The wording stays concrete and avoids vague qualifiers.",
    "Intermediate values are named after what they represent.",
    "The final figure was double-checked by recomputing it in a different order.",
    "Assumptions are listed so that a reviewer can challenge them quickly.",
    "The explanation is kept to the three facts that actually matter.",
)
_CODE_SNIPPETS: Final = (
    (
        "def {f}(items):",
        "    total = 0",
        "    for item in items:",
        "        total += item",
        "    return total",
    ),
    (
        "def {f}(rows):",
        "    if not rows:",
        "        return []",
        "    seen = set()",
        "    return [r for r in rows if not (r in seen or seen.add(r))]",
    ),
    (
        "def {f}(text):",
        "    words = text.split()",
        "    counts = {{}}",
        "    for word in words:",
        "        counts[word] = counts.get(word, 0) + 1",
        "    return counts",
    ),
    (
        "def {f}(values, limit=10):",
        "    ordered = sorted(values, reverse=True)",
        "    return ordered[:limit]",
    ),
)
_CODE_HINTS: Final = ("```python", "def ", "function", "python", "code", "implement", "class ")


class _Writer:
    """Deterministic text and JSON instance generator for one request."""

    def __init__(self, digest: bytes, p_done: float, root: Any = None) -> None:
        self.digest = digest
        self.tag = f"[sim {digest.hex()[:8]}]"
        self.rng = random.Random(int.from_bytes(digest[:16], "big"))
        self.done = _unit(digest, b"done") < p_done
        self.root = root

    # -- text ---------------------------------------------------------------------------

    def action(self, template: str) -> str:
        rng = self.rng
        n = rng.randint(2, 40)
        return template.format(
            v=rng.choice(_VARS),
            w=rng.choice(_NEW_VARS),
            n=n,
            n2=n + rng.randint(2, 9),
            f=rng.choice(_FUNCS),
            m=rng.choice(_MODULES),
            p=rng.randint(1, 5),
            adj=rng.choice(_VAGUE),
            term=rng.choice(_TERMS),
            filler=rng.choice(_FILLERS),
        )

    def actions(self, count: int) -> list[str]:
        picks = self.rng.sample(_ACTIONS, min(count, len(_ACTIONS)))
        out = [self.action(t) for t in picks]
        for i in range(len(out), count):  # more than the template pool: keep items distinct
            out.append(f"{self.action(self.rng.choice(_ACTIONS))} (item {i + 1})")
        return out

    def sentences(self, count: int) -> str:
        return " ".join(self.rng.sample(_SENTENCES, min(count, len(_SENTENCES))))

    def code(self) -> str:
        lines = self.rng.choice(_CODE_SNIPPETS)
        name = self.rng.choice(_FUNCS)
        return "\n".join(line.format(f=name) for line in lines)

    def text_answer(self, messages_text: str) -> str:
        lowered = messages_text.lower()
        opener = f"{self.rng.choice(_OPENERS)} {self.tag}"
        if any(hint in lowered for hint in _CODE_HINTS):
            body = f"```python\n{self.code()}\n```"
            return f"{opener}\n\n{body}\n\n{self.sentences(2)}"
        picked = self.rng.sample(_SENTENCES, 5)
        bullets = "\n".join(f"- {s}" for s in picked[2:4])
        return f"{opener}\n\n{picked[0]} {picked[1]}\n{bullets}\n\n{picked[4]}"

    # -- JSON Schema instances ----------------------------------------------------------

    def _deref(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while isinstance(schema.get("$ref"), str) and seen < 32:
            ref: str = schema["$ref"]
            target: Any = self.root
            if not ref.startswith("#"):
                return {}
            for part in ref[1:].split("/"):
                if not part:
                    continue
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, dict) else None
            if not isinstance(target, dict):
                return {}
            extra = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **extra}
            seen += 1
        return schema

    def instance(self, schema: Any, name: str | None = None, depth: int = 0) -> Any:
        if not isinstance(schema, dict):
            return self.string({}, name)
        schema = self._deref(schema)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return self.rng.choice(enum)
        special = name in ("done", "score")
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                options = [
                    b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")
                ]
                if not options or (
                    not special and len(options) < len(branches) and self.rng.random() < 0.1
                ):
                    return None
                return self.instance(self.rng.choice(options), name, depth + 1)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for sub in all_of:
                if isinstance(sub, dict):
                    sub = self._deref(sub)
                    props = {**merged.get("properties", {}), **sub.get("properties", {})}
                    required = [*merged.get("required", []), *sub.get("required", [])]
                    merged = {**merged, **sub, "properties": props, "required": required}
            return self.instance(merged, name, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            non_null = [k for k in kind if k != "null"]
            if not non_null or (not special and "null" in kind and self.rng.random() < 0.1):
                return None
            kind = non_null[0] if len(non_null) == 1 else self.rng.choice(non_null)
        if kind is None:
            if "properties" in schema:
                kind = "object"
            elif "items" in schema:
                kind = "array"
            else:
                kind = "string"
        if kind == "object":
            return self.obj(schema, depth)
        if kind == "array":
            return self.array(schema, name, depth)
        if kind in ("number", "integer"):
            return self.number(schema, name, integer=kind == "integer")
        if kind == "boolean":
            return self.done if name == "done" else self.rng.random() < 0.5
        if kind == "null":
            return None
        return self.string(schema, name)

    def obj(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required_list = schema.get("required")
        required = set(required_list) if isinstance(required_list, list) else set()
        out: dict[str, Any] = {}
        for key, sub in props.items():
            if key in required or (depth < 6 and self.rng.random() < 0.75):
                out[key] = self.instance(sub, key, depth + 1)
        for key in required_list if isinstance(required_list, list) else ():
            if isinstance(key, str) and key not in out:
                out[key] = self.string({}, key)
        return out

    def array(self, schema: dict[str, Any], name: str | None, depth: int) -> list[Any]:
        lo = schema.get("minItems", 0)
        hi = schema.get("maxItems")
        lo = lo if isinstance(lo, int) and lo > 0 else 0
        hi = hi if isinstance(hi, int) and hi >= lo else None
        low = lo if (hi == 0 or lo > 0) else 1
        high = max(low, min(3, hi) if hi is not None else 3)
        if hi is not None:
            low, high = min(low, hi), min(high, hi)
        count = low if depth >= 6 else self.rng.randint(low, high)
        items = schema.get("items", {})
        item_schema = self._deref(items) if isinstance(items, dict) else {}
        plain_string = item_schema.get("type") in ("string", ["string"]) and not any(
            k in item_schema for k in ("enum", "const", "format")
        )
        if plain_string:
            texts = self.actions(count)
            return [self._fit(t, item_schema) for t in texts]
        singular = name[:-1] if name and name.endswith("s") else name
        return [self.instance(item_schema, singular, depth + 1) for _ in range(count)]

    def number(self, schema: dict[str, Any], name: str | None, *, integer: bool) -> float | int:
        lo_default, hi_default = (0.0, 10.0) if name == "score" else (0.0, 100.0)
        lo = schema.get("minimum")
        hi = schema.get("maximum")
        ex_lo = schema.get("exclusiveMinimum")
        ex_hi = schema.get("exclusiveMaximum")
        lo_f = float(lo) if isinstance(lo, int | float) else None
        hi_f = float(hi) if isinstance(hi, int | float) else None
        if isinstance(ex_lo, int | float) and not isinstance(ex_lo, bool):
            lo_f = max(lo_f, float(ex_lo)) if lo_f is not None else float(ex_lo)
        if isinstance(ex_hi, int | float) and not isinstance(ex_hi, bool):
            hi_f = min(hi_f, float(ex_hi)) if hi_f is not None else float(ex_hi)
        if lo_f is None and hi_f is None:
            lo_f, hi_f = lo_default, hi_default
        elif lo_f is None:
            assert hi_f is not None
            lo_f = min(lo_default, hi_f - (hi_default - lo_default))
        elif hi_f is None:
            hi_f = lo_f + (hi_default - lo_default)
        assert lo_f is not None and hi_f is not None
        strict_lo = isinstance(ex_lo, int | float) and lo_f == float(ex_lo)
        strict_hi = isinstance(ex_hi, int | float) and hi_f == float(ex_hi)
        if integer:
            low = math.floor(lo_f) + 1 if strict_lo and lo_f.is_integer() else math.ceil(lo_f)
            high = math.ceil(hi_f) - 1 if strict_hi and hi_f.is_integer() else math.floor(hi_f)
            return self.rng.randint(low, high) if low <= high else low
        value = round(self.rng.uniform(lo_f, hi_f), 2)
        if (
            value < lo_f
            or (strict_lo and value <= lo_f)
            or value > hi_f
            or (strict_hi and value >= hi_f)
        ):
            value = (lo_f + hi_f) / 2
        return value

    def string(self, schema: dict[str, Any], name: str | None) -> str:
        fmt = schema.get("format")
        lowered = (name or "").lower()
        if fmt == "date-time":
            text = f"2024-0{self.rng.randint(1, 9)}-1{self.rng.randint(0, 9)}T12:00:00Z"
        elif fmt == "date":
            text = f"2024-0{self.rng.randint(1, 9)}-1{self.rng.randint(0, 9)}"
        elif fmt == "email":
            text = f"user{self.rng.randint(1, 999)}@example.com"
        elif fmt in ("uri", "url"):
            text = f"https://example.com/{self.digest.hex()[:8]}"
        elif fmt == "uuid":
            h = hashlib.md5(self.digest + lowered.encode()).hexdigest()
            text = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"
        elif any(w in lowered for w in ("feedback", "critique", "comment", "suggestion", "issue")):
            text = "; ".join(self.actions(self.rng.randint(1, 2))) + "."
        elif any(w in lowered for w in ("reason", "explanation", "rationale", "justification")):
            text = self.sentences(1)
        elif "code" in lowered:
            text = self.code()
        elif any(
            w in lowered
            for w in (
                "answer",
                "text",
                "content",
                "output",
                "response",
                "refined",
                "revis",
                "draft",
            )
        ):
            text = f"{self.sentences(2)} {self.tag}"
        elif lowered.endswith("id"):
            text = f"id-{self.digest.hex()[:10]}"
        elif any(w in lowered for w in ("name", "title", "label")):
            text = f"{self.rng.choice(_TERMS).capitalize()} {self.digest.hex()[:4]}"
        else:
            text = f"{self.rng.choice(_NEW_VARS)} {self.digest.hex()[:6]}"
        return self._fit(text, schema)

    @staticmethod
    def _fit(text: str, schema: dict[str, Any]) -> str:
        min_len = schema.get("minLength")
        max_len = schema.get("maxLength")
        if isinstance(min_len, int) and len(text) < min_len:
            text = (text + " ") * (min_len // max(1, len(text) + 1) + 1)
            text = text[: max(min_len, len(text.rstrip()))].ljust(min_len, ".")
        if isinstance(max_len, int) and len(text) > max_len:
            text = text[:max_len]
        return text


def _fenced_schema(text: str) -> dict[str, Any] | None:
    """The last ```json block of ``text`` that parses to an object with "properties"."""
    found: dict[str, Any] | None = None
    for match in _FENCED_JSON.finditer(text):
        try:
            parsed = orjson.loads(match.group(1))
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, dict) and "properties" in parsed:
            found = parsed
    return found


# --------------------------------------------------------------------------------------
# Rate limiting
# --------------------------------------------------------------------------------------


class _Bucket:
    """Token bucket of capacity ``limit/60`` refilled at ``limit/60`` per second.

    It starts full. A full bucket admits one request of any cost (going into debt), so a
    request larger than the per-second capacity is not starved; the long-run rate holds.
    """

    __slots__ = ("capacity", "level", "limit", "rate", "stamp")

    def __init__(self, per_minute: float, now: float) -> None:
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.capacity = self.rate
        self.level = self.capacity
        self.stamp = now

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def admits(self, cost: float) -> bool:
        return self.level >= cost or self.level >= self.capacity

    def wait_s(self, cost: float) -> float:
        return max(0.0, (min(cost, self.capacity) - self.level) / self.rate)

    def headers(self, kind: str) -> list[tuple[str, str]]:
        return [
            (f"x-ratelimit-limit-{kind}", _fmt_number(self.limit)),
            (f"x-ratelimit-remaining-{kind}", str(max(0, math.floor(self.level)))),
            (f"x-ratelimit-reset-{kind}", _fmt_duration((self.capacity - self.level) / self.rate)),
        ]


# --------------------------------------------------------------------------------------
# Engine: decides what to answer
# --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Reply:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    action: str = "send"  # "send" | "hang" | "reset" | "truncate"
    delay: float = 0.0
    hang_s: float = 0.0
    log: RequestLog | None = None
    close: bool = False


class _Engine:
    def __init__(self, config: SimConfig, log_path: Path | None, keep_requests: bool) -> None:
        self.config = config
        self.keep_requests = keep_requests
        self._applied: SimConfig | None = None
        self.log_path = log_path
        self._log_file: IO[bytes] | None = None
        self._logs: list[RequestLog] = []
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
        self._ids = itertools.count(1)
        self._req_bucket: _Bucket | None = None
        self._tok_bucket: _Bucket | None = None
        self._fault_rng = random.Random(0)
        self._jitter_rng = random.Random(0)
        self.conns: set[_Conn] = set()
        self.closing = False

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> None:
        self.t0 = time.monotonic()
        self._applied = None
        self.closing = False
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = self.log_path.open("ab")

    def close(self) -> None:
        with self._lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def _current(self, now: float) -> SimConfig:
        cfg = self.config
        prev = self._applied
        if cfg is prev:
            return cfg
        if prev is None or prev.rpm != cfg.rpm:
            self._req_bucket = _Bucket(cfg.rpm, now) if cfg.rpm else None
        if prev is None or prev.tpm != cfg.tpm:
            self._tok_bucket = _Bucket(cfg.tpm, now) if cfg.tpm else None
        if prev is None or prev.faults_seed != cfg.faults_seed:
            self._fault_rng = random.Random(f"faults:{cfg.faults_seed}")
        if prev is None or prev.seed != cfg.seed:
            self._jitter_rng = random.Random(f"jitter:{cfg.seed}")
        self._applied = cfg
        return cfg

    # -- logging ------------------------------------------------------------------------

    def record(self, entry: RequestLog) -> None:
        line = orjson.dumps(entry) + b"\n" if self.log_path is not None else b""
        with self._lock:
            if self.keep_requests:
                self._logs.append(entry)
            if self._log_file is not None:
                self._log_file.write(line)
                self._log_file.flush()

    def logs(self) -> list[RequestLog]:
        with self._lock:
            return list(self._logs)

    # -- routing ------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> _Reply:
        path = target.split("?", 1)[0]
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/")
        if path == "/v1/chat/completions" and method == "POST":
            return self.chat(headers, body)
        if method == "GET" and (path == "/v1/models" or path.startswith("/v1/models/")):
            return self.models(path, headers)
        message = f"Invalid URL ({method} {path})"
        return _Reply(404, _error_body(message, "invalid_request_error", None, "unknown_url"))

    def _auth_error(self, cfg: SimConfig, headers: dict[str, str]) -> bytes | None:
        if cfg.api_key is None:
            return None
        auth = headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if token == cfg.api_key:
            return None
        if token:
            message = (
                f"Incorrect API key provided: {_mask_key(token)}. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
        else:
            message = (
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
            )
        return _error_body(message, "invalid_request_error", None, "invalid_api_key")

    def models(self, path: str, headers: dict[str, str]) -> _Reply:
        cfg = self._current(time.monotonic())
        auth = self._auth_error(cfg, headers)
        if auth is not None:
            return _Reply(401, auth)
        names = cfg.models if cfg.models is not None else (DEFAULT_MODEL,)
        created = 1_700_000_000
        cards = [
            {"id": n, "object": "model", "created": created, "owned_by": "simulator"} for n in names
        ]
        if path == "/v1/models":
            return _Reply(200, orjson.dumps({"object": "list", "data": cards}))
        wanted = path[len("/v1/models/") :]
        for card in cards:
            if card["id"] == wanted:
                return _Reply(200, orjson.dumps(card))
        return _Reply(404, self._model_error(wanted))

    @staticmethod
    def _model_error(model: str) -> bytes:
        message = f"The model `{model}` does not exist or you do not have access to it."
        return _error_body(message, "invalid_request_error", None, "model_not_found")

    # -- chat completions ----------------------------------------------------------------

    def chat(self, headers: dict[str, str], raw: bytes) -> _Reply:
        now = time.monotonic()
        t = now - self.t0
        cfg = self._current(now)
        try:
            parsed: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}

        def done(
            status: int, payload: bytes, outcome: str, *, completed: bool = False, **kw: Any
        ) -> _Reply:
            sent = status if kw.get("action", "send") in ("send", "truncate") else 0
            log = RequestLog(t, body, sent, outcome, completed, headers)
            return _Reply(status, payload, log=log, **kw)

        def bad(message: str, param: str | None, code: str | None = None) -> _Reply:
            return done(
                400, _error_body(message, "invalid_request_error", param, code), "bad_request"
            )

        auth = self._auth_error(cfg, headers)
        if auth is not None:
            return done(401, auth, "auth")
        if parsed is None:
            return bad(
                "We could not parse the JSON body of your request. (HINT: This likely means you "
                "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
                None,
            )
        if not isinstance(parsed, dict):
            return bad("The request body must be a JSON object.", None)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return bad("you must provide a model parameter", "model")
        if cfg.models is not None and model not in cfg.models:
            return done(404, self._model_error(model), "not_found")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return bad(
                "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
            )
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                return bad(f"Invalid value for 'messages[{i}]'.", f"messages[{i}]", "invalid_value")
        if body.get("stream"):
            return bad(
                "Streaming is not supported by the simulator.", "stream", "unsupported_value"
            )
        limit = body.get("max_completion_tokens")
        if limit is None:
            limit = body.get("max_tokens")
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            return bad(
                "Invalid 'max_tokens': integer below minimum value.",
                "max_tokens",
                "integer_below_min_value",
            )

        # What kind of answer (and whether the configured level supports it).
        fmt = body.get("response_format")
        mode = "text"
        schema: Any = None
        if fmt is not None:
            kind = fmt.get("type") if isinstance(fmt, dict) else None
            if cfg.structured == "none":
                return bad(
                    "Invalid parameter: 'response_format' is not supported by this server.",
                    "response_format",
                    "unsupported_parameter",
                )
            if kind == "text":
                mode = "text"
            elif kind == "json_schema" and cfg.structured == "json_schema":
                spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
                if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                    return bad(
                        "Missing required parameter: 'response_format.json_schema.name'.",
                        "response_format.json_schema.name",
                        "missing_required_parameter",
                    )
                mode, schema = "json", spec.get("schema", {})
            elif kind == "json_object":
                mode, schema = "json", cast(dict[str, Any], fmt).get("schema")
            else:
                return bad(
                    f"Invalid parameter: 'response_format' of type '{kind}' is not supported "
                    "by this server.",
                    "response_format",
                    "unsupported_value",
                )

        if any(start <= t < end for start, end in cfg.outages):
            return done(
                503,
                _error_body(
                    "The service is temporarily unavailable (simulated outage).",
                    "server_error",
                    None,
                    "service_unavailable",
                ),
                "outage",
            )

        # Rate limits, decided at arrival. Refused requests consume nothing.
        texts = [_content_text(m.get("content")) for m in messages]
        prompt_tokens = _estimate_tokens(sum(len(x) for x in texts))
        rl_headers: list[tuple[str, str]] = []
        rb, tb = self._req_bucket, self._tok_bucket
        if rb is not None or tb is not None:
            cost = prompt_tokens + (limit if limit is not None else DEFAULT_COST_COMPLETION_TOKENS)
            limited: str | None = None
            wait = 0.0
            if rb is not None:
                rb.refill(now)
                if not rb.admits(1):
                    limited, wait = "requests", rb.wait_s(1)
            if tb is not None:
                tb.refill(now)
                if not tb.admits(cost):
                    limited = limited or "tokens"
                    wait = max(wait, tb.wait_s(cost))
            if limited is None:
                if rb is not None:
                    rb.level -= 1
                if tb is not None:
                    tb.level -= cost
            if rb is not None:
                rl_headers += rb.headers("requests")
            if tb is not None:
                rl_headers += tb.headers("tokens")
            if limited is not None:
                wait_ms = max(1, math.ceil(wait * 1000))
                bucket = rb if limited == "requests" else tb
                assert bucket is not None
                unit = "RPM" if limited == "requests" else "TPM"
                asked = 1 if limited == "requests" else cost
                message = (
                    f"Rate limit reached for {limited} in organization org-simulator on {limited} "
                    f"per min ({unit}): Limit {_fmt_number(bucket.limit)}, Requested {asked}. "
                    f"Please try again in {_fmt_duration(wait_ms / 1000)}."
                )
                rl_headers += [
                    ("retry-after-ms", str(wait_ms)),
                    ("retry-after", str(max(1, math.ceil(wait_ms / 1000)))),
                ]
                reply = done(
                    429,
                    _error_body(message, limited, None, "rate_limit_exceeded"),
                    "rate_limited",
                )
                reply.headers = rl_headers
                return reply

        # Faults: always draw every number, in a fixed order, so runs are reproducible.
        rng = self._fault_rng
        draws = [rng.random() for _ in _FAULTS]
        delay = cfg.latency_s
        if cfg.jitter_s > 0:
            delay += self._jitter_rng.uniform(-cfg.jitter_s, cfg.jitter_s)
        delay = max(0.0, delay)
        if draws[0] < cfg.p_500:
            payload = _error_body(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
            )
            reply = done(500, payload, "error_500", delay=delay)
            reply.headers = rl_headers
            return reply
        if draws[1] < cfg.p_503:
            payload = _error_body(
                "The engine is currently overloaded, please try again later.", "server_error"
            )
            reply = done(503, payload, "error_503", delay=delay)
            reply.headers = rl_headers
            return reply
        if draws[2] < cfg.p_hang:
            return done(0, b"", "hang", action="hang", hang_s=cfg.hang_s)
        if draws[3] < cfg.p_reset:
            return done(0, b"", "reset", action="reset", delay=delay)

        # The answer itself.
        canonical = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)
        digest = hashlib.sha256(cfg.seed.to_bytes(16, "big", signed=True) + canonical).digest()
        last_user = next(
            (
                x
                for m, x in zip(reversed(messages), reversed(texts), strict=True)
                if m.get("role") == "user"
            ),
            texts[-1],
        )
        if mode == "json" and not isinstance(schema, dict):
            schema = _fenced_schema(last_user)
        elif mode == "text":
            schema = _fenced_schema(last_user)
            if schema is not None:
                mode = "fenced" if cfg.fence_json else "json"
        writer = _Writer(digest, cfg.p_done, schema)
        if mode == "text":
            answer = writer.text_answer("\n".join(texts))
        else:
            if isinstance(schema, dict):
                value = writer.instance(schema)
            else:
                value = {"answer": writer.sentences(2), "done": writer.done, "tag": writer.tag}
            answer = orjson.dumps(value).decode()
            if mode == "fenced":
                answer = f"```json\n{answer}\n```"

        outcome = "ok"
        finish = "stop"
        content: str | None = answer
        refusal: str | None = None
        if draws[5] < cfg.p_length:
            content = answer[: max(1, len(answer) // 2)]
            outcome, finish = "length", "length"
        if limit is not None and content is not None and _estimate_tokens(len(content)) > limit:
            content = content[: limit * 4]
            outcome, finish = "length", "length"
        if draws[6] < cfg.p_refusal:
            content, refusal, outcome, finish = None, REFUSAL_TEXT, "refusal", "stop"
        completion_tokens = _estimate_tokens(len(content if content is not None else REFUSAL_TEXT))
        payload = orjson.dumps(
            {
                "id": f"chatcmpl-sim{next(self._ids):x}{digest.hex()[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content, "refusal": refusal},
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
                "system_fingerprint": f"fp_sim{cfg.seed & 0xFFFFFFFF:08x}",
            }
        )
        if draws[4] < cfg.p_truncate:
            reply = done(200, payload, "truncated", action="truncate", delay=delay)
        else:
            reply = done(200, payload, outcome, completed=outcome == "ok", delay=delay)
        reply.headers = rl_headers
        return reply


# --------------------------------------------------------------------------------------
# HTTP/1.1 protocol
# --------------------------------------------------------------------------------------


def _encode_head(
    status: int, headers: Sequence[tuple[str, str]], length: int, close: bool
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
        "content-type: application/json",
        f"content-length: {length}",
        "connection: close" if close else "connection: keep-alive",
        *(f"{name}: {value}" for name, value in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Conn(asyncio.Protocol):
    """One client connection: parses requests one at a time and writes the replies."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: tuple[str, str, dict[str, str], int, bool] | None = None
        self.scan_from = 0
        self.busy = False
        self.closed = False
        self.pending: asyncio.TimerHandle | None = None
        self.pending_reply: _Reply | None = None

    # -- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.engine.closing:
            self.abort()
            return
        self.engine.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.engine.conns.discard(self)
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
        reply = self.pending_reply
        self.pending_reply = None
        if reply is not None and reply.log is not None and reply.action != "hang":
            log = reply.log
            self.engine.record(RequestLog(log.t, log.body, 0, "client_closed", False, log.headers))
        self.buf.clear()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.process()

    # -- parsing ------------------------------------------------------------------------

    def process(self) -> None:
        buf = self.buf
        while not self.busy and not self.closed:
            if self.head is None:
                end = buf.find(b"\r\n\r\n", self.scan_from)
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        self.fail(431, "Request header fields too large.")
                    else:
                        self.scan_from = max(0, len(buf) - 3)
                    return
                raw_head = bytes(buf[:end])
                del buf[: end + 4]
                self.scan_from = 0
                if not raw_head.strip():
                    continue  # stray CRLFs between requests
                head = self.parse_head(raw_head)
                if head is None:
                    return
                self.head = head
                if head[2].get("expect", "").lower() == "100-continue" and len(buf) < head[3]:
                    assert self.transport is not None
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            method, target, headers, length, keep_alive = self.head
            if len(buf) < length:
                return
            body = bytes(buf[:length])
            del buf[:length]
            self.head = None
            try:
                reply = self.engine.handle(method, target, headers, body)
            except Exception as exc:  # never let a bug kill the connection silently
                reply = _Reply(500, _error_body(f"Simulator error: {exc!r}", "server_error"))
            if not keep_alive:
                reply.close = True
            self.dispatch(reply)

    def parse_head(self, raw: bytes) -> tuple[str, str, dict[str, str], int, bool] | None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.fail(400, "Malformed request line.")
            return None
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self.fail(400, "Malformed header line.")
                return None
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.fail(501, "Chunked request bodies are not supported; send Content-Length.")
            return None
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self.fail(400, "Invalid Content-Length.")
            return None
        if length > MAX_BODY_BYTES:
            self.fail(413, "Request body too large.")
            return None
        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in connection
        else:
            keep_alive = "close" not in connection
        return method.upper(), target, headers, length, keep_alive

    def fail(self, status: int, message: str) -> None:
        self.dispatch(_Reply(status, _error_body(message, "invalid_request_error"), close=True))

    # -- replying -----------------------------------------------------------------------

    def dispatch(self, reply: _Reply) -> None:
        if reply.action == "hang":
            self.busy = True
            if reply.log is not None:
                self.engine.record(reply.log)
            loop = asyncio.get_running_loop()
            self.pending = loop.call_later(reply.hang_s, self.abort)
            return
        if reply.delay > 0:
            self.busy = True
            self.pending_reply = reply
            loop = asyncio.get_running_loop()
            self.pending = loop.call_later(reply.delay, self.fire)
            return
        self.execute(reply)

    def fire(self) -> None:
        self.pending = None
        reply = self.pending_reply
        self.pending_reply = None
        if reply is None or self.closed:
            return
        self.execute(reply)
        if self.closed:
            return
        self.busy = False
        self.process()

    def execute(self, reply: _Reply) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if reply.log is not None:
            self.engine.record(reply.log)
        if reply.action == "reset":
            self.abort()
            return
        close = reply.close or reply.action == "truncate" or transport.is_closing()
        head = _encode_head(reply.status, reply.headers, len(reply.body), close)
        if reply.action == "truncate":
            transport.write(head + reply.body[: len(reply.body) // 2])
            self.closed = True
            transport.close()
            return
        transport.write(head + reply.body)
        if close:
            self.closed = True
            transport.close()

    def abort(self) -> None:
        """Close abruptly (TCP RST where possible), dropping anything unsent."""
        self.pending = None
        transport = self.transport
        if transport is None:
            return
        self.closed = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()


# --------------------------------------------------------------------------------------
# Public server object
# --------------------------------------------------------------------------------------


class Simulator:
    """The simulated OpenAI server; ``start()`` runs it on its own thread and event loop."""

    def __init__(
        self,
        config: SimConfig = _DEFAULT_CONFIG,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | Path | None = None,
        *,
        keep_requests: bool = True,
    ) -> None:
        """``keep_requests=False`` keeps no in-memory log (``requests`` stays empty), for long
        benchmark runs; ``log_path`` still gets every line."""
        path = Path(log_path) if log_path is not None else None
        self._engine = _Engine(config, path, keep_requests)
        self._host = host
        self._port = port
        self._bound_port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- properties ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The listening port (the configured one until started)."""
        return self._bound_port if self._bound_port is not None else self._port

    @property
    def url(self) -> str:
        """The ``base_url`` for ``openai.AsyncOpenAI``: ``http://HOST:PORT/v1``."""
        if self._bound_port is None and self._port == 0:
            raise RuntimeError("the simulator is not listening yet; call start() first")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/v1"

    @property
    def config(self) -> SimConfig:
        return self._engine.config

    @property
    def requests(self) -> list[RequestLog]:
        """A snapshot of the chat-completion requests received so far."""
        return self._engine.logs()

    @property
    def uptime_s(self) -> float:
        """Seconds since the server started listening (the clock of ``outages`` and ``t``)."""
        return time.monotonic() - self._engine.t0

    def completed_bodies(self) -> list[dict[str, Any]]:
        """Request bodies of the completions that got a full, usable 200 answer."""
        return [r.body for r in self._engine.logs() if r.completed]

    def set_config(self, config: SimConfig) -> None:
        """Swap the configuration; the next request sees it (rate buckets reset if changed)."""
        self._engine.config = config

    # -- lifecycle ----------------------------------------------------------------------

    async def _serve(self, on_ready: Callable[[], None], *, handle_signals: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop_event = stop = asyncio.Event()
        engine = self._engine
        server = await loop.create_server(
            lambda: _Conn(engine), self._host, self._port, backlog=BACKLOG, reuse_address=True
        )
        try:
            self._bound_port = int(server.sockets[0].getsockname()[1])
            engine.open()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, stop.set)
            on_ready()
            await stop.wait()
        finally:
            engine.closing = True
            server.close()
            for conn in list(engine.conns):
                conn.abort()
            # Connections accepted but not yet set up are finished by asyncio tasks; let them
            # run (connection_made aborts them now that the engine is closing).
            current = asyncio.current_task()
            others = [t for t in asyncio.all_tasks() if t is not current]
            if others:
                await asyncio.wait(others, timeout=2.0)
            for _ in range(3):
                await asyncio.sleep(0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)
            engine.close()

    def start(self) -> Simulator:
        """Listen on a background thread with its own event loop; return once listening."""
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        _raise_nofile_limit()
        self._ready.clear()
        self._error = None

        def run() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self._serve(self._ready.set))
            except BaseException as exc:
                self._error = exc
            finally:
                try:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()
                    self._ready.set()

        self._thread = threading.Thread(target=run, name="openai-simulator", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"simulator failed to start: {self._error!r}") from self._error
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then join the server thread."""
        thread, loop, stop = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None
        self._stop_event = None

    def serve_forever(self, announce: Callable[[str], None] | None = None) -> None:
        """Serve on the calling thread until SIGTERM/SIGINT (used by the CLI)."""
        _raise_nofile_limit()

        def ready() -> None:
            if announce is not None:
                announce(self.url)

        asyncio.run(self._serve(ready, handle_signals=True))

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def _outage(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("an outage is START:END in seconds since server start")
    return float(start), float(end)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.testing.simulator",
        description="OpenAI-compatible HTTP server simulator (prints 'listening URL' when ready).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", dest="log_path", default=None, help="append JSONL request log")
    d = _DEFAULT_CONFIG
    parser.add_argument(
        "--latency", "--latency-s", dest="latency_s", type=float, default=d.latency_s
    )
    parser.add_argument("--jitter", "--jitter-s", dest="jitter_s", type=float, default=d.jitter_s)
    parser.add_argument("--p-done", dest="p_done", type=float, default=d.p_done)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--api-key", dest="api_key", default=d.api_key)
    parser.add_argument(
        "--models",
        "--model",
        dest="models",
        action="append",
        default=None,
        help="accepted model names (comma separated and/or repeated)",
    )
    parser.add_argument("--structured", choices=STRUCTURED_LEVELS, default=d.structured)
    parser.add_argument("--fence-json", dest="fence_json", action="store_true")
    parser.add_argument("--rpm", type=float, default=d.rpm)
    parser.add_argument("--tpm", type=float, default=d.tpm)
    for name in ("p_500", "p_503", "p_hang", "p_reset", "p_truncate", "p_length", "p_refusal"):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=float, default=getattr(d, name))
    parser.add_argument("--hang", "--hang-s", dest="hang_s", type=float, default=d.hang_s)
    parser.add_argument(
        "--outage",
        "--outages",
        dest="outages",
        type=_outage,
        action="append",
        default=[],
        help="START:END seconds since server start (repeatable)",
    )
    parser.add_argument("--faults-seed", dest="faults_seed", type=int, default=d.faults_seed)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator as a process until SIGTERM/SIGINT."""
    args = _build_parser().parse_args(argv)
    values = vars(args)
    models: list[str] | None = values.pop("models")
    if models is not None:
        values["models"] = tuple(m.strip() for arg in models for m in arg.split(",") if m.strip())
    values["outages"] = tuple(values["outages"])
    host: str = values.pop("host")
    port: int = values.pop("port")
    log_path: str | None = values.pop("log_path")
    known = {f.name for f in fields(SimConfig)}
    try:
        config = SimConfig(**{k: v for k, v in values.items() if k in known})
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def announce(url: str) -> None:
        sys.stdout.write(f"listening {url}\n")
        sys.stdout.flush()

    Simulator(config, host, port, log_path, keep_requests=False).serve_forever(announce)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
