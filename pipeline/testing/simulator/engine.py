"""Chat completions, answered in steps: validate → rate-limit → fault → answer.

Batch lines take the same validation and answer, without the real-time limits and faults.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any, Final

import orjson

from .answerkey import KnownAnswers
from .auth import auth_error
from .caching import PrefixCache, prefixes
from .chatrequest import (
    DEFAULT_COST_COMPLETION_TOKENS,
    ChatRequest,
    Rejection,
    model_error,
    parse_chat,
)
from .config import DEFAULT_MODEL, FAULTS, SimConfig
from .content import estimate_tokens, write_answer
from .faults import (
    ErrorReply,
    context_refusal,
    poison_refusal,
    quota_refusal,
    retry_after_headers,
    throttle_refusal,
)
from .log import RequestLog, RequestLogger
from .ratelimit import ChatLimiter
from .replies import Action, Reply, error_body, json_reply
from .tiers import Bill, flex_refusal, served_tier

__all__ = [
    "DEFAULT_COST_COMPLETION_TOKENS",
    "REFUSAL_TEXT",
    "ChatRequest",
    "Engine",
    "Rejection",
    "line_error_body",
    "model_error",
    "models_reply",
    "parse_chat",
]

REFUSAL_TEXT: Final = "I'm sorry, but I can't help with that request."

_LINE_FAILURES: Final[dict[int, tuple[str, str, str | None]]] = {
    400: (
        "The request could not be processed (simulated line failure).",
        "invalid_request_error",
        None,
    ),
    429: (
        "Rate limit reached for requests (simulated line failure).",
        "requests",
        "rate_limit_exceeded",
    ),
}
_SERVER_FAILURE: Final = (
    "The server had an error while processing your request. Sorry about that!",
    "server_error",
    None,
)


def line_error_body(status: int) -> bytes:
    """The error body of a batch line that failed with ``status``."""
    default = _SERVER_FAILURE if status >= 500 else _LINE_FAILURES[400]
    message, type_, code = _LINE_FAILURES.get(status, default)
    return error_body(message, type_, None, code)


def models_reply(cfg: SimConfig, path: str) -> Reply:
    """``GET /v1/models`` and ``GET /v1/models/{id}``."""
    names = cfg.models if cfg.models is not None else (DEFAULT_MODEL,)
    created = 1_700_000_000
    cards = [
        {"id": n, "object": "model", "created": created, "owned_by": "simulator"} for n in names
    ]
    if path == "/v1/models":
        return json_reply({"object": "list", "data": cards})
    wanted = path[len("/v1/models/") :]
    for card in cards:
        if card["id"] == wanted:
            return json_reply(card)
    return Reply(404, model_error(wanted))


@dataclass(frozen=True, slots=True)
class _Call:
    """A real-time request on its way through the steps: what its reply's log entry needs."""

    t: float
    body: dict[str, Any]
    headers: dict[str, str]
    model: str | None

    def reply(
        self,
        status: int,
        payload: bytes,
        outcome: str,
        *,
        action: Action = "send",
        usage: tuple[int, int] = (0, 0),
        headers: list[tuple[str, str]] | None = None,
        delay: float = 0.0,
        hang_s: float = 0.0,
    ) -> Reply:
        """The reply, carrying this request's log entry (status 0 when nothing is sent)."""
        sent = status if action in ("send", "truncate") else 0
        completed = outcome == "ok"
        log = RequestLog(
            self.t, self.body, sent, outcome, completed, self.headers, self.model, *usage
        )
        return Reply(status, payload, headers or [], action, delay, hang_s, log)


def _validate(cfg: SimConfig, call: _Call, parsed: Any, answered: int) -> ChatRequest | Reply:
    """The request, or the reply refusing it: a bad key, an invalid body, an outage, a
    rate limit that does not clear, a spent quota, a prompt past the context window."""
    auth = auth_error(cfg.api_key, call.headers)
    if auth is not None:
        return call.reply(401, auth, "auth")
    request = parse_chat(cfg, parsed)
    if isinstance(request, Rejection):
        return call.reply(request.status, request.body, request.outcome)
    if any(start <= call.t < end for start, end in cfg.outages):
        message = "The service is temporarily unavailable (simulated outage)."
        payload = error_body(message, "server_error", None, "service_unavailable")
        return call.reply(503, payload, "outage", headers=list(retry_after_headers(cfg)))
    refusal = (
        throttle_refusal(cfg, call.t)
        or quota_refusal(cfg, answered)
        or context_refusal(cfg, request.prompt_tokens, request.max_tokens)
    )
    if refusal is not None:
        return _refuse(call, refusal)
    return request


def _refuse(call: _Call, refusal: ErrorReply) -> Reply:
    return call.reply(refusal.status, refusal.body, refusal.outcome, headers=list(refusal.headers))


class Engine:
    """Answers chat completions and logs each one; owns the rate limits and fault draws."""

    def __init__(self, logger: RequestLogger) -> None:
        self.logger = logger
        self.t0 = time.monotonic()
        self._ids = itertools.count(1)
        self._limiter = ChatLimiter()
        self._applied: SimConfig | None = None
        self._fault_rng = random.Random(0)
        self._jitter_rng = random.Random(0)
        self._answered = 0  # full answers given, against ``quota_requests``
        self._flex_rng = random.Random(0)
        self.cache = PrefixCache()
        self.bill = Bill()
        self.known = KnownAnswers()

    def open(self, now: float) -> None:
        """Start the clock; the first request sets up limits and draws afresh."""
        self.t0 = now
        self._applied = None
        self._limiter = ChatLimiter()
        self._answered = 0

    def _apply(self, cfg: SimConfig, now: float) -> None:
        """Bring the limits and random streams in line with a (possibly swapped) config."""
        prev = self._applied
        if cfg is prev:
            return
        self._limiter.configure(now, cfg.rpm, cfg.tpm)
        if prev is None or prev.faults_seed != cfg.faults_seed:
            self._fault_rng = random.Random(f"faults:{cfg.faults_seed}")
            self._flex_rng = random.Random(f"flex:{cfg.faults_seed}")
        if prev is None or prev.seed != cfg.seed:
            self._jitter_rng = random.Random(f"jitter:{cfg.seed}")
        self._applied = cfg

    # -- real time -------------------------------------------------------------------------

    def chat(self, cfg: SimConfig, headers: dict[str, str], raw: bytes, now: float) -> Reply:
        """``POST /v1/chat/completions``: validate → rate-limit → fault → answer."""
        self._apply(cfg, now)
        try:
            parsed: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        model = body.get("model")
        call = _Call(now - self.t0, body, headers, model if isinstance(model, str) else None)
        request = _validate(cfg, call, parsed, self._answered)
        if isinstance(request, Reply):
            return request
        tier = served_tier(request.tier)
        flex = flex_refusal(cfg, tier, self._flex_rng.random() if tier == "flex" else 1.0)
        if flex is not None:
            return _refuse(call, flex)
        admission = self._limiter.admit(now, request.cost)
        if admission.refusal is not None:
            return call.reply(429, admission.refusal, "rate_limited", headers=admission.headers)
        # Always draw every number, in a fixed order, so runs are reproducible.
        draws = [self._fault_rng.random() for _ in FAULTS]
        delay = cfg.latency_s
        if cfg.jitter_s > 0:
            delay += self._jitter_rng.uniform(-cfg.jitter_s, cfg.jitter_s)
        delay = max(0.0, delay) * (cfg.flex_slowdown if tier == "flex" else 1.0)
        poison = poison_refusal(cfg, request.texts)
        if poison is not None:
            extra = [*admission.headers, *poison.headers]
            return call.reply(poison.status, poison.body, poison.outcome, headers=extra)
        fault = _fault(cfg, draws)
        if fault is not None:
            status, payload, outcome, action = fault
            if action == "hang":
                return call.reply(0, b"", outcome, action=action, hang_s=cfg.hang_s)
            rl_headers = [*admission.headers, *retry_after_headers(cfg)] if status else []
            return call.reply(
                status, payload, outcome, action=action, delay=delay, headers=rl_headers
            )
        self._answered += 1
        cached = self._cached(cfg, request, now)
        value, outcome, usage = self.answer(
            cfg,
            request,
            cut=draws[5] < cfg.p_length,
            refuse=draws[6] < cfg.p_refusal,
            cached=cached,
            tier=tier,
        )
        self.bill.charge(cfg, request.model, tier, usage[0], cached, usage[1])
        truncate = draws[4] < cfg.p_truncate
        return call.reply(
            200,
            orjson.dumps(value),
            "truncated" if truncate else outcome,
            action="truncate" if truncate else "send",
            usage=usage,
            delay=delay,
            headers=admission.headers,
        )

    def _cached(self, cfg: SimConfig, request: ChatRequest, now: float) -> int:
        """Prompt tokens the prefix cache serves (and the prompt's prefixes cached)."""
        if not cfg.prefix_cache:
            return 0
        partition = f"{request.model}\x00{request.cache_key or ''}"
        roles = [str(m.get("role")) for m in request.messages]
        found = prefixes(partition, list(zip(roles, request.texts, strict=True)))
        return min(self.cache.serve(found, now, cfg.cache_ttl_s), request.prompt_tokens)

    # -- the answer ------------------------------------------------------------------------

    def answer(
        self,
        cfg: SimConfig,
        request: ChatRequest,
        *,
        cut: bool,
        refuse: bool,
        cached: int = 0,
        tier: str = "default",
    ) -> tuple[dict[str, Any], str, tuple[int, int]]:
        """The ``chat.completion`` object, its log outcome, and (prompt, completion) tokens.

        ``cut`` halves the answer (finish_reason "length"); ``refuse`` refuses it;
        ``cached`` prompt tokens came from the prefix cache; ``tier`` served it.
        """
        known = None
        if cfg.answer_key is not None and request.mode == "text":
            known = self.known.reply(
                cfg.answer_key,
                request.messages,
                request.texts,
                temperature=request.temperature,
                seed=cfg.seed,
                p_right=cfg.p_right,
                p_right_refined=cfg.right_when_refined,
            )
        answer, digest = known or write_answer(
            request.messages,
            request.texts,
            request.mode,
            request.schema,
            seed=cfg.seed,
            p_done=cfg.p_done,
            fence_json=cfg.fence_json,
        )
        outcome, finish = "ok", "stop"
        content: str | None = answer
        refusal: str | None = None
        if cut:
            content = answer[: max(1, len(answer) // 2)]
            outcome, finish = "length", "length"
        limit = request.max_tokens
        if limit is not None and content is not None and estimate_tokens(len(content)) > limit:
            content = content[: limit * 4]
            outcome, finish = "length", "length"
        if refuse:
            content, refusal, outcome, finish = None, REFUSAL_TEXT, "refusal", "stop"
        completion_tokens = estimate_tokens(len(content if content is not None else REFUSAL_TEXT))
        prompt_tokens = request.prompt_tokens
        value = {
            "id": f"chatcmpl-sim{next(self._ids):x}{digest.hex()[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
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
                "prompt_tokens_details": {"cached_tokens": cached},
            },
            "service_tier": tier,
            "system_fingerprint": f"fp_sim{cfg.seed & 0xFFFFFFFF:08x}",
        }
        return value, outcome, (prompt_tokens, completion_tokens)

    # -- batch lines -----------------------------------------------------------------------

    def answer_line(
        self,
        cfg: SimConfig,
        body: dict[str, Any],
        *,
        batch_id: str,
        custom_id: str,
        fail_status: int | None,
        cut: bool,
        refuse: bool,
        now: float,
    ) -> tuple[int, dict[str, Any], tuple[int, int]]:
        """Answer and log one batch line: its status, response body and token usage.

        The line is answered as ``/v1/chat/completions`` would, without the real-time limits
        and transport faults.
        """
        model = body.get("model") if isinstance(body.get("model"), str) else None
        request = parse_chat(cfg, body)
        usage = (0, 0)
        if isinstance(request, Rejection):
            status, value, outcome = request.status, orjson.loads(request.body), request.outcome
        elif fail_status is not None:
            status, value = fail_status, orjson.loads(line_error_body(fail_status))
            outcome = f"error_{fail_status}"
        else:
            # Batch lines share the prefix cache too (OpenAI discounts cached batch input).
            cached = self._cached(cfg, request, now)
            value, outcome, usage = self.answer(cfg, request, cut=cut, refuse=refuse, cached=cached)
            status = 200
            self.bill.charge(cfg, request.model, "batch", usage[0], cached, usage[1])
        self.logger.record(
            RequestLog(
                now - self.t0,
                body,
                status,
                outcome,
                outcome == "ok",
                {},
                model,
                usage[0],
                usage[1],
                batch_id,
                custom_id,
            )
        )
        return status, value, usage


def _fault(cfg: SimConfig, draws: list[float]) -> tuple[int, bytes, str, Action] | None:
    """The transport-level fault the draws pick, if any: status, body, outcome, action."""
    if draws[0] < cfg.p_500:
        message = "The server had an error while processing your request. Sorry about that!"
        return 500, error_body(message, "server_error"), "error_500", "send"
    if draws[1] < cfg.p_503:
        message = "The engine is currently overloaded, please try again later."
        return 503, error_body(message, "server_error"), "error_503", "send"
    if draws[2] < cfg.p_hang:
        return 0, b"", "hang", "hang"
    if draws[3] < cfg.p_reset:
        return 0, b"", "reset", "reset"
    return None
