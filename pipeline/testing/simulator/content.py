"""Deterministic answers: prose, code, and JSON instances valid against a request's schema.

Every answer is a function of the seed and the request messages alone, so the same
request always gets the same answer and tests can predict what a run produces.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from typing import Any, Final, Literal

import orjson

__all__ = [
    "AnswerMode",
    "content_text",
    "estimate_tokens",
    "fenced_schema",
    "write_answer",
]

AnswerMode = Literal["text", "json"]
_FENCED_JSON: Final = re.compile(r"```json[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def content_text(content: Any) -> str:
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


def estimate_tokens(n_chars: int) -> int:
    """Tokens in ``n_chars`` characters, by the usual four-characters rule."""
    return max(1, math.ceil(n_chars / 4))


def _unit(digest: bytes, label: bytes) -> float:
    """A deterministic number in [0, 1) derived from ``digest`` and ``label``."""
    sub = hashlib.blake2b(label, key=digest[:32], digest_size=8).digest()
    return int.from_bytes(sub, "big") / 2.0**64


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
        type_ = schema.get("type")
        if isinstance(type_, list):
            non_null = [k for k in type_ if k != "null"]
            if not non_null or (not special and "null" in type_ and self.rng.random() < 0.1):
                return None
            type_ = non_null[0] if len(non_null) == 1 else self.rng.choice(non_null)
        if type_ is None:
            if "properties" in schema:
                type_ = "object"
            elif "items" in schema:
                type_ = "array"
            else:
                type_ = "string"
        if type_ == "object":
            return self.obj(schema, depth)
        if type_ == "array":
            return self.array(schema, name, depth)
        if type_ in ("number", "integer"):
            return self.number(schema, name, integer=type_ == "integer")
        if type_ == "boolean":
            return self.done if name == "done" else self.rng.random() < 0.5
        if type_ == "null":
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


def fenced_schema(text: str) -> dict[str, Any] | None:
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


def write_answer(
    messages: list[dict[str, Any]],
    texts: list[str],
    mode: AnswerMode,
    schema: Any,
    *,
    seed: int,
    p_done: float,
    fence_json: bool,
) -> tuple[str, bytes]:
    """The answer to ``messages`` (whose texts are ``texts``) and the digest it derives from.

    ``mode`` "json" answers an instance of ``schema`` (or of a schema fenced in the last
    user message); "text" answers prose, unless the last user message fences a schema.
    """
    canonical = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(seed.to_bytes(16, "big", signed=True) + canonical).digest()
    last_user = next(
        (
            x
            for m, x in zip(reversed(messages), reversed(texts), strict=True)
            if m.get("role") == "user"
        ),
        texts[-1],
    )
    fenced = False
    if mode == "json" and not isinstance(schema, dict):
        schema = fenced_schema(last_user)
    elif mode == "text":
        schema = fenced_schema(last_user)
        if schema is not None:
            mode, fenced = "json", fence_json
    writer = _Writer(digest, p_done, schema)
    if mode == "text":
        return writer.text_answer("\n".join(texts)), digest
    if isinstance(schema, dict):
        value = writer.instance(schema)
    else:
        value = {"answer": writer.sentences(2), "done": writer.done, "tag": writer.tag}
    answer = orjson.dumps(value).decode()
    return (f"```json\n{answer}\n```" if fenced else answer), digest
